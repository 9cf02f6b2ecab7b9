"""Batching: pure functions over unit lengths. No tensors, no devices.

- Exact buckets (vision): only units with the same patch count share a batch, so no padding patch is computed
  and attention needs no mask.
- Ragged groups (text, audio): each unit is padded to `padded_length` of its own length, a fixed ladder (four
  rungs an octave, multiples of 4), and only units on the same rung share a batch; engine.py cuts each group
  within the memory plan's and the tuner's row limit. A unit's padded length, and so its bytes, never depend on
  which other units came with it, how the tuner sized the batches or how many threads ran them: attention's
  sums depend on the padded length (the same text padded to another length gives another float32 vector in its
  last bits), while batch size and thread count leave them alone once GEMM rows and elementwise kernels are
  aligned (numerics.py).
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


def padded_length(length: int) -> int:
    """The ladder's rung for a unit of this length: the next multiple of a power-of-two step, at least 4 and an
    eighth of the octave's start, so padding adds under 25% from 13 on (the cap the batch plan kept before the
    ladder; at most 3 units below) and every batch's B x rung rows are a multiple of 4 (the GEMM alignment)."""
    length = max(1, int(length))
    step = 4
    while step * 8 <= length:  # rungs at 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...: four an octave
        step *= 2
    return -(-length // step) * step


def padded_buckets(lengths: Sequence[int]) -> list[Group]:
    """One group per rung of `padded_length`, longest rung first; indices longest first (ties in input order)
    inside each, so the longest units lead and the memory plan meets the worst case first."""
    buckets: dict[int, list[int]] = {}
    for index in sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i)):
        buckets.setdefault(padded_length(lengths[index]), []).append(index)
    return [Group(tuple(ix), rung) for rung, ix in sorted(buckets.items(), key=lambda item: -item[0])]


def longest_first(lengths: Sequence[int]) -> list[Group]:
    """One group of every unit, longest first (ties in input order), padded to the longest's rung: the tests'
    way to put units of any lengths in one batch and check a tower's padding against each unit alone."""
    if not lengths:
        return []
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    return [Group(tuple(order), int(lengths[order[0]]))]
