"""The groups' and the map's parquet tables: built from a computation's arrays, written atomically beside the
output (or where asked), and the record in each table's schema metadata that says which output it was computed
from (`row_table.fingerprint`: every file's name, size, time and sampled digest) and how. A table whose record
does not match the output as it is now is stale (`stale_because`): `kept.ensure_groups` and `kept.ensure_map` compute
it again.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gemma_embed.collection import GROUP_COLUMNS, MAP_COLUMNS
from gemma_embed.collection.vectors import as_text
from gemma_embed.locations import Location, location
from gemma_embed.locations.written import output_location

if TYPE_CHECKING:
    import pyarrow as pa

    from gemma_embed.collection.vectors import ItemVectors

RECORD_KEY = b"gemma-embed"
GROUPS_FORMAT = "gemma-embed-groups/1"
MAP_FORMAT = "gemma-embed-map/1"


class GroupsReport(Protocol):
    """What a groups' table records of how it was made (`dedup.DedupReport`)."""

    method: str
    threshold: float
    keep: str
    items: int
    pairs: int
    same_content: int
    recall: float | None
    settings: dict


def output_fingerprint(output: str | os.PathLike | Location, files: list[Location] | None = None) -> list[dict]:
    """Each file of the output: name, size, modification time and sampled digest (what `compare_fingerprint`
    checks), read from a few blocks of each file, not the whole of it. `files`: the output's `listing` where the
    caller has it (listing a sharded output reads its index, which names every key)."""
    from gemma_embed.store.digests import sampled_sha256
    from gemma_embed.store.row_table import fingerprint, listing

    where = output_location(output)
    files = listing(where) if files is None else files
    entries = fingerprint(where, files=files)
    for entry, file in zip(entries, files, strict=True):
        with file.open_input() as fh:
            size, _ = file.size_and_time(fh)
            entry["sampled_sha256"] = sampled_sha256(fh, size)
    return entries


def _table(columns: dict[str, Any], record: dict) -> pa.Table:
    import pyarrow as pa

    table = pa.table(columns)
    return table.replace_schema_metadata({RECORD_KEY: json.dumps(record, sort_keys=True).encode()})


def groups_table(
    found: ItemVectors,
    order: np.ndarray,
    groups: np.ndarray,
    kept: np.ndarray,
    similarity: np.ndarray,
    report: GroupsReport,
) -> pa.Table:
    """The groups' table (`collection.GROUP_COLUMNS`, then `item`) with its record."""
    import pyarrow as pa

    keep_mask = np.zeros(found.count, bool)
    keep_mask[kept] = True
    columns = {
        "key": as_text(found.keys.take(order)),
        "group": pa.array(groups, pa.int64()),
        "keep": pa.array(keep_mask[order], pa.bool_()),
        "similarity": pa.array(np.asarray(similarity, np.float32), pa.float32()),
        "path": as_text(found.paths(order)),
        "item": pa.array(order, pa.int64()),
    }
    assert tuple(columns)[: len(GROUP_COLUMNS)] == GROUP_COLUMNS
    record = {
        "format": GROUPS_FORMAT,
        "output": output_fingerprint(found.output, found.listing),
        "vectors": "pooled" if found.pooled else "rows",
        "method": report.method,
        "threshold": report.threshold,
        "keep": report.keep,
        "items": report.items,
        "pairs": report.pairs,
        "same_content": report.same_content,
        "recall": report.recall,
        "settings": report.settings,
        "groups": len(kept),
        "drop": len(order) - len(kept),
    }
    return _table(columns, record)


def map_table(found: ItemVectors, xy: np.ndarray, clusters: np.ndarray, names: list[str], settings: dict) -> pa.Table:
    """The map's table (`collection.MAP_COLUMNS`, then `item`) with its record."""
    import pyarrow as pa

    columns = {
        "key": as_text(found.keys),
        "x": pa.array(xy[:, 0].astype(np.float32), pa.float32()),
        "y": pa.array(xy[:, 1].astype(np.float32), pa.float32()),
        "cluster": pa.array(clusters, pa.int64()),
        "cluster_name": pa.array([names[c] if c >= 0 else "" for c in clusters], pa.string()),
        "path": as_text(found.paths()),
        "item": pa.array(np.arange(found.count), pa.int64()),
    }
    assert tuple(columns)[: len(MAP_COLUMNS)] == MAP_COLUMNS
    record = {
        "format": MAP_FORMAT,
        "output": output_fingerprint(found.output, found.listing),
        "vectors": "pooled" if found.pooled else "rows",
        "items": found.count,
        "clusters": len(names),
        **settings,
    }
    return _table(columns, record)


def read_record(table_or_path: pa.Table | str | os.PathLike | Location) -> dict:
    """The record of a groups' or map's table (a pyarrow Table, or a parquet file: only its schema is read);
    a ValueError naming the file when it has none."""
    import pyarrow.parquet as pq

    if isinstance(table_or_path, (str, os.PathLike, Location)):
        where = location(table_or_path)
        with where.open_input() as fh:
            schema = pq.read_schema(fh)
        name = str(where)
    else:
        schema, name = table_or_path.schema, "table"
    raw = (schema.metadata or {}).get(RECORD_KEY)
    try:
        record = json.loads(raw) if raw is not None else None
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict) or record.get("format") not in (GROUPS_FORMAT, MAP_FORMAT):
        raise ValueError(f"{name}: not a gemma-embed groups or map table (no record in its metadata)")
    return record


def write_table(table: pa.Table, path: str | os.PathLike | Location) -> Location:
    """The table as one parquet file, whole or not at all (a temporary file renamed into place)."""
    import pyarrow.parquet as pq

    where = location(path)
    with where.atomic_write() as fh:
        pq.write_table(table, fh, compression="zstd")
    return where


def read_table(path: str | os.PathLike | Location) -> pa.Table:
    import pyarrow.parquet as pq

    with location(path).open_input() as fh:
        return pq.read_table(fh)


def stale_because(path: str | os.PathLike | Location, output: str | os.PathLike | Location, wanted: dict) -> str | None:
    """None when the table at `path` was computed from the output as it is now with the `wanted` settings (those
    given: a None value asks nothing); else one sentence saying why it is not."""
    from gemma_embed.store.row_table import compare_fingerprint

    where = location(path)
    if not where.lexists():
        return f"{where}: missing"
    try:
        record = read_record(where)
    except (OSError, ValueError) as exc:
        return str(exc)
    changed = compare_fingerprint(record["output"], output_location(output))
    if changed is not None:
        return f"{where}: the output changed ({changed})"
    for name, value in wanted.items():
        if value is not None and record.get(name) != value:
            return f"{where}: made with {name}={record.get(name)!r}, not {value!r}"
    return None
