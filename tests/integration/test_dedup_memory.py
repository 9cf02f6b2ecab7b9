"""`dedup` never holds the output's vectors whole (issue 49: 1M x 768 within 1.5x the vectors' bytes).

- The reader (`vectors.StoredRows`) gives the same bits as the vectors read whole, for blocks and gathered rows,
  across the files of a sharded output in its index's order, for float16 and pooled outputs too.
- On an output of several files, both scans read at most a bounded number of rows at once (never the whole) and
  give the same table as from the vectors held in memory.
- On a 4-file output of 120,000 x 256 (117 MiB of float32), the index path's peak of numpy arrays (tracemalloc:
  the bytes allocated, not a time nor the allocator's whims) stays under 0.75x the vectors' bytes: any N x D
  float32 array would be 1.0x by itself. Measured: 0.64x (the codes a quarter, a block of 16,384 rows a seventh,
  the cells' ids, the cells' queries, scores and decoded codes of one cell at a time).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import gemma_embed
from gemma_embed.collection import dedup as dedup_module
from gemma_embed.collection import planted, vectors
from gemma_embed.collection.vectors import StoredRows, item_rows, item_vectors


def sharded(folder, rows: np.ndarray, files: int, order_seed: int | None = None, **options):
    """An output of `files` shards (and their index) holding `rows`; with `order_seed` the index lists the keys
    in a shuffled order (the output's order is then not the files' concatenation)."""
    from gemma_embed.store import shard_path, write_index

    out = folder / "sharded.safetensors"
    keys = [f"k{i:07d}" for i in range(len(rows))]
    bounds = np.linspace(0, len(rows), files + 1).astype(int)
    written, located = [], []
    for number, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        written.append(planted.write_vectors(shard_path(out, number), rows[a:b], keys=keys[a:b], **options))
        located += [(key, number) for key in keys[a:b]]
    if order_seed is not None:
        located = [located[i] for i in np.random.default_rng(order_seed).permutation(len(located))]
    write_index(out, written, located)
    return out


@pytest.mark.parametrize(
    "case", ["float32", "float16", "shuffled", "pooled"], ids=["float32", "float16", "shuffled-shards", "pooled"]
)
def test_blocks_and_gathered_rows_are_the_bits_of_the_whole(tmp_path, monkeypatch, case):
    monkeypatch.setattr(vectors, "SPAN_ROWS", 5)  # gathered rows read in many short spans
    monkeypatch.setattr(vectors, "SPAN_GAP", 2)
    monkeypatch.setattr(vectors, "READ_BLOCK_ROWS", 7)  # pooled items cross the blocks their rows are summed in
    rng = np.random.default_rng(11)
    if case == "pooled":
        counts = rng.integers(0, 4, 300).tolist()  # items of no rows too: zero vectors
        rows = rng.standard_normal((sum(counts), 12)).astype(np.float32)
        path = planted.write_vectors(tmp_path / "pooled.safetensors", rows, rows_per_item=counts)
    else:
        rows = rng.standard_normal((300, 12)).astype(np.float32)
        dtype = "float16" if case == "float16" else "float32"
        path = sharded(tmp_path, rows, 3, order_seed=1 if case == "shuffled" else None, dtype=dtype)
    whole = item_vectors(path).vectors
    with item_rows(path) as found:
        assert isinstance(found.rows, StoredRows) and found.pooled == (case == "pooled")
        ids = rng.integers(0, len(whole), 200)  # unsorted, with repeats, across the files
        assert found.rows.take(ids).tobytes() == whole[ids].tobytes()
        for begin, end in [(0, 300), (95, 205), (299, 300), (10, 10)]:
            assert found.rows.block(begin, end).tobytes() == whole[begin:end].tobytes()
    norms = np.linalg.norm(whole, axis=1)
    assert np.all((np.abs(norms - 1) < 1e-5) | (norms == 0))


class Reads:
    """The rows each read of a StoredRows returned; reading everything at once is refused."""

    def __init__(self, monkeypatch):
        self.sizes: list[int] = []
        block, take = StoredRows.block, StoredRows.take

        def counted_block(rows, begin, end):
            out = block(rows, begin, end)
            self.sizes.append(len(out))
            return out

        def counted_take(rows, ids):
            out = take(rows, ids)
            self.sizes.append(len(out))
            return out

        def refused(rows):
            raise AssertionError("dedup read every vector at once")

        monkeypatch.setattr(StoredRows, "block", counted_block)
        monkeypatch.setattr(StoredRows, "take", counted_take)
        monkeypatch.setattr(StoredRows, "whole", refused)


@pytest.mark.parametrize("method", ["exact", "index"])
def test_both_scans_read_bounded_blocks_and_match_the_vectors_held_whole(tmp_path, monkeypatch, method):
    """3,000 items in 3 files, with the scans' sizes made small: tiles of 64 columns (a panel of 255 rows, windows
    of 128), IVF blocks of 256 items, 400 training rows, rescoring and similarity 64 pairs at a time."""
    for name, value in [
        ("TILE_COLUMNS", 64),
        ("TILE_BYTES", (4096, 16384)),
        ("SEARCH_BLOCK", 256),
        ("TRAIN_AT_LEAST", 200),
        ("RECALL_QUERIES", 50),
        ("RESCORE_BLOCK", 64),
        ("SIMILARITY_BLOCK", 64),
    ]:
        monkeypatch.setattr(dedup_module, name, value)
    base, _ = planted.gaussian_clusters(30, 90, 16, spread=1.0, seed=12)
    rows, _ = planted.with_repeats(base, 150, 150, 0.2, seed=13)
    path = sharded(tmp_path, rows, 3)
    options = {"threshold": 0.9, "method": method, "ivf": {"cells": 10, "nprobe": 3}}
    held = gemma_embed.dedup(path, vectors=item_vectors(path), **options)
    reads = Reads(monkeypatch)
    streamed = gemma_embed.dedup(path, **options)
    assert streamed.num_rows > 300 and streamed.equals(held) and streamed.schema.metadata == held.schema.metadata
    assert max(reads.sizes) <= 400 < len(rows) // 4  # the panel, a window, a block, the training rows
    assert sum(reads.sizes) > len(rows)  # and every row was read


@pytest.mark.slow
def test_the_index_path_never_holds_an_array_the_size_of_the_vectors(tmp_path):
    count, width = 120_000, 256
    base, _ = planted.gaussian_clusters(120, 990, width, spread=0.8, seed=14)
    rows, _ = planted.with_repeats(base, 600, 600, 0.1, seed=15)
    path = sharded(tmp_path, rows, 4)
    vector_bytes = count * width * 4
    assert len(rows) == count
    del base, rows
    with item_rows(path) as found:  # the keys and items' columns first: what is measured is the scans'
        tracemalloc.start()
        try:
            table = gemma_embed.dedup(path, threshold=0.95, method="index", vectors=found)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert table.num_rows >= 1200  # the repeats found
    assert peak < 0.75 * vector_bytes, f"{peak / vector_bytes:.2f}x the vectors' bytes"
