"""`gemma_embed.dedup` against brute force (issue 49): on outputs with planted exact and near repeats, the groups
are exactly the connected components of the pairs a brute-force numpy Gram matrix puts at or above the threshold
(every such pair in one group, no group joining items no chain of such pairs joins), on the exact path (recall
1.0) and, on the index path, at least 99% of those pairs inside one group and a measured recall >= 0.99; items
of the same content hash grouped whatever the threshold; the kept table beside the output renewed when the output
changes (`ensure_groups`)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

import gemma_embed
from gemma_embed.collection import GROUP_COLUMNS, groups_path, planted
from gemma_embed.collection.tables import read_record, read_table
from gemma_embed.errors import UsageError

THRESHOLD = 0.9


def brute_force_groups(vectors: np.ndarray, threshold: float, same: list[tuple[int, int]] = ()) -> set[frozenset]:
    """The groups (two or more items) of the graph of pairs with cosine >= threshold, from the whole Gram matrix
    in float64, plus the `same` pairs."""
    unit = vectors.astype(np.float64)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    gram = unit @ unit.T
    assert not (np.abs(gram - threshold) < 1e-5).any(), "a pair so close to T that rounding decides it"
    i, j = np.nonzero(gram >= threshold)
    i, j = np.concatenate([i, [a for a, _ in same]]), np.concatenate([j, [b for _, b in same]])
    graph = coo_matrix((np.ones(len(i)), (i, j)), shape=(len(unit),) * 2)
    _, labels = connected_components(graph, directed=False)
    groups: dict[int, set[int]] = {}
    for item, label in enumerate(labels.tolist()):
        groups.setdefault(label, set()).add(item)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def table_groups(table) -> set[frozenset]:
    groups: dict[int, set[int]] = {}
    for item, group in zip(table["item"].to_pylist(), table["group"].to_pylist(), strict=True):
        groups.setdefault(group, set()).add(item)
    return {frozenset(g) for g in groups.values()}


@pytest.fixture(scope="module")
def repeats(tmp_path_factory):
    """1,200 clustered vectors with 60 exact and 120 near repeats; the near ones at noise 0.35-0.6 (cosine 0.86
    to 0.94 to their originals), so that some fall below the threshold and some chains form."""
    base, _ = planted.gaussian_clusters(40, 30, 48, spread=1.2, seed=3)
    vectors, _ = planted.with_repeats(base, 60, 60, 0.35, seed=4)
    vectors, _ = planted.with_repeats(vectors, 0, 60, 0.6, seed=5)
    path = planted.write_vectors(tmp_path_factory.mktemp("dedup") / "repeats.safetensors", vectors)
    return path, vectors


def test_exact_groups_are_the_brute_force_components(repeats):
    path, vectors = repeats
    table = gemma_embed.dedup(path, threshold=THRESHOLD, method="exact")
    assert table.column_names[: len(GROUP_COLUMNS)] == list(GROUP_COLUMNS)
    truth = brute_force_groups(vectors, THRESHOLD)
    assert len(truth) > 60 and any(len(g) > 2 for g in truth)  # the planted repeats, and some chains
    assert table_groups(table) == truth
    assert read_record(table)["method"] == "exact"


def test_each_group_keeps_one_item_and_scores_the_rest_against_it(repeats):
    path, vectors = repeats
    table = gemma_embed.dedup(path, threshold=THRESHOLD).to_pylist()
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    kept = {row["group"]: row["item"] for row in table if row["keep"]}
    assert len(kept) == len({row["group"] for row in table}) == sum(row["keep"] for row in table)
    for row in table:
        assert kept[row["group"]] == min(r["item"] for r in table if r["group"] == row["group"])  # keep=first
        expected = float(unit[row["item"]] @ unit[kept[row["group"]]])
        assert row["similarity"] == pytest.approx(min(expected, 1.0), abs=1e-5)
    assert [row["group"] for row in table] == sorted(row["group"] for row in table)
    assert sorted(kept.values()) == [kept[g] for g in sorted(kept)]  # numbered in output order of the kept item


def test_the_index_path_finds_the_exact_pairs_and_measures_its_recall(tmp_path):
    """20,000 items in 100 cells, 8 probed: most pairs' two items share a cell, not all."""
    base, _ = planted.gaussian_clusters(200, 95, 32, spread=1.0, seed=6)
    vectors, _ = planted.with_repeats(base, 500, 500, 0.3, seed=7)
    path = planted.write_vectors(tmp_path / "many.safetensors", vectors)
    found = gemma_embed.dedup(path, threshold=THRESHOLD, method="index", ivf={"cells": 100, "nprobe": 8})
    record = read_record(found)
    assert record["method"] == "index" and record["settings"]["cells"] == 100
    assert record["recall"] >= 0.99
    exact = gemma_embed.dedup(path, threshold=THRESHOLD, method="exact")
    group_of = dict(zip(found["item"].to_pylist(), found["group"].to_pylist(), strict=True))
    pairs = 0
    together = 0
    for group in table_groups(exact):
        members = sorted(group)
        for a in members:
            for b in members:
                if a < b:
                    pairs += 1
                    together += a in group_of and group_of.get(a) == group_of.get(b)
    assert pairs > 1000 and together / pairs >= 0.99
    # and no index group joins what the exact scan keeps apart: every index group lies inside an exact one
    exact_of = dict(zip(exact["item"].to_pylist(), exact["group"].to_pylist(), strict=True))
    assert all(len({exact_of.get(i) for i in g}) == 1 for g in table_groups(found))


def test_same_content_is_one_group_whatever_the_threshold(tmp_path):
    vectors = np.eye(6, 8, dtype=np.float32)  # orthogonal: no two near at any threshold above 0
    items = [{"path": f"{n}.jpg", "sha256": digest} for n, digest in enumerate("aabcbd")]
    path = planted.write_vectors(tmp_path / "same.safetensors", vectors, items=items)
    for threshold in (0.5, 1.0):
        table = gemma_embed.dedup(path, threshold=threshold)
        assert table_groups(table) == brute_force_groups(vectors, 0.99, same=[(0, 1), (2, 4)])
        assert read_record(table)["same_content"] == 2


def test_pooled_soft_tokens_are_the_mean_of_each_items_rows(tmp_path):
    """Items of several rows: two with the same mean direction (rows in another order and scale) are one group."""
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((3, 16)), rng.standard_normal((2, 16))
    rows = np.concatenate([a, b, 2 * a[::-1], rng.standard_normal((4, 16))]).astype(np.float32)
    path = planted.write_vectors(tmp_path / "tokens.safetensors", rows, rows_per_item=[3, 2, 3, 4])
    table = gemma_embed.dedup(path, threshold=0.999)
    assert table_groups(table) == {frozenset({0, 2})} and read_record(table)["vectors"] == "pooled"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rows_per_item", [None, [2, 3, 1, 4, 2, 3]])
def test_item_vectors_read_every_stored_dtype(tmp_path, dtype, rows_per_item):
    import torch

    from gemma_embed.collection.vectors import item_vectors

    rng = np.random.default_rng(9)
    count = 6 if rows_per_item is None else sum(rows_per_item)
    rows = rng.standard_normal((count, 24)).astype(np.float32)
    path = planted.write_vectors(tmp_path / "v.safetensors", rows, rows_per_item=rows_per_item, dtype=dtype)
    stored = torch.from_numpy(rows).to(getattr(torch, dtype)).float().numpy()  # what the file holds
    bounds = np.cumsum([0, *(rows_per_item or [1] * count)])
    means = np.stack([stored[a:b].mean(axis=0) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    found = item_vectors(path)
    assert found.pooled == (rows_per_item is not None)
    np.testing.assert_allclose(found.vectors, means / np.linalg.norm(means, axis=1, keepdims=True), atol=1e-6)


@pytest.mark.parametrize("threshold", [1.5, -2, float("nan")])
def test_a_threshold_outside_minus_one_to_one_is_refused(repeats, threshold):
    with pytest.raises(UsageError, match="threshold: a cosine is between -1 and 1"):
        gemma_embed.dedup(repeats[0], threshold=threshold)


def test_ensure_groups_keeps_a_current_table_and_renews_a_stale_one(tmp_path, repeats):
    _, vectors = repeats
    path = planted.write_vectors(tmp_path / "kept.safetensors", vectors[:300])
    where = gemma_embed.ensure_groups(path, threshold=THRESHOLD)
    assert where == groups_path(path) and read_record(where)["threshold"] == THRESHOLD
    stamp = os.stat(where.path).st_mtime_ns
    assert gemma_embed.ensure_groups(path) == where and os.stat(where.path).st_mtime_ns == stamp  # current: kept
    gemma_embed.ensure_groups(path, threshold=0.95)  # another threshold: computed again
    assert read_record(where)["threshold"] == 0.95
    planted.write_vectors(path, vectors[:301])  # the output changed
    gemma_embed.ensure_groups(path)
    assert read_record(where)["items"] == 301 and read_table(where).num_rows == len(
        gemma_embed.dedup(path, threshold=0.95)
    )


def test_a_sharded_output_is_read_in_its_index_order(tmp_path):
    """Two shards whose index lists the keys interleaved: the vectors come in the index's order, as `load` gives."""
    from gemma_embed.collection.vectors import item_vectors
    from gemma_embed.store import shard_path, write_index

    rng = np.random.default_rng(10)
    out = tmp_path / "sharded.safetensors"
    rows = rng.standard_normal((6, 8)).astype(np.float32)
    files = [
        planted.write_vectors(shard_path(out, 0), rows[:3], keys=["a", "c", "e"]),
        planted.write_vectors(shard_path(out, 1), rows[3:], keys=["b", "d", "f"]),
    ]
    write_index(out, files, [("a", 0), ("b", 1), ("c", 0), ("d", 1), ("e", 0), ("f", 1)])
    found = item_vectors(out)
    loaded = gemma_embed.load(out)
    assert found.keys.to_pylist() == list(loaded) == ["a", "b", "c", "d", "e", "f"]
    expected = np.stack([loaded[key][0].numpy() for key in loaded])
    np.testing.assert_allclose(found.vectors, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-6)


def test_a_shard_index_whose_keys_are_not_its_files_is_a_damaged_file(tmp_path):
    from gemma_embed.store import DamagedFile, shard_path, write_index

    rows = np.random.default_rng(16).standard_normal((4, 8)).astype(np.float32)
    out = tmp_path / "sharded.safetensors"
    files = [
        planted.write_vectors(shard_path(out, 0), rows[:2], keys=["a", "b"]),
        planted.write_vectors(shard_path(out, 1), rows[2:], keys=["c", "d"]),
    ]
    write_index(out, files, [("b", 0), ("a", 0), ("x", 1), ("d", 1)])  # "x" is in no file, "c" is left out
    with pytest.raises(DamagedFile, match="its keys are not those of its files"):
        gemma_embed.dedup(out, threshold=0.9)
