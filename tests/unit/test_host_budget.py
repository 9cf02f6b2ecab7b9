"""One host-memory budget on a CPU: how it is shared out (pure functions), and the decode room that makes workers
wait for room (fake decodes that say their estimated peak, as the real decoders do once they read a header)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from gemma_embed.decoding import prepared_stream
from gemma_embed.memory import decode_peaks, decode_room, planner
from gemma_embed.models.base import PreparedItem, Unit
from gemma_embed.sources import Source

GiB, MiB = 2**30, 2**20


# ------------------------------------------------------------------------------------------ sharing out


def test_on_a_cpu_the_budget_covers_the_model_and_the_rest_is_split_between_decode_and_encode():
    plan = planner.host_plan(10 * GiB, 16 * GiB, planner.parse_budget("1GiB"), 100 * MiB, host_is_device=True)
    assert plan.budget == GiB and plan.model == 100 * MiB
    assert plan.model + plan.decode + plan.encode == plan.budget  # nothing counted twice, nothing left out
    assert abs(plan.decode - plan.encode) <= 1
    # The engines' chunk budget is the encode share, even with far more free and asked for.
    spec = plan.chunk_spec(planner.parse_budget("1GiB"))
    assert planner.budget(10 * GiB, 16 * GiB, spec) == plan.encode
    assert spec.explicit  # the user's budget is still the user's (the warning below one unit names it)


def test_a_model_larger_than_the_budget_leaves_nothing_and_a_budget_above_free_is_what_is_free():
    plan = planner.host_plan(10 * GiB, 16 * GiB, planner.parse_budget("1GiB"), 2 * GiB, host_is_device=True)
    assert (plan.decode, plan.encode) == (0, 0)
    plan = planner.host_plan(GiB, 16 * GiB, planner.parse_budget("8GiB"), 0, host_is_device=True)
    assert plan.budget == GiB and plan.decode + plan.encode == GiB


def test_the_default_rule_plans_the_host_too():
    plan = planner.host_plan(10 * GiB, 16 * GiB, planner.BudgetSpec(), 0, host_is_device=True)
    assert plan.budget == planner.budget(10 * GiB, 16 * GiB) == int(1.6 * GiB)  # min(free/2, total/10)
    assert not plan.chunk_spec(planner.BudgetSpec()).explicit


def test_on_an_accelerator_the_decode_side_gets_the_default_rule_on_host_memory():
    spec = planner.parse_budget("2GiB")  # the device's budget
    plan = planner.host_plan(10 * GiB, 16 * GiB, spec, 0, host_is_device=False)
    assert plan.encode is None and plan.model == 0
    assert plan.decode == planner.budget(10 * GiB, 16 * GiB)
    assert plan.chunk_spec(spec) == spec  # chunks plan from the device's memory as before
    assert "decode" in plan.describe()


def test_decode_peak_estimates():
    image_peak = decode_peaks.image_decode_peak
    assert image_peak(1000, 2000, composited=False) == 2_000_000 * decode_peaks.IMAGE_PEAK_BYTES_PER_PIXEL
    assert image_peak(1000, 2000, composited=True) > image_peak(1000, 2000, False)
    assert decode_peaks.video_decode_peak(32, 640, 360) == 32 * decode_peaks.video_decode_peak(1, 640, 360)
    assert decode_peaks.audio_decode_peak(10.0, 16_000) == 160_000 * decode_peaks.AUDIO_PEAK_BYTES_PER_SAMPLE
    unknown = decode_peaks.audio_decode_peak(None, 16_000)
    assert unknown == decode_peaks.audio_decode_peak(decode_peaks.AUDIO_UNKNOWN_DURATION_S, 16_000) > 0


def test_budget_cap_holds_whatever_the_rule():
    for spec in (
        planner.BudgetSpec(cap=5),
        planner.BudgetSpec(bytes=100, cap=5),
        planner.BudgetSpec(fraction_of_total=0.5, cap=5),
    ):
        assert planner.budget(1000, 1000, spec) == 5
    assert planner.budget(3, 1000, planner.BudgetSpec(bytes=100, cap=5)) == 3  # never more than is free


# ------------------------------------------------------------------------------------------ the room itself


def _reserve_in_thread(room, ticket, nbytes) -> threading.Event:
    admitted = threading.Event()

    def go():
        room.reserve(ticket, nbytes)
        admitted.set()

    threading.Thread(target=go, daemon=True).start()
    return admitted


def _until_waiting(room, *tickets) -> None:
    """Until each ticket's thread waits in `reserve`: seen under the room's lock, it has found that it may not go
    yet and sleeps until the room changes (reserve notifies when a ticket starts waiting). The timeout is only
    against a hang."""
    with room._cond:
        assert room._cond.wait_for(lambda: set(tickets) <= set(room._waiting), timeout=60), room._waiting


def test_an_item_waits_until_its_estimate_fits_beside_what_is_held():
    room = decode_room.DecodeRoom(100)
    room.reserve(0, 60)
    second = _reserve_in_thread(room, 1, 60)
    _until_waiting(room, 1)
    assert not second.is_set()  # 60 + 60 > 100
    room.finish(0, 60, prepared_bytes=5)  # decoded: its estimate gives way to its prepared bytes
    assert second.wait(60)
    assert room.held == 65 and room.peak_held <= 100
    room.finish(1, 60, prepared_bytes=5)
    room.release(10)  # the window of both is done with
    assert room.held == 0


def test_an_item_that_fits_but_has_not_woken_after_resume_is_not_taken_for_stuck():
    """Just after `resume` the waiting item fits but has not run yet: the stream's `wait` must wait for it, not
    hand its window on as if the item waited for room (it did, 1 time in 5: test_bf16's windows split)."""
    from concurrent.futures import Future

    room = decode_room.DecodeRoom(100)
    room.pause()
    done: Future = Future()

    def decode():
        room.reserve(0, 10)
        room.finish(0, 10, prepared_bytes=5)
        done.set_result("decoded")

    threading.Thread(target=decode, daemon=True).start()
    _until_waiting(room, 0)
    with room._cond:  # re-entrant: the decode thread cannot wake before `wait` sleeps, whatever the scheduler does
        room.resume()
        assert room.wait(done, can_release=True) is True  # not False: nothing was stuck
    assert done.result() == "decoded" and room.held == 5


def test_turns_go_in_input_order_so_a_small_item_never_takes_room_an_earlier_one_waits_for():
    room = decode_room.DecodeRoom(100)
    room.reserve(0, 80)
    big = _reserve_in_thread(room, 1, 80)
    small = _reserve_in_thread(room, 2, 10)
    _until_waiting(room, 1, 2)
    assert not small.is_set() and not big.is_set()  # 80 + 10 fits, but item 1 waits ahead of it
    room.finish(0, 80, prepared_bytes=0)
    assert big.wait(60) and small.wait(60)
    assert room.held == 90


def test_an_item_that_never_asks_passes_its_turn_on():
    room = decode_room.DecodeRoom(100)
    later = _reserve_in_thread(room, 1, 10)
    _until_waiting(room, 1)
    assert not later.is_set()  # ticket 0 has its turn
    room.finish(0, None, prepared_bytes=0)  # a file that failed before its header was read
    assert later.wait(60)


# ------------------------------------------------------------------------------------------ through the stream


class FakeModality:
    """Decodes b"ESTIMATE/PREPARED" items: says ESTIMATE through decode_room.admit, as real decoders do, then holds a
    PREPARED-byte tensor. Records which items decode at the same time. With `meet`, the first `meet` decodes also
    wait for each other before they end (a barrier: they can only end if that many decode at once)."""

    def __init__(self, hold_s: float = 0.03, meet: int = 0):
        self.hold_s = hold_s
        self.meeting = threading.Barrier(meet, timeout=60) if meet else None  # the timeout: only against a hang
        self.started = 0
        self.lock = threading.Lock()
        self.now: dict[bytes, int] = {}  # decoding now -> its estimate
        self.overlaps: list[tuple[bytes, int]] = []  # (item, estimates of the items decoding beside it, summed)
        self.preparer = self

    def decode(self, content: bytes):
        estimate, prepared = (int(x) for x in content.split(b"/")[:2])
        decode_room.admit(estimate)
        with self.lock:
            self.now[content] = estimate
            self.overlaps.append((content, sum(self.now.values())))
            self.started += 1
            meets = self.meeting is not None and self.started <= self.meeting.parties
        if meets:
            self.meeting.wait()
        time.sleep(self.hold_s)
        with self.lock:
            self.overlaps.append((content, sum(self.now.values())))
            del self.now[content]
        return prepared

    def prepare(self, prepared: int) -> PreparedItem:
        unit = Unit(inputs={"pixel_values": np.zeros(prepared, np.uint8)}, length=1, rows=1)
        return PreparedItem(units=[unit])


def _sources(specs: list[tuple[int, int]]) -> list[Source]:
    # The item's bytes are its spec (a few bytes, held by the window like a tar member's: counted, negligible).
    return [
        Source(key=f"k{i}", path=f"k{i}", position=i, data=f"{e}/{p}/{i}".encode()) for i, (e, p) in enumerate(specs)
    ]


def _keys(windows) -> list[str]:
    return [p.source.key for w in windows for p in w]


def test_workers_decode_together_only_while_their_estimates_fit():
    modality = FakeModality()
    sources = _sources([(300, 0)] * 12)
    windows = list(prepared_stream(modality, sources, workers=4, window_items=100, host_budget=1000))
    assert _keys(windows) == [s.key for s in sources]  # all of them, in input order
    assert all(p.error is None for w in windows for p in w)
    assert max(total for _, total in modality.overlaps) <= 900  # three fit in 1000, four never ran together
    # Without the budget the same four workers decode four at once (the first four meet before they end).
    unbounded = FakeModality(hold_s=0.0, meet=4)
    windows = list(prepared_stream(unbounded, _sources([(300, 0)] * 12), workers=4, window_items=100))
    assert all(p.error is None for w in windows for p in w)  # no decode's barrier broke
    assert max(total for _, total in unbounded.overlaps) > 900


def test_an_item_larger_than_the_whole_budget_decodes_alone_and_the_run_goes_on():
    modality = FakeModality()
    sources = _sources([(300, 0), (300, 0), (5000, 0), (300, 0), (300, 0)])
    windows = list(prepared_stream(modality, sources, workers=4, window_items=100, host_budget=1000))
    assert _keys(windows) == [s.key for s in sources]
    big = sources[2].data
    assert all(total == 5000 for item, total in modality.overlaps if item == big)  # nothing beside it


def test_a_window_is_handed_on_early_when_the_next_item_needs_the_room_it_holds():
    # Each item's prepared bytes stay held until its window is done with: 250 each, estimates 300.
    # 250 + 250 + 250 + 300 > 1000, so the fourth item waits until the first three leave in a window.
    modality = FakeModality(hold_s=0.0)
    sources = _sources([(300, 250)] * 9)
    windows = list(prepared_stream(modality, sources, workers=4, window_items=100, host_budget=1000))
    # Never more than the room holds in one window (100 items are allowed), none lost, in input order. Where
    # exactly a window is cut depends on which decode thread finishes first: [3, 3, 3] on a quiet machine, and
    # [3, 3, 2, 1] was seen on a loaded one.
    sizes = [len(w) for w in windows]
    assert max(sizes) == 3 and sum(sizes) == 9 and len(sizes) >= 3
    assert _keys(windows) == [s.key for s in sources]


def test_stopping_early_never_hangs_on_decodes_that_wait_for_room():
    modality = FakeModality(hold_s=0.05)
    stream = prepared_stream(modality, _sources([(600, 500)] * 20), workers=4, window_items=1, host_budget=1000)
    finished = threading.Event()

    def consume_one_and_stop():
        next(stream)
        stream.close()
        finished.set()

    threading.Thread(target=consume_one_and_stop, daemon=True).start()
    assert finished.wait(60)  # only against a hang: a decode waiting for room that never comes
    assert len(modality.overlaps) < 40  # the queued items were never decoded


@pytest.mark.parametrize("workers", [1, 3])
def test_without_admit_calls_items_flow_as_before(workers):
    class Silent(FakeModality):
        def decode(self, content):  # a decoder with no estimate (text): never waits
            return int(content.split(b"/")[1])

    windows = list(prepared_stream(Silent(), _sources([(0, 10)] * 7), workers=workers, window_items=3, host_budget=1))
    assert [len(w) for w in windows] == [3, 3, 1]
