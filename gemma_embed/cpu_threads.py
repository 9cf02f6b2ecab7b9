"""Intra-op threads for CPU forwards: as many as the cores other work leaves free, measured while the run goes on.

Why: a CPU forward runs on torch's intra-op (OpenMP) threads, which meet at a barrier after every parallel region.
When another process keeps one of the cores busy, the scheduler shares that core between it and one of ours, and
every region waits for the thread that was descheduled. Measured on a 2-core AMD EPYC (EmbeddingGemma 2 text model,
hidden 512 x 8 layers, 600 mixed lines, each run its own process, one `python -c "while True: pass"` beside it):
2 threads 14.8-17.3 items/s, 1 thread 23.3-26.6; sentence-transformers 11.8-12.8 at 2 threads, 16.7-16.9 at 1.
On the quiet machine 2 threads are the faster ones (`bench/README.md`). So the count follows the cores free.

How it is measured: the CPUs this process may run on (its affinity) and their busy time in `/proc/stat`, against
this process's own CPU time (`time.process_time`, every thread of it) over the same wall-clock span. What is busy
and not ours is other work: `others` cores on average. The threads are the cores left, rounded, between 1 and the
count the run started with (torch's default: the physical cores). It is decided at batch boundaries, over spans
long enough that `/proc/stat`'s ticks (10 ms per CPU) round it by at most `ROUNDING_CORES` (`min_span_s`).
Where `/proc/stat` is missing (macOS, Windows) the count stays as it is. A cgroup CPU quota (`cpu.max`) is not
read: a quota below the CPUs of the affinity shows as our own threads getting less, not as other work.

A fixed `--cpu-threads N` sets N for the run instead. Either way the caller's count comes back when the run's
stream ends (`CpuThreads.running`), so a Python caller's own torch work keeps its setting.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
CPUINFO = Path("/proc/cpuinfo")
# A span is measured once /proc/stat's rounding can move the result by at most this many cores: each CPU's counter
# may be one tick short at either end of a span, so 2 ticks per CPU (0.2 s of span per CPU at 10 ms ticks; 0.4 s on
# 2 CPUs, 6.4 s on 32), and never less than MIN_SPAN_S.
ROUNDING_CORES = 0.1
MIN_SPAN_S = 0.2
# The first span starts at this module's import (`IMPORTED`) unless that sample is older than this, else when the
# command's `CpuThreads` is made; a stream (`running()`) starts a new span when the last sample is older than this:
# what other work did before a Python caller's earlier call says little about now.
STALE_S = 10.0
# /proc/stat's fields after the name: user nice system idle iowait irq softirq steal (guest is inside user).
# Steal is time a hypervisor gave this CPU to someone else: not free for us either.
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def cpu_model() -> str:
    """The CPU's model name as the kernel gives it (`/proc/cpuinfo`'s "model name"), or "" where it gives none."""
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def threads_for(cores: int, others: float, most: int) -> int:
    """Intra-op threads for `cores` usable CPUs while other work kept `others` of them busy on average: the cores
    left, rounded half up, at least 1 and at most `most`."""
    return max(1, min(most, math.floor(cores - max(0.0, others) + 0.5)))


@dataclass(frozen=True)
class Sample:
    wall_s: float
    busy_s: float  # busy time of the affinity's CPUs, every process's
    own_s: float  # this process's CPU time


def read_busy_seconds(cpus: frozenset[int], stat: Path = PROC_STAT) -> float | None:
    """Busy seconds of these CPUs since boot, from `/proc/stat`; None where it cannot be read."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    ticks = 0
    seen = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        fields = [int(x) for x in rest.split()]
        ticks += sum(fields[i] for i in BUSY_FIELDS if i < len(fields))
        seen += 1
    if seen != len(cpus):
        return None
    return ticks * tick_seconds()


def tick_seconds() -> float:
    try:
        return 1.0 / os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):  # not on a POSIX system: /proc/stat is missing too
        return 0.01


def affinity() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return frozenset(range(os.cpu_count() or 1))


def sample_now(cpus: frozenset[int]) -> Sample | None:
    busy = read_busy_seconds(cpus)
    return None if busy is None else Sample(time.monotonic(), busy, time.process_time())


# This module is imported with the embedder, seconds before a command's first batch (torch, transformers and the
# checkpoint load in between), so a span from here lets the first batch's count be measured too: from the count's
# creation alone, a small model's first batch ran at 2 threads beside a busy process (0.3 s of loading, under
# `min_span_s`).
IMPORTED = sample_now(affinity())


class CpuThreads:
    """The intra-op thread count of one command's CPU forwards (`--cpu-threads`: None for auto, or fixed), shared by
    its engines.

    Measuring starts when this module was imported (or, if that is over `STALE_S` ago, when it is made), and
    again with `running()`, which wraps each stream, when the start is over `STALE_S` ago. The caller's count
    comes back when a stream ends. `before_batch()` runs in the encode thread before each batch and may change the
    count there. `changes` counts the changes, so a batch tuner can tell that the rates it compares were measured
    under other conditions."""

    def __init__(
        self,
        fixed: int | None = None,
        *,
        get: Callable[[], int] | None = None,
        set_: Callable[[int], None] | None = None,
        busy: Callable[[], float | None] | None = None,
        own: Callable[[], float] = time.process_time,
        wall: Callable[[], float] = time.monotonic,
        cpus: frozenset[int] | None = None,
    ):
        import torch

        self._get = get or torch.get_num_threads
        self._set = set_ or torch.set_num_threads
        self.cpus = cpus if cpus is not None else affinity()
        self._busy = busy or (lambda: read_busy_seconds(self.cpus))
        self.min_span_s = max(MIN_SPAN_S, 2 * len(self.cpus) * tick_seconds() / ROUNDING_CORES)
        self._own, self._wall = own, wall
        self.fixed = fixed
        self.most = fixed or self._get()  # the caller's count: auto never runs more threads than it chose
        self.current = self.most
        self.changes = 0
        self.others: float | None = None  # the last measured average of other work, in cores
        self.seconds_at: dict[int, float] = {}  # wall seconds of the streams' batches at each count, for the report
        self._in_use: tuple[float, int] | None = None  # (since when, count) set for the batches under way
        self._last: Sample | None = None
        if fixed is None:
            real = busy is None and own is time.process_time and wall is time.monotonic and cpus is None
            recent = IMPORTED is not None and time.monotonic() - IMPORTED.wall_s <= STALE_S
            self._last = IMPORTED if real and recent else self._sample()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        caller = self._get()
        if self.fixed is None:
            self.most = caller
            self.current = min(self.current, caller)
            if self._last is None or self._wall() - self._last.wall_s > STALE_S:
                self._last = self._sample()
        try:
            yield
        finally:
            self._count_time()
            if self._get() != caller:
                self._set(caller)

    def _sample(self) -> Sample | None:
        busy = self._busy()
        return None if busy is None else Sample(self._wall(), busy, self._own())

    def before_batch(self) -> int:
        """The count for the batch about to run: decided again once the span since the last decision is long
        enough to measure, and set in the calling thread."""
        if self.fixed is None:
            self._measure()
        if self._get() != self.current:
            self._set(self.current)
        self._count_time()
        self._in_use = (self._wall(), self.current)
        return self.current

    def _count_time(self) -> None:
        """Add the time since the last batch began to the count it ran at (loading and other time outside a
        stream's batches is measured, but is no count's)."""
        if self._in_use is not None:
            since, count = self._in_use
            self.seconds_at[count] = self.seconds_at.get(count, 0.0) + self._wall() - since
            self._in_use = None

    def _measure(self) -> None:
        last = self._last
        now = self._sample()
        if last is None or now is None:  # the first sample (outside `running()`: a Ray actor's batches), or none
            self._last = now
            return
        span = now.wall_s - last.wall_s
        if span < self.min_span_s:
            return
        self.others = max(0.0, ((now.busy_s - last.busy_s) - (now.own_s - last.own_s)) / span)
        self._last = now
        wanted = threads_for(len(self.cpus), self.others, self.most)
        self.changes += wanted != self.current
        self.current = wanted

    def report(self) -> dict:
        """For the run's summary: the count in use and why, in measured numbers."""
        if self.fixed is not None:
            return {"threads": self.fixed, "reason": "fixed by --cpu-threads"}
        if self.others is None:
            return {"threads": self.current, "reason": "not measured (no /proc/stat, or the run was too short)"}
        spent = ", ".join(f"{n}: {s:.1f} s" for n, s in sorted(self.seconds_at.items()))
        reason = (
            f"other work kept {self.others:.2f} of this process's {len(self.cpus)} CPUs busy when last measured "
            f"(wall time of batches at each count: {spent})"
        )
        return {"threads": self.current, "reason": reason}
