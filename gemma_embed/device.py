"""Which device and compute dtype a run uses, from `--device` and `--dtype` and what this machine has; and the few
things the engine asks of that device (`DeviceOps`: memory numbers, peak statistics, releasing the allocator's
cache), in one object a test can replace with a fake device."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from gemma_embed.config import Dtype
from gemma_embed.cpu_kernels import cpuinfo_flags
from gemma_embed.errors import UsageError
from gemma_embed.memory import readings


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


DTYPES = {str(name): getattr(torch, str(name)) for name in Dtype if name != Dtype.auto}  # --dtype's names


# CPU flags of bf16 matrix instructions: AMX tiles (Sapphire Rapids and later) and AVX512-BF16 dot products
# (Cooper Lake, Zen 4 and later), which oneDNN's bf16 kernels use. Without them torch computes bf16 by converting
# to float32 and back. On a 2-core Xeon with both flags a release-size vision tower ran 2.4-2.9x faster in bf16
# than in float32; on machines of the same kind without them bf16 ran at 0.5x (bench/README.md).
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
PROC_CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class DtypeChoice:
    """The compute dtype of a run and why (the run summary and the output's metadata say both)."""

    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return dtype_name(self.dtype)


def resolve_dtype(name: str, device: torch.device, stored: torch.dtype | None = None) -> torch.dtype:
    """`choose_dtype(...).dtype`: the compute dtype alone."""
    return choose_dtype(name, device, stored).dtype


def choose_dtype(
    name: str, device: torch.device, stored: torch.dtype | None = None, stored_from: str = ""
) -> DtypeChoice:
    """An explicit --dtype is obeyed. auto follows transformers' `dtype="auto"` and vLLM: the dtype the checkpoint
    stores its weights in (`stored`; `stored_from` says what said so), where this device computes it fast. A bf16
    checkpoint runs in bf16 on a GPU that computes bf16 natively and on a CPU with bf16 matrix instructions, in
    float32 elsewhere. float16 stays opt-in (its narrow range can overflow in a tower trained in bf16); a float32
    checkpoint, or one whose dtype is unknown, runs in float32."""
    if name != "auto":
        return DtypeChoice(DTYPES[str(name)], f"--dtype {name}")
    where = f" ({stored_from})" if stored_from else ""
    if stored is None:
        return DtypeChoice(torch.float32, "auto: the checkpoint names no dtype, so float32")
    if stored == torch.float16:
        opt_in = "float16 is opt-in (--dtype float16)"
        return DtypeChoice(torch.float32, f"auto: the checkpoint stores float16{where}; {opt_in}, so float32")
    if stored != torch.bfloat16:
        return DtypeChoice(torch.float32, f"auto: the checkpoint stores {dtype_name(stored)}{where}, so float32")
    fast, why = bf16_is_fast(device)
    if fast:
        return DtypeChoice(torch.bfloat16, f"auto: the checkpoint stores bfloat16{where} and {why}")
    return DtypeChoice(torch.float32, f"auto: the checkpoint stores bfloat16{where}, but {why}, so float32")


def bf16_is_fast(device: torch.device) -> tuple[bool, str]:
    """Whether this device computes bf16 matrix products in hardware, and what says so (one clause)."""
    device = torch.device(device)
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        if cuda_bf16_native(device):
            return True, f"{gpu} computes bf16 natively"
        return False, f"{gpu} only emulates bf16"
    if device.type == "cpu":
        units = cpu_bf16_units()
        if units:
            return True, f"this CPU has bf16 matrix instructions ({', '.join(units)})"
        return False, f"this CPU has no bf16 matrix instructions (no {' or '.join(CPU_BF16_FLAGS)})"
    return False, f"bf16 speed on {device.type} is not measured here"


def cpu_bf16_units(capabilities: Mapping | None = None) -> tuple[str, ...]:
    """The bf16 matrix instructions (`CPU_BF16_FLAGS`) this CPU reports, read from the hardware."""
    capabilities = cpu_capabilities() if capabilities is None else capabilities
    return tuple(flag for flag in CPU_BF16_FLAGS if capabilities.get(flag))


def cpu_capabilities() -> Mapping:
    """The CPU's instruction-set flags: torch's own query (`torch.cpu.get_capabilities`: cpuinfo's CPUID at run
    time), else the kernel's flags in /proc/cpuinfo, else none."""
    query = getattr(torch.cpu, "get_capabilities", None)
    if query is not None:
        try:
            return query()
        except RuntimeError:
            pass
    try:
        text = PROC_CPUINFO.read_text()
    except OSError:
        return {}
    return dict.fromkeys(cpuinfo_flags(text), True)


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
    (the CPU, and MPS): memory from `readings.device_memory`, no peaks, nothing cached to release."""

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
        return readings.device_memory(self.device)

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
