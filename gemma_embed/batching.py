"""Batching: pure functions over unit lengths. No tensors, no devices.

- Exact buckets (vision): only units with the same patch count share a batch, so no padding patch is computed
  and attention needs no mask.
- Ragged groups (audio): sorted by length, a group closes when padding it to its longest member would waste
  more than a set fraction of its frames.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def ragged_groups(lengths: Sequence[int], max_padding_fraction: float = 0.25) -> list[Group]:
    """Sort by length (longest first) and cut groups where padding would exceed the fraction of the batch.

    Padding waste of a group = sum(longest - length_i) / (longest * size). 0.0 gives exact-length groups.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    groups: list[Group] = []
    current: list[int] = []
    real = 0
    for index in order:
        length = int(lengths[index])
        if current:
            longest = int(lengths[current[0]])
            size = len(current) + 1
            waste = 1.0 - (real + length) / (longest * size) if longest > 0 else 0.0
            if waste > max_padding_fraction + 1e-12:
                groups.append(Group(tuple(current), longest))
                current, real = [], 0
        current.append(index)
        real += length
    if current:
        groups.append(Group(tuple(current), int(lengths[current[0]])))
    return groups


def chunks(indices: Sequence[int], size: int) -> list[tuple[int, ...]]:
    """Consecutive slices of at most `size` (at least 1)."""
    size = max(1, int(size))
    return [tuple(indices[i : i + size]) for i in range(0, len(indices), size)]
