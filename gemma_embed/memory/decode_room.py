"""The decode room: the decode side's share of host memory, handed out to decode threads in input order.

Decoders say what an item will need once its header is read (`admit`, with `memory.decode_peaks`' estimates), and
the decode thread waits until that fits beside what the items decoding and decoded-not-yet-encoded hold.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any


class RoomClosed(Exception):
    """The stream that owned the room has ended: a decode still waiting for room gives up."""


class DecodeRoom:
    """The decode side's share of host memory, in bytes (`planner.host_plan`), handed out in input order.

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
        self._waiting: dict[int, int] = {}  # tickets waiting in `reserve`: the bytes each asks for
        self._force: int | None = None  # the ticket let through over the budget
        self._paused = False
        self._closed = False

    # -------------------------------------------------------------------- the decode threads' side

    def reserve(self, ticket: int, nbytes: int) -> None:
        """Block until it is `ticket`'s turn and `nbytes` fit beside what is held (or `wait` lets it through)."""
        nbytes = max(0, int(nbytes))
        with self._cond:
            self._waiting[ticket] = nbytes
            self._cond.notify_all()  # the stream may be waiting to see whether this item is stuck
            try:
                self._cond.wait_for(
                    lambda: self._closed or (not self._paused and self._turn == ticket and self._fits(ticket, nbytes))
                )
            finally:
                self._waiting.pop(ticket, None)
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

    def wait(self, future: Future[Any], can_release: bool) -> bool:
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

    def wake(self, *_: object) -> None:
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
        """The item whose turn it is waits in `reserve` for room that nothing decoding will give back. Not merely
        waiting: just after `resume` (or a release) it fits but has not woken yet, and taking that for stuck
        handed windows on early at random (a decode window split in two 1 time in 5 on a 2-core machine)."""
        if self.decoding or self._paused or self._turn not in self._waiting:
            return False
        return not self._fits(self._turn, self._waiting[self._turn])

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
def decode_slot(room: DecodeRoom, ticket: int) -> Iterator[_Slot]:
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
    """A decoder's call once it knows, from the header, the host memory its item will need
    (`decode_peaks.*_decode_peak`): blocks until the decode room has it. Outside a room (library use, `plan` without a
    budget) it returns at once; an item asks once (a second call returns)."""
    slot = getattr(_slots, "current", None)
    if slot is None or slot.reserved is not None:
        return
    slot.room.reserve(slot.ticket, nbytes)
    slot.reserved = max(0, int(nbytes))
