"""Outputs with planted structure, for the tests and benches of `dedup` and `map` (and the gallery's): the tiny
sample models' vectors have no structure to find, so these write given vectors in the `gemma-embed/1` layout with
the store's own file writer, and draw the structures the issue asks to find (Gaussian clusters; exact and near
repeats).
"""

from __future__ import annotations

import json
import os

import numpy as np

from gemma_embed import FORMAT
from gemma_embed.locations import Location

HEADER = {"model": "planted", "modality": "images", "space": "retrieval", "pooling": "none", "dtype": "float32"}


def write_vectors(
    path: str | os.PathLike,
    vectors: np.ndarray,
    keys: list[str] | None = None,
    items: list[dict] | None = None,
    rows_per_item: list[int] | None = None,
    header: dict | None = None,
    dtype: str = "float32",
) -> Location:
    """An output holding `vectors` as its rows (stored as `dtype`: float32, float16 or bfloat16): one row per item,
    or `rows_per_item` rows each; keys `i0000000`..., items' metadata `{"path": KEY.jpg, "sha256": a digest
    unique to the item}` unless given."""
    import torch

    from gemma_embed import __version__
    from gemma_embed.store.tensors_file import write_embedding_file

    counts = list(rows_per_item) if rows_per_item is not None else [1] * len(vectors)
    keys = keys if keys is not None else [f"i{i:07d}" for i in range(len(counts))]
    if items is None:
        items = [{"path": f"{key}.jpg", "sha256": f"{i:064x}"} for i, key in enumerate(keys)]
    items = [{**item, "rows": count} for item, count in zip(items, counts, strict=True)]
    metadata = {
        "format": FORMAT,
        "created_by": f"gemma-embed {__version__}",
        **(header or HEADER),
        "dtype": dtype,
        "keys": json.dumps(keys, ensure_ascii=True),
        "items": json.dumps(items, ensure_ascii=True),
    }
    rows = torch.from_numpy(np.ascontiguousarray(vectors, np.float32))
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    blocks = (rows[bounds[i] : bounds[i + 1]] for i in range(len(counts)))
    return write_embedding_file(path, metadata, counts, rows.shape[1], getattr(torch, dtype), blocks)


def gaussian_clusters(
    clusters: int, per_cluster: int, width: int, spread: float = 0.5, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(vectors [clusters * per_cluster, width] float32, each row's planted cluster): unit centres drawn at random,
    each point its centre plus isotropic noise of `spread` in total length (per dimension spread / sqrt(width))."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, width))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels = np.repeat(np.arange(clusters), per_cluster)
    noise = rng.standard_normal((len(labels), width)) * (spread / np.sqrt(width))
    return (centres[labels] + noise).astype(np.float32), labels


def with_repeats(
    vectors: np.ndarray, exact: int, near: int, noise: float, seed: int = 0
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """`vectors` (unit rows) with `exact` copies and `near` perturbed copies (noise of length `noise` before
    renormalising) of randomly chosen rows appended; returns the new vectors and (original, copy) pairs."""
    rng = np.random.default_rng(seed)
    base = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sources = rng.choice(len(base), exact + near, replace=True)
    copies = base[sources].copy()
    jitter = rng.standard_normal((near, base.shape[1]))
    copies[exact:] += jitter / np.linalg.norm(jitter, axis=1, keepdims=True) * noise
    copies /= np.linalg.norm(copies, axis=1, keepdims=True)
    pairs = [(int(s), len(base) + n) for n, s in enumerate(sources)]
    return np.concatenate([base, copies]).astype(np.float32), pairs
