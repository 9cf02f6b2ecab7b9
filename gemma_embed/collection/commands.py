"""What `gemma-embed dedup` and `gemma-embed map` do once their options are parsed (cli.py only parses and calls
these): check where each file goes before any work, compute, write the table (beside the output unless `-o` says
otherwise) and the drop list, and return the summary record the command prints."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from gemma_embed.collection import groups_path, map_path
from gemma_embed.locations import Location, location
from gemma_embed.locations.written import Written, is_stdout, output_location

GROUPS_TABLE = Written("a duplicates table", ".parquet", "the gallery reads it from a file; --drop-list - streams")
MAP_TABLE = Written("a map table", ".parquet", "the gallery reads it from a file")


def _table_destination(
    output: Location, given: str | os.PathLike | None, default: Location, kind: Written, overwrite: bool
) -> Location:
    """Where the table goes: `-o` (checked as every named file is: its suffix, its folder, an existing file only
    with --overwrite), else beside the output (the tool's own file there: renewed each time, as `index` renews
    OUT.search-index)."""
    from gemma_embed.store.layout import check_destination, check_output_folder

    if given is None:
        check_output_folder(default)
        return default
    place = check_destination(given, kind, overwrite)
    assert place is not None  # the kind does not stream
    return place


def _check_output(output: Location) -> None:
    """A missing output is one line before any work (the readers' own `no such output` line)."""
    from gemma_embed.store.layout import output_files

    if not output_files(output):
        raise FileNotFoundError(f"{output}: no such output (neither the file nor its .index.json)")


def run_dedup(
    path: str,
    threshold: float,
    keep: str,
    method: str,
    destination: str | os.PathLike | None,
    drop_list: str | None,
    overwrite: bool,
    stdout_text: Callable[[str], None],
) -> dict:
    """`gemma-embed dedup`: the groups' table written, the drop list written (or given to `stdout_text` for `-`),
    and the summary record."""
    from gemma_embed.collection.dedup import dedup
    from gemma_embed.collection.tables import read_record, write_table
    from gemma_embed.export import escape_name
    from gemma_embed.store.atomic import atomic_write_text
    from gemma_embed.store.layout import check_output_folder, refuse_existing

    output = output_location(path)
    _check_output(output)
    table_at = _table_destination(output, destination, groups_path(output), GROUPS_TABLE, overwrite)
    drop_at = None
    if drop_list is not None and not is_stdout(drop_list):
        drop_at = location(drop_list)
        check_output_folder(drop_at)
        refuse_existing(drop_at, overwrite)
    started = time.perf_counter()
    table = dedup(output, threshold=threshold, keep=str(keep), method=str(method))
    write_table(table, table_at)
    record = read_record(table)
    drop = [key for key, kept in zip(table["key"].to_pylist(), table["keep"].to_pylist(), strict=True) if not kept]
    text = "".join(escape_name(key) + "\n" for key in drop)
    if drop_at is not None:
        atomic_write_text(drop_at, text)
    elif drop_list is not None:
        stdout_text(text)
    summary = {
        "type": "dedup",
        "output": str(output),
        "groups": record["groups"],
        "drop": record["drop"],
        "items": record["items"],
        "threshold": record["threshold"],
        "keep": record["keep"],
        "method": record["method"],
        "recall": record["recall"],
        "table": str(table_at),
        **({"drop_list": str(drop_at)} if drop_at is not None else {}),
        "seconds": round(time.perf_counter() - started, 3),
    }
    return summary


def run_map(path: str, seed: int, sample: int, destination: str | os.PathLike | None, overwrite: bool) -> dict:
    """`gemma-embed map`: the map's table written, and the summary record."""
    from gemma_embed.collection.layout import layout
    from gemma_embed.collection.tables import read_record, write_table

    output = output_location(path)
    _check_output(output)
    table_at = _table_destination(output, destination, map_path(output), MAP_TABLE, overwrite)
    started = time.perf_counter()
    table = layout(output, seed=seed, sample=sample)
    write_table(table, table_at)
    record = read_record(table)
    return {
        "type": "map",
        "output": str(output),
        "items": record["items"],
        "clusters": record["clusters"],
        "in_no_cluster": int((table["cluster"].to_numpy() < 0).sum()),
        "fitted_on": record["fitted_on"],
        "seed": record["seed"],
        "table": str(table_at),
        "seconds": round(time.perf_counter() - started, 3),
    }
