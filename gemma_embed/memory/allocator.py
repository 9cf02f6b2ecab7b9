"""glibc's allocator settings for a long run: flat peak memory, and forwards on the CPU without page faults.

Two needs pull glibc's allocator apart:
- Between forwards: glibc raises its mmap threshold each time a large block is freed, after which same-sized blocks
  (a window's pixel tensors, ~2 MB each) come from the heap and fragment it: measured on 2,000 images, peak RSS crept
  up by ~80 MB over the run instead of staying flat. Pinning the threshold (256 KiB) keeps big blocks in mmap,
  returned to the OS when freed.
- During a forward on the CPU: every activation above that threshold is then a fresh mmap, and every page of it a
  page fault the kernel zeroes. A release-size vision tower (bench/bench_release.py) allocates ~6 GB per 280-token
  image in bf16 (float32 norm temporaries, MLP intermediates): 1.5 million faults and 2.5-2.7 s of system time per
  forward, which doubled it (3.1-3.3 s against 1.5 s unpinned; Xeon with AMX, 2 cores).
So the CLI pins the threshold, and the engine runs each CPU forward inside `heap_only()`: no new mmaps while it
runs, so activations come from the heap and the blocks a forward frees are reused within it (~37,000 faults and
0.1 s of system time a forward, measured the same way). The heap a window's forwards grew stays with the process
until the window's last forward is done (`heap_kept()`, around each decode window), and only then does
`malloc_trim` hand it back, so peak RSS stays as flat from window to window as before. Trimmed after every forward
instead, each forward faulted its activations in afresh: on a 512-wide 8-layer text model, a 37 x 160-token batch
took 57,000-58,000 faults (glibc's own settings: 138,000-160,000) where a kept heap takes about 1,000, and 3.12-3.18
CPU s a forward against 3.13-3.34 trimmed and 3.46-3.59 with glibc's (2-core AMD EPYC,
`python -m bench.bench_forward_faults`, bench/README.md "Page faults in text forwards").

Process-wide, so the CLI turns it on (`configure_for_long_runs`); library users decide for their own process, and
`heap_only()` does nothing until then.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
import threading
from collections.abc import Iterator

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 * 1024
DEFAULT_MMAP_MAX = 65536  # glibc's defaults: mmap allowed, free memory at the heap's top returned beyond 128 KiB
DEFAULT_TRIM_THRESHOLD = 128 * 1024
# During a forward, free memory at the heap's top is returned to the OS only beyond this (mallopt takes a C int:
# 2 GiB - 1 is the most it can say).
KEEP_FREED = 2**31 - 1

_libc: ctypes.CDLL | None = None
_heap_only = False  # configure_for_long_runs() turned heap_only() on
_lock = threading.Lock()
_depth = 0  # heap_only() scopes open now (nested or in other threads)
_kept = 0  # heap_kept() scopes open now


def _mallopt(param: int, value: int) -> bool:
    return bool(_libc is not None and _libc.mallopt(param, int(value)))


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018 - glibc only (musl has no mallopt)
    except (OSError, AttributeError):
        return None
    return libc


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold; a no-op (False) off Linux or without glibc."""
    global _libc
    _libc = _libc or _load_libc()
    return _mallopt(M_MMAP_THRESHOLD, threshold)


def configure_for_long_runs() -> bool:
    """The CLI's settings: the pinned mmap threshold, and `heap_only()` in effect. False (and nothing changed) off
    Linux or without glibc."""
    global _heap_only
    _heap_only = pin_mmap_threshold()
    return _heap_only


@contextlib.contextmanager
def heap_only() -> Iterator[None]:
    """While it is open (a CPU forward), blocks come from the heap, never from a fresh mmap (glibc's M_MMAP_MAX = 0),
    and freed ones stay there (a trim threshold above any forward's activations), so each activation reuses memory
    an earlier one freed. When the last scope closes, mmap is allowed again and, unless a `heap_kept()` scope is
    open, `malloc_trim` hands the heap's free pages back to the OS. Nothing happens before
    `configure_for_long_runs()`."""
    global _depth
    if not _heap_only:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            _mallopt(M_MMAP_MAX, 0)
            _mallopt(M_TRIM_THRESHOLD, KEEP_FREED)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
                if _kept == 0:
                    _give_back()


@contextlib.contextmanager
def heap_kept() -> Iterator[None]:
    """While it is open (one decode window's encodes), the heap the forwards grew stays with the process between
    them: the trim threshold stays above their activations, so the next forward reuses the pages instead of
    faulting them in again. Blocks outside the forwards still come from mmap above the pinned threshold, as
    before. When the last scope closes (and no forward runs), `malloc_trim` hands the free pages back: the next
    window decodes on a trimmed heap, as when every forward trimmed. Nothing happens before
    `configure_for_long_runs()`."""
    global _kept
    if not _heap_only:
        yield
        return
    with _lock:
        _kept += 1
        if _kept == 1:
            _mallopt(M_TRIM_THRESHOLD, KEEP_FREED)
    try:
        yield
    finally:
        with _lock:
            _kept -= 1
            if _kept == 0 and _depth == 0:
                _give_back()


def _give_back() -> None:
    """glibc's trim threshold back to its default, and the heap's free pages handed back now. Called under
    `_lock` once no scope is open."""
    _mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
    if _libc is not None:  # always so: the scopes are on only where glibc was loaded
        _libc.malloc_trim(0)
