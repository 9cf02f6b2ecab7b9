"""Host-memory settings for a long-running command: flat peak memory, and forwards on the CPU without page faults.

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
0.1 s of system time a forward, measured the same way), and when the forward ends `malloc_trim` hands the freed heap
back, so peak RSS stays as flat as before.

Process-wide, so the CLI turns it on (`configure_for_long_runs`); library users decide for their own process, and
`heap_only()` does nothing until then.

The decode side's share of host memory (`DecodeRoom`) is here too: decoders say what an item will need once its
header is read (`admit`), and the worker waits until that fits.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
import threading

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 * 1024
DEFAULT_MMAP_MAX = 65536  # glibc's defaults: mmap allowed, free memory at the heap's top returned beyond 128 KiB
DEFAULT_TRIM_THRESHOLD = 128 * 1024
# During a forward, free memory at the heap's top is returned to the OS only beyond this (mallopt takes a C int:
# 2 GiB - 1 is the most it can say).
KEEP_FREED = 2**31 - 1

_libc = None
_heap_only = False  # configure_for_long_runs() turned heap_only() on
_lock = threading.Lock()
_depth = 0  # heap_only() scopes open now (nested or in other threads)


def _mallopt(param: int, value: int) -> bool:
    return bool(_libc is not None and _libc.mallopt(param, int(value)))


def _load_libc():
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
def heap_only():
    """While it is open (a CPU forward), blocks come from the heap, never from a fresh mmap (glibc's M_MMAP_MAX = 0),
    and freed ones stay there (a trim threshold above any forward's activations), so each activation reuses memory
    an earlier one freed. When the last scope closes, mmap is allowed again and `malloc_trim` hands the heap's free
    pages back to the OS: peak RSS stays flat from window to window. Nothing happens before
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
                _mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
                _libc.malloc_trim(0)


# ------------------------------------------------------------------------------------------ the decode room


class RoomClosed(Exception):
    """The stream that owned the room has ended: a decode still waiting for room gives up."""


class DecodeRoom:
    """The decode side's share of host memory, in bytes (`memory.host_plan`), handed out in input order.

    Held: the estimated decode peaks of the items decoding now (asked for through `admit` once a decoder has read
    the header, given back when the item is prepared) and the prepared bytes of the items decoded and not yet
    encoded (from the end of their decode until the stream's consumer is done with their window: `release`).
    An item waits until its estimate fits beside what is held. Turns go by ticket (input order), so a later item
    never takes room an earlier one waits for: the stream, which collects items in input order, waits only on an
    item that is decoding or whose turn it is. When that item waits while nothing decodes, only the stream can make
    room: it hands its window on (and releases it), or, with nothing left to give back, lets the item through over
    the budget (`wait`), so a run whose every item is larger than the budget still goes on, one at a time.
    Every call is O(1) (a ticket that finished without asking joins a set its turn pops it from)."""

    def __init__(self, capacity: int):
        self.capacity = max(0, int(capacity))
        self.held = 0
        self.peak_held = 0  # the most held at once (estimates and prepared bytes): for tests and benches
        self.decoding = 0  # items admitted whose decode has not ended
        self.forced = 0  # items let through over the budget
        self._cond = threading.Condition()
        self._turn = 0  # the next ticket to admit
        self._passed: set[int] = set()  # tickets that ended without asking, ahead of the turn
        self._waiting: set[int] = set()  # tickets waiting in `reserve`
        self._force: int | None = None  # the ticket let through over the budget
        self._paused = False
        self._closed = False

    # -------------------------------------------------------------------- the decode threads' side

    def reserve(self, ticket: int, nbytes: int) -> None:
        """Block until it is `ticket`'s turn and `nbytes` fit beside what is held (or `wait` lets it through)."""
        nbytes = max(0, int(nbytes))
        with self._cond:
            self._waiting.add(ticket)
            self._cond.notify_all()  # the stream may be waiting to see whether this item is stuck
            try:
                self._cond.wait_for(
                    lambda: self._closed or (not self._paused and self._turn == ticket and self._fits(ticket, nbytes))
                )
            finally:
                self._waiting.discard(ticket)
            if self._closed:
                raise RoomClosed("the decode stream has ended")
            if self._force == ticket:
                self._force = None
                self.forced += self.held + nbytes > self.capacity
            self._hold(nbytes)
            self.decoding += 1
            self._next_turn()
            self._cond.notify_all()  # the stream may wait for this item to take the room it was let through to

    def finish(self, ticket: int, reserved: int | None, prepared_bytes: int) -> None:
        """An item's decode has ended: its estimate (None: it never asked) gives way to its prepared bytes."""
        with self._cond:
            if reserved is None:
                if self._turn == ticket:
                    self._next_turn()
                else:
                    self._passed.add(ticket)
            else:
                self.held -= max(0, int(reserved))
                self.decoding -= 1
            self._hold(max(0, int(prepared_bytes)))
            self._cond.notify_all()

    # -------------------------------------------------------------------- the stream's side

    def release(self, nbytes: int) -> None:
        """The consumer is done with a window of items whose prepared bytes were `nbytes`."""
        with self._cond:
            self.held -= max(0, int(nbytes))
            self._cond.notify_all()

    def wait(self, future, can_release: bool) -> bool:
        """Until `future` is done (True), or the item whose turn it is waits for room while nothing decodes: then
        only the stream can make room. With a window to hand on (`can_release`) that is False; with nothing to
        give back the item is let through over the budget, and the wait goes on. The stream waits on the first
        item it has not collected; with turns in input order, an item that waits while nothing decodes is that one.
        """
        with self._cond:
            while True:
                self._cond.wait_for(lambda: future.done() or self._stuck())
                if future.done():
                    return True
                if can_release:
                    return False
                self._force = self._turn  # decided under the lock: the turn cannot move meanwhile
                self._cond.notify_all()
                self._cond.wait_for(lambda: future.done() or self._force is None)

    def pause(self) -> None:
        """Admit nothing more until `resume`, and return once the decodes running now have ended."""
        with self._cond:
            self._paused = True
            self._cond.wait_for(lambda: self.decoding == 0 or self._closed)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def wake(self, *_) -> None:
        """Wake the stream (a future's done-callback)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """The stream has ended: decodes still waiting give up (`RoomClosed`)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -------------------------------------------------------------------- inside the lock

    def _stuck(self) -> bool:
        return self.decoding == 0 and self._turn in self._waiting and not self._paused

    def _fits(self, ticket: int, nbytes: int) -> bool:
        return self.held + nbytes <= self.capacity or self._force == ticket

    def _hold(self, nbytes: int) -> None:
        self.held += nbytes
        self.peak_held = max(self.peak_held, self.held)

    def _next_turn(self) -> None:
        self._turn += 1
        while self._turn in self._passed:
            self._passed.remove(self._turn)
            self._turn += 1


class _Slot:
    def __init__(self, room: DecodeRoom, ticket: int):
        self.room, self.ticket = room, ticket
        self.reserved: int | None = None


_slots = threading.local()


@contextlib.contextmanager
def decode_slot(room: DecodeRoom, ticket: int):
    """The calling (decode) thread's item, ticket `ticket` of `room`, for `admit`; yields the slot, whose `reserved`
    says what the item was given (None: it never asked)."""
    slot = _Slot(room, ticket)
    previous = getattr(_slots, "current", None)
    _slots.current = slot
    try:
        yield slot
    finally:
        _slots.current = previous


def admit(nbytes: int) -> None:
    """A decoder's call once it knows, from the header, the host memory its item will need (`memory.*_decode_peak`):
    blocks until the decode room has it. Outside a room (library use, `plan` without a budget) it returns at once;
    an item asks once (a second call returns)."""
    slot = getattr(_slots, "current", None)
    if slot is None or slot.reserved is not None:
        return
    slot.room.reserve(slot.ticket, nbytes)
    slot.reserved = max(0, int(nbytes))
