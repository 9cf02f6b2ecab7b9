"""The CPU forwards' thread count follows the cores other work leaves (clocks and /proc/stat faked here; the real
ones in tests/integration/test_cpu_threads.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemma_embed.cpu_threads import STALE_S, CpuThreads, read_busy_seconds, threads_for
from gemma_embed.tuning import BatchTuner


@pytest.mark.parametrize(
    ("cores", "others", "most", "threads"),
    [
        (2, 0.0, 2, 2),  # quiet
        (2, 0.3, 2, 2),  # light background work: a core is still mostly free
        (2, 0.67, 2, 1),  # a busy process beside 2 spinning threads gets 2/3 of a core
        (2, 1.0, 2, 1),  # ... and a whole one beside 1 thread
        (2, 2.5, 2, 1),  # never below 1
        (16, 1.0, 8, 8),  # never more than the caller's count
        (16, 9.2, 8, 7),
        (2, -0.01, 2, 2),  # rounding in /proc/stat's ticks
    ],
)
def test_threads_are_the_cores_left_rounded(cores, others, most, threads):
    assert threads_for(cores, others, most) == threads


class FakeMachine:
    """Two CPUs, a wall clock, this process's CPU time and the CPUs' busy time, advanced by the test."""

    def __init__(self):
        self.wall = 100.0
        self.busy = 5000.0
        self.own = 10.0
        self.threads = 2
        self.set_calls: list[int] = []

    def run(self, seconds: float, ours: float, theirs: float) -> None:
        """`seconds` pass; this process keeps `ours` cores busy and other work `theirs`."""
        self.wall += seconds
        self.own += ours * seconds
        self.busy += (ours + theirs) * seconds

    def set(self, n: int) -> None:
        self.threads = n
        self.set_calls.append(n)

    def governor(self, fixed: int | None = None) -> CpuThreads:
        return CpuThreads(
            fixed,
            get=lambda: self.threads,
            set_=self.set,
            busy=lambda: self.busy,
            own=lambda: self.own,
            wall=lambda: self.wall,
            cpus=frozenset({0, 1}),
        )


def test_a_busy_process_takes_the_count_down_and_its_end_brings_it_back():
    machine = FakeMachine()
    threads = machine.governor()
    with threads.running():
        assert threads.before_batch() == 2  # nothing measured yet
        machine.run(2.0, ours=1.33, theirs=0.67)  # a busy process starts beside our 2 threads
        assert threads.before_batch() == 1 and machine.threads == 1
        machine.run(2.0, ours=1.0, theirs=1.0)  # it goes on: the one thread keeps a core
        assert threads.before_batch() == 1
        machine.run(2.0, ours=1.0, theirs=0.0)  # it ended: a core is idle
        assert threads.before_batch() == 2 and machine.threads == 2
    assert threads.changes == 2
    report = threads.report()
    assert report["threads"] == 2 and "other work kept 0.00 of this process's 2 CPUs" in report["reason"]
    assert "1: 4.0 s, 2: 2.0 s" in report["reason"]


def test_a_span_too_short_to_measure_decides_nothing():
    machine = FakeMachine()
    threads = machine.governor()
    with threads.running():
        machine.run(threads.min_span_s / 2, ours=0.0, theirs=2.0)
        assert threads.before_batch() == 2 and threads.others is None
        machine.run(threads.min_span_s / 2, ours=0.0, theirs=2.0)  # the span adds up
        assert threads.before_batch() == 1 and threads.others == pytest.approx(2.0)


def test_loading_the_model_counts_toward_the_first_span_unless_it_is_stale():
    machine = FakeMachine()
    threads = machine.governor()  # made before the towers load
    machine.run(2.0, ours=1.0, theirs=1.0)  # loading, beside a busy process
    with threads.running():
        assert threads.before_batch() == 1  # the first batch already runs on the free core
        machine.run(3.0, ours=1.0, theirs=1.0)
    assert threads.seconds_at == {1: 3.0}  # the batches' time; loading is measured but ran no count's batch
    machine.run(STALE_S + 1, ours=0.0, theirs=2.0)  # the caller's own time between two calls
    with threads.running():  # measured again from here: the old span says nothing of now
        assert threads.before_batch() == 1 and threads.others == pytest.approx(1.0)
        machine.run(1.0, ours=1.0, theirs=0.0)
        assert threads.before_batch() == 2


def test_the_callers_count_comes_back_when_the_stream_ends_and_is_never_exceeded():
    machine = FakeMachine()
    threads = machine.governor()
    with threads.running():
        machine.run(1.0, ours=0.0, theirs=1.5)
        threads.before_batch()
    assert machine.threads == 2  # restored
    machine.threads = 1  # the caller chose one thread for its own work before the next call
    with threads.running():
        machine.run(1.0, ours=1.0, theirs=0.0)  # a core idle: still no more than the caller's 1
        assert threads.before_batch() == 1
    assert machine.threads == 1


def test_a_fixed_count_is_set_for_the_batches_and_given_back():
    machine = FakeMachine()
    threads = machine.governor(fixed=1)
    with threads.running():
        machine.run(5.0, ours=1.0, theirs=0.0)
        assert threads.before_batch() == 1 and machine.threads == 1
    assert machine.threads == 2 and threads.changes == 0
    assert threads.report() == {"threads": 1, "reason": "fixed by --cpu-threads"}


def test_without_proc_stat_the_count_stays():
    machine = FakeMachine()
    threads = CpuThreads(get=lambda: machine.threads, set_=machine.set, busy=lambda: None, cpus=frozenset({0, 1}))
    with threads.running():
        assert threads.before_batch() == 2
    assert machine.set_calls == [] and "not measured" in threads.report()["reason"]


def test_proc_stat_is_read_for_the_affinitys_cpus_only(tmp_path: Path):
    stat = tmp_path / "stat"
    #            user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(
        "cpu  900 0 90 0 0 0 0 0 0 0\n"
        "cpu0 100 10 20 500 7 1 2 3 0 0\n"
        "cpu1 200 0 30 400 0 0 0 0 0 0\n"
        "cpu2 600 0 40 0 0 0 0 0 0 0\n"
        "intr 1 2 3\n"
    )
    import os

    tick = os.sysconf("SC_CLK_TCK")
    assert read_busy_seconds(frozenset({0, 2}), stat) == pytest.approx((136 + 640) / tick)  # idle, iowait left out
    assert read_busy_seconds(frozenset({0, 5}), stat) is None  # a CPU missing: no number rather than a wrong one
    assert read_busy_seconds(frozenset({0}), tmp_path / "missing") is None


def test_a_change_of_threads_drops_the_tuners_pair_under_way_and_keeps_finished_pairs_and_decisions():
    tuner = BatchTuner(start=8)
    tuner.size(1024)
    for size, seconds in [(8, 1.0), (8, 1.0), (16, 1.0), (16, 1.0)]:  # warm-up, one A B pair, the next one's B
        tuner.record(size, size, seconds)
    assert tuner.comparison is not None and len(tuner.comparison.log_ratios) == 1
    assert tuner.comparison.pending is not None
    tuner.rejected.add(4)
    tuner.conditions_changed()
    assert len(tuner.comparison.log_ratios) == 1 and tuner.comparison.pending is None and tuner.comparison.step == 0
    assert (tuner.comparison.incumbent, tuner.comparison.challenger) == (8, 16) and tuner.rejected == {4}
