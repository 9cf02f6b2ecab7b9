"""Which device and compute dtype a run uses, from `--device` and `--dtype` and what this machine has; and the few
things the engine asks of that device (`DeviceOps`: memory numbers, peak statistics, releasing the allocator's
cache), in one object a test can replace with a fake device."""

from __future__ import annotations

import torch

from gemma_embed import memory
from gemma_embed.errors import UsageError


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """auto: CUDA (one GPU per local rank under torchrun), then MPS, then the CPU. A CUDA device always comes back
    with its index, so every later call (memory, peaks, `set_device`) names the same GPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UsageError(f"--device {name!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {name}: MPS is not available on this machine")
    return device


def use_device(device: torch.device) -> None:
    """Make a CUDA device the process's current one, so what runs on the current device (cuBLAS handles, kernels
    that allocate scratch, `torch.cuda` calls without a device) uses it too: under torchrun, rank k on GPU k
    never opens a context on GPU 0."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on a CUDA device that computes it natively, else float32."""
    if name == "auto":
        if device.type == "cuda" and cuda_bf16_native(device):
            return torch.bfloat16
        return torch.float32
    return DTYPES[str(name)]


def cuda_bf16_native(device: torch.device) -> bool:
    """bf16 in hardware on this GPU (compute capability 8.0 and up, or ROCm). `is_bf16_supported()` alone also
    says yes where bf16 is only emulated (T4, V100), where SDPA falls back to its math kernel with full N x N
    scores the cost model leaves out; and it asks about the current device, not necessarily this one."""
    with torch.cuda.device(device):
        return torch.cuda.is_bf16_supported(including_emulation=False)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class DeviceOps:
    """What the engine asks of the device it runs on. This base class is a device without allocator statistics
    (the CPU, and MPS): memory from `memory.device_memory`, no peaks, nothing cached to release."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)

    @staticmethod
    def for_device(device) -> DeviceOps:
        device = torch.device(device)
        if device.type == "cuda":
            return CudaOps(device)
        if device.type == "mps":
            return MpsOps(device)
        return DeviceOps(device)

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes a chunk may plan with now; free includes what the allocator caches but no tensor
        uses."""
        return memory.device_memory(self.device)

    def allocated(self) -> int | None:
        """Bytes held by live tensors now; None where the device keeps no statistics."""
        return None

    def peak(self) -> int | None:
        """Most bytes held by live tensors since the last `reset_peak`; None where not measured."""
        return None

    def reset_peak(self) -> None:
        pass

    def release_cache(self) -> None:
        """Hand the allocator's unused cached blocks back to the device."""


class CudaOps(DeviceOps):
    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def release_cache(self) -> None:
        torch.cuda.empty_cache()


class MpsOps(DeviceOps):
    def release_cache(self) -> None:
        torch.mps.empty_cache()
