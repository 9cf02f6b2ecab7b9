"""A 2D map of an output with clusters (`gemma-embed map`, `gemma_embed.layout`).

The items' unit vectors (collection/vectors.py) are reduced by PCA to PCA_DIMS dimensions (the neighbour search
UMAP begins with is that much cheaper, and at these widths the neighbours barely change), then laid out in 2D by
UMAP (umap-learn, the `[map]` extra) with a fixed seed: the same output and seed give the same map, byte for byte.
Clusters are HDBSCAN's (scikit-learn) on the 2D layout, so that a cluster is what the eye sees on the map; points
in none are cluster -1. Each cluster is named by its most central items: the NAME_KEYS items whose vectors are
nearest (cosine) to the mean of its members' vectors.

Above FIT_SAMPLE items, PCA and UMAP are fitted on a seeded sample of FIT_SAMPLE items and every other item is
placed by `transform` (its neighbours among the sample, then a few epochs of the same optimisation), and HDBSCAN
runs on the sample's points, each placed item taking the cluster of most of its nearest sample points on the map:
the map's time grows with the items placed, not with their square. Figures (2-core AMD EPYC, shared): bench/README.md.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from gemma_embed.collection.vectors import ItemVectors, as_text, item_vectors
from gemma_embed.config import DEFAULT_SEED, FIT_SAMPLE
from gemma_embed.errors import UsageError
from gemma_embed.locations import Location

if TYPE_CHECKING:
    import pyarrow as pa

PCA_DIMS = 50
NEIGHBORS = 15
MIN_DIST = 0.0  # points packed by neighbourhood: the clusters stand apart (silhouette), the gallery spreads them
NAME_KEYS = 3
PLACED_NEIGHBORS = 5
SPECTRAL_FROM = 100  # items: below, UMAP starts from random points
TRANSFORM_BLOCK = 50_000
MAP_EXTRA = "pip install 'gemma-embed[map]'"


def min_cluster_size(count: int) -> int:
    """HDBSCAN's smallest cluster: 1 fitted item in 200 (a map shows no more than a couple of hundred clusters
    well), at least 5."""
    return max(5, count // 200)


def _libraries() -> Any:
    try:
        import sklearn  # noqa: F401
        import umap
    except ImportError:
        raise UsageError(f"map needs umap-learn and scikit-learn, which are not installed: {MAP_EXTRA}") from None
    return umap


def layout(
    output: str | os.PathLike | Location,
    seed: int = DEFAULT_SEED,
    sample: int = FIT_SAMPLE,
    neighbors: int = NEIGHBORS,
    min_cluster: int | None = None,
    vectors: ItemVectors | None = None,
    progress: Callable[[str], None] | None = None,
) -> pa.Table:
    """The map of `output` (see the module's note) as a pyarrow Table with the columns of `collection.MAP_COLUMNS`
    (and `item`, the item's position), one row per item in output order; its schema metadata records how it was
    made (`tables.read_record`)."""
    from gemma_embed.collection.tables import map_table

    if int(sample) < 2:
        raise UsageError(f"sample={sample!r}: fit on at least 2 items")
    if int(neighbors) < 2:
        raise UsageError(f"neighbors={neighbors!r}: at least 2")
    _libraries()
    found = vectors if vectors is not None else item_vectors(output)
    held = found.vectors
    smallest = min_cluster if min_cluster is not None else 0
    xy, fit_rows = _layout(held, int(seed), int(sample), int(neighbors), progress)
    fitted = len(fit_rows)
    if min_cluster is None:
        smallest = min_cluster_size(fitted)
    clusters = _clusters(xy, fit_rows, smallest)
    names = _names(found, held, clusters)
    settings = {
        "seed": int(seed),
        "fitted_on": fitted,
        "sample": int(sample),
        "pca_dims": PCA_DIMS,
        "neighbors": int(neighbors),
        "min_dist": MIN_DIST,
        "min_cluster_size": smallest,
    }
    return map_table(found, xy, clusters, names, settings)


def _layout(
    vectors: np.ndarray, seed: int, sample: int, neighbors: int, progress: Callable[[str], None] | None
) -> tuple[np.ndarray, np.ndarray]:
    """(N x 2 float32 layout, the items UMAP was fitted on)."""
    count = len(vectors)
    if count < 3:  # too few for a neighbour graph: a line
        return np.column_stack([np.arange(count), np.zeros(count)]).astype(np.float32), np.arange(count)
    umap = _libraries()
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(seed)
    fit_rows = np.sort(rng.choice(count, sample, replace=False)) if count > sample else np.arange(count)
    fit_on = vectors[fit_rows]
    dims = min(PCA_DIMS, fit_on.shape[1], len(fit_on))
    pca = PCA(n_components=dims, svd_solver="randomized", random_state=seed).fit(fit_on)
    reducer = umap.UMAP(
        n_neighbors=min(neighbors, len(fit_rows) - 1),
        n_components=2,
        min_dist=MIN_DIST,
        # umap-learn's spectral start fails on a graph of a handful of points (scipy's eigsh needs k < N)
        init="spectral" if len(fit_rows) >= SPECTRAL_FROM else "random",
        random_state=seed,
        transform_seed=seed,
        n_jobs=1,  # a seed makes umap-learn run on one thread anyway; said here so it does not warn
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # umap-learn's and numba's notes about threads and spectral init
        fitted = reducer.fit_transform(pca.transform(fit_on))
    xy = np.empty((count, 2), np.float32)
    xy[fit_rows] = fitted
    rest = np.setdiff1d(np.arange(count), fit_rows)
    for begin in range(0, len(rest), TRANSFORM_BLOCK):
        part = rest[begin : begin + TRANSFORM_BLOCK]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            xy[part] = reducer.transform(pca.transform(vectors[part]))
        if progress is not None:
            progress(f"{begin + len(part)}/{len(rest)} items placed")
    return xy, fit_rows


def _clusters(xy: np.ndarray, fit_rows: np.ndarray, smallest: int) -> np.ndarray:
    """HDBSCAN's labels (-1: in no cluster) on the layout of the items UMAP was fitted on; every other item takes
    the label most of its PLACED_NEIGHBORS nearest fitted items on the map have. HDBSCAN on all 100k points of a
    layout took 42 s of CPU on the 2-core EPYC, on 20k under 5 s, and the placed points lie among the fitted ones."""
    labels = np.full(len(xy), -1, np.int64)
    if len(fit_rows) < max(2, smallest):
        return labels
    from sklearn.cluster import HDBSCAN

    fitted = HDBSCAN(min_cluster_size=smallest, copy=True).fit_predict(xy[fit_rows].astype(np.float64))
    labels[fit_rows] = fitted
    rest = np.setdiff1d(np.arange(len(xy)), fit_rows)
    if len(rest):
        from sklearn.neighbors import KNeighborsClassifier

        vote = KNeighborsClassifier(n_neighbors=min(PLACED_NEIGHBORS, len(fit_rows)))
        labels[rest] = vote.fit(xy[fit_rows], fitted).predict(xy[rest])
    return labels


def _names(found: ItemVectors, vectors: np.ndarray, clusters: np.ndarray) -> list[str]:
    """Each cluster's name: the keys of its NAME_KEYS most central items, most central first."""
    names = []
    for number in range(int(clusters.max()) + 1 if len(clusters) else 0):
        members = np.flatnonzero(clusters == number)
        centre = vectors[members].mean(axis=0)
        scores = vectors[members] @ centre
        best = members[np.argsort(-scores, kind="stable")[:NAME_KEYS]]
        names.append(", ".join(as_text(found.keys.take(best)).to_pylist()))
    return names
