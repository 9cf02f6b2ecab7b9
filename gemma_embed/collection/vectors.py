"""One unit vector per item of an output, the input of `dedup` and `layout`.

A retrieval output has one row per item: that row, L2-normalised. An output of soft tokens (several rows per item)
gives each item the mean of its rows, L2-normalised (`pooled`): the same vector `--pool mean` would have written.
Rows are read a block at a time with plain reads (float32 rows of one-row items straight into place), so the
only array the size of the collection is the result: N x D float32 (1M x 768: 3.1 GB).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from gemma_embed.locations import Location
from gemma_embed.locations.written import output_location

READ_BLOCK_ROWS = 65_536  # 200 MB of float32 at 768 wide: the one block in memory besides the result


@dataclass(frozen=True)
class ItemVectors:
    """The output's items in its order: keys, one unit vector each (float32 [N, D]; `pooled` when the vectors are
    means of several rows), and of each item's metadata only what dedup and map read (`ItemFacts`): a million
    items' metadata as dicts is 400 MB more beside the vectors."""

    output: Location
    keys: list[str]
    facts: ItemFacts
    vectors: np.ndarray
    pooled: bool

    def paths(self) -> list[str]:
        """Each item's source as its metadata names it (its key where it names none)."""
        return [key if path is None else path for key, path in zip(self.keys, self.facts.paths, strict=True)]


@dataclass
class ItemFacts:
    """What dedup and map read of the items' metadata, as columns: `path`, the content hash (`sha256`), the size
    (`width` x `height` where given: `pixels`; `bytes`) and `mtime`; None or NaN where an item has none."""

    paths: list[str | None] = field(default_factory=list)
    digests: list[str | None] = field(default_factory=list)
    pixels: list[float] = field(default_factory=list)
    sizes: list[float] = field(default_factory=list)
    mtimes: list[float] = field(default_factory=list)

    def extend(self, items: list[dict]) -> None:
        for item in items:
            path, digest = item.get("path"), item.get("sha256")
            self.paths.append(None if path is None else str(path))
            self.digests.append(digest if isinstance(digest, str) and digest else None)
            self.pixels.append(_number(item.get("width")) * _number(item.get("height")))
            self.sizes.append(_number(item.get("bytes")))
            self.mtimes.append(_number(item.get("mtime")))

    @classmethod
    def of(cls, items: list[dict]) -> ItemFacts:
        facts = cls()
        facts.extend(items)
        return facts


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return float("nan")


def item_vectors(output: str | os.PathLike) -> ItemVectors:
    """Every item's unit vector (see the module's note), in output order. An item whose rows sum to zero (a zero
    vector) stays zero: it is similar to nothing."""
    from contextlib import ExitStack

    from gemma_embed.store.reader import _files, _open_rows

    where = output_location(output)
    keys: list[str] = []
    facts = ItemFacts()
    counts, paths = [], _files(where)
    for path in paths:  # one file's header at a time (its metadata dicts go with it), through the numpy reader
        with ExitStack() as stack:
            file = _open_rows(path, stack, "numpy")
            keys += file.keys
            facts.extend(file.items)
            counts.append(np.asarray([item["rows"] for item in file.items], np.int64))
    layouts = [_rows_layout(path) for path in paths]
    widths = {layout[2] for layout in layouts if layout[1]}
    if len(widths) > 1:
        raise ValueError(f"{where}: files of different widths {sorted(widths)}")
    width = widths.pop() if widths else 0
    pooled = any(bool((rows != 1).any()) for rows in counts)
    vectors = np.zeros((len(keys), width), np.float32)
    first_item = 0
    for path, file_counts, (dtype, rows, _, data_start) in zip(paths, counts, layouts, strict=True):
        offsets = np.concatenate([[0], np.cumsum(file_counts)])
        with path.open_input() as fh:
            for begin in range(0, rows, READ_BLOCK_ROWS):
                end = min(rows, begin + READ_BLOCK_ROWS)
                if not pooled and dtype == "F32":  # rows are items, stored as float32: read into place
                    _read_into(fh, data_start + begin * width * 4, vectors[first_item + begin : first_item + end])
                    continue
                block = _read_rows(fh, data_start, dtype, begin, end, width)
                if not pooled:
                    vectors[first_item + begin : first_item + end] = block
                    continue
                # the file's items that have rows in this block, and where each one's rows start in it
                lo = int(np.searchsorted(offsets, begin, side="right")) - 1
                hi = int(np.searchsorted(offsets, end, side="left"))
                starts = np.clip(offsets[lo:hi], begin, end) - begin
                stops = np.clip(offsets[lo + 1 : hi + 1], begin, end) - begin
                touched = np.arange(lo, hi)[starts < stops]
                if len(touched):
                    vectors[first_item + touched] += np.add.reduceat(block, starts[starts < stops], axis=0)
        first_item += len(offsets) - 1
    _normalise(vectors)
    order = _output_order(where, keys)
    if order is not None:
        vectors = vectors[order]
        keys = [keys[i] for i in order]
        facts = ItemFacts(*([column[i] for i in order] for column in vars(facts).values()))
    return ItemVectors(where, keys, facts, vectors, pooled)


def _rows_layout(path: Location) -> tuple[str, int, int, int]:
    """(stored dtype, rows, width, byte offset of the first row) of one file's embeddings, from its header."""
    from gemma_embed.store.row_table import STORED_DTYPES, _tensor, read_file_header

    _, tensors, start = read_file_header(path)
    dtype, shape, data_start, _ = _tensor(path, tensors, start, "embeddings")
    if dtype not in STORED_DTYPES or len(shape) != 2:
        raise ValueError(f"{path}: embeddings of dtype {dtype} and shape {shape} are no vectors to compare")
    return dtype, int(shape[0]), int(shape[1]), data_start


def _read_into(fh, offset: int, out: np.ndarray) -> None:
    """Read `out`'s bytes from `offset` of an open file straight into it. Plain reads, not a memory map: a mapped
    output's pages would count in the process's resident memory beside the vectors (3 GB more at 1M x 768)."""
    fh.seek(offset)
    view = memoryview(out.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        got = fh.readinto(view[done:])
        if not got:
            raise ValueError(f"{getattr(fh, 'name', 'output')}: shorter than its header says (truncated?)")
        done += got


def _read_rows(fh, data_start: int, dtype: str, begin: int, end: int, width: int) -> np.ndarray:
    """Rows begin..end of a file as float32 (bfloat16 is stored as the top half of a float32)."""
    stored = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[dtype]
    raw = np.empty((end - begin, width), stored)
    _read_into(fh, data_start + begin * width * raw.itemsize, raw)
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32, copy=False)


def _normalise(vectors: np.ndarray, block: int = READ_BLOCK_ROWS) -> None:
    """In place, a block at a time (no second N x D array): rows to unit length, zero rows left zero."""
    for begin in range(0, len(vectors), block):
        part = vectors[begin : begin + block]
        norms = np.linalg.norm(part, axis=1, keepdims=True)
        np.divide(part, norms, out=part, where=norms > 0)


def _output_order(where: Location, keys: list[str]) -> np.ndarray | None:
    """The permutation from the files' concatenation to the output's order, where a shard index lists its keys in
    another order; None when they are the same order (the usual case: nothing is copied)."""
    from gemma_embed.store.reader import _index_keys

    indexed = _index_keys(where)
    if indexed is None or list(indexed[1]) == keys:
        return None
    position = {key: i for i, key in enumerate(keys)}
    return np.asarray([position[key] for key in indexed[1]], np.int64)
