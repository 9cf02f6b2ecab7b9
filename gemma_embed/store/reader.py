"""Read outputs in every layout (single file, output shards, joined slices), in their order, lazily."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import torch

from gemma_embed.store.layout import index_path, output_files
from gemma_embed.store.tensors_file import FileRows, read_header


def _files(path: Path) -> list[Path]:
    files = output_files(Path(path))
    if not files:
        raise FileNotFoundError(f"{path}: no such output (neither the file nor its .index.json)")
    return files


def _index_keys(path: Path) -> dict[str, int] | None:
    """key -> file number, in order, when `path` is (or names) an index that lists keys."""
    index = path if path.suffix == ".json" else index_path(path)
    if path.suffix != ".json" and path.exists():
        return None
    if not index.exists():
        return None
    return json.loads(index.read_text()).get("keys")


def _entries(path: Path, stack: ExitStack) -> Iterator[tuple[str, dict, Callable[[], torch.Tensor], dict]]:
    """(key, item metadata, rows reader, file header) in order; rows are read only when asked."""
    opened = [FileRows(file, stack) for file in _files(path)]
    order = _index_keys(path)
    if order is None:  # a single file, or files whose concatenation is the order
        order = {key: number for number, file in enumerate(opened) for key in file.keys}
    positions = [{key: i for i, key in enumerate(file.keys)} for file in opened]
    for key, number in order.items():
        file, i = opened[number], positions[number][key]
        yield key, file.items[i], (lambda file=file, i=i: file.rows(i)), file.metadata


def read_metadata(path: str | os.PathLike) -> dict:
    """The header of an output with `keys` and `items` decoded from JSON, in order (for shards or slices:
    the first file's header with every file's keys and items). Reads no embeddings."""
    meta: dict = {}
    keys: list[str] = []
    items: list[dict] = []
    with ExitStack() as stack:
        for key, item, _, header in _entries(Path(path), stack):
            meta = meta or header
            keys.append(key)
            items.append(item)
    if not meta:
        meta = read_header(_files(Path(path))[0])
    return {**meta, "keys": keys, "items": items}


def iter_items(path: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor, dict]]:
    """Yield (key, rows, item metadata) one item at a time, reading only that item's rows, in order."""
    with ExitStack() as stack:
        for key, item, rows, _ in _entries(Path(path), stack):
            yield key, rows(), item


def load(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every item's rows, keyed as in the output, in order."""
    return {key: rows for key, rows, _ in iter_items(path)}
