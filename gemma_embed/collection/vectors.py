"""One unit vector per item of an output, the input of `dedup` and `layout`.

A retrieval output has one row per item: that row, L2-normalised. An output of soft tokens (several rows per item)
gives each item the mean of its rows, L2-normalised (`pooled`): the same vector `--pool mean` would have written.
Rows are read a block at a time (`store.iter_row_blocks`, memory-mapped), so the only array the size of the
collection is the result: N x D float32 (1M x 768: 3.1 GB).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from gemma_embed.locations import Location
from gemma_embed.locations.written import output_location

READ_BLOCK_ROWS = 65_536  # 200 MB of float32 at 768 wide: the one block in memory besides the result


@dataclass(frozen=True)
class ItemVectors:
    """The output's items in its order: keys, metadata, and one unit vector each (float32 [N, D]); `pooled` when
    the vectors are means of several rows."""

    output: Location
    keys: list[str]
    items: list[dict]
    vectors: np.ndarray
    pooled: bool

    def paths(self) -> list[str]:
        """Each item's source as its metadata names it (its key where it names none)."""
        return [str(item.get("path", key)) for key, item in zip(self.keys, self.items, strict=True)]


def item_vectors(output: str | os.PathLike) -> ItemVectors:
    """Every item's unit vector (see the module's note), in output order. An item whose rows sum to zero (a zero
    vector) stays zero: it is similar to nothing."""
    import torch

    from gemma_embed.store import iter_row_blocks, output_index

    where = output_location(output)
    files = output_index(where)
    keys = [key for file in files for key in file.keys]
    items = [item for file in files for item in file.items]
    bounds = np.concatenate([[0], np.cumsum([len(f.offsets) - 1 for f in files])]).astype(np.int64)
    rows_per_item = np.concatenate([f.offsets.diff().numpy() for f in files]) if files else np.zeros(0, np.int64)
    count = len(keys)
    width = _width(files)
    pooled = bool(count) and bool((rows_per_item != 1).any())
    vectors = np.zeros((count, width), np.float32)
    for block in iter_row_blocks(where, READ_BLOCK_ROWS, files):
        rows = block.rows.to(torch.float32).numpy()
        offsets = files[block.file].offsets.numpy()
        first_row, end_row = block.start, block.start + len(rows)
        if not pooled:  # one row per item: rows are items
            begin = int(bounds[block.file]) + first_row
            vectors[begin : begin + len(rows)] = rows
            continue
        # the file's items that have rows in this block, and where each one's rows start in it
        lo = int(np.searchsorted(offsets, first_row, side="right")) - 1
        hi = int(np.searchsorted(offsets, end_row, side="left"))
        starts = np.clip(offsets[lo:hi], first_row, end_row) - first_row
        touched = np.arange(lo, hi)
        nonempty = starts < np.clip(offsets[lo + 1 : hi + 1], first_row, end_row) - first_row
        starts, touched = starts[nonempty], touched[nonempty]
        if len(starts):
            vectors[bounds[block.file] + touched] += np.add.reduceat(rows, starts, axis=0)
    _normalise(vectors)
    order = _output_order(where, keys)
    if order is not None:
        vectors = vectors[order]
        keys = [keys[i] for i in order]
        items = [items[i] for i in order]
    return ItemVectors(where, keys, items, vectors, pooled)


def _width(files) -> int:
    from safetensors import safe_open

    for file in files:
        with file.path.input_by_name() as (_, name), safe_open(name, framework="numpy") as fh:
            return int(fh.get_slice("embeddings").get_shape()[1])
    return 0


def _normalise(vectors: np.ndarray, block: int = READ_BLOCK_ROWS) -> None:
    """In place, a block at a time (no second N x D array): rows to unit length, zero rows left zero."""
    for begin in range(0, len(vectors), block):
        part = vectors[begin : begin + block]
        norms = np.linalg.norm(part, axis=1, keepdims=True)
        np.divide(part, norms, out=part, where=norms > 0)


def _output_order(where: Location, keys: list[str]) -> np.ndarray | None:
    """The permutation from the files' concatenation to the output's order, where a shard index lists its keys in
    another order; None when they are the same order (the usual case: nothing is copied)."""
    from gemma_embed.store import read_metadata

    if where.suffix != ".json" and where.exists():
        return None  # a single file: its order is the output's
    listed = read_metadata(where)["keys"]
    if listed == keys:
        return None
    position = {key: i for i, key in enumerate(keys)}
    return np.asarray([position[key] for key in listed], np.int64)
