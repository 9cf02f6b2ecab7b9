"""`gemma-embed export`: an output as parquet (pandas, DuckDB, LanceDB) or .npy (numpy), streamed.

Items are read one at a time through the store's reader (every layout: single file, shards, joined slices) and
written in blocks, so an index larger than memory exports in bounded memory. Only the item metadata, which the
output's headers hold as JSON anyway, is read whole: a first pass over it fixes the parquet schema.

- parquet: a `key` column, one column per item metadata field (nested objects flattened to `a.b` names; lists of
  scalars as list columns; anything else as JSON text), and `embedding`: a fixed-size list of D numbers per item
  when every item has one row (pooled outputs), else the item's rows as a list of such lists.
- npy: `OUT.npy` with every row ([total_rows, D]), `OUT.keys.txt` with one key per line, and when items have
  other than one row, `OUT.offsets.npy` (int64 [N+1]: item i is rows[offsets[i]:offsets[i+1]]).
bfloat16 rows become float32 (numpy and parquet have no bfloat16); float32 and float16 stay as they are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gemma_embed.errors import UsageError

BLOCK_ITEMS = 4096  # items per parquet row group; rows flushed to the .npy memory map per block


def default_destination(path: Path, to: str) -> Path:
    """OUT.safetensors (or OUT.index.json) -> OUT.parquet / OUT.npy beside it."""
    path = Path(path)
    stem = path.name.removesuffix(".safetensors").removesuffix(".index.json")
    return path.with_name(f"{stem}.{to}")


def _numpy_rows(rows) -> np.ndarray:
    import torch

    if rows.dtype == torch.bfloat16:
        rows = rows.float()
    return rows.numpy()


def flatten(meta: dict, prefix: str = "") -> dict:
    """Nested objects become dotted column names; lists stay lists."""
    flat = {}
    for name, value in meta.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def _column_type(values: list):
    """The Arrow type of one metadata column over all items, or None when it must be stored as JSON text."""
    import pyarrow as pa

    try:
        return pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return None


def _items(path: Path) -> Iterator[tuple[str, np.ndarray, dict]]:
    from gemma_embed.store import iter_items

    for key, rows, item in iter_items(path):
        yield key, _numpy_rows(rows), item


def _checked_destination(path: Path, to: str, destination: Path | None, overwrite: bool) -> Path:
    destination = Path(destination) if destination else default_destination(path, to)
    if destination.exists() and not overwrite:
        raise UsageError(f"{destination}: exists; pass --overwrite to replace it")
    return destination


def export(
    path: str | os.PathLike, to: str, destination: str | os.PathLike | None = None, overwrite: bool = False
) -> dict:
    """Write `path` as parquet or npy; returns what was written (files, items, rows, dim)."""
    from gemma_embed.store import read_metadata

    path = Path(path)
    meta = read_metadata(path)  # keys and items only; no rows are read
    destination = _checked_destination(path, str(to), destination, overwrite)
    counts = [int(item["rows"]) for item in meta["items"]]
    if str(to) == "parquet":
        return _to_parquet(path, meta, counts, destination)
    return _to_npy(path, meta, counts, destination, overwrite)


# ------------------------------------------------------------------------------------------------ parquet


def _to_parquet(path: Path, meta: dict, counts: list[int], destination: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gemma_embed.store import atomic_path

    flat = [flatten(item) for item in meta["items"]]
    names = sorted({name for item in flat for name in item} - {"key"})
    types = {name: _column_type([item.get(name) for item in flat]) for name in names}
    one_row = all(count == 1 for count in counts)
    writer = None
    written = rows_total = 0
    dim = 0
    with atomic_path(destination) as tmp:
        block: list[tuple[str, np.ndarray, dict]] = []

        def flush() -> None:
            nonlocal writer, written
            if not block:
                return
            vectors = np.concatenate([rows for _, rows, _ in block])
            values = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)
            if not one_row:
                offsets = np.concatenate([[0], np.cumsum([rows.shape[0] for _, rows, _ in block])]).astype(np.int32)
                values = pa.ListArray.from_arrays(pa.array(offsets), values)
            columns = {"key": pa.array([key for key, _, _ in block], type=pa.string())}
            for name in names:
                column = [flatten(item).get(name) for _, _, item in block]
                kind = types[name]
                if kind is None:
                    columns[name] = pa.array([None if v is None else json.dumps(v) for v in column], type=pa.string())
                else:
                    columns[name] = pa.array(column, type=kind)
            columns["embedding"] = values
            table = pa.table(columns)
            if writer is None:
                writer = pq.ParquetWriter(str(tmp), table.schema)
            writer.write_table(table)
            written += len(block)
            block.clear()

        for key, rows, item in _items(path):
            dim = dim or int(rows.shape[1])
            rows_total += int(rows.shape[0])
            block.append((key.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), rows, item))
            if len(block) >= BLOCK_ITEMS:
                flush()
        flush()
        if writer is None:  # no item: an empty table with the key column
            pq.write_table(pa.table({"key": pa.array([], type=pa.string())}), str(tmp))
        else:
            writer.close()
    return {"files": [str(destination)], "items": written, "rows": rows_total, "dim": dim}


# ------------------------------------------------------------------------------------------------ npy


def _to_npy(path: Path, meta: dict, counts: list[int], destination: Path, overwrite: bool) -> dict:
    from gemma_embed.store import atomic_path, atomic_write_text

    keys_file = destination.with_suffix(".keys.txt")
    offsets_file = destination.with_suffix(".offsets.npy")
    one_row = all(count == 1 for count in counts)
    for extra in (keys_file, *([] if one_row else [offsets_file])):
        if extra.exists() and not overwrite:
            raise UsageError(f"{extra}: exists; pass --overwrite to replace it")
    broken = next((k for k in meta["keys"] if "\n" in k or "\r" in k), None)
    if broken is not None:
        raise UsageError(
            f"key {broken!r} holds a line break and cannot be one line of {keys_file.name}; export --to parquet instead"
        )
    total = sum(counts)
    items = _items(path)
    first = next(items, None)
    dim = int(first[1].shape[1]) if first else 0
    dtype = first[1].dtype if first else np.float32
    with atomic_path(destination) as tmp:
        array = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(total, dim))
        row = 0
        for n, (_, rows, _) in enumerate(_chain(first, items)):
            array[row : row + rows.shape[0]] = rows
            row += rows.shape[0]
            if n % BLOCK_ITEMS == BLOCK_ITEMS - 1:
                array.flush()  # bounded dirty pages, whatever the index's size
        array.flush()
        del array
    lines = "".join(k.encode("utf-8", "surrogateescape").decode("utf-8", "replace") + "\n" for k in meta["keys"])
    atomic_write_text(keys_file, lines)
    files = [str(destination), str(keys_file)]
    if not one_row:
        with atomic_path(offsets_file) as tmp, open(tmp, "wb") as fh:  # a file object: np.save adds no suffix
            np.save(fh, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), allow_pickle=False)
        files.append(str(offsets_file))
    return {"files": files, "items": len(counts), "rows": total, "dim": dim}


def _chain(first, rest):
    if first is not None:
        yield first
        yield from rest
