"""Throughput-aware chunk sizes: within the memory cap, the chunk that measures fastest on this machine.

On a GPU bigger batches are the main win; on a CPU a realistic tower often runs no faster, or slower, batched
(measured on 2 cores: 0.64-1.07x for a 256-wide tower). So the engine does not assume: the first chunks run at
1, 2, 4, ... units of real work, each size's rate (patches per second) is recorded, and once doubling stops
paying (under 5% faster) or the memory cap stops it, the best size (the smallest within 5% of the fastest) is
kept for the rest of the run.
No work is wasted: every probe chunk's rows are kept. Pure bookkeeping: timings come from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GAIN = 1.05  # doubling goes on only while it buys at least this much speed
TIE = 0.95  # sizes within this fraction of the best rate count as equal: the smaller one wins (less memory)


@dataclass
class ChunkTuner:
    max_size: int = 1024
    probe: int = 1
    settled: int | None = None
    warmed_up: bool = False
    rates: dict[int, list[float]] = field(default_factory=dict)

    def size(self, cap: int) -> int:
        """The chunk to run next, never above the memory cap."""
        cap = max(1, cap)
        if self.settled is not None:
            return min(self.settled, cap)
        return min(self.probe, cap)

    def best(self) -> int:
        if not self.rates:
            return 1
        top = max(self.mean_rate(s) for s in self.rates)
        return min(s for s in self.rates if self.mean_rate(s) >= TIE * top)

    def mean_rate(self, size: int) -> float:
        return sum(self.rates[size]) / len(self.rates[size])

    def record(self, size: int, work: float, seconds: float, cap: int) -> None:
        """One chunk of `size` units doing `work` (patches, frames) took `seconds`; `cap` was the memory cap."""
        if not self.warmed_up:  # the first call pays one-off costs (allocator, thread pools, kernels)
            self.warmed_up = True
            return
        if self.settled is not None or seconds <= 0 or work <= 0:
            return
        self.rates.setdefault(size, []).append(work / seconds)
        if size < self.probe and size < cap:
            return  # a short group: measured, but the probe size still awaits a full chunk
        smaller = [s for s in self.rates if s < size]
        gained = not smaller or self.mean_rate(size) >= GAIN * max(self.mean_rate(s) for s in smaller)
        if not gained or size >= cap or self.probe >= self.max_size:
            self.settled = self.best()
        else:
            self.probe *= 2

    def limit(self, size: int) -> None:
        """An out-of-memory error at `size`: never probe or settle above half of it."""
        self.max_size = max(1, min(self.max_size, size // 2))
        self.probe = min(self.probe, self.max_size)
        if self.settled is not None:
            self.settled = min(self.settled, self.max_size)

    def report(self) -> dict:
        return {
            "chosen": self.settled if self.settled is not None else self.probe,
            "settled": self.settled is not None,
            "patches_per_s": {str(s): round(self.mean_rate(s), 1) for s in sorted(self.rates)},
        }
