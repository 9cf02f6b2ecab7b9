"""Throughput-aware chunk sizes: within the memory cap, the chunk that measures fastest on this machine, per
length of unit.

On a GPU bigger batches are the main win; on a CPU a realistic tower often runs no faster, or slower, batched
(measured on 2 cores: 0.64-1.07x for a 256-wide tower). So the engine does not assume: the first chunks run at
1, 2, 4, ... units of real work, each size's rate (patches or mel frames per second) is recorded, and once
two doublings in a row stop paying (under 5% faster than every smaller size) or the memory cap stops it, the best
size (the smallest within 5% of the fastest) is kept. One doubling is not enough to judge: on a 2-core CPU with
AMX, a release-size tower in bf16 at 70 tokens ran 1380, 1515 and 2004 patches/s at 1, 2 and 4 images a chunk
(the gain comes with the larger matrices), and single timings there move by +-10%.

The best size depends on the unit's length: one 1120-token image (10080 patches) can fill a GPU that needs 16
frames of 70 tokens to do the same. So every length class (lengths within a factor of two: 630-patch frames and
10080-patch images never share one) has its own search, and an out-of-memory limit holds only for its own class.
No work is wasted: every probe chunk's rows are kept. Pure bookkeeping: timings come from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GAIN = 1.05  # a doubling pays when it buys at least this much speed
PATIENCE = 2  # doublings in a row that do not pay before the search settles
TIE = 0.95  # sizes within this fraction of the best rate count as equal: the smaller one wins (less memory)


@dataclass
class SizeSearch:
    """The fastest chunk size for one length class: probe 1, 2, 4, ... then settle."""

    max_size: int = 1024
    probe: int = 1
    settled: int | None = None
    misses: int = 0  # doublings in a row that did not pay
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
        if self.settled is not None or seconds <= 0 or work <= 0:
            return
        self.rates.setdefault(size, []).append(work / seconds)
        if size < self.probe and size < cap:
            return  # a short group: measured, but the probe size still awaits a full chunk
        smaller = [s for s in self.rates if s < size]
        gained = not smaller or self.mean_rate(size) >= GAIN * max(self.mean_rate(s) for s in smaller)
        self.misses = 0 if gained else self.misses + 1
        if self.misses >= PATIENCE or size >= cap or self.probe >= self.max_size:
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
            "rate_per_s": {str(s): round(self.mean_rate(s), 1) for s in sorted(self.rates)},
        }


def length_class(length: int) -> int:
    """Lengths in [2^(k-1), 2^k) share class k."""
    return max(1, int(length)).bit_length()


def class_name(k: int) -> str:
    return f"{1 << (k - 1)}-{(1 << k) - 1}"


@dataclass
class ChunkTuner:
    """One `SizeSearch` per length class. `length` is the bucket's length: patches per image or frame, or the
    padded mel frames of a ragged audio group."""

    searches: dict[int, SizeSearch] = field(default_factory=dict)
    warmed_up: bool = False

    def search(self, length: int) -> SizeSearch:
        return self.searches.setdefault(length_class(length), SizeSearch())

    def size(self, length: int, cap: int) -> int:
        return self.search(length).size(cap)

    def record(self, length: int, size: int, work: float, seconds: float, cap: int) -> None:
        """One chunk of `size` units of this length doing `work` (patches, frames) took `seconds`; `cap` was the
        memory cap."""
        if not self.warmed_up:  # the run's first chunk pays one-off costs (allocator, thread pools, kernels)
            self.warmed_up = True
            return
        self.search(length).record(size, work, seconds, cap)

    def limit(self, length: int, size: int) -> None:
        self.search(length).limit(size)

    def largest_wanted(self) -> int:
        """The largest chunk any length class will run next (1 before any has been measured): a decode window
        should hold at least that many units."""
        return max((search.size(search.max_size) for search in self.searches.values()), default=1)

    def report(self) -> dict:
        """Per length class (`"512-1023"`: patches or frames per unit): the chunk chosen, whether it settled, and
        the rates measured per size."""
        return {class_name(k): self.searches[k].report() for k in sorted(self.searches)}
