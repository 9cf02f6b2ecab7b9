r"""`gemma-embed export`: an output as parquet (pandas, DuckDB, LanceDB) or .npy (numpy), streamed.

Items are read one at a time through the store's reader (every layout: single file, shards, joined slices) and
written in blocks, so an index larger than memory exports in bounded memory. Only the item metadata, which the
output's headers hold as JSON anyway, is read whole: a first pass over it fixes the parquet schema.

- parquet: a `key` column, one column per item metadata field (nested objects flattened to `a.b` names; lists of
  scalars as list columns; anything else as JSON text), and `embedding`: a fixed-size list of D numbers per item
  when every item has one row (pooled outputs), else the item's rows as a list of such lists.
- npy: `OUT.npy` with every row ([total_rows, D]), `OUT.keys.txt` with one key per line (escaped), and when items have
  other than one row, `OUT.offsets.npy` (int64 [N+1]: item i is rows[offsets[i]:offsets[i+1]]).
- jsonl: one JSON object per item and line: `key`, the item's metadata as the output holds it (nested objects stay
  nested), and `embedding` (a list of D numbers when every item has one row, else the item's rows as lists).
bfloat16 rows become float32 (numpy, parquet and JSON have no bfloat16); float32 and float16 stay as they are.

Where the destination is `-`, a parquet or JSON-lines export goes to standard output (both are written front to
back: parquet's footer comes last); npy is several files and is refused there (`locations.written`). A file
destination is written to a temporary file and renamed into place; an existing one is replaced only with
`overwrite` (`store.check_destination`, the rule of every file the tool writes).

Names are kept exactly. Keys (and file paths) are what Python made of the file system's bytes (`os.fsdecode`):
bytes that are not UTF-8 are held as surrogate escapes, which no UTF-8 file can store. So:
- parquet: where a key is not valid UTF-8, `key` holds `escape_name(key)` and a binary `key_bytes` column the
  original bytes (null for the other rows; the column exists only when some key needs it). Any other text column
  (`path`, `name`, ...) likewise gets a `NAME_bytes` column. `os.fsdecode(key_bytes)` is the key again.
- npy: every line of `keys.txt` is `escape_name(key)`, a UTF-8 line that `unescape_name` (or `read_keys` for the
  whole file) turns back into the exact key. The escapes: `\\` for a backslash; `\n`, `\r`, `\t`; `\xNN` for
  the other control characters below 0x80 (NN < 80) and for each byte that is not UTF-8 (NN >= 80, so the two
  never clash); `\uNNNN` for C1 controls (U+0080-U+009F), the line and paragraph separators U+2028/U+2029
  (which `str.splitlines` splits on) and other lone surrogates. Every other character is itself.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import typing
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from gemma_embed.errors import UsageError
from gemma_embed.locations import Location, filesystem_for, location
from gemma_embed.locations.written import EXPORTS, STDOUT, output_location

BLOCK_ITEMS = 4096  # items per parquet row group; rows flushed to the .npy memory map per block


# ----------------------------------------------------------------------------------------------- names

# What escape_name rewrites: the backslash, C0 controls and DEL, C1 controls, U+2028/U+2029, and surrogates
# (surrogateescape's U+DC80-U+DCFF for bytes that are not UTF-8, and any other lone one).
_ESCAPED = re.compile(r"[\\\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_SHORT = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPE = re.compile(r"\\(?:([\\nrt])|x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|(.?))", re.DOTALL)
_UNSHORT = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t"}


def _escape_char(match: re.Match) -> str:
    char = match.group()
    code = ord(char)
    if char in _SHORT:
        return _SHORT[char]
    if code < 0x80:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as os.fsdecode holds it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def escape_name(name: str) -> str:
    """`name` as one printable line of valid UTF-8, reversibly (`unescape_name`); the escapes are in the module
    note. A name without backslashes, control characters or undecodable bytes stays as it is."""
    return _ESCAPED.sub(_escape_char, name)


def _unescape(match: re.Match) -> str:
    short, byte, code, other = match.groups()
    if short is not None:
        return _UNSHORT[short]
    if byte is not None:
        value = int(byte, 16)
        return chr(value) if value < 0x80 else chr(0xDC00 + value)
    if code is not None:
        return chr(int(code, 16))
    raise ValueError(f"unknown escape \\{other} in a name")


def unescape_name(line: str) -> str:
    """The exact name `escape_name` wrote (bytes that are not UTF-8 as surrogate escapes, as os.fsdecode gives)."""
    return _ESCAPE.sub(_unescape, line)


def read_keys(path: str | os.PathLike) -> list[str]:
    """The keys of an `OUT.keys.txt` written by `export --to npy`, exactly as the output holds them."""
    text = location(path).read_text(encoding="utf-8")
    return [unescape_name(line) for line in text.split("\n")[:-1]]


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ----------------------------------------------------------------------------------------------- export


def default_destination(path: str | os.PathLike, to: str) -> Location:
    """OUT.safetensors (or OUT.index.json) -> OUT.parquet / OUT.npy beside it."""
    where = location(path)
    stem = where.name.removesuffix(".safetensors").removesuffix(".index.json")
    return where.with_name(f"{stem}.{to}")


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
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, UnicodeEncodeError):
        return None


def _items(path: Location) -> Iterator[tuple[str, np.ndarray, dict]]:
    from gemma_embed.store import iter_items

    for key, rows, item in iter_items(path):
        yield key, _numpy_rows(rows), item


def check_export_destination(
    path: str | os.PathLike | Location, to: str, destination: str | os.PathLike | None, overwrite: bool
) -> Location | None:
    """Where an export of `path` goes, checked before any work by the rule of every file the tool writes
    (`store.check_destination`: the format's suffix, `-` only for a format that streams, the folder, an existing
    file replaced only with overwrite; npy's keys file beside it too). None: standard output. Worded for the
    command line (`export` rewords it for a Python caller)."""
    from gemma_embed.store import check_destination

    where = destination if destination is not None and str(destination) != "" else default_destination(path, to)
    return check_destination(where, EXPORTS[str(to)], overwrite, also=(".keys.txt",) if str(to) == "npy" else ())


def export(
    path: str | os.PathLike,
    to: str,
    destination: str | os.PathLike | None = None,
    overwrite: bool = False,
    stdout: BinaryIO | None = None,
    command_line: bool = False,
) -> dict:
    """Write `path` as parquet, npy or JSON lines; returns what was written (files, items, rows, dim).

    `destination` `-` writes a parquet or JSON-lines export to `stdout` (a binary stream; default: this process's
    standard output). A usage error names the parameters (`overwrite=True`); with `command_line`, the flags."""
    from gemma_embed.config import python_spelling

    try:
        return _export(output_location(path), str(to), destination, overwrite, stdout)
    except UsageError as exc:
        if command_line:
            raise
        raise exc.reworded(python_spelling(str(exc))) from None


def _export(path: Location, to: str, destination, overwrite: bool, stdout: BinaryIO | None) -> dict:
    from gemma_embed.store import read_metadata

    if to not in EXPORTS:
        raise UsageError(f"{to!r}: export to {', '.join(EXPORTS)}")
    filesystem_for(path)  # a protocol the tool cannot read is refused naming the output, not the file beside it
    place = check_export_destination(path, to, destination, overwrite)
    meta = read_metadata(path)  # keys and items only; no rows are read
    counts = [int(item["rows"]) for item in meta["items"]]
    if place is None:
        stream = stdout if stdout is not None else sys.stdout.buffer
        written = (_to_parquet if to == "parquet" else _to_jsonl)(path, meta, counts, _Sink(None, stream))
        return {**written, "files": [STDOUT]}
    if to == "npy":
        return _to_npy(path, meta, counts, place, overwrite)
    return (_to_parquet if to == "parquet" else _to_jsonl)(path, meta, counts, _Sink(place))


class _Sink:
    """Where an export's bytes go: a file written whole or not at all (a temporary name, renamed into place), or a
    stream (standard output) written as they come. `name()` gives what pyarrow takes: the temporary file's name or
    the stream itself."""

    def __init__(self, place: Location | None, stream: BinaryIO | None = None):
        self.place, self.stream = place, stream

    def __str__(self) -> str:
        return STDOUT if self.place is None else str(self.place)

    @contextlib.contextmanager
    def name(self) -> Iterator[Any]:
        if self.place is None:
            with _whole_writes(typing.cast(BinaryIO, self.stream)) as stream:
                yield stream
            return
        with self.place.temp_path() as tmp:
            yield tmp

    @contextlib.contextmanager
    def file(self) -> Iterator[BinaryIO]:
        if self.place is None:
            with _whole_writes(typing.cast(BinaryIO, self.stream)) as stream:
                yield stream
            return
        with self.place.atomic_write() as fh:
            yield fh


@contextlib.contextmanager
def _whole_writes(stream: BinaryIO) -> Iterator[BinaryIO]:
    """`stream`, where each write writes everything it is given, flushed at the end. An unbuffered stream's write
    may write part of it and say so only in its count (`python -u` or PYTHONUNBUFFERED=1 make `sys.stdout.buffer`
    a raw FileIO: a write of 1 MB to a pipe wrote 64 kB, and the rest was lost, without an error); such a stream
    gets a buffer, which writes the rest, and is detached from it afterwards (the stream stays open)."""
    if not isinstance(stream, io.RawIOBase):
        yield stream
        stream.flush()
        return
    buffered = io.BufferedWriter(stream)
    try:
        yield typing.cast(BinaryIO, buffered)
        buffered.flush()
    finally:
        with contextlib.suppress(OSError, ValueError):  # a reader gone: the error raised above says so
            buffered.detach()


# ------------------------------------------------------------------------------------------------ parquet


def _to_parquet(path: Location, meta: dict, counts: list[int], destination: _Sink) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat = [flatten(item) for item in meta["items"]]
    names = sorted({name for item in flat for name in item} - {"key"})
    # Text columns holding a name that is not UTF-8 (keys, paths): a readable form, and the bytes beside it.
    with_bytes = {
        name
        for name, values in [("key", meta["keys"]), *((n, [item.get(n) for item in flat]) for n in names)]
        if any(isinstance(v, str) and not _is_utf8(v) for v in values)
    }
    types = {name: _column_type([_readable(item.get(name)) for item in flat]) for name in names}
    one_row = all(count == 1 for count in counts)
    writer = None
    written = rows_total = 0
    dim = 0
    with destination.name() as tmp:
        block: list[tuple[str, np.ndarray, dict]] = []

        def text_column(name: str, values: list) -> dict:
            columns = {name: pa.array([_readable(v) for v in values], type=pa.string())}
            if name in with_bytes:
                columns[f"{name}_bytes"] = pa.array([_original_bytes(v) for v in values], type=pa.binary())
            return columns

        def flush() -> None:
            nonlocal writer, written
            if not block:
                return
            vectors = np.concatenate([rows for _, rows, _ in block])
            values = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)
            if not one_row:
                offsets = np.concatenate([[0], np.cumsum([rows.shape[0] for _, rows, _ in block])]).astype(np.int32)
                values = pa.ListArray.from_arrays(pa.array(offsets), values)
            columns = text_column("key", [key for key, _, _ in block])
            for name in names:
                column = [flatten(item).get(name) for _, _, item in block]
                kind = types[name]
                if kind is None:
                    columns[name] = pa.array([None if v is None else json.dumps(v) for v in column], type=pa.string())
                elif kind == pa.string():
                    columns.update(text_column(name, column))
                else:
                    columns[name] = pa.array(column, type=kind)
            columns["embedding"] = values
            table = pa.table(columns)
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
            written += len(block)
            block.clear()

        for key, rows, item in _items(path):
            dim = dim or int(rows.shape[1])
            rows_total += int(rows.shape[0])
            block.append((key, rows, item))
            if len(block) >= BLOCK_ITEMS:
                flush()
        flush()
        if writer is None:  # no item: an empty table with the key column
            pq.write_table(pa.table({"key": pa.array([], type=pa.string())}), tmp)
        else:
            writer.close()
    return {"files": [str(destination)], "items": written, "rows": rows_total, "dim": dim}


def _readable(value):
    """A text value parquet can hold (valid UTF-8): itself, or `escape_name` of it when it is not valid UTF-8."""
    return escape_name(value) if isinstance(value, str) and not _is_utf8(value) else value


def _original_bytes(value) -> bytes | None:
    """The bytes a name that is not valid UTF-8 came from (None for the others)."""
    if not isinstance(value, str) or _is_utf8(value):
        return None
    try:
        return value.encode("utf-8", "surrogateescape")  # os.fsdecode's bytes
    except UnicodeEncodeError:  # a lone surrogate that stood for no byte
        return value.encode("utf-8", "surrogatepass")


# ------------------------------------------------------------------------------------------------ npy


def _to_npy(path: Location, meta: dict, counts: list[int], destination: Location, overwrite: bool) -> dict:
    from gemma_embed.store import atomic_write_text, refuse_existing

    keys_file = destination.with_suffix(".keys.txt")
    offsets_file = destination.with_suffix(".offsets.npy")
    one_row = all(count == 1 for count in counts)
    if not one_row:  # known once the items are read: the keys file was checked with the destination
        refuse_existing(offsets_file, overwrite)
    total = sum(counts)
    items = _items(path)
    first = next(items, None)
    dim = int(first[1].shape[1]) if first else 0
    dtype = first[1].dtype if first else np.float32
    with destination.temp_path() as tmp:
        array = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(total, dim))
        row = 0
        for n, (_, rows, _) in enumerate(_chain(first, items)):
            array[row : row + rows.shape[0]] = rows
            row += rows.shape[0]
            if n % BLOCK_ITEMS == BLOCK_ITEMS - 1:
                array.flush()  # bounded dirty pages, whatever the index's size
        array.flush()
        del array
    atomic_write_text(keys_file, "".join(escape_name(key) + "\n" for key in meta["keys"]))  # read_keys reads it
    files = [str(destination), str(keys_file)]
    if not one_row:
        with offsets_file.atomic_write() as fh:  # a file object: np.save adds no suffix
            np.save(fh, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), allow_pickle=False)
        files.append(str(offsets_file))
    return {"files": files, "items": len(counts), "rows": total, "dim": dim}


def _chain(first, rest):
    if first is not None:
        yield first
        yield from rest


# ------------------------------------------------------------------------------------------------ JSON lines


# JSON lines are written once this much text waits (or BLOCK_ITEMS items): memory holds one block, whatever the
# items' size (an unpooled image is ~100 kB of JSON at width 32, megabytes at a real model's width).
JSONL_BLOCK_CHARS = 1 << 20


def _to_jsonl(path: Location, meta: dict, counts: list[int], destination: _Sink) -> dict:
    """One JSON object per item and line (ASCII: a key that is not UTF-8 keeps its surrogate escapes, which
    `json.loads` gives back as the exact key), written in blocks of JSONL_BLOCK_CHARS or BLOCK_ITEMS items."""
    one_row = all(count == 1 for count in counts)
    written = rows_total = dim = 0
    with destination.file() as fh:
        lines: list[str] = []
        waiting = 0
        for key, rows, item in _items(path):
            dim = dim or int(rows.shape[1])
            rows_total += int(rows.shape[0])
            vectors = rows.tolist()
            record = {"key": key, **{k: v for k, v in item.items() if k != "key"}}  # the key first, as in parquet
            record["embedding"] = vectors[0] if one_row else vectors
            lines.append(json.dumps(record, ensure_ascii=True) + "\n")
            waiting += len(lines[-1])
            written += 1
            if len(lines) >= BLOCK_ITEMS or waiting >= JSONL_BLOCK_CHARS:
                fh.write("".join(lines).encode("ascii"))
                lines.clear()
                waiting = 0
        fh.write("".join(lines).encode("ascii"))
    return {"files": [str(destination)], "items": written, "rows": rows_total, "dim": dim}
