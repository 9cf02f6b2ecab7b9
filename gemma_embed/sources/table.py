"""Tables: rows of .parquet files (pyarrow), JSON-lines files (.jsonl, .jsonl.gz) and Hugging Face datasets (the
optional `datasets` extra) as items.

`--column NAME` names the media, or for the text command the texts; `--url-column NAME` a column of http(s) URLs,
each fetched by the fetch stage (sources/fetch.py: timeouts, retries, a per-host limit, the size limit). A media
column may hold the bytes themselves (a binary column), paths of files (a string column; a relative path is taken
from the parquet file's folder, or the dataset's), or the struct of `bytes` and `path` that `datasets` stores its
`Image`, `Audio` and `Video` features as, in saved datasets and parquet exports alike (the bytes when there are
some, else the path; the path's file name goes to the item's metadata as `name` and gives the bytes their
extension). The cells reach the tool's own decoders untouched: nothing in `datasets` decodes them (they are read as
Arrow data), so an image in a dataset becomes exactly what the same file would. A text column holds the texts
(strings, or UTF-8 bytes): a cell is one item, its UTF-8 bytes what a line of a text file would carry, so the same
text gives the same vector and content hash wherever it was read; a null or blank cell fails by key (never a silent
skip).

JSON lines are a table whose rows are the file's records (one JSON object a line, blank lines ignored): a row is
a record, counted from 0, and the fields are its columns. They are read a line at a time (gzip-decompressed as
they stream for .jsonl.gz): memory holds one record. A line that is no JSON object fails by key.

Rows are read a record batch of BATCH_ROWS rows at a time, row group by row group, and only the columns the run
needs: memory holds one batch, however many rows or row groups a file has. A row group that cannot be read fails
each of its rows that was not read yet, by key, and reading goes on with the next. A cell larger than the
collection's `max_item_bytes` fails by key: its length comes from the Arrow array's offsets, and the cell is never
copied out of the batch (the batch itself is pyarrow's: a memory-mapped dataset's cells are not even paged in).

A path cell names a file under its table's folder (the parquet file's, the dataset's): an absolute path, or one
that leads out of the folder (`..`, or a symbolic link), fails by key with the same line whether that file exists
or not (a table from elsewhere must not open, nor tell which paths exist on this machine) unless the collection
allows outside paths (--allow-outside-paths). A dataset from the hub has no folder: its path cells need that too.

Keys: `FILE:ROW` (the file keyed as any file is; ROW counts from 0 over the whole file) or, for a dataset,
`DATASET:SPLIT:ROW`; with `--key-column` the column's value (it must be unique: a repeat fails, naming the row).
Each item's metadata has `row`, and the `--keep-columns` (scalar columns: numbers, strings, booleans, dates as
ISO text) by their own names; a name the tool writes itself (RESERVED) is refused, so nothing is overwritten.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from gemma_embed.config import RESERVED, Collection, parse_columns  # noqa: F401 - parse_columns re-exported
from gemma_embed.errors import ItemProblem, UsageError
from gemma_embed.locations import Location, NotRegularFile, UnsupportedLocation, location
from gemma_embed.locations.location import URL_PROTOCOLS
from gemma_embed.media import MediaBytes
from gemma_embed.redact import redact
from gemma_embed.sizes import human_bytes
from gemma_embed.sources import bounded, records
from gemma_embed.sources.base import Source, item_too_large, text_source

PARQUET_SUFFIXES = (".parquet",)
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
SUFFIXES = PARQUET_SUFFIXES + JSONL_SUFFIXES
BATCH_ROWS = 16  # rows converted at a time: a batch of 16 large images is tens of MB at most
# The bytes of a JSON-lines record read besides its text (paths, kept columns, keys); the text command reads six
# times --max-text-bytes more, what a text of that many bytes takes at most written as JSON (\\u0001 for 0x01).
# A longer record is read as far: its beginning, parsed, costs about three times this (bytes, text, the cut string).
RECORD_BYTES = 4 << 20


def record_limit(collection: Collection) -> int:
    """How much of one JSON-lines record is read: a longer one is read as far (its text cut, sources/records.py)."""
    return RECORD_BYTES + (6 * collection.max_text_bytes if collection.column_holds_text else 0)


def is_table(path: Location) -> bool:
    return path.name.lower().endswith(SUFFIXES)


def is_json_lines(path: Location) -> bool:
    return path.name.lower().endswith(JSONL_SUFFIXES)


# ------------------------------------------------------------------------------------------ columns


def _media_kind(kind) -> str | None:
    """'bytes', 'path' or 'struct' for a column type the tool reads media from; None otherwise."""
    import pyarrow as pa

    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return "bytes"
    if getattr(pa.types, "is_binary_view", lambda _: False)(kind):
        return "bytes"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "path"
    if getattr(pa.types, "is_string_view", lambda _: False)(kind):
        return "path"
    if pa.types.is_struct(kind) and {kind.field(i).name for i in range(kind.num_fields)} & {"bytes", "path"}:
        return "struct"
    return None


def _text_kind(kind) -> str | None:
    """'bytes' for a column type the text command reads texts from (strings, or bytes holding UTF-8)."""
    return "bytes" if _media_kind(kind) in ("bytes", "path") else None


def _missing_columns(names: list[str], collection: Collection) -> str | None:
    """Why a table with these columns cannot give the run's items (--column missing or not there), or None."""
    listed = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    if collection.column_holds_text and "text" in collection.keep_columns:  # models.base.text_meta writes it
        return "--keep-columns text: the text command keeps each item's text under that name itself; rename the column"
    if collection.column is None:
        what = "texts" if collection.column_holds_text else "media or file paths"
        return f"give --column NAME, the column of {what} (its columns: {listed})"
    for wanted in (collection.column, collection.key_column, *collection.keep_columns):
        if wanted is not None and wanted not in names:
            return f"no column {wanted!r} (its columns: {listed})"
    return None


def column_problem(schema, collection: Collection) -> str | None:
    """Why these columns cannot be read from a table with this schema (one line), or None."""
    import pyarrow as pa

    missing = _missing_columns(schema.names, collection)
    if missing:
        return missing
    kind = schema.field(collection.column).type
    if collection.column_holds_text:
        if _text_kind(kind) is None:
            return f"column {collection.column!r} holds {kind}: the text command's --column needs a column of texts"
    elif collection.column_holds_urls:
        if _media_kind(kind) != "path":
            return f"column {collection.column!r} holds {kind}: --url-column needs a column of http(s) URLs (text)"
    elif _media_kind(kind) is None:
        return (
            f"column {collection.column!r} holds {kind}: --column needs bytes (binary), file paths (string) or a "
            f"struct of bytes and path (datasets' Image, Audio and Video features)"
        )
    for kept in (collection.key_column, *collection.keep_columns):
        if kept is None:
            continue
        kind = schema.field(kept).type
        if pa.types.is_nested(kind) or _media_kind(kind) == "bytes":
            return f"column {kept!r} holds {kind}: only scalar columns (numbers, text, dates) can be kept or key items"
    return None


def _scalar(value):
    """A cell as JSON metadata: dates and decimals as text, NaN and infinities as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (datetime.date, datetime.time, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, datetime.timedelta)):
        return str(value)
    return value


@dataclass
class Keys:
    """--key-column values seen so far in this run: a repeat is refused (the output needs unique keys)."""

    seen: set[str] = field(default_factory=set)

    def take(self, key: str) -> bool:
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def repeated_key(row: int, key: str) -> str:
    """Why a row cannot have its --key-column value as its key: an earlier row of the run took it."""
    return f"row {row} repeats the key {key!r} of an earlier row (--key-column values must be unique)"


def checked_key(source: Source, keys: Keys) -> Source:
    """A row found by a unit that knew only its own --key-column values (`sources.base.Unit`: each checks its own
    rows), checked against the run's (`keys`, taken in input order): its failure when an earlier row of another unit
    took its key, as the single-process find stage words it; else the row as it is."""
    if source.row_key is None or keys.take(source.key):
        return source
    why = repeated_key(source.meta["row"], source.key)
    return Source(source.row_key, source.path, error=why, kind="bad-key", position=source.position)


@dataclass
class _Rows:
    """Turns record batches of one table into items."""

    collection: Collection
    keys: Keys
    where: str  # Source.path of a row carrying bytes: the parquet file, or the dataset
    key_prefix: str  # FILE or DATASET:SPLIT
    folder: Location | None  # relative paths in a path column are taken from here

    def row_key(self, row: int) -> str:
        return f"{self.key_prefix}:{row}"

    def lost(self, first: int, end: int, reason: str) -> Iterator[Source]:
        for row in range(first, end):
            yield Source(self.row_key(row), self.where, error=reason, kind="unreadable")

    def key_of(self, row: int, value) -> tuple[str, str | None]:
        """The row's key and, when it cannot have one (an empty or repeated --key-column value, a JSON list or
        object, text that is no Unicode), why not."""
        key = self.row_key(row)
        name = self.collection.key_column
        if name is None:
            return key, None
        value = _scalar(value)
        if value is None:
            return key, f"row {row}: its --key-column {name!r} is empty"
        if isinstance(value, (list, dict)):
            what = "a JSON list" if isinstance(value, list) else "a JSON object"
            return key, f"row {row}: its --key-column {name!r} holds {what}, not a key (a string or a number)"
        if isinstance(value, str) and not _is_unicode(value):
            return key, f"row {row}: its --key-column {name!r} holds a lone surrogate escape, not Unicode text"
        key = json.dumps(value) if isinstance(value, bool) else str(value)  # true, not Python's True
        if not self.keys.take(key):
            return self.row_key(row), repeated_key(row, key)
        return key, None

    def keyed(self, source: Source, row: int) -> Source:
        """The row's item, marked with its own key (`Source.row_key`) when its key is a --key-column value it took."""
        if self.collection.key_column is None:
            return source
        return replace(source, row_key=self.row_key(row))

    def at(self, row: int) -> str:
        """Where a row is, in a line about it: `row 3`, and the file when its key is a --key-column value."""
        return f"row {row}" if self.collection.key_column is None else f"row {row} of {self.key_prefix}"

    def meta_of(self, row: int, kept: dict) -> dict:
        return {"row": row, **{name: _scalar(value) for name, value in kept.items()}}

    def of_batch(self, batch, first: int) -> Iterator[Source]:
        column = batch.column(batch.schema.get_field_index(self.collection.column))
        kind = _text_kind(column.type) if self.collection.column_holds_text else _media_kind(column.type)
        keyed = (
            batch.column(batch.schema.get_field_index(self.collection.key_column))
            if self.collection.key_column
            else None
        )
        kept = {name: batch.column(batch.schema.get_field_index(name)) for name in self.collection.keep_columns}
        if kind == "struct":
            names = {column.type.field(i).name for i in range(column.type.num_fields)}
            data_cells = column.field("bytes") if "bytes" in names else None
            path_cells = column.field("path") if "path" in names else None
        else:
            data_cells = column if kind == "bytes" else None
            path_cells = column if kind == "path" else None
        for i in range(batch.num_rows):
            row = first + i
            key, why = self.key_of(row, keyed[i].as_py() if keyed is not None else None)
            if why is not None:
                yield Source(key, self.where, error=why, kind="bad-key")
                continue
            meta = self.meta_of(row, {name: cells[i].as_py() for name, cells in kept.items()})
            # The cell's bytes as Arrow's own buffer (no copy): measured before the one copy into the item.
            valid = column[i].is_valid
            data = data_cells[i].as_buffer() if data_cells is not None and valid else None
            name = path_cells[i].as_py() if path_cells is not None and valid else None
            yield self.keyed(self.item(key, row, meta, data, name), row)

    def item(self, key: str, row: int, meta: dict, data, name: str | None) -> Source:
        """The row's item from its cell: `data` (a buffer with `.size`, or bytes) or a path `name`."""
        if self.collection.column_holds_text:
            return self.text_item(key, row, meta, data)
        if data is not None:
            limit = self.collection.max_item_bytes
            if limit is not None and data.size > limit:
                return Source(
                    key,
                    self.where,
                    error=f"{self.at(row)}: {item_too_large(data.size, limit, 'its cell')}",
                    kind="too-large",
                )
            if name:
                meta["name"] = name
            return Source(key, self.where, data=MediaBytes(data, location(name or "").name), meta=meta)
        if not name:
            return Source(
                key,
                self.where,
                error=f"{self.at(row)} has no media (column {self.collection.column!r} is empty)",
                kind="missing",
            )
        if self.collection.column_holds_urls:
            return self.url_item(key, row, meta, name)
        path = location(name).expanduser()
        if not path.is_absolute() and self.folder is not None:
            path = self.folder / path.path
        try:
            if not self.collection.allow_outside_paths and not self.inside(path):
                folder = (
                    self.folder.realpath() if self.folder is not None else "the table's folder (a hub dataset has none)"
                )
                return Source(
                    key,
                    self.where,
                    error=f"{self.at(row)} names {name!r}, outside {folder}: not opened (--allow-outside-paths opens "
                    f"paths outside the table's folder)",
                    kind="outside",
                )
            if not path.isfile():
                exists = path.exists()
                why = "not a file" if exists else "no such file or directory"
                return Source(
                    key,
                    str(path),
                    error=f"{self.at(row)} names {path}: {why}",
                    kind="unreadable" if exists else "missing",
                )
        except UnsupportedLocation as exc:
            return Source(key, self.where, error=f"{self.at(row)} names {name!r}: {exc.reason}", kind="unreadable")
        return Source(key, str(path), meta=meta)

    def url_item(self, key: str, row: int, meta: dict, url: str) -> Source:
        """A URL cell (--url-column) as an item the fetch stage reads (sources/fetch.py): its path is the URL; a
        cell that is no http(s) URL fails by key (a table of URLs must not open local files or buckets)."""
        if location(url).protocol not in URL_PROTOCOLS:
            return Source(
                key,
                self.where,
                error=f"{self.at(row)}: {redact(url)!r} is no http(s) URL (--url-column)",
                kind="unreadable",
            )
        return Source(key, url, meta=meta)

    def text_item(self, key: str, row: int, meta: dict, data, size: int | None = None) -> Source:
        """A text cell as an item carrying its UTF-8 bytes, as a line of a text file carries its own: cut at
        --max-text-bytes or passed over (`base.text_source`), and a null or blank cell passed over as a blank line
        is. `data`: Arrow's buffer of the cell (its length known before any copy) or bytes; `size`: the text's
        length when `data` is only its beginning."""
        column = self.collection.column
        if data is None:
            return Source(
                key, self.where, error=f"{self.at(row)} has no text (column {column!r} is null)", kind="blank"
            )
        size = size if size is not None else (data.size if hasattr(data, "size") else len(data))
        return text_source(key, self.where, data, size, meta, self.collection, f"{self.at(row)}: its text")

    def inside(self, path: Location) -> bool:
        """Whether a path cell's file lies under the table's folder, links resolved (a path that does not exist
        resolves as far as it does, then by its text), so the answer does not depend on whether it exists."""
        if self.folder is None:
            return False
        return path.realpath().is_relative_to(self.folder.realpath())


# ------------------------------------------------------------------------------------------ parquet


def _open_parquet(path: Location):
    """pyarrow's reader: a local file by its name, a remote one through the seam's seekable file (ranged reads: the
    footer, then the row groups and columns asked for; never the whole file)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path.local_path() if path.is_local else path.open_input())


def _parquet_footer(path: Location) -> Any:
    """pyarrow's reader of the file's footer alone (its schema, row groups and their row counts), read in two ranged
    reads: its last 8 bytes, then the footer they measure. pyarrow's own open reads the last 64 KiB, which in a
    small file or at the end of a large one is rows too: the check before a model loads, the progress count and a
    Ray run's driver (`parquet_units`) read the footer only. A file whose footer this cannot read is opened by
    pyarrow, which says why as in any run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        size = path.size()
        tail = path.cat_file(max(0, size - 8), size)
        length = int.from_bytes(tail[:4], "little")
        if len(tail) == 8 and tail[4:] == b"PAR1" and 12 + length <= size:
            footer = path.cat_file(size - 8 - length, size - 8)
            return pq.ParquetFile(pa.BufferReader(b"PAR1" + footer + tail))
    except Exception:  # noqa: BLE001 - pyarrow's own open below says what is wrong with the file
        pass
    return _open_parquet(path)


def check_parquet(path: Location, collection: Collection) -> None:
    """UsageError (naming the file) when the run's columns cannot be read from it: checked before a model is
    loaded, for files named on the command line."""
    try:
        schema = _parquet_footer(path).schema_arrow
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file; one line says why
        raise UsageError(f"{path}: not a readable parquet file ({_one_line(exc)})") from None
    problem = column_problem(schema, collection)
    if problem:
        raise UsageError(f"{path}: {problem}")


def _not_a_regular_file(path: Location, what: str, file_key: str) -> Source | None:
    """The table file's failure when it is no regular file (a FIFO, a device behind a link), else None; any other
    OS error is left to opening it, which says why."""
    try:
        path.regular_file(what)
    except NotRegularFile as exc:
        return Source(file_key, str(path), error=str(exc), kind="unreadable")
    except OSError:
        pass
    return None


def _opened_parquet(
    path: Location, file_key: str, collection: Collection, footer: bool = False
) -> tuple[object, Source | None]:
    """(pyarrow's reader, None), or (None, the file's failure as its one item): no regular file, not parquet, or
    without the run's columns. `footer`: a reader of the footer alone (`_parquet_footer`)."""
    refused = _not_a_regular_file(path, "a parquet file", file_key)
    if refused is not None:
        return None, refused
    try:
        table = _parquet_footer(path) if footer else _open_parquet(path)
        problem = column_problem(table.schema_arrow, collection)
    except Exception as exc:  # noqa: BLE001
        return None, Source(
            file_key, str(path), error=f"not a readable parquet file ({_one_line(exc)})", kind="unreadable"
        )
    if problem:
        return None, Source(file_key, str(path), error=problem, kind="bad-cell")
    return table, None


def parquet_rows(path: Location, file_key: str, collection: Collection, keys: Keys) -> Iterator[Source]:
    """The items of one parquet file, in row order; a file or row group that cannot be read fails by key."""
    table, failure = _opened_parquet(path, file_key, collection)
    if failure is not None:
        yield failure
        return
    row = 0
    for group in range(table.num_row_groups):  # type: ignore[attr-defined]
        end = row + table.metadata.row_group(group).num_rows  # type: ignore[attr-defined]
        yield from _group_rows(table, path, file_key, collection, keys, group, row, end)
        row = end


def _group_rows(
    table: Any, path: Location, file_key: str, collection: Collection, keys: Keys, group: int, first: int, end: int
) -> Iterator[Source]:
    """The items of rows [first, end) of a parquet file, its row group `group`, read a record batch at a time and
    only the run's columns; a row group that cannot be read fails each of its rows not read yet. `table`: the
    file's reader, or None to open it here (a worker's `RowGroup`)."""
    import pyarrow as pa

    rows = _Rows(collection, keys, str(path), file_key, path.parent)
    columns = list(dict.fromkeys(c for c in (collection.column, collection.key_column, *collection.keep_columns) if c))
    row = first
    try:
        table = table if table is not None else _open_parquet(path)
        for batch in table.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns, use_threads=False):
            yield from rows.of_batch(batch, row)
            row += batch.num_rows
    except (pa.ArrowException, OSError) as exc:
        yield from rows.lost(row, end, f"row group {group} cannot be read ({_one_line(exc)})")


@dataclass(frozen=True)
class RowGroup:
    """A parquet file's row group left whole (a `sources.base.Unit`): whoever reads it opens the file (its footer,
    then this group's columns: ranged reads) and gives its rows as items, as `parquet_rows` does."""

    path: str
    key: str  # the file's key: its items are FILE:ROW
    collection: Collection
    group: int
    first: int  # the group's first row in the file
    end: int

    def items(self, keys: Keys, skipped: Counter | None = None) -> Iterator[Source]:
        path = location(self.path)
        return _group_rows(None, path, self.key, self.collection, keys, self.group, self.first, self.end)


def parquet_units(path: Location, file_key: str, collection: Collection) -> Iterator[Source]:
    """The file's row groups as units (`RowGroup`: their rows are read where the unit is), from its footer alone;
    a file that cannot give items fails here, as in `parquet_rows`."""
    table, failure = _opened_parquet(path, file_key, collection, footer=True)
    if failure is not None:
        yield failure
        return
    row = 0
    for group in range(table.num_row_groups):  # type: ignore[attr-defined]
        end = row + table.metadata.row_group(group).num_rows  # type: ignore[attr-defined]
        if end > row:
            yield Source(file_key, str(path), unit=RowGroup(str(path), file_key, collection, group, row, end))
        row = end


def parquet_row_count(path: Location, collection: Collection) -> int:
    """How many items the file gives (from its footer; 1, its failure, when the columns do not fit)."""
    try:
        path.regular_file("a parquet file")
        table = _parquet_footer(path)
    except Exception:  # noqa: BLE001
        return 1
    return 1 if column_problem(table.schema_arrow, collection) else table.metadata.num_rows


# ------------------------------------------------------------------------------------------ JSON lines


def _records(path: Location, limit: int) -> Iterator[tuple[int, bounded.Line]]:
    """(row, line) for every line that is not blank, `limit` bytes of each kept (sources/bounded.py); rows count
    from 0. Raises OSError or ItemProblem where reading stops (a damaged or bomb-like gzip stream)."""
    with bounded.open_bytes(path) as read:
        row = 0
        for line in bounded.lines(read, limit):
            if not line.blank:
                yield row, line
                row += 1


def _record(line: bounded.Line, row: int, collection: Collection) -> tuple[dict, str | None]:
    """The record a line holds, and the field its cut falls in (a record longer than `record_limit`: its
    beginning, sources/records.py); ItemProblem otherwise."""
    if not line.cut:
        return records.parse(line.data, row), None
    if not collection.column_holds_text:
        raise ItemProblem(
            f"row {row} is {human_bytes(line.size)}, over the {human_bytes(len(line.data))} a record may have: "
            f"not read",
            "too-large",
        )
    return records.parse_beginning(line.data, row)


def check_json_lines(path: Location, collection: Collection) -> None:
    """UsageError (naming the file) when its first record lacks the run's columns: checked before a model is
    loaded, for files named on the command line (a later record without them fails by key)."""
    try:
        first = next(_records(path, record_limit(collection)), None)
    except (OSError, ItemProblem) as exc:
        raise UsageError(f"{path}: not a readable JSON-lines file ({_one_line(exc)})") from None
    try:
        fields = list(_record(first[1], 0, collection)[0]) if first is not None else []
    except ItemProblem:
        fields = []  # the first record fails by key
    problem = _missing_columns(fields, collection) if fields or collection.column is None else None
    if problem:
        raise UsageError(f"{path}: {problem}")


def _is_unicode(value) -> bool:
    """Whether a JSON value's strings are all Unicode text (no lone surrogate escape such as \\ud800, which no
    UTF-8 writer takes); depth bounded by records.MAX_DEPTH."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_is_unicode(k) and _is_unicode(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_unicode(v) for v in value)
    return True


def _record_source(rows: _Rows, line: bounded.Line, row: int) -> Source:
    """One JSON-lines record as its item, or its failure by key (what happened: RECORD_KINDS)."""
    collection, where, column = rows.collection, rows.where, rows.collection.column
    try:
        record, cut_in = _record(line, row, collection)
    except ItemProblem as exc:
        return Source(rows.row_key(row), where, error=str(exc), kind=exc.kind)
    if line.cut:
        needed = [n for n in (column, collection.key_column, *collection.keep_columns) if n and n != cut_in]
        beyond = [n for n in needed if n not in record] + ([cut_in] if cut_in not in (None, column) else [])
        if beyond or cut_in is None and column not in record:
            named = ", ".join(repr(n) for n in beyond or [column])
            return Source(
                rows.row_key(row),
                where,
                error=f"row {row} is {human_bytes(line.size)}: its field {named} lies beyond the first "
                f"{human_bytes(len(line.data))}, what is read of a record (--max-text-bytes raises it)",
                kind="too-large",
            )
    key, why = rows.key_of(row, record.get(collection.key_column) if collection.key_column else None)
    if why is not None:
        return Source(key, where, error=why, kind="bad-key")
    return rows.keyed(_record_item(rows, key, row, record, cut_in, line), row)


def _record_item(rows: _Rows, key: str, row: int, record: dict, cut_in: str | None, line: bounded.Line) -> Source:
    """A keyed record as its item: its kept fields and its --column field (a text, a path or a URL)."""
    collection, where, column = rows.collection, rows.where, rows.collection.column
    kept = {name: record.get(name) for name in collection.keep_columns}
    if not _is_unicode(kept):
        return Source(
            key, where, error=f"{rows.at(row)}: a kept field holds a lone surrogate escape", kind="undecodable"
        )
    meta = rows.meta_of(row, kept)
    cell = record.get(column)
    if cell is not None and not isinstance(cell, str):
        return Source(
            key, where, error=f"{rows.at(row)}: field {column!r} holds {type(cell).__name__}, not text", kind="bad-cell"
        )
    if cell is not None and not _is_unicode(cell):
        at = next(i for i, c in enumerate(cell) if 0xD800 <= ord(c) <= 0xDFFF)
        return Source(
            key,
            where,
            error=f"{rows.at(row)}: field {column!r} holds a lone surrogate escape (\\u{ord(cell[at]):04x} at "
            f"character {at}), not Unicode text",
            kind="undecodable",
        )
    if not collection.column_holds_text:
        return rows.item(key, row, meta, None, cell)
    if cell is None:
        return Source(
            key, where, error=f"{rows.at(row)} has no text (field {column!r} is missing or null)", kind="blank"
        )
    data = cell.encode("utf-8")
    if cut_in == column:  # only its beginning was read: cut, whatever --max-text-bytes is below
        return rows.text_item(key, row, meta, data, max(line.size, len(data) + 1))
    return rows.text_item(key, row, meta, data)


def json_lines_rows(path: Location, file_key: str, collection: Collection, keys: Keys) -> Iterator[Source]:
    """The items of one JSON-lines file, in order, one record read at a time (at most `record_limit` bytes of
    it); a record that is no JSON object, nests too deep, or whose --column field is missing or holds no string,
    fails by key; a file cut short (or inflating like a gzip bomb) fails the rest by its key."""
    refused = _not_a_regular_file(path, "a JSON-lines file", file_key)
    if refused is not None:
        yield refused
        return
    rows = _Rows(collection, keys, str(path), file_key, path.parent)
    if collection.column is None:
        yield Source(
            file_key, str(path), error="give --column NAME, the field that holds each record's item", kind="bad-cell"
        )
        return
    try:
        for row, line in _records(path, record_limit(collection)):
            yield _record_source(rows, line, row)
    except (OSError, NotRegularFile, ItemProblem) as exc:  # NotRegularFile: swapped in after the check above
        kind = exc.kind if isinstance(exc, ItemProblem) else "unreadable"
        yield Source(file_key, str(path), error=f"cannot read it to the end ({_one_line(exc)})", kind=kind)


@dataclass(frozen=True)
class JsonLines:
    """A JSON-lines file left whole (a `sources.base.Unit`): whoever reads it gives its records as items, as
    `json_lines_rows` does (its rows count from the file's first record, so it is read by one worker, front to
    back)."""

    path: str
    key: str  # the file's key: its items are FILE:ROW
    collection: Collection

    def items(self, keys: Keys, skipped: Counter | None = None) -> Iterator[Source]:
        return json_lines_rows(location(self.path), self.key, self.collection, keys)


def json_lines_row_count(path: Location) -> int:
    """How many items the file gives (its records: lines that are not blank)."""
    try:
        return sum(1 for _ in _records(path, 0))
    except (OSError, NotRegularFile, ItemProblem):
        return 1


# ------------------------------------------------------------------------------------------ datasets


@dataclass
class OpenedDataset:
    dataset: object  # datasets.Dataset (saved or cached: memory-mapped) or IterableDataset (streamed)
    name: str
    split: str | None
    folder: Location | None  # the dataset's folder when it is local

    @property
    def key_prefix(self) -> str:
        return f"{self.name}:{self.split}" if self.split else self.name

    @property
    def num_rows(self) -> int | None:
        return getattr(self.dataset, "num_rows", None)


@contextlib.contextmanager
def _quiet_datasets():
    """datasets and huggingface_hub print progress bars and retry warnings; the tool says what failed itself."""
    import logging

    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    loggers = [logging.getLogger(name) for name in ("datasets", "huggingface_hub", "fsspec")]
    levels = [logger.level for logger in loggers]
    bars_were_on = not are_progress_bars_disabled()
    disable_progress_bars()
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
        if bars_were_on:
            enable_progress_bars()


@contextlib.contextmanager
def _offline(datasets):
    """datasets reads its offline switch from its config at call time: set for a local dataset (no network call)
    or when the hub cannot be reached (the cache only)."""
    before = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = before


def open_dataset(collection: Collection) -> OpenedDataset:
    """The dataset `--dataset` names, its split chosen, checked: UsageError in one line otherwise. A folder saved
    with `save_to_disk` is memory-mapped; another local folder (data files) is streamed with the network off; a
    hub id is streamed, or read from the local cache when the hub cannot be reached."""
    try:
        import datasets
    except ImportError:
        raise UsageError("--dataset needs the datasets package: pip install 'gemma-embed[datasets]'") from None
    from gemma_embed.config import looks_like_path

    name = collection.dataset
    local = location(name).expanduser()
    with _quiet_datasets():
        if local.exists():
            _check_dataset_folder(local, name)
            try:
                if (local / "dataset_dict.json").isfile() or (local / "state.json").isfile():
                    loaded = datasets.load_from_disk(local.local_path())
                else:
                    with _offline(datasets):
                        loaded = datasets.load_dataset(local.local_path(), split=collection.split, streaming=True)
            except Exception as exc:  # noqa: BLE001 - datasets raises many types; one line says why
                raise UsageError(f"--dataset {name}: cannot read this dataset ({_one_line(exc)})") from None
            folder = local
        elif looks_like_path(name):
            raise UsageError(f"--dataset {name}: no such folder (and not a hub id)")
        else:
            loaded, folder = _from_hub(datasets, name, collection.split), None
    dataset, split = _choose_split(loaded, collection.split, name)
    opened = OpenedDataset(dataset, name, split, folder)
    features = getattr(dataset, "features", None)
    if features is not None:
        problem = column_problem(features.arrow_schema, collection)
        if problem:
            raise UsageError(f"--dataset {name}: {problem}")
    return opened


def _check_dataset_folder(folder: Location, name: str) -> None:
    """UsageError unless `folder` is a folder whose files are all regular ones: datasets opens the files it
    finds there, and a FIFO would block it, a device never end (checked by stat, nothing opened)."""
    try:
        folder.regular_file()
    except IsADirectoryError:
        pass
    except NotRegularFile as exc:
        raise UsageError(f"--dataset {name}: {exc}") from None
    else:
        raise UsageError(f"--dataset {name}: a file, not a dataset's folder (give the folder that holds it)")
    for root, _, files in folder.walk():
        for file in files:
            try:
                (root / file).regular_file()
            except NotRegularFile as exc:
                raise UsageError(f"--dataset {name}: {root / file}: {exc}") from None
            except OSError:
                pass  # a dangling link: datasets says so if it needs the file


def _from_hub(datasets, name: str, split: str | None):
    from gemma_embed.models.loading import hub_offline

    offline = hub_offline()
    try:
        if offline is None:
            return datasets.load_dataset(name, split=split, streaming=True)
        with _offline(datasets):
            return datasets.load_dataset(name, split=split)
    except Exception as exc:  # noqa: BLE001
        if offline is not None:
            raise UsageError(
                f"--dataset {name}: not in the local cache and {offline}; download it where there is a network "
                f"(load_dataset) and run with HF_HUB_OFFLINE=1, or pass a saved dataset's folder"
            ) from None
        raise UsageError(f"--dataset {name}: cannot load it from the hub ({_one_line(exc)})") from None


def _choose_split(loaded, wanted: str | None, name: str):
    """(dataset, split name) from what loading gave: a dict of splits, or one split."""
    if not hasattr(loaded, "keys"):  # one split
        split = getattr(loaded, "split", None)
        split = str(split) if split is not None else None
        if wanted is not None and split is not None and wanted != split:
            raise UsageError(f"--dataset {name}: it holds the split {split!r}, not {wanted!r}")
        return loaded, split or wanted
    splits = list(loaded.keys())
    if wanted is None:
        wanted = "train" if "train" in splits else (splits[0] if len(splits) == 1 else None)
        if wanted is None:
            raise UsageError(f"--dataset {name}: choose a split with --split ({', '.join(splits)})")
    if wanted not in splits:
        raise UsageError(f"--dataset {name}: no split {wanted!r} (its splits: {', '.join(splits)})")
    return loaded[wanted], wanted


def dataset_rows(opened: OpenedDataset, collection: Collection, keys: Keys) -> Iterator[Source]:
    """The dataset's rows as items, in order, read as Arrow record batches (nothing decoded by datasets)."""
    columns = list(dict.fromkeys(c for c in (collection.column, collection.key_column, *collection.keep_columns) if c))
    rows = _Rows(collection, keys, opened.name, opened.key_prefix, opened.folder)
    row = 0
    checked = getattr(opened.dataset, "features", None) is not None
    with _quiet_datasets():
        tables = opened.dataset.select_columns(columns).with_format("arrow").iter(batch_size=BATCH_ROWS)
    for table in tables:
        if not checked:  # a streamed dataset may say its features only with its first rows
            problem = column_problem(table.schema, collection)
            if problem:
                yield Source(opened.name, opened.name, error=problem, kind="bad-cell")
                return
            checked = True
        for batch in table.to_batches():
            yield from rows.of_batch(batch, row)
            row += batch.num_rows


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
