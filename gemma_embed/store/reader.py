"""Read outputs in every layout (single file, output shards, joined slices), in their order, lazily."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gemma_embed import FORMAT
from gemma_embed.locations import Location
from gemma_embed.locations.written import output_location
from gemma_embed.store.damage import DamagedFile
from gemma_embed.store.layout import index_path, output_files, read_index
from gemma_embed.store.tensors_file import (
    FileRows,
    _metadata,
    _safe_open,
    checked_offsets,
    json_list,
    read_header,
)

if TYPE_CHECKING:
    import torch

# What to do about a gemma-embed output that is damaged or of another format version; a file that is no output at
# all (README.md) gets no such advice: there is nothing to rebuild.
REBUILD = "embed the inputs again with --overwrite to rebuild it"


def _told(exc: DamagedFile) -> DamagedFile:
    return exc.told(fix=REBUILD) if exc.ours else exc


def _files(path: Location) -> list[Location]:
    files = output_files(path)
    if not files:
        raise FileNotFoundError(f"{path}: no such output (neither the file nor its .index.json)")
    return files


def _index_keys(path: Location) -> tuple[Location, dict[str, int]] | None:
    """(the index, key -> file number in order) when `path` is (or names) an index that lists keys."""
    index = path if path.suffix == ".json" else index_path(path)
    if path.suffix != ".json" and path.exists():
        return None
    if not index.exists():
        return None
    keys = read_index(index).get("keys")
    return (index, keys) if keys else None


def _open_rows(file: Location, stack: ExitStack, framework: str) -> FileRows:
    try:
        return FileRows(file, stack, framework)
    except DamagedFile as exc:
        raise _told(exc) from None


def _entries(
    path: Location, stack: ExitStack, framework: str = "pt"
) -> Iterator[tuple[str, dict, Callable[[], torch.Tensor], FileRows]]:
    """(key, item metadata, rows reader, its file) in order; rows are read only when asked (as numpy arrays with
    `framework="numpy"`, which imports no torch)."""
    opened = [_open_rows(file, stack, framework) for file in _files(path)]
    positions = [{key: i for i, key in enumerate(file.keys)} for file in opened]
    indexed = _index_keys(path)
    if indexed is None:  # a single file, or files whose concatenation is the order
        order = {key: number for number, file in enumerate(opened) for key in file.keys}
    else:
        index, order = indexed
        if sum(len(file.keys) for file in opened) != len(order):
            raise DamagedFile(index, "its keys are not those of its files", f"{FORMAT} index", REBUILD)
    for key, number in order.items():
        file, i = opened[number], positions[number].get(key)
        if i is None:
            raise DamagedFile(index, f"names {key!r} in {file.file}, which does not hold it", f"{FORMAT} index")
        yield key, file.items[i], functools.partial(file.rows, i), file


def read_metadata(path: str | os.PathLike) -> dict:
    """The header of an output with `keys` and `items` decoded from JSON, in order (for shards or slices:
    the first file's header with every file's keys and items). Reads no embeddings, imports no torch."""
    meta: dict = {}
    keys: list[str] = []
    items: list[dict] = []
    with ExitStack() as stack:
        for key, item, _, file in _entries(output_location(path), stack, "numpy"):
            meta = meta or file.metadata
            keys.append(key)
            items.append(item)
    if not meta:
        meta = read_header(_files(output_location(path))[0])
    return {**meta, "keys": keys, "items": items}


def item_shapes(path: str | os.PathLike) -> Iterator[tuple[str, int, int, dict]]:
    """(key, rows, width, item metadata) of each item in order, from the files' headers: no embedding is read
    and torch is not imported (`gemma-embed inspect`)."""
    with ExitStack() as stack:
        for key, item, _, file in _entries(output_location(path), stack, "numpy"):
            yield key, item["rows"], file.width, item


def iter_items(path: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor, dict]]:
    """Yield (key, rows, item metadata) one item at a time, reading only that item's rows, in order."""
    with ExitStack() as stack:
        for key, item, rows, _ in _entries(output_location(path), stack):
            yield key, rows(), item


def load(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every item's rows, keyed as in the output, in order."""
    return {key: rows for key, rows, _ in iter_items(path)}


# ------------------------------------------------------------------------------------------ block reader


@dataclass(frozen=True)
class OutputFile:
    """One file of an output, without its embeddings: whose rows are where (row r of the file belongs to item i
    where offsets[i] <= r < offsets[i + 1]). Keys and items are decoded from the header when first asked for."""

    path: Location
    header: dict
    offsets: torch.Tensor  # int64 [N + 1]

    @functools.cached_property
    def keys(self) -> list[str]:
        return self._checked("keys", str)

    @functools.cached_property
    def items(self) -> list[dict]:
        return self._checked("items", dict)

    def _checked(self, field: str, element: type) -> list:
        try:
            values = json_list(self.path, self.header, field, element)
            if len(values) != len(self.offsets) - 1:
                raise DamagedFile(self.path, f"{len(values)} {field} but {len(self.offsets) - 1} items in its offsets")
            if field == "items" and [item.get("rows") for item in values] != self.offsets.diff().tolist():
                raise DamagedFile(self.path, "offsets do not match the items' row counts")
        except DamagedFile as exc:
            raise _told(exc) from None
        return values


@dataclass(frozen=True)
class RowBlock:
    """Consecutive rows of one file: rows `start` .. `start + len(rows)` of `files[file]`."""

    file: int
    start: int
    rows: torch.Tensor  # (n, D), in the stored dtype


def output_index(path: str | os.PathLike) -> list[OutputFile]:
    """Every file of an output (a single file, or the shards its index lists, in that order) with its keys, items
    and offsets; reads no embeddings."""
    files = []
    for file in _files(output_location(path)):
        try:
            with _safe_open(file) as fh:
                header = _metadata(file, fh)
                offsets = checked_offsets(file, fh)  # keys and items are checked against them when decoded
        except DamagedFile as exc:
            raise _told(exc) from None
        files.append(OutputFile(file, header, offsets))
    return files


def iter_row_blocks(
    path: str | os.PathLike, rows: int = 65_536, files: list[OutputFile] | None = None
) -> Iterator[RowBlock]:
    """The output's embeddings in blocks of at most `rows` rows, file by file. safetensors maps each file and
    copies out only the block asked for, so an output far larger than memory is read with one block in RAM.
    `files`: the output's `output_index`, when the caller has it (saves reading a shard index again)."""
    size = max(1, int(rows))
    paths = [f.path for f in files] if files is not None else _files(output_location(path))
    for number, file in enumerate(paths):
        with _safe_open(file) as fh:
            embeddings = fh.get_slice("embeddings")
            total = embeddings.get_shape()[0]
            for start in range(0, total, size):
                yield RowBlock(number, start, embeddings[start : min(start + size, total)])
