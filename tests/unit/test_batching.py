from __future__ import annotations

import random

from gemma_embed.batching import chunks, exact_buckets, ragged_groups


def test_exact_buckets_group_equal_lengths_in_input_order():
    groups = exact_buckets([567, 540, 567, 576, 540, 567])
    assert [(g.length, g.indices) for g in groups] == [(567, (0, 2, 5)), (540, (1, 4)), (576, (3,))]
    assert exact_buckets([]) == []


def test_ragged_groups_cover_everything_and_cap_waste():
    rng = random.Random(0)
    for cap in (0.0, 0.1, 0.25, 0.5):
        lengths = [rng.randint(1, 3000) for _ in range(200)]
        groups = ragged_groups(lengths, cap)
        seen = sorted(i for g in groups for i in g.indices)
        assert seen == list(range(200))
        for g in groups:
            assert g.length == max(lengths[i] for i in g.indices)
            waste = 1 - sum(lengths[i] for i in g.indices) / (g.length * len(g.indices))
            assert waste <= cap + 1e-9


def test_ragged_zero_waste_means_equal_lengths():
    groups = ragged_groups([5, 3, 5, 3, 7], 0.0)
    assert sorted(sorted(g.indices) for g in groups) == [[0, 2], [1, 3], [4]]


def test_chunks():
    assert chunks((1, 2, 3, 4, 5), 2) == [(1, 2), (3, 4), (5,)]
    assert chunks((1, 2), 0) == [(1,), (2,)]
    assert chunks((), 3) == []
