from __future__ import annotations

import random

from gemma_embed.batching import BatchPlan, exact_buckets, longest_first


def test_exact_buckets_group_equal_lengths_in_input_order():
    groups = exact_buckets([567, 540, 567, 576, 540, 567])
    assert [(g.length, g.indices) for g in groups] == [(567, (0, 2, 5)), (540, (1, 4)), (576, (3,))]
    assert exact_buckets([]) == []


def test_longest_first_is_one_group_sorted_by_length_ties_in_input_order():
    (group,) = longest_first([5, 9, 5, 7, 9])
    assert group.indices == (1, 4, 3, 0, 2) and group.length == 9
    assert longest_first([]) == []


def cut(lengths, rows_at, overhead, cap):
    """The batches a plan cuts from the lengths sorted longest first."""
    order = sorted(lengths, reverse=True)
    sizes = BatchPlan(order, rows_at, overhead, cap).cuts()
    batches, position = [], 0
    for size in sizes:
        batches.append(order[position : position + size])
        position += size
    return batches


def exhaustive_cost(order, rows_at, overhead, cap):
    """The cheapest plan over every possible cut (O(n x rows)), for comparison."""
    best = [0.0] * (len(order) + 1)
    for i in range(len(order) - 1, -1, -1):
        head, best[i] = order[i], float("inf")
        for j in range(i + 1, min(len(order), i + rows_at(head)) + 1):
            if sum(order[i:j]) < (1 - cap - 1e-12) * (j - i) * head:
                break
            best[i] = min(best[i], (j - i) * head + overhead + best[j])
    return best[0]


def test_batches_cover_everything_within_the_rows_and_the_padding_cap():
    rng = random.Random(0)
    for cap in (0.0, 0.1, 0.25, 0.5):
        lengths = [rng.randint(1, 3000) for _ in range(300)]
        batches = cut(lengths, lambda head: max(1, 8192 // head), 256, cap)
        assert sorted(x for b in batches for x in b) == sorted(lengths)
        for b in batches:
            assert len(b) <= max(1, 8192 // b[0])
            assert 1 - sum(b) / (b[0] * len(b)) <= cap + 1e-9


def test_the_plan_is_as_cheap_as_an_exhaustive_search_on_text_like_lengths():
    # 300 lines of 1-300 words, log-normal (median 20): as the text benchmark's mixed corpus.
    rng = random.Random(1)
    order = sorted((12 + min(300, max(1, round(rng.lognormvariate(3.0, 1.0)))) for _ in range(300)), reverse=True)
    for target, overhead in ((1024, 64), (4096, 256), (16384, 1024)):
        rows_at = lambda head, target=target: max(1, target // head)  # noqa: E731
        batches = cut(order, rows_at, overhead, 0.25)
        cost = sum(len(b) * b[0] + overhead for b in batches)
        assert cost <= 1.005 * exhaustive_cost(order, rows_at, overhead, 0.25)


def test_equal_lengths_run_unpadded_and_a_short_run_joins_its_neighbours():
    # A window of equal lengths: full batches, none padded.
    assert cut([17] * 100, lambda head: 32, 256, 0.25) == [[17] * 32] * 3 + [[17] * 4]
    # 40 texts of 30 tokens, then 3 of 29: one batch padding the 29s (3 tokens) is cheaper than a second batch.
    assert [len(b) for b in cut([30] * 40 + [29] * 3, lambda head: 4096 // head, 256, 0.25)] == [43]
    # With no fixed cost per batch, padding is never worth it: each length alone.
    assert cut([30] * 40 + [29] * 3, lambda head: 4096 // head, 0, 0.25) == [[30] * 40, [29] * 3]
    # No padding allowed: equal lengths only, whatever the fixed cost.
    assert all(len(set(b)) == 1 for b in cut([5, 3, 5, 3, 7, 3], lambda head: 100, 10**6, 0.0))
