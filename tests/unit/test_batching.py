from __future__ import annotations

from gemma_embed.batching import exact_buckets, longest_first, padded_buckets, padded_length


def test_exact_buckets_group_equal_lengths_in_input_order():
    groups = exact_buckets([567, 540, 567, 576, 540, 567])
    assert [(g.length, g.indices) for g in groups] == [(567, (0, 2, 5)), (540, (1, 4)), (576, (3,))]
    assert exact_buckets([]) == []


def test_longest_first_is_one_group_sorted_by_length_ties_in_input_order():
    (group,) = longest_first([5, 9, 5, 7, 9])
    assert group.indices == (1, 4, 3, 0, 2) and group.length == 9
    assert longest_first([]) == []


def test_the_ladder_pads_under_a_quarter_to_multiples_of_four_and_is_monotone():
    rungs = [padded_length(n) for n in range(1, 20000)]
    assert all(rung % 4 == 0 and rung >= n for n, rung in zip(range(1, 20000), rungs, strict=True))
    assert all(a <= b for a, b in zip(rungs, rungs[1:], strict=False))  # a longer unit never lands on a lower rung
    assert max((padded_length(n) - n) / n for n in range(13, 20000)) < 0.25
    # Four rungs an octave from 32 on (fewer groups than lengths: units share batches).
    assert sorted({padded_length(n) for n in range(33, 65)}) == [40, 48, 56, 64]
    assert padded_length(512) == 512 and padded_length(513) == 640  # a power of two is its own rung


def test_padded_buckets_group_by_rung_longest_first_ties_in_input_order():
    lengths = [30, 5, 31, 29, 6, 300, 8]
    groups = padded_buckets(lengths)
    assert [(g.length, g.indices) for g in groups] == [(320, (5,)), (32, (2, 0, 3)), (8, (6, 4, 1))]
    # A unit's group length depends on its own length only, never on the others'.
    for keep in (lengths[:3], lengths[2:], [lengths[0]]):
        for group in padded_buckets(keep):
            assert {padded_length(keep[i]) for i in group.indices} == {group.length}
    assert padded_buckets([]) == []
