"""CPU numerics that do not depend on the thread count or the batch: the same inputs give the same bytes with 1, 2
or any number of threads and however the batches were cut, so `--cpu-threads auto` (which follows the machine's
load), `--resume`, a Ray worker and a single process all write the same output, on any x86-64 CPU with AVX2.

Three things change a product's last bits with the thread count or the batch, each handled where its library has
a control and worked around where it has none:
- float32 GEMMs (MKL): MKL's strict reproducibility mode, asked for when `gemma_embed` is imported
  (`cpu_kernels.request_reproducible_gemm`): the same bytes at any thread count, Intel or AMD. What the mode does not
  cover is the row count: MKL takes other kernels for products of 1-3 rows, whose rows then differ from the same
  rows of a larger product at every thread count (measured on an AMD EPYC, Zen 4, MKL 2024.2, strict: rows 1-3 of
  29 row counts x 5 shapes). `aligned()` pads a product of fewer than SMALL_GEMM_ROWS rows to that many; 16 leaves
  room for other CPUs' small-matrix kernels (not measured: no other CPU here), and costs nothing measurable, a
  product that small reads its weights once either way.
- bf16 and float16 GEMMs (oneDNN) on a CPU without instructions for the type: no control exists, and the emulating
  kernel splits sums between threads (`cpu_kernels`' docstring). `aligned()` computes such a product in float32
  through MKL's strict GEMM and rounds it to the type once, as oneDNN's kernels do with their float32 sums.
- Elementwise kernels whose vector and scalar code differ (tanh-GELU, SiLU, sigmoid, softplus, tanh: SLEEF in the
  vector loop, libm in the scalar tail): ATen splits a tensor into one chunk per thread and finishes each chunk's
  last elements with the scalar code, so which elements take that path moves with the thread count (70,000
  floats: other bytes at 2 threads than at 1), and so does the batch size (with one thread too: the tail is the
  tensor's last elements). No library control exists. `aligned()` runs every element through the vector code:
  most tensors of a model whose width is a multiple of 64 are cut on whole vector steps at 2 threads already and
  need nothing but that test; the others run on a buffer with room for whole chunks, at the cost of one copy. An
  element's bytes then depend on its value only. Measured under each of ATen's kernel paths (ATEN_CPU_CAPABILITY
  default, avx2, avx512) on the AMD EPYC: tests/integration/test_kernel_paths.py.

The rest of a forward (attention at a fixed padded length, reductions over a row, exact elementwise operations
such as add and multiply) was measured to give the same bytes at every thread count and batch size. What is not
promised: the same bytes on two kinds of CPU. MKL's branches, ATen's vector widths and oneDNN's kernels differ
between them in the last bits (avx512 against avx2: 1.7e-6, measured on the Intel Xeon), so each output's header
records the kernels it was computed with (`kernels()`, shown by `gemma-embed inspect`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gemma_embed import cpu_kernels
from gemma_embed.cpu_threads import cpu_model
from gemma_embed.device import cpu_capabilities, dtype_name

# ATen's parallel_for grain (at::internal::GRAIN_SIZE): a tensor below it runs on one thread. GELU sets its own:
# above 16,384 elements, one chunk per thread (aten/src/ATen/native/cpu/Activation.cpp).
GRAIN = 32768
GELU_ONE_CHUNK_PER_THREAD_ABOVE = 16384
# Bytes in one vector register of the CPU kernels torch picked (torch.backends.cpu.get_cpu_capability()).
VECTOR_BYTES = {"AVX512": 64, "AVX512_BF16": 64, "AMX": 64, "AVX2": 32, "DEFAULT": 16}
# GEMMs of fewer rows are padded to this many (module docstring).
SMALL_GEMM_ROWS = 16
# A GEMM runs on at most one MKL thread per this many output columns (module docstring).
COLUMNS_PER_THREAD = 16
HALF_TYPES = (torch.bfloat16, torch.float16)
# MKL's CNR modes (mkl_cbwr.h: MKL_CBWR_BRANCH values and the STRICT bit), as MKL_CBWR spells them.
MKL_BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2", 9: "AVX"}
MKL_BRANCHES.update({10: "AVX2", 12: "AVX512"})
MKL_STRICT = 0x10000
MKL_ALL = -1

# The kernels whose vector and scalar code round differently (see the module's docstring).
_ELEMENTWISE = {
    F.gelu,
    F.silu,
    F.softplus,
    F.mish,
    torch.sigmoid,
    torch.tanh,
    torch.Tensor.sigmoid,
    torch.Tensor.tanh,
}


def vector_step(dtype: torch.dtype) -> int:
    """Elements one step of ATen's vector loop takes (two registers) for this dtype on this CPU."""
    register = VECTOR_BYTES.get(torch.backends.cpu.get_cpu_capability(), 64)
    return 2 * register // torch.empty((), dtype=dtype).element_size()


def _tasks(size: int, threads: int, gelu: bool) -> int:
    """How many chunks ATen's parallel_for cuts `size` elements into."""
    if gelu:
        return threads if size > GELU_ONE_CHUNK_PER_THREAD_ABOVE else 1
    return max(1, min(threads, -(-size // GRAIN)))


def all_vector(size: int, threads: int, step: int, gelu: bool = False) -> bool:
    """Whether every chunk ATen cuts `size` elements into is a whole number of vector steps: then no element
    takes the scalar tail, and each element's bytes depend on its value only."""
    return size % step == 0 and (-(-size // _tasks(size, threads, gelu))) % step == 0


def _elementwise(func, x: torch.Tensor, args, kwargs):
    """`func(x)` with every element through the vector code. Most calls need nothing but the size test; the
    others run on a buffer with room for whole chunks (one copy), whose extra elements are dropped."""
    inplace = bool(kwargs.pop("inplace", False))
    numel, step, threads = x.numel(), vector_step(x.dtype), torch.get_num_threads()
    gelu = func is F.gelu
    if x.is_contiguous() and all_vector(numel, threads, step, gelu):
        out = func(x, *args, **kwargs)
    else:
        size = -(-numel // step) * step
        while not all_vector(size, threads, step, gelu):
            size += step
        buffer = x.new_zeros(size)
        buffer[:numel].copy_(x.reshape(-1))
        out = func(buffer, *args, **kwargs)[:numel].view(x.shape)
    if inplace:
        return x.copy_(out)
    return out


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` with a small product padded to SMALL_GEMM_ROWS rows, and a half-type product computed in float32
    where the CPU has no instructions for the type (module docstring)."""
    rows = x.numel() // max(1, x.shape[-1])
    emulated = x.dtype in HALF_TYPES and not half_native(x.dtype)
    with _mkl_threads_at_most(max(1, weight.shape[0] // COLUMNS_PER_THREAD)):
        if rows >= SMALL_GEMM_ROWS and not emulated:
            return F.linear(x, weight, bias)
        flat = x.reshape(rows, x.shape[-1])
        if rows < SMALL_GEMM_ROWS:
            flat = torch.cat([flat, flat.new_zeros(SMALL_GEMM_ROWS - rows, x.shape[-1])])
        if emulated:
            out = F.linear(flat.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
        else:
            out = F.linear(flat, weight, bias)
    return out[:rows].view(*x.shape[:-1], weight.shape[0])


@contextlib.contextmanager
def _mkl_threads_at_most(most: int) -> Iterator[None]:
    """MKL's threads for the calls inside, on this thread only (`mkl_set_num_threads_local`), capped at `most`;
    nothing changes where the cap is above the count or torch has no MKL."""
    local = _mkl_function("MKL_Set_Num_Threads_Local") if most < torch.get_num_threads() else None
    if local is None:
        yield
        return
    before = local(most)
    try:
        yield
    finally:
        local(before)


@functools.cache
def half_native(dtype: torch.dtype) -> bool:
    """Whether oneDNN computes this half type's products with the CPU's own instructions (then its kernels are
    left alone); read once, as oneDNN reads its ISA cap once."""
    flags = {name for name, present in cpu_capabilities().items() if present}
    return cpu_kernels.half_gemm_native(dtype_name(dtype), flags, os.environ.get("ONEDNN_MAX_CPU_ISA"))


@functools.cache
def _mkl_function(name: str):
    """One of MKL's C functions (int -> int) from torch's CPU library, which links MKL in and exports them; None
    where torch has no MKL."""
    if not torch.backends.mkl.is_available():
        return None
    try:
        function = getattr(ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int
    return function


def mkl_mode() -> str | None:
    """MKL's reproducibility mode in force in this process, spelled as MKL_CBWR spells it ("AUTO,STRICT", "OFF"),
    read from MKL itself (its service call `mkl_serv_cbwr_get`); None where torch has no MKL. Reading it fixes
    the mode: call it when products are about to run."""
    get = _mkl_function("mkl_serv_cbwr_get")
    if get is None:
        return None
    mode = get(MKL_ALL)
    branch = MKL_BRANCHES.get(mode & 0xFFFF, f"branch {mode & 0xFFFF}")
    return f"{branch},STRICT" if mode & MKL_STRICT else branch


def kernels() -> dict[str, object]:
    """The CPU kernels a forward here computes with, as an output's header records them: the CPU, ATen's vector
    path, MKL's mode, how half-type products run, and whether the thread count can change a byte."""
    mkl = mkl_mode()
    described: dict[str, object] = {
        "cpu": cpu_model() or "unknown",
        "aten": torch.backends.cpu.get_cpu_capability(),
        "mkl": mkl or "none",
    }
    for dtype in HALF_TYPES:
        described[dtype_name(dtype)] = "oneDNN, in hardware" if half_native(dtype) else "float32 GEMM, rounded"
    described["thread_count_invariant"] = bool(mkl and mkl.endswith(",STRICT"))
    return described


def kernels_json() -> str:
    return json.dumps(kernels())


class _Aligned(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        first = args[0] if args else kwargs.get("input")
        if not isinstance(first, torch.Tensor) or first.device.type != "cpu" or not first.is_floating_point():
            return func(*args, **kwargs)
        if func in _ELEMENTWISE:
            if not args:
                args = (kwargs.pop("input"),)
            return _elementwise(func, args[0], args[1:], kwargs)
        if func is F.linear and first.dim() >= 1:
            return _linear(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def aligned(device: torch.device) -> Iterator[None]:
    """Thread-count-independent kernels for the forwards run inside, on a CPU device; elsewhere nothing changes
    (a GPU's kernels are another matter: tests/integration/test_bf16.py)."""
    if device.type != "cpu":
        yield
        return
    with _Aligned():
        yield
