"""CPU numerics that do not depend on the thread count: the same inputs give the same bytes with 1, 2 or any
number of threads, so `--cpu-threads auto` (which follows the machine's load), a Ray worker on a larger machine
and a single process all write the same output.

Two kinds of kernel change their last bits with the thread count (measured on an AMD EPYC, AVX512, torch 2.14):
- float32 GEMMs (MKL) with fewer than 12 rows that are not a multiple of 4: rows 1-3 differ from the same rows of a
  larger product at any thread count, rows 5-7 and 9-11 also at 2 threads; 4, 8 and every count from 12 on give
  the same bytes at 1, 2 and 3 threads (bf16 GEMMs gave the same bytes at every count). `aligned()` pads such an
  input to the next multiple of 4 rows and drops the extra rows of the output.
- Elementwise kernels whose vector and scalar code differ (tanh-GELU, SiLU, sigmoid, softplus, tanh: SLEEF in the
  vector loop, libm in the scalar tail): ATen splits a tensor into one chunk per thread and finishes each chunk's
  last elements with the scalar code, so which elements take that path moves with the thread count (70,000
  floats: other bytes at 2 threads than at 1), and so does the batch size (with one thread too: the tail is the
  tensor's last elements). `aligned()` runs every element through the vector code: most tensors of a model whose
  width is a multiple of 64 are cut on whole vector steps at 2 threads already and need nothing but that test; the
  others run on a buffer with room for whole chunks, at the cost of one copy. An element's bytes then depend on its
  value only: not on the thread count, the batch, or where it sits in the tensor.

The rest of a forward (attention at a fixed padded length, reductions over a row, exact elementwise operations
such as add and multiply) was measured to give the same bytes at every thread count and batch size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# ATen's parallel_for grain (at::internal::GRAIN_SIZE): a tensor below it runs on one thread. GELU sets its own:
# above 16,384 elements, one chunk per thread (aten/src/ATen/native/cpu/Activation.cpp).
GRAIN = 32768
GELU_ONE_CHUNK_PER_THREAD_ABOVE = 16384
# Bytes in one vector register of the CPU kernels torch picked (torch.backends.cpu.get_cpu_capability()).
VECTOR_BYTES = {"AVX512": 64, "AVX512_BF16": 64, "AMX": 64, "AVX2": 32, "DEFAULT": 16}
# GEMM rows that are the same at any thread count: a multiple of this, or at least SMALL_GEMM_ROWS.
GEMM_ROW_MULTIPLE = 4
SMALL_GEMM_ROWS = 12

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
    rows = x.numel() // max(1, x.shape[-1])
    if rows >= SMALL_GEMM_ROWS or rows % GEMM_ROW_MULTIPLE == 0:
        return F.linear(x, weight, bias)
    padded = -(-rows // GEMM_ROW_MULTIPLE) * GEMM_ROW_MULTIPLE
    flat = x.reshape(rows, x.shape[-1])
    filled = torch.cat([flat, flat.new_zeros(padded - rows, x.shape[-1])])
    return F.linear(filled, weight, bias)[:rows].view(*x.shape[:-1], weight.shape[0])


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
