"""Batching: pure functions over unit lengths. No tensors, no devices.

- Exact buckets (vision): only units with the same patch count share a batch, so no padding patch is computed
  and attention needs no mask.
- Ragged groups (text, audio): sorted by length, longest first, then cut into batches by `BatchPlan`: the
  cheapest cut of the sorted lengths (padding plus a fixed cost per batch), within a row limit per length and a
  padding cap. Equal lengths share a batch with no padding token wherever that is as cheap.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    """Indices (into the caller's unit list) that may share a device batch, and their padded length."""

    indices: tuple[int, ...]
    length: int  # every unit in the group is padded (ragged) or equal (exact) to this length


def exact_buckets(lengths: Sequence[int]) -> list[Group]:
    """One group per distinct length, in order of first appearance; indices keep input order."""
    buckets: dict[int, list[int]] = {}
    for index, length in enumerate(lengths):
        buckets.setdefault(int(length), []).append(index)
    return [Group(tuple(ix), length) for length, ix in buckets.items()]


def longest_first(lengths: Sequence[int]) -> list[Group]:
    """One group of every unit, longest first (ties in input order), padded to the longest: `BatchPlan` cuts it."""
    if not lengths:
        return []
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    return [Group(tuple(order), int(lengths[order[0]]))]


class BatchPlan:
    """The cheapest way to cut a sorted group (lengths longest first) into batches: each batch is a run of the
    group, padded to its first length, at most `rows_at(length)` rows, and wastes at most `max_padding_fraction` of
    its tokens on padding. A batch costs its padded work plus `overhead` (the fixed cost of a forward: kernel
    launches, Python, a GEMM too small to run well, in units of work); the plan minimises the summed cost, so equal
    lengths share a batch with no padding wherever that is as cheap, and short runs join their neighbours where a
    small batch would cost more than their padding.

    `next_cut(i)`: where the batch starting at position i ends, in the cheapest plan of everything from i on (a
    suffix's best plan does not depend on what came before, so batches of another plan may have run first).
    Only batch ends at a change of length, at the row limit, or at the padding limit inside a run are candidates:
    the cost is linear between them."""

    def __init__(
        self, lengths: Sequence[int], rows_at: Callable[[int], int], overhead: float, max_padding_fraction: float
    ):
        self.lengths = [int(x) for x in lengths]
        self.rows_at = rows_at
        self.overhead = float(overhead)
        self.keep = 1.0 - max_padding_fraction - 1e-12  # the share of a batch's tokens that must be real
        self.prefix = [0]
        for length in self.lengths:
            self.prefix.append(self.prefix[-1] + length)
        n = len(self.lengths)
        self.changes = [i for i in range(1, n) if self.lengths[i] != self.lengths[i - 1]] + [n]
        self.best: dict[int, tuple[float, int]] = {n: (0.0, n)}  # position -> (cost of the rest, end of its batch)

    def _fits(self, start: int, end: int) -> bool:
        return self.prefix[end] - self.prefix[start] >= self.keep * (end - start) * self.lengths[start]

    def _ends(self, start: int) -> list[int]:
        """Where a batch from `start` may end: each change of length before the row limit, the row limit, and the
        last end the padding cap admits (padding grows with every shorter unit taken)."""
        head = self.lengths[start]
        limit = min(len(self.lengths), start + max(1, int(self.rows_at(head))))
        ends: list[int] = []
        low = start + 1  # one unit always fits
        for change in self.changes[bisect.bisect_right(self.changes, start) :]:
            end = min(change, limit)
            if not self._fits(start, end):
                high = end  # the last end that fits lies in [low, end): bisect it
                while high - low > 1:
                    middle = (low + high) // 2
                    low, high = (middle, high) if self._fits(start, middle) else (low, middle)
                if not ends or low > ends[-1]:
                    ends.append(low)
                break
            ends.append(end)
            if end == limit:
                break
            low = end
        return ends

    def next_cut(self, start: int) -> int:
        stack = [start]
        while stack:
            position = stack[-1]
            if position in self.best:
                stack.pop()
                continue
            ends = self._ends(position)
            missing = [end for end in ends if end not in self.best]
            if missing:
                stack.extend(missing)
                continue
            head = self.lengths[position]
            self.best[position] = min(
                ((end - position) * head + self.overhead + self.best[end][0], end) for end in ends
            )
            stack.pop()
        return self.best[start][1]

    def cuts(self) -> list[int]:
        """The batch sizes of the whole group, in order."""
        sizes, position = [], 0
        while position < len(self.lengths):
            end = self.next_cut(position)
            sizes.append(end - position)
            position = end
        return sizes
