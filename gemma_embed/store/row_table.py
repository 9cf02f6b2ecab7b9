"""The row table of an output: where each file's rows lie, which item each row belongs to, every row's norm, and
each item's key and metadata as one JSON line, so a search reads only what it needs.

Without it, a search parses every file's whole JSON header (every key and item) before the first row is scored,
and decodes every item of a file to name one hit: at 1M items that is 1.6 s of a 3.5 s query (issue 23). With it,
opening an output reads a few small arrays, rows are memory-mapped where they lie in the output's files, and a
hit's key and metadata are one JSON line read from the table.

`gemma-embed index` writes the table beside the output as `OUT.search-index` (safetensors layout: the table's arrays
as tensors, the index record as metadata), with the output's fingerprint (every file's name, size and
modification time) so that a reader can tell when the output changed after indexing.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gemma_embed import FORMAT, __version__
from gemma_embed.locations import Location, location
from gemma_embed.store.damage import DamagedFile
from gemma_embed.store.digests import file_digests, sampled_sha256
from gemma_embed.store.layout import index_path, inside_folder, output_files, relative_name
from gemma_embed.store.safetensors_header import TensorEntry, build_header, read_header

TABLE_FORMAT = "gemma-embed-search/2"  # /1 recorded no digests: refused, to be built again
TABLE_SUFFIX = ".search-index"
# Norms are computed this many rows at a time (float32 copies of one block: 200 MB at 768 wide).
NORM_BLOCK_ROWS = 65_536
NUMPY_DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": np.uint16, "I64": np.int64, "U8": np.uint8}
STORED_DTYPES = {"F16": "float16", "F32": "float32", "BF16": "bfloat16"}
SAFETENSORS_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8"}
TABLE_ARRAYS = {"norms": np.float32, "item_rows": np.int64, "file_items": np.int64, "line_starts": np.int64}
# Rows whose norms a search recomputes from the output when it opens the table (evenly spread): a table of other
# vectors, or with its norms damaged, differs there. Their norms are computed as the build computed them
# (float32 of the stored rows), so they agree to rounding.
NORM_SAMPLE_ROWS = 32
# What a table's record holds (write_table, index.build_index), checked before any field is used.
RECORD_FIELDS: dict[str, type] = {
    "kind": str,
    "rows": int,
    "width": int,
    "items": int,
    "files": list,
    "output": list,
    "settings": dict,
    "header": dict,
    "faiss": dict,
    "arrays_crc32": int,
}
RECORD_TYPES = {str: "text", int: "whole number", list: "JSON list", dict: "JSON object"}
NORM_TOLERANCE = 1e-4


def arrays_crc32(arrays: dict[str, np.ndarray]) -> int:
    """CRC-32 of the table's arrays (TABLE_ARRAYS, in order), recorded when the table is written and checked each
    time it is opened: the sampled norms miss a norm scaled up at a row they do not sample (that item then silently
    drops out of every answer), and the boundary checks miss an item boundary moved by one that still rises. Every
    array once: 4 MB at 200,000 rows, 0.93 ms (median of 50 on the 2-core AMD EPYC); damage, not forgery, is what
    it is for (the record sits in the same file)."""
    crc = 0
    for name in TABLE_ARRAYS:
        crc = zlib.crc32(np.ascontiguousarray(arrays[name]).data, crc)
    return crc


def output_stem(output: str | os.PathLike | Location) -> Location:
    """The output's name without `.safetensors` or `.index.json`: what every file beside it is named after."""
    where = location(output)
    return where.with_name(where.name.removesuffix(".index.json").removesuffix(".safetensors"))


def table_path(output: str | os.PathLike) -> Location:
    stem = output_stem(output)
    return stem.with_name(stem.name + TABLE_SUFFIX)


# ------------------------------------------------------------------------------------------ fingerprint


def listing(output: str | os.PathLike | Location) -> list[Location]:
    """The files whose change makes a table stale: the shard index (when there is one) and every file. Reading a
    sharded output's index parses every key it lists (a third of a 200,000-row query's time): a caller that needs
    the list twice passes it on (`files=`)."""
    output = location(output)
    files = output_files(output)
    if not files:
        raise FileNotFoundError(f"{output}: no such output (neither the file nor its .index.json)")
    if output.suffix != ".json" and output.exists():
        return files  # a single file
    return [output if output.suffix == ".json" else index_path(output), *files]


def fingerprint(
    output: str | os.PathLike | Location, digests: bool = False, files: list[Location] | None = None
) -> list[dict]:
    """What the output is now: per file, its name relative to the output's folder, size and modification time
    (for a sharded output the shard index comes first); with `digests`, the whole and sampled SHA-256 of its
    content too (store/digests.py: read once, when the index is built). Any rewrite changes the time; a copy
    that keeps the bytes but not the times counts as changed too (telling them apart would mean reading every
    row)."""
    where = location(output)
    entries = []
    for file in listing(where) if files is None else files:
        info = file.info()
        entry = {"name": relative_name(file, where.parent), "size": info["size"], "mtime_ns": info["mtime_ns"]}
        if digests:
            facts = file_digests(file)
            entry.update(sha256=facts["sha256"], sampled_sha256=facts["sampled_sha256"])
        entries.append(entry)
    return entries


def compare_fingerprint(
    recorded: list[dict], output: str | os.PathLike | Location, files: list[Location] | None = None
) -> str | None:
    """None when the output is the one recorded; else one sentence saying what differs. Past the names, each
    file's size, time and sampled digest, from one open of it: the same size and time with other bytes (a file
    copied over and its time set back, rows rewritten in place) is another output."""
    where = location(output)
    try:
        files = listing(where) if files is None else files
        names = [relative_name(file, where.parent) for file in files]
        if names != [e["name"] for e in recorded]:
            return f"it covers {', '.join(e['name'] for e in recorded)}, the output now has {', '.join(names)}"
        for old, name, file in zip(recorded, names, files, strict=True):
            with file.open_input() as fh:
                size, mtime_ns = file.size_and_time(fh)
                if old["size"] != size:
                    return f"{name} is now {size} bytes, {old['size']} when indexed"
                if old["mtime_ns"] != mtime_ns:
                    return f"{name} was modified after indexing"
                if sampled_sha256(fh, size) != old["sampled_sha256"]:
                    return f"{name} holds other bytes than the ones indexed (its content digest differs)"
    except (OSError, ValueError) as exc:  # missing, not a regular file (a FIFO: refused unopened), a damaged index
        return " ".join(str(exc).split())
    return None


# ------------------------------------------------------------------------------------------ reading files


@dataclass(frozen=True)
class TableFile:
    """One file of the output: where its embeddings start (bytes from the file's start) and their layout."""

    path: Location
    data_start: int
    dtype: str  # safetensors' name: F16, F32 or BF16
    rows: int
    width: int

    def rows_view(self) -> np.ndarray:
        """The file's embeddings, memory-mapped where they lie (copy-on-write: nothing is ever written back);
        bfloat16 rows come as uint16 (numpy has no bfloat16; torch views them as one)."""
        if self.rows == 0:
            return np.zeros((0, self.width), NUMPY_DTYPES[self.dtype])
        with self.path.input_by_name() as (_, name):  # the file checked is the file mapped (no FIFO: no wait)
            return np.memmap(name, NUMPY_DTYPES[self.dtype], "c", self.data_start, (self.rows, self.width))


def read_file_header(file: str | os.PathLike | Location) -> tuple[dict, dict, int]:
    """(string metadata, tensor entries, byte offset of the data section) of one gemma-embed/1 file."""
    file = location(file)
    with file.open("rb") as fh:
        meta, header, start = read_header(fh, file)
    if meta.get("format") != FORMAT:
        raise DamagedFile(file, f"format={meta.get('format')!r}")
    return meta, header, start


def _tensor(file: Location, header: dict, start: int, name: str) -> tuple[str, list[int], int, int]:
    entry = header.get(name)
    if not isinstance(entry, dict) or entry.get("dtype") not in NUMPY_DTYPES:
        raise ValueError(f"{file}: not a {FORMAT} file (no usable {name!r} tensor)")
    begin, end = entry["data_offsets"]
    return entry["dtype"], list(entry["shape"]), start + begin, start + end


# ------------------------------------------------------------------------------------------ the table


class RowTable:
    """An output's row table: files, item boundaries (global item i is rows `item_rows[i]:item_rows[i + 1]` of
    the files' concatenation), the rows' norms, and each item's (key, metadata)."""

    def __init__(
        self,
        files: list[TableFile],
        header: dict,
        item_rows: np.ndarray,
        file_items: np.ndarray,
        norms: np.ndarray,
        entry: Callable[[int], tuple[str, dict]],
    ):
        self.files = files
        self.header = header  # the first file's run metadata, without keys and items
        self.item_rows = item_rows  # int64 [N + 1], global rows
        self.file_items = file_items  # int64 [F + 1]: file f holds items file_items[f]:file_items[f + 1]
        self.norms = norms  # float32 [R]
        self.entry = entry
        self.file_rows = np.concatenate([[0], np.cumsum([f.rows for f in files])]).astype(np.int64)
        self._views: list[np.ndarray] | None = None

    def views(self) -> list[np.ndarray]:
        """Each file's rows memory-mapped (`TableFile.rows_view`), mapped once for the table: a fresh mapping pays
        its page faults again on every search. Measured at 1M x 768 float16: 165 ms a query mapping the files
        each time (23k minor faults), against 38 ms of arithmetic."""
        if self._views is None:
            self._views = [f.rows_view() for f in self.files]
        return self._views

    @property
    def rows(self) -> int:
        return int(self.file_rows[-1])

    @property
    def width(self) -> int:
        return self.files[0].width if self.files else 0


def build_table(output: str | os.PathLike, progress: Callable[[int, int], None] | None = None) -> tuple:
    """Read every file of the output once: item boundaries, keys and items as JSON lines, and every row's norm
    (float32, as the exact search computes it). Returns (RowTable, the lines); `progress(rows_done, rows)`."""
    import torch

    paths = output_files(output)
    if not paths:
        raise FileNotFoundError(f"{output}: no such output (neither the file nor its .index.json)")
    files: list[TableFile] = []
    lines: list[bytes] = []
    item_rows: list[np.ndarray] = [np.zeros(1, np.int64)]
    file_items: list[int] = [0]
    header: dict | None = None
    for path in paths:
        meta, tensors, start = read_file_header(path)
        dtype, shape, data_start, _ = _tensor(path, tensors, start, "embeddings")
        if dtype not in STORED_DTYPES or len(shape) != 2:
            raise ValueError(f"{path}: embeddings of dtype {dtype} and shape {shape} cannot be searched")
        _, _, offsets_start, offsets_end = _tensor(path, tensors, start, "offsets")
        offsets = np.frombuffer(path.cat_file(offsets_start, offsets_end), np.int64)
        keys, items = json.loads(meta.pop("keys")), json.loads(meta.pop("items"))
        if len(offsets) != len(keys) + 1 or (len(offsets) and offsets[-1] != shape[0]):
            raise ValueError(f"{path}: offsets do not match its {len(keys)} items and {shape[0]} rows")
        header = header if header is not None else meta
        lines += [
            json.dumps([key, item], ensure_ascii=True).encode("ascii") for key, item in zip(keys, items, strict=True)
        ]
        item_rows.append(offsets[1:] + sum(f.rows for f in files))
        file_items.append(file_items[-1] + len(keys))
        files.append(TableFile(path, data_start, dtype, shape[0], shape[1]))
    widths = {f.width for f in files if f.rows}
    if len(widths) > 1:
        raise ValueError(f"{output}: files of different widths {sorted(widths)}")
    total = sum(f.rows for f in files)
    norms = np.empty(total, np.float32)
    done = 0
    for file in files:
        view = file.rows_view()
        for begin in range(0, file.rows, NORM_BLOCK_ROWS):
            block = as_float32(view[begin : begin + NORM_BLOCK_ROWS], file.dtype)
            norms[done : done + len(block)] = torch.linalg.vector_norm(block, dim=1).numpy()
            done += len(block)
            if progress is not None:
                progress(done, total)
    starts = np.concatenate([[0], np.cumsum([len(line) + 1 for line in lines])]).astype(np.int64)
    blob = b"".join(line + b"\n" for line in lines)
    table = RowTable(
        files,
        header or {},
        np.concatenate(item_rows),
        np.asarray(file_items, np.int64),
        norms,
        _lines_entry(blob, starts),
    )
    return table, (blob, starts)


def as_float32(rows: np.ndarray, dtype: str) -> Any:
    """A block of stored rows as a float32 torch tensor (bfloat16 stored as uint16 bits)."""
    import torch

    tensor = torch.from_numpy(np.ascontiguousarray(rows))
    if dtype == "BF16":
        tensor = tensor.view(torch.bfloat16)
    return tensor.float()


def _lines_entry(blob: Any, starts: np.ndarray) -> Callable[[int], tuple[str, dict]]:
    def entry(item: int) -> tuple[str, dict]:
        key, meta = json.loads(bytes(blob[int(starts[item]) : int(starts[item + 1]) - 1]))
        return key, meta

    return entry


# ------------------------------------------------------------------------------------------ the file


def write_table(path: str | os.PathLike | Location, record: dict, table: RowTable, lines: tuple) -> dict:
    """The table and its record as one safetensors file, written atomically (a stopped write leaves nothing).
    Returns the record as written (with the files, rows, width and run header it covers)."""
    blob, starts = lines
    path = location(path)
    folder = path.parent
    record = {
        **record,
        "files": [
            {"name": relative_name(f.path, folder), "data_start": f.data_start, "dtype": f.dtype, "rows": f.rows}
            for f in table.files
        ],
        "width": table.width,
        "rows": table.rows,
        "items": int(table.file_items[-1]),
        "header": table.header,
    }
    arrays = {
        "norms": table.norms,
        "item_rows": table.item_rows,
        "file_items": table.file_items,
        "line_starts": starts,
        "lines": np.frombuffer(blob, np.uint8),
    }
    record["arrays_crc32"] = arrays_crc32(arrays)
    metadata = {"format": TABLE_FORMAT, "created_by": f"gemma-embed {__version__}", "record": json.dumps(record)}
    tensors = {name: TensorEntry(SAFETENSORS_NAMES[a.dtype], list(a.shape), a.nbytes) for name, a in arrays.items()}
    with path.atomic_write() as fh:
        fh.write(build_header(tensors, metadata))
        for array in arrays.values():
            fh.write(np.ascontiguousarray(array).tobytes())
    return record


def read_record(path: str | os.PathLike | Location) -> dict:
    """The record of a table file (what it covers, how its index was built), checked field by field, reading none
    of its arrays. A file that is not one (a FIFO: refused unopened), or whose record is not what `write_table`
    writes, is a ValueError naming it."""
    from safetensors import SafetensorError, safe_open

    path = location(path)
    try:
        with path.input_by_name() as (_, name), safe_open(name, framework="numpy") as fh:
            meta = fh.metadata() or {}
    except SafetensorError as exc:
        raise ValueError(f"{path}: not a {TABLE_FORMAT} file ({' '.join(str(exc).split())})") from None
    if meta.get("format") != TABLE_FORMAT:
        earlier = (
            " made by an earlier gemma-embed, without digests"
            if meta.get("format", "").startswith("gemma-embed-search/")
            else ""
        )
        raise ValueError(f"{path}: not a {TABLE_FORMAT} file (format={meta.get('format')!r}{earlier})")
    try:
        record = json.loads(meta.get("record", ""))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a {TABLE_FORMAT} file (its record is not valid JSON: {exc})") from None
    problem = _record_problem(record)
    if problem is not None:
        raise ValueError(f"{path}: not a {TABLE_FORMAT} file ({problem})")
    return record


def _record_problem(record: Any) -> str | None:
    """What is wrong with a table's record, in words; None when every field `load_table` and a search read is
    there with its type, and every file it names lies inside the output's folder."""
    if not isinstance(record, dict):
        return f"its record is a JSON {type(record).__name__}, not an object"
    for name, kind in RECORD_FIELDS.items():
        value = record.get(name, {} if name == "faiss" else None)  # faiss: only an IVF or HNSW index has one
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"its record has no {RECORD_TYPES[kind]} {name!r}"
    if record["kind"] not in ("flat", "ivf", "hnsw"):
        return f"its record names an unknown kind {record['kind']!r}"
    entries = [*record["files"], *record["output"], *([record["faiss"]] if "faiss" in record else [])]
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            return "its record lists a file without a name"
        if not inside_folder(entry["name"]):
            return f"its record names {entry['name']!r}, outside the output's folder"
    for entry in record["files"]:
        if entry.get("dtype") not in STORED_DTYPES or not all(
            isinstance(entry.get(n), int) and entry[n] >= 0 for n in ("data_start", "rows")
        ):
            return f"its record's entry for {entry['name']!r} has no usable dtype, data_start or rows"
    for entry in [*record["output"], *([record["faiss"]] if "faiss" in record else [])]:
        if not all(isinstance(entry.get(n), int) for n in ("size", "mtime_ns")) or not isinstance(
            entry.get("sampled_sha256"), str
        ):
            return f"its record's entry for {entry['name']!r} has no size, time and content digest"
    return None


def load_table(path: str | os.PathLike | Location, record: dict) -> RowTable:
    """The table of a (checked) table file: small arrays read and checked (`check_table`), key/metadata lines
    memory-mapped. A table that does not hold together is a ValueError naming the file."""
    from safetensors import SafetensorError, safe_open

    path = location(path)
    folder = path.parent
    files = [
        TableFile(folder / f["name"], int(f["data_start"]), f["dtype"], int(f["rows"]), int(record["width"]))
        for f in record["files"]
    ]
    try:
        with path.input_by_name() as (opened, name):
            with safe_open(name, framework="numpy") as fh:
                arrays = {n: fh.get_tensor(n) for n in TABLE_ARRAYS}
            starts = arrays["line_starts"]
            lines_offset, lines_size = _data_span(opened, path, "lines")
            if starts.ndim != 1 or not len(starts) or int(starts[-1]) != lines_size:
                raise ValueError("its line offsets do not match its lines")
            blob: Any = np.memmap(name, np.uint8, "r", lines_offset, lines_size) if lines_size else b""
    except DamagedFile:
        raise  # named already, as a table file
    except (SafetensorError, KeyError, ValueError) as exc:
        raise ValueError(f"{path}: not a {TABLE_FORMAT} file ({' '.join(str(exc).split())})") from None
    table = RowTable(
        files,
        record.get("header", {}),
        arrays["item_rows"],
        arrays["file_items"],
        arrays["norms"],
        _lines_entry(blob, starts),
    )
    problem = check_table(table, record, arrays)
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    return table


def check_table(table: RowTable, record: dict, arrays: dict[str, np.ndarray]) -> str | None:
    """The table's arrays against each other, its record and the output's rows, cheaply (each array once, a few
    rows of the output): dtypes and lengths, item boundaries that rise from 0 to the last row and meet the files'
    boundaries (a shuffled `item_rows` would name the wrong keys), line offsets that rise, and norms that are
    finite, not negative and, at NORM_SAMPLE_ROWS rows, what the rows give (damaged norms would make cosines of
    any size); then the arrays' CRC-32 against the record's, for damage anywhere else. None when it holds
    together."""
    for name, dtype in TABLE_ARRAYS.items():
        if arrays[name].dtype != dtype or arrays[name].ndim != 1:
            return f"its {name} are not a 1-D {np.dtype(dtype).name} array"
    rows, items = table.rows, int(record["items"])
    norms, item_rows, file_items, starts = (arrays[n] for n in TABLE_ARRAYS)
    if rows != record["rows"] or len(norms) != rows or len(item_rows) != items + 1 or len(starts) != items + 1:
        return f"its arrays do not match its record's {record['rows']} rows and {items} items"
    if len(file_items) != len(table.files) + 1 or file_items[0] != 0 or file_items[-1] != items:
        return "its file boundaries do not match its files"
    if not (_rising(item_rows) and _rising(file_items) and _rising(starts)) or item_rows[0] != 0 or starts[0] != 0:
        return "its item boundaries or line offsets do not rise (damaged or reordered)"
    if item_rows[-1] != rows or not np.array_equal(item_rows[file_items], table.file_rows):
        return "its item boundaries do not meet its files' rows"
    if not bool(np.isfinite(norms).all()) or bool((norms < 0).any()):
        return "its row norms are not all finite and positive (damaged)"
    if rows:
        sample = np.unique(np.linspace(0, rows - 1, min(NORM_SAMPLE_ROWS, rows)).astype(np.int64))
        recorded = norms[sample]
        if (np.abs(_sample_norms(table, sample) - recorded) > NORM_TOLERANCE * recorded).any():
            return "its row norms are not the output's rows' (from other vectors, or damaged)"
    if arrays_crc32(arrays) != record["arrays_crc32"]:  # last: the checks above say more about what is wrong
        return "its arrays are not the ones it was written with (damaged)"
    return None


def _rising(values: np.ndarray) -> bool:
    return bool((values[1:] >= values[:-1]).all())


def _sample_norms(table: RowTable, sample: np.ndarray) -> np.ndarray:
    """float32 norms of the given global rows (sorted), computed as `build_table` computed them."""
    import torch

    out = np.empty(len(sample), np.float32)
    files = np.searchsorted(table.file_rows, sample, side="right") - 1
    views = table.views()
    for number in np.unique(files):
        chosen = np.flatnonzero(files == number)
        stored = views[number].view(np.ndarray)[sample[chosen] - table.file_rows[number]]  # no memmap wrapper
        block = as_float32(stored, table.files[number].dtype)
        out[chosen] = torch.linalg.vector_norm(block, dim=1).numpy()
    return out


def _data_span(fh: Any, file: Location, tensor: str) -> tuple[int, int]:
    """(offset from the file's start, size) of one tensor's bytes in an open table file."""
    _, tensors, start = read_header(fh, file, f"{TABLE_FORMAT} file")
    begin, end = tensors[tensor]["data_offsets"]
    return start + int(begin), int(end) - int(begin)
