"""Who takes which items: a deterministic partition of the input over slices."""

from __future__ import annotations

from gemma_embed.distributed import Slice, take
from gemma_embed.sources import Source


def test_take_is_a_deterministic_partition():
    sources = [Source(f"k{i}", f"p{i}", position=i) for i in range(10)]
    slices = [[s.key for s in take(sources, Slice(r, 3))] for r in range(3)]
    assert slices == [["k0", "k3", "k6", "k9"], ["k1", "k4", "k7"], ["k2", "k5", "k8"]]
