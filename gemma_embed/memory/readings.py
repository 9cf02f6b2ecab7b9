"""Memory readings: how much memory the device and the host have, read now, and how much the model holds.

The only module that reads memory from the system (psutil, the cgroup files under /sys/fs/cgroup, torch's CUDA and
MPS counters); the planner (`memory.planner`) takes what it reads as plain numbers. The arithmetic on a reading
(`host_memory`, `cuda_free`) is kept apart from the reading itself, so tests can give it numbers.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def host_memory(available: int, total: int, cgroup_limit: int | None, cgroup_usage: int | None) -> tuple[int, int]:
    """Free/total host memory, honouring a cgroup limit (the kernel kills past it rather than raising)."""
    free, cap = int(available), int(total)
    if cgroup_limit is not None and 0 < cgroup_limit < cap:
        cap = int(cgroup_limit)
        used = int(cgroup_usage or 0)
        free = min(free, max(0, cap - used))
    return max(0, free), max(0, cap)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def cgroup_memory(root: Path = Path("/sys/fs/cgroup")) -> tuple[int | None, int | None]:
    """(limit, usage) of this process's cgroup, v2 or v1; (None, None) where there is none."""
    if (root / "memory.max").exists():
        return _read_int(root / "memory.max"), _read_int(root / "memory.current")
    v1 = root / "memory"
    limit = _read_int(v1 / "memory.limit_in_bytes")
    if limit is not None and limit >= 1 << 60:  # v1 spells "no limit" as a huge number
        limit = None
    return limit, _read_int(v1 / "memory.usage_in_bytes")


def resident_bytes(*towers: object) -> int:
    """Bytes of the tensors (parameters and buffers) of the torch modules these towers hold as attributes (or in
    lists), each tensor counted once: the model's own memory on its device. None towers are skipped."""
    import torch

    seen: set[tuple[int, int]] = set()
    total = 0
    for tower in towers:
        if tower is None:
            continue
        for value in vars(tower).values():
            for module in value if isinstance(value, (list, tuple)) else (value,):
                if not isinstance(module, torch.nn.Module):
                    continue
                for tensor in itertools.chain(module.parameters(), module.buffers()):
                    key = (tensor.data_ptr(), tensor.nbytes)
                    if key not in seen:
                        seen.add(key)
                        total += tensor.nbytes
    return total


def cuda_free(driver_free: int, reserved: int, allocated: int) -> int:
    """Bytes a chunk can use on a CUDA device: what the driver reports free plus what PyTorch's caching allocator
    holds reserved but no tensor uses. `mem_get_info` counts that cache as used, so after one large chunk (or an
    out-of-memory error) planning from it alone would leave every later chunk near 1."""
    return max(0, int(driver_free)) + max(0, int(reserved) - int(allocated))


def device_memory(device: str | torch.device) -> tuple[int, int]:
    """(free, total) bytes of the device a chunk will run on, read now."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        reserved, allocated = torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)
        return cuda_free(free, reserved, allocated), int(total)
    if device.type == "mps":
        total = int(torch.mps.recommended_max_memory())
        return max(0, total - int(torch.mps.driver_allocated_memory())), total
    import psutil

    vm = psutil.virtual_memory()
    limit, usage = cgroup_memory()
    return host_memory(vm.available, vm.total, limit, usage)
