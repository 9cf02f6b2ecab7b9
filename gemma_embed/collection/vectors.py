"""One unit vector per item of an output, the input of `dedup` and `layout`, read a block at a time.

A retrieval output has one row per item: that row, L2-normalised. An output of soft tokens (several rows per item)
gives each item the mean of its rows, L2-normalised (`pooled`): the same vector `--pool mean` would have written.

`item_rows` opens an output without reading its vectors: its keys and the items' metadata as compact columns
(`ItemVectors.keys`, `ItemFacts`), and `StoredRows`, which reads the unit vectors of a block of items, or of any
items, from the files when asked (plain reads into fresh arrays, normalised as they are read), so that `dedup`
holds no array the size of the collection. Rows of a pooled output are summed once into a temporary file of one
float32 row per item (N x D x 4 bytes, in the system's temporary folder: $TMPDIR; deleted when closed), read the
same way. `item_vectors` reads every vector into memory (`HeldRows`: N x D float32, 1M x 768 is 3.1 GB), for
`layout`, which needs them all at once.

A vector is the same bits whichever way it is read (a block, a gathered row, the whole): each row is normalised
on its own (tests/integration/test_dedup_memory.py checks the readers against each other).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from gemma_embed.locations import Location, scratch_file
from gemma_embed.locations.written import output_location

if TYPE_CHECKING:
    import pyarrow as pa

READ_BLOCK_ROWS = 65_536  # rows of a pooled output summed at once (200 MB of float32 at 768 wide)
NORMALISE_ROWS = 4_096
# Gathered rows (`StoredRows.take`): rows at most SPAN_GAP apart are read with one read of the rows between,
# at most SPAN_ROWS rows a read.
SPAN_GAP = 8
SPAN_ROWS = 4_096
STORED = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # bfloat16: the top half of a float32


# ------------------------------------------------------------------------------------------ the rows


class UnitRows:
    """The items' unit vectors (float32, `count` x `width`), in output order, read as asked: `block(begin, end)`
    for items begin..end, `take(ids)` for any items (in the order given). Every array returned is the caller's."""

    count: int
    width: int

    def block(self, begin: int, end: int) -> np.ndarray:
        raise NotImplementedError

    def take(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def whole(self) -> np.ndarray:
        """Every vector: N x D float32 (readers of everything at once: `layout`)."""
        return self.block(0, self.count)


class HeldRows(UnitRows):
    """Unit vectors held in memory (an N x D float32 array); `block` gives views of it, not copies."""

    def __init__(self, vectors: np.ndarray):
        self.vectors = np.ascontiguousarray(vectors, np.float32)
        self.count, self.width = (int(n) for n in vectors.shape)

    def block(self, begin: int, end: int) -> np.ndarray:
        return self.vectors[begin:end]

    def take(self, ids: np.ndarray) -> np.ndarray:
        return self.vectors[np.asarray(ids, np.int64)]

    def whole(self) -> np.ndarray:
        return self.vectors


@dataclass(frozen=True)
class _Segment:
    """A run of items stored one row each: `items` rows of `dtype` from byte `start` of an open file, the items
    `first`.. of the files' concatenation."""

    fh: IO[bytes]
    start: int
    dtype: str
    first: int
    items: int


class StoredRows(UnitRows):
    """Unit vectors read from open files (the output's own, or the pooled sums' temporary file), one row an item,
    normalised as they are read. `order`: the items of the files' concatenation in output order (None: the same
    order)."""

    def __init__(self, segments: list[_Segment], width: int, order: np.ndarray | None):
        self.segments = segments
        self.width = width
        self.count = sum(segment.items for segment in segments)
        self.order = order
        self._firsts = np.asarray([segment.first for segment in segments], np.int64)

    def _read(self, segment: _Segment, begin: int, end: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows begin..end of a segment as float32, not normalised (into `out` where given)."""
        stored = np.dtype(STORED[segment.dtype])
        offset = segment.start + begin * self.width * stored.itemsize
        if segment.dtype == "F32" and out is not None:
            _read_into(segment.fh, offset, out)
            return out
        raw = np.empty((end - begin, self.width), stored)
        _read_into(segment.fh, offset, raw)
        if segment.dtype == "BF16":
            rows = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            rows = raw.astype(np.float32, copy=False)
        if out is not None:
            out[...] = rows
            return out
        return rows

    def block(self, begin: int, end: int) -> np.ndarray:
        begin, end = max(0, begin), min(self.count, end)
        if self.order is not None:
            return self.take(np.arange(begin, end, dtype=np.int64))
        out = np.empty((max(0, end - begin), self.width), np.float32)
        for segment in self.segments:
            lo, hi = max(begin, segment.first), min(end, segment.first + segment.items)
            if lo < hi:
                self._read(segment, lo - segment.first, hi - segment.first, out[lo - begin : hi - begin])
        _normalise(out)
        return out

    def take(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64).reshape(-1)
        stored = ids if self.order is None else self.order[ids]
        by_row = np.argsort(stored, kind="stable")
        rows = stored[by_row]
        out = np.empty((len(ids), self.width), np.float32)
        if not len(ids):
            return out
        segment_of = np.searchsorted(self._firsts, rows, side="right") - 1
        # runs of rows at most SPAN_GAP apart in one segment; each read in spans of at most SPAN_ROWS rows
        cut = np.flatnonzero((np.diff(rows) > SPAN_GAP) | (np.diff(segment_of) != 0)) + 1
        for a, b in zip(np.concatenate([[0], cut]).tolist(), np.concatenate([cut, [len(rows)]]).tolist(), strict=True):
            segment = self.segments[int(segment_of[a])]
            while a < b:
                first = int(rows[a])
                stop = a + int(np.searchsorted(rows[a:b], first + SPAN_ROWS, side="left"))
                last = int(rows[stop - 1])
                span = self._read(segment, first - segment.first, last + 1 - segment.first)
                out[by_row[a:stop]] = span[rows[a:stop] - first]
                a = stop
        _normalise(out)
        return out


def _read_into(fh: IO[bytes], offset: int, out: np.ndarray) -> None:
    """Read `out`'s bytes from `offset` of an open file straight into it. Plain reads, not a memory map: a mapped
    output's pages would count in the process's resident memory (3 GB more at 1M x 768)."""
    fh.seek(offset)
    view = out.reshape(-1).view(np.uint8).data
    done = 0
    while done < len(view):
        got = fh.readinto(view[done:])  # type: ignore[attr-defined]
        if not got:
            raise ValueError(f"{getattr(fh, 'name', 'output')}: shorter than its header says (truncated?)")
        done += got


def _normalise(vectors: np.ndarray, block: int = NORMALISE_ROWS) -> None:
    """In place, a block at a time (the squares are a temporary the block's size): rows to unit length, zero rows
    left zero (each row on its own: the same bits whichever rows are normalised together)."""
    for begin in range(0, len(vectors), block):
        part = vectors[begin : begin + block]
        norms = np.linalg.norm(part, axis=1, keepdims=True)
        np.divide(part, norms, out=part, where=norms > 0)


# ------------------------------------------------------------------------------------------ the items


def _numbers(values: list[Any]) -> np.ndarray:
    """float64 of each value (NaN where it is none, or no number)."""
    if set(map(type, values)) <= {type(None), int, float}:
        try:
            return np.asarray(values, np.float64)  # None is NaN
        except OverflowError:
            pass
    return np.fromiter((_number(value) for value in values), np.float64, len(values))


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return float("nan")


def text_column(values: Sequence[str | None]) -> pa.Array:
    """Strings as a pyarrow column. A value that is no UTF-8 (a file name that is not, surrogate-escaped by Python)
    makes it a binary column of the values' bytes with the surrogates kept (`surrogatepass`); `as_text` turns it
    back into strings where a table is written (and fails there for such a value, as pyarrow does)."""
    import pyarrow as pa

    try:
        return pa.array(values, pa.string())
    except UnicodeEncodeError:
        return pa.array([None if v is None else v.encode("utf-8", "surrogatepass") for v in values], pa.binary())


def concat_text(parts: list[pa.Array]) -> pa.Array:
    """`text_column`s as one (binary where one of them is)."""
    import pyarrow as pa

    if not parts:
        return pa.array([], pa.string())
    if all(part.type == pa.string() for part in parts):
        return pa.concat_arrays(parts)
    return pa.concat_arrays([part.cast(pa.binary()) for part in parts])


def as_text(column: pa.Array) -> pa.Array:
    """A `text_column` as pyarrow strings."""
    import pyarrow as pa

    if column.type == pa.string():
        return column
    values = column.to_pylist()
    return pa.array([None if v is None else v.decode("utf-8", "surrogatepass") for v in values], pa.string())


@dataclass(frozen=True)
class ItemFacts:
    """What dedup and map read of the items' metadata, as columns: `path` and the content hash (`sha256`) as
    pyarrow strings (null where an item has none), the size (`width` x `height` where given: `pixels`; `bytes`)
    and `mtime` as float64 (NaN where none). A million items' metadata as dicts is 400 MB; as these, 100 MB."""

    paths: pa.Array
    digests: pa.Array
    pixels: np.ndarray
    sizes: np.ndarray
    mtimes: np.ndarray

    @classmethod
    def of(cls, items: list[dict]) -> ItemFacts:
        paths = [item.get("path") for item in items]
        digests = [item.get("sha256") for item in items]
        return cls(
            text_column([None if path is None else str(path) for path in paths]),
            text_column([d if isinstance(d, str) and d else None for d in digests]),
            _numbers([item.get("width") for item in items]) * _numbers([item.get("height") for item in items]),
            _numbers([item.get("bytes") for item in items]),
            _numbers([item.get("mtime") for item in items]),
        )

    @classmethod
    def concat(cls, parts: list[ItemFacts]) -> ItemFacts:
        if not parts:
            return cls.of([])
        return cls(
            concat_text([part.paths for part in parts]),
            concat_text([part.digests for part in parts]),
            *(np.concatenate([getattr(part, name) for part in parts]) for name in ("pixels", "sizes", "mtimes")),
        )

    def take(self, order: np.ndarray) -> ItemFacts:
        return ItemFacts(
            self.paths.take(order), self.digests.take(order), self.pixels[order], self.sizes[order], self.mtimes[order]
        )


@dataclass(frozen=True)
class ItemVectors:
    """The output's items in its order: keys (pyarrow strings), `facts` (ItemFacts), the unit vectors (`rows`:
    read as asked, `StoredRows`, or held, `HeldRows`; `pooled` when they are means of several rows), and the files
    a table's record fingerprints (`listing`: the shard index and the files; None: listed again when asked)."""

    output: Location
    keys: pa.Array
    facts: ItemFacts
    rows: UnitRows
    pooled: bool
    listing: list[Location] | None = None

    @property
    def count(self) -> int:
        return len(self.keys)

    @property
    def vectors(self) -> np.ndarray:
        """Every unit vector, N x D float32 (held ones as they are; stored ones read whole)."""
        return self.rows.whole()

    def paths(self, ids: np.ndarray | None = None) -> pa.Array:
        """Each item's source as its metadata names it (its key where it names none), of every item or of `ids`."""
        import pyarrow as pa
        import pyarrow.compute as pc

        paths, keys = self.facts.paths, self.keys
        if ids is not None:
            paths, keys = paths.take(ids), keys.take(ids)
        if paths.type != keys.type:  # one of them binary (`text_column`)
            paths, keys = paths.cast(pa.binary()), keys.cast(pa.binary())
        return pc.coalesce(paths, keys)


@contextmanager
def item_rows(output: str | os.PathLike | Location) -> Iterator[ItemVectors]:
    """The output's items (see the module's note) with their vectors read from the files as asked, while open."""
    with ExitStack() as stack:
        yield _open_items(output_location(output), stack)


def item_vectors(output: str | os.PathLike | Location) -> ItemVectors:
    """Every item's unit vector in memory (see the module's note), in output order. An item whose rows sum to
    zero (a zero vector) stays zero: it is similar to nothing."""
    with item_rows(output) as found:
        held = HeldRows(found.rows.whole())
    return ItemVectors(found.output, found.keys, found.facts, held, found.pooled, found.listing)


def _open_items(where: Location, stack: ExitStack) -> ItemVectors:
    """Each file's header in turn (its metadata dicts go once its columns are taken), then the files opened for
    reading (kept open by `stack`)."""
    import pyarrow as pa

    from gemma_embed.store.reader import _open_rows

    paths, indexed, listing = _files(where)
    keys: list[pa.Array] = []
    facts: list[ItemFacts] = []
    counts: list[np.ndarray] = []
    in_files: list[str] | None = [] if indexed is not None else None
    for path in paths:
        with ExitStack() as header:
            file = _open_rows(path, header, "numpy")
            keys.append(text_column(file.keys))
            if in_files is not None:
                in_files += file.keys
            facts.append(ItemFacts.of(file.items))
            counts.append(np.asarray([item["rows"] for item in file.items], np.int64))
            del file
    layouts = [_rows_layout(path) for path in paths]
    widths = {layout[2] for layout in layouts if layout[1]}
    if len(widths) > 1:
        raise ValueError(f"{where}: files of different widths {sorted(widths)}")
    width = widths.pop() if widths else 0
    pooled = any(bool((rows != 1).any()) for rows in counts)
    handles = [stack.enter_context(path.open_input()) for path in paths]
    if pooled:
        segments = [_pooled_sums(handles, counts, layouts, width, stack)]
    else:
        firsts = np.concatenate([[0], np.cumsum([len(c) for c in counts])]).tolist()
        segments = [
            _Segment(fh, data_start, dtype, first, len(file_counts))
            for fh, file_counts, (dtype, _, _, data_start), first in zip(handles, counts, layouts, firsts, strict=False)
        ]
    order = _output_order(listing[0], indexed, in_files) if indexed is not None and in_files is not None else None
    all_keys = concat_text(keys)
    all_facts = ItemFacts.concat(facts)
    if order is not None:
        all_keys, all_facts = all_keys.take(order), all_facts.take(order)
    rows = StoredRows(segments, width, order)
    pa.default_memory_pool().release_unused()  # the columns' builders' memory, which arrow's pool keeps otherwise
    return ItemVectors(where, all_keys, all_facts, rows, pooled, listing)


def _files(where: Location) -> tuple[list[Location], dict[str, int] | None, list[Location]]:
    """(the output's files, the shard index's keys when it lists them, the files a table's record fingerprints),
    reading a sharded output's index once (it lists every key: 1.5 s a million)."""
    from gemma_embed.store.layout import index_path, read_index

    if where.suffix != ".json" and where.exists():
        return [where], None, [where]
    index = where if where.suffix == ".json" else index_path(where)
    if not index.exists():
        raise FileNotFoundError(f"{where}: no such output (neither the file nor its .index.json)")
    content = read_index(index)
    files = [index.parent / name for name in content["shards"]]
    if not files:
        raise FileNotFoundError(f"{where}: no such output (neither the file nor its .index.json)")
    return files, content.get("keys") or None, [index, *files]


def _output_order(index: Location, indexed: dict[str, int], keys: list[str]) -> np.ndarray | None:
    """The permutation from the files' concatenation to the output's order, where a shard index lists its keys in
    another order; None when they are the same order (the usual case: nothing is copied). An index whose keys are
    not the files' is damaged (as the readers tell it)."""
    from gemma_embed import FORMAT
    from gemma_embed.store.damage import DamagedFile
    from gemma_embed.store.reader import REBUILD

    if len(indexed) == len(keys) and all(a == b for a, b in zip(indexed, keys, strict=True)):
        return None
    position = {key: i for i, key in enumerate(keys)}
    if len(indexed) != len(keys) or any(key not in position for key in indexed):
        raise DamagedFile(index, "its keys are not those of its files", f"{FORMAT} index", REBUILD)
    return np.asarray([position[key] for key in indexed], np.int64)


def _rows_layout(path: Location) -> tuple[str, int, int, int]:
    """(stored dtype, rows, width, byte offset of the first row) of one file's embeddings, from its header."""
    from gemma_embed.store.row_table import STORED_DTYPES, _tensor, read_file_header

    _, tensors, start = read_file_header(path)
    dtype, shape, data_start, _ = _tensor(path, tensors, start, "embeddings")
    if dtype not in STORED_DTYPES or len(shape) != 2:
        raise ValueError(f"{path}: embeddings of dtype {dtype} and shape {shape} are no vectors to compare")
    return dtype, int(shape[0]), int(shape[1]), data_start


def _pooled_sums(
    handles: Sequence[IO[bytes]],
    counts: list[np.ndarray],
    layouts: list[tuple[str, int, int, int]],
    width: int,
    stack: ExitStack,
) -> _Segment:
    """Each item's rows summed (float32, in the files' order; normalising the sum gives the mean's direction)
    into a temporary file, READ_BLOCK_ROWS rows read at a time: a segment of one row an item. An item whose rows
    cross a block's end is summed as the sum of each block's part."""
    out = stack.enter_context(scratch_file("gemma-embed-pooled-"))
    total = 0
    for fh, file_counts, (dtype, rows, _, data_start) in zip(handles, counts, layouts, strict=True):
        offsets = np.concatenate([[0], np.cumsum(file_counts)])
        file = _Segment(fh, data_start, dtype, 0, rows)
        reader = StoredRows([file], width, None)
        written = 0  # the file's items written so far
        carry = np.zeros(width, np.float32)  # the sum so far of item `written`, when it crosses a block's end
        for begin in range(0, rows, READ_BLOCK_ROWS):
            end = min(rows, begin + READ_BLOCK_ROWS)
            block = reader._read(file, begin, end)
            # the file's items that have rows in this block, and where each one's rows start in it
            lo = int(np.searchsorted(offsets, begin, side="right")) - 1
            hi = int(np.searchsorted(offsets, end, side="left"))
            starts = np.clip(offsets[lo:hi], begin, end) - begin
            stops = np.clip(offsets[lo + 1 : hi + 1], begin, end) - begin
            touched = np.arange(lo, hi)[starts < stops]
            sums = np.zeros((hi - written, width), np.float32)
            sums[0] = carry
            if len(touched):
                sums[touched - written] += np.add.reduceat(block, starts[starts < stops], axis=0)
            done = hi - 1 if offsets[hi] > end else hi  # the last item goes on in the next block
            out.write(sums[: done - written].tobytes())
            carry = sums[done - written].copy() if done < hi else np.zeros(width, np.float32)
            written = done
        out.write(np.zeros((len(file_counts) - written, width), np.float32).tobytes())  # items of no rows
        total += len(file_counts)
    out.flush()
    return _Segment(out, 0, "F32", 0, total)
