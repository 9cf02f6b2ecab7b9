"""Which device and compute dtype a run uses, from `--device` and `--dtype` and what this machine has."""

from __future__ import annotations

import torch

from gemma_embed.errors import UsageError


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """auto: CUDA (one GPU per local rank under torchrun), then MPS, then the CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            index = local_rank % torch.cuda.device_count() if local_rank else torch.cuda.current_device()
            return torch.device("cuda", index)
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UsageError(f"--device {name!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine")
    if device.type == "cuda" and device.index is None and local_rank:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {name}: MPS is not available on this machine")
    return device


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
