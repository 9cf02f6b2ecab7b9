"""CPU numerics that do not depend on the thread count or the batch: the same inputs give the same bytes with 1, 2
or any number of threads and however the batches were cut, so `--cpu-threads auto` (which follows the machine's
load), `--resume`, a Ray worker and a single process all write the same output, on any x86-64 CPU with AVX2.

What changes a forward's last bits with the thread count or the batch, each handled with its library's control
where there is one and worked around where there is none (measured on an AMD EPYC, Zen 4, avx512_bf16, torch 2.14.1
with MKL 2024.2 and oneDNN 3.12, threads 1-16 on 2 cores; the Intel Xeon figures are from issue 46):
- float32 GEMMs (MKL): MKL's strict reproducibility mode, asked for when `gemma_embed` is imported
  (`cpu_kernels.request_reproducible_gemm`). Intel documents it for its CPUs. On this AMD CPU MKL keeps STRICT on
  its AUTO branch, which held for every shape but narrow ones at many threads: a product of 64 output columns
  differed at 8 threads, 128 at 16, 32 at 4 (MKL splits the sum over K when the columns run out). So every product
  runs on at most one MKL thread per COLUMNS_PER_THREAD output columns (`mkl_set_num_threads_local`, this thread
  only): 0 differences in 27 shapes x 26 row counts x threads 2-16 and 32. The mode does not cover the row count
  either: MKL takes other kernels for 1-3 rows, which differ from the same rows of a larger product at every thread
  count, so a product of fewer than SMALL_GEMM_ROWS rows is padded; 16 leaves room for other CPUs' small-matrix
  kernels (not measured: no other CPU here), and a product that small reads its weights once either way. Both
  rules apply to F.linear and to projections written as matmul (Gemma 3's multimodal projector) or batched matmul
  (Gemma 4's pooler averages patches with one).
- bf16 and float16 GEMMs (oneDNN) on a CPU without instructions for the type: no control exists (torch's
  `backends.mkldnn.deterministic` reaches Intel GPUs only), and the emulating kernel splits sums between threads
  (`cpu_kernels`' docstring). `aligned()` computes such a product in float32 through MKL's strict GEMM and rounds
  it to the type once, as oneDNN's kernels do with their float32 sums.
- convolutions (oneDNN: Gemma 3n's MobileNet, the audio towers): no control either. A 1x1 convolution to 8
  channels split its sums at 8 threads, and the kernel oneDNN picks follows the batch's size (an image in a batch
  of 7 against alone: 5e-6). `aligned()` runs a convolution one item at a time, on at most one thread per
  COLUMNS_PER_THREAD output channels.
- Elementwise kernels whose vector and scalar code differ (tanh-GELU, SiLU, sigmoid, softplus, tanh, rsqrt: SLEEF
  or a vector formula in the vector loop, libm in the scalar tail): ATen splits a tensor into one chunk per thread
  and finishes each chunk's last elements with the scalar code, so which elements take that path moves with the
  thread count (70,000 floats: other bytes at 2 threads than at 1), and so does the batch size (with one thread
  too: the tail is the tensor's last elements; Gemma 3n's RMSNorm2d's rsqrt in bf16: 0.03 apart). No library
  control exists. `aligned()` runs every element through the vector code: most tensors of a model whose width is a
  multiple of 64 are cut on whole vector steps at 2 threads already and need nothing but that test; the others run
  on a buffer with room for whole chunks, at the cost of one copy. An element's bytes then depend on its value
  only. Under each of ATen's kernel paths (ATEN_CPU_CAPABILITY default, avx2, avx512) and every family and
  modality of the samples: tests/integration/test_kernel_paths.py.

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
    torch.rsqrt,
    torch.Tensor.rsqrt,
}


# oneDNN's convolutions: a thread cap by output channels, as MKL's by output columns (module docstring).
_CONVOLUTIONS = {F.conv1d, F.conv2d}
# Products of a tensor's rows with a matrix written without F.linear.
_MATMUL = {
    torch.matmul,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.mm,
    torch.Tensor.mm,
    torch.bmm,
    torch.Tensor.bmm,
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
    def compute(rows: torch.Tensor, wide: bool) -> torch.Tensor:
        if wide:
            return F.linear(rows.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
        return F.linear(rows, weight, bias)

    return _product(x, weight.shape[0], compute)


def _matmul(func, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """`x @ other` for a matrix `other` (a projection written as matmul, as Gemma 3's multimodal projector)."""

    def compute(rows: torch.Tensor, wide: bool) -> torch.Tensor:
        return func(rows.float(), other.float()).to(x.dtype) if wide else func(rows, other)

    return _product(x, other.shape[-1], compute)


def _batched_matmul(func, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """`x @ other` for a stack of matrices (Gemma 4's pooler averages patches with one): the same rules as
    `_product`, each matrix of `x` padded along its rows."""
    rows, columns = x.shape[-2], other.shape[-1]
    emulated = x.dtype in HALF_TYPES and not half_native(x.dtype)
    with _mkl_threads_at_most(max(1, columns // COLUMNS_PER_THREAD)):
        if rows >= SMALL_GEMM_ROWS and not emulated:
            return func(x, other)
        if rows < SMALL_GEMM_ROWS:
            x = torch.cat([x, x.new_zeros(*x.shape[:-2], SMALL_GEMM_ROWS - rows, x.shape[-1])], dim=-2)
        out = func(x.float(), other.float()).to(x.dtype) if emulated else func(x, other)
    return out[..., :rows, :]


def _product(x: torch.Tensor, columns: int, compute) -> torch.Tensor:
    """A product of `x`'s rows with a matrix giving `columns` columns, `compute(rows, wide)`: padded to
    SMALL_GEMM_ROWS rows when smaller, on at most one MKL thread per COLUMNS_PER_THREAD columns, and in float32
    (`wide`) for a half type the CPU has no instructions for (module docstring)."""
    rows = x.numel() // max(1, x.shape[-1])
    emulated = x.dtype in HALF_TYPES and not half_native(x.dtype)
    with _mkl_threads_at_most(max(1, columns // COLUMNS_PER_THREAD)):
        if rows >= SMALL_GEMM_ROWS and not emulated:
            return compute(x, False)
        flat = x.reshape(rows, x.shape[-1])
        if rows < SMALL_GEMM_ROWS:
            flat = torch.cat([flat, flat.new_zeros(SMALL_GEMM_ROWS - rows, x.shape[-1])])
        out = compute(flat, emulated)
    return out[:rows].view(*x.shape[:-1], columns)


def _convolution(func, x: torch.Tensor, rest, kwargs) -> torch.Tensor:
    """A convolution one item at a time (oneDNN picks its kernel by the batch's size: Gemma 3n's MobileNet gave
    other bytes for an image in a batch of 7 than alone, 5e-6), on at most one thread per COLUMNS_PER_THREAD output
    channels (as a GEMM; measured: a 1x1 convolution to 8 channels split its sums at 8 threads)."""
    with _threads_at_most(max(1, rest[0].shape[0] // COLUMNS_PER_THREAD)):
        if x.dim() != rest[0].dim() or x.shape[0] == 1:  # unbatched, or one item
            return func(x, *rest, **kwargs)
        return torch.cat([func(x[i : i + 1], *rest, **kwargs) for i in range(x.shape[0])])


@contextlib.contextmanager
def _threads_at_most(most: int) -> Iterator[None]:
    """torch's intra-op threads (which oneDNN runs on) capped at `most` for the calls inside, then set back."""
    before = torch.get_num_threads()
    if most >= before:
        yield
        return
    torch.set_num_threads(most)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
        if func in _CONVOLUTIONS and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            return _convolution(func, first, args[1:], kwargs)
        if func in _MATMUL and len(args) == 2 and not kwargs and first.dim() >= 2:
            other = args[1]
            if isinstance(other, torch.Tensor) and other.dim() >= 2 and other.dtype == first.dtype:
                return _matmul(func, first, other) if other.dim() == 2 else _batched_matmul(func, first, other)
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
