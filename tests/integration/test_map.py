"""`gemma_embed.layout` on a planted structure (issue 49): an output whose rows are 12 Gaussian clusters is laid
out with the groups apart (silhouette of the 2D points by planted group >= 0.8, scikit-learn's silhouette_score;
a PCA projection of the same vectors scores far lower) and found as clusters (adjusted Rand index >= 0.9), also
when fitted on a sample and the rest placed by `transform`; the same seed gives the same bytes; clusters are named
by their most central items; `ensure_map` keeps a current table."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.metrics import adjusted_rand_score, silhouette_score

import gemma_embed
from gemma_embed.collection import MAP_COLUMNS, map_path, planted
from gemma_embed.collection.tables import read_record, write_table

pytest.importorskip("umap")


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """12 clusters of 100 points in 64 dimensions, noise 0.8 around unit centres (centres ~1.4 apart)."""
    vectors, labels = planted.gaussian_clusters(12, 100, 64, spread=0.8, seed=1)
    path = planted.write_vectors(tmp_path_factory.mktemp("map") / "clusters.safetensors", vectors)
    return path, vectors, labels


@pytest.fixture(scope="module")
def laid_out(clusters):
    return gemma_embed.layout(clusters[0], seed=7)


def points(table) -> np.ndarray:
    return np.column_stack([table["x"].to_numpy(), table["y"].to_numpy()])


def test_the_planted_groups_lie_apart_and_are_found_as_clusters(clusters, laid_out):
    path, vectors, labels = clusters
    assert laid_out.column_names[: len(MAP_COLUMNS)] == list(MAP_COLUMNS)
    assert laid_out["key"].to_pylist() == gemma_embed.read_metadata(path)["keys"]
    assert silhouette_score(points(laid_out), labels) >= 0.8
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert silhouette_score(PCA(2, random_state=0).fit_transform(unit), labels) < 0.6  # not a structure PCA shows
    assert adjusted_rand_score(labels, laid_out["cluster"].to_numpy()) >= 0.9


def test_fitted_on_a_sample_the_rest_is_placed_with_its_group(clusters):
    path, _, labels = clusters
    table = gemma_embed.layout(path, seed=7, sample=400)
    assert read_record(table)["fitted_on"] == 400
    assert silhouette_score(points(table), labels) >= 0.8
    assert adjusted_rand_score(labels, table["cluster"].to_numpy()) >= 0.9


def test_the_same_seed_writes_the_same_bytes(clusters, laid_out, tmp_path):
    again = gemma_embed.layout(clusters[0], seed=7)
    first, second = write_table(laid_out, tmp_path / "a.parquet"), write_table(again, tmp_path / "b.parquet")
    assert first.read_bytes() == second.read_bytes()


def test_each_cluster_is_named_by_its_most_central_items(clusters, laid_out):
    _, vectors, _ = clusters
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    keys = laid_out["key"].to_pylist()
    found = laid_out["cluster"].to_numpy()
    names = laid_out["cluster_name"].to_pylist()
    for number in range(found.max() + 1):
        members = np.flatnonzero(found == number)
        centre = unit[members].mean(axis=0)
        central = members[np.argsort(-(unit[members] @ centre))[:3]]
        assert names[members[0]] == ", ".join(keys[i] for i in central)
        assert {names[i] for i in members} == {names[members[0]]}
    assert all(name == "" for name, c in zip(names, found, strict=True) if c < 0)


def test_ensure_map_keeps_a_current_table(clusters, tmp_path):
    _, vectors, _ = clusters
    path = planted.write_vectors(tmp_path / "small.safetensors", vectors[:200])
    where = gemma_embed.ensure_map(path, seed=3)
    assert where == map_path(path) and read_record(where)["seed"] == 3
    before = where.read_bytes()
    assert gemma_embed.ensure_map(path) == where and where.read_bytes() == before
