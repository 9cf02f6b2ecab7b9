"""The pure parts of `dedup` (issue 49): components from a stream of edges in bounded memory against scipy's
connected_components on the whole graph, the exact tiled scan against a brute-force numpy Gram matrix, tiles that
bound memory, and the keep rules."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from gemma_embed.collection.dedup import _groups, _keep_order, exact_pairs, tile_shape
from gemma_embed.collection.graph import Components
from gemma_embed.collection.vectors import HeldRows, ItemFacts, ItemVectors
from gemma_embed.locations import location


def partition(labels: np.ndarray) -> set[frozenset[int]]:
    """The groups of two or more items a labelling makes."""
    groups: dict[int, set[int]] = {}
    for item, label in enumerate(labels.tolist()):
        groups.setdefault(label, set()).add(item)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


@pytest.mark.parametrize("limit", [1, 7, 10_000])
def test_components_folded_in_small_buffers_are_scipys_on_the_whole_graph(limit):
    rng = np.random.default_rng(limit)
    count = 3000
    left, right = rng.integers(0, count, 2500), rng.integers(0, count, 2500)
    components = Components(count, limit=limit)
    for begin in range(0, len(left), 37):
        components.add(left[begin : begin + 37], right[begin : begin + 37])
    graph = coo_matrix((np.ones(len(left)), (left, right)), shape=(count, count))
    _, reference = connected_components(graph, directed=False)
    assert partition(components.labels()) == partition(reference)
    labels = components.labels()  # each item labelled by its component's first item
    assert all(labels[i] == min(g) for g in partition(reference) for i in g)


def test_the_tiled_scan_finds_exactly_the_brute_force_pairs():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((1500, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    threshold = 0.75
    gram = vectors.astype(np.float64) @ vectors.astype(np.float64).T
    assert not (np.abs(gram - threshold) < 1e-5).any()  # no pair so close to T that rounding decides it
    i, j = np.nonzero(np.triu(gram >= threshold, k=1))
    found_i, found_j = exact_pairs(vectors, threshold)
    assert len(i) > 100
    assert set(zip(found_i.tolist(), found_j.tolist(), strict=True)) == set(zip(i.tolist(), j.tolist(), strict=True))


def test_tiles_stay_within_a_quarter_of_the_vectors_bytes_and_256_mb():
    for count, width in [(1000, 768), (100_000, 768), (1_000_000, 768), (5_000_000, 1024)]:
        rows, columns = tile_shape(count, width)
        tile_bytes = rows * columns * 5
        assert tile_bytes <= max(16 << 20, min(256 << 20, count * width))
        assert rows >= 1 and columns <= count


def _found(items: list[dict]) -> ItemVectors:
    keys = pa.array([f"k{i}" for i in range(len(items))], pa.string())
    return ItemVectors(location("x.safetensors"), keys, ItemFacts.of(items), HeldRows(np.zeros((0, 1))), False)


@pytest.mark.parametrize(
    "rule, kept",
    [("first", 1), ("largest", 3), ("smallest", 4), ("newest", 4), ("oldest", 3)],
)
def test_each_group_keeps_one_item_by_the_rule(rule, kept):
    items = [
        {"width": 10, "height": 10, "mtime": 5},
        {"width": 20, "height": 10, "mtime": 6},
        {"width": 1, "height": 1, "mtime": 1},
        {"width": 50, "height": 50, "mtime": 2},
        {"bytes": 3, "mtime": 9},  # no width and height: its bytes are its size
    ]
    labels = np.asarray([0, 1, 2, 1, 1])  # items 1, 3 and 4 are one group; 0 and 2 alone
    group_of, kept_items, order = _groups(labels, _keep_order(_found(items), rule))
    assert kept_items.tolist() == [kept]
    assert group_of.tolist() == [-1, 0, -1, 0, 0] and order.tolist() == [1, 3, 4]


def test_groups_are_numbered_in_output_order_of_their_kept_item():
    labels = np.asarray([0, 1, 1, 0, 4, 4, 6])
    items = [{"bytes": b} for b in (1, 9, 1, 5, 1, 1, 1)]
    group_of, kept, order = _groups(labels, _keep_order(_found(items), "largest"))
    assert kept.tolist() == [1, 3, 4]  # groups {1, 2} (keeps 1), {0, 3} (keeps 3), {4, 5} (keeps 4)
    assert group_of.tolist() == [1, 0, 0, 1, 2, 2, -1]
    assert order.tolist() == [1, 2, 0, 3, 4, 5]
