"""Every file layout of an output, written and read here and nowhere else (the `gemma-embed/1` format).

One `.safetensors` file: `embeddings` [total_rows, D] with every item's rows in input order, `offsets` int64
[N+1], and string metadata (`keys` and `items` as JSON lists in row order). Around it, by name:

- `OUT.safetensors.parts/part-NNNNNN.safetensors`: an unfinished run's flushed items;
- output shards `OUT-00000.safetensors`, ... and `OUT.index.json` (shard list, key -> shard, input order);
- slices (`--num-slices`, torchrun ranks) `OUT-rank00001-of-00004.safetensors` with a positions manifest
  `OUT-rank00001-of-00004.positions.json`, joined by the same kind of index;
- `OUT.errors.jsonl`: one failure record per line.

Every file appears atomically: written to a temporary file in the same folder, flushed to disk, then renamed.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from gemma_embed import FORMAT, __version__
from gemma_embed.device import DTYPES
from gemma_embed.errors import RunError, UsageError

PARTS_SUFFIX = ".parts"
# Settings that change an item's rows: parts made under other values cannot be resumed into this run.
FINGERPRINT = ("model", "revision", "modality", "space", "pooling", "compute_dtype", "preprocessing", "dtype")


def parts_folder(output: Path) -> Path:
    """Where an unfinished run keeps its flushed parts: beside the output, named after it."""
    output = Path(output)
    return output.with_name(output.name + PARTS_SUFFIX)


def errors_path(output: Path) -> Path:
    output = Path(output)
    return output.with_name(output.name.removesuffix(".safetensors") + ".errors.jsonl")


# safetensors refuses headers over 100 MB; shard well before an output's JSON metadata gets there.
HEADER_CAP = 50_000_000


def index_path(output: Path) -> Path:
    output = Path(output)
    return output.with_name(output.name.removesuffix(".safetensors") + ".index.json")


def shard_path(output: Path, number: int) -> Path:
    """Output shard `number` of a sharded output."""
    output = Path(output)
    return output.with_name(f"{output.name.removesuffix('.safetensors')}-{number:05d}.safetensors")


def slice_path(output: Path, index: int, count: int) -> Path:
    """Where slice `index` of `count` (a --num-slices task or a torchrun rank) writes its own output."""
    output = Path(output)
    if count <= 1:
        return output
    stem = output.name.removesuffix(".safetensors")
    return output.with_name(f"{stem}-rank{index:05d}-of-{count:05d}.safetensors")


def manifest_path(slice_output: Path) -> Path:
    """A slice's manifest: its items' positions in the whole input, so the index can restore input order."""
    return slice_output.with_name(slice_output.name.removesuffix(".safetensors") + ".positions.json")


def output_files(output: Path) -> list[Path]:
    """The files an existing output consists of: itself, or the shards its index lists; [] if none."""
    output = Path(output)
    if output.suffix == ".json":
        index = output
    elif output.exists():
        return [output]
    else:
        index = index_path(output)
    if not index.exists():
        return []
    return [index.parent / name for name in json.loads(index.read_text())["shards"]]


def plan_shards(header_sizes: list[int], shard_size: int | None, header_cap: int = HEADER_CAP) -> list[range]:
    """Consecutive item ranges, each at most `shard_size` items and under `header_cap` bytes of metadata."""
    ranges: list[range] = []
    start, size = 0, 0
    for i, item_size in enumerate(header_sizes):
        full = (shard_size and i - start >= shard_size) or (i > start and size + item_size > header_cap)
        if full:
            ranges.append(range(start, i))
            start, size = i, 0
        size += item_size
    ranges.append(range(start, len(header_sizes)))
    return ranges


def make_header(**fields) -> dict[str, str]:
    """The run-level metadata every file of an output carries, as strings (None becomes ""). The FINGERPRINT
    fields among them must match for --resume to reuse earlier work."""
    return {name: "" if value is None else str(value) for name, value in fields.items()}


def check_output_path(path: Path, overwrite: bool, resume: bool = False) -> None:
    """Fail before any work if the run would clobber something, or the output folder is not writable."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path}: output path is a folder")
    parts = parts_folder(path)
    if not resume and not overwrite:
        if parts.exists():
            raise UsageError(
                f"{parts}: an unfinished run left parts here; pass --resume to finish it or --overwrite to start over"
            )
        if output_files(path):
            raise UsageError(f"{path}: output exists; pass --overwrite to replace it or --resume to add to it")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{folder}: output folder does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.", suffix=".probe"):
            pass
    except OSError as exc:
        raise UsageError(f"{folder}: cannot write the output here: {exc.strerror or exc}") from exc


def atomic_save(tensors: dict[str, torch.Tensor], metadata: dict[str, str], path: Path) -> None:
    """Write to a temporary file in the same folder, fsync, then rename: the file is whole or absent."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        try:
            save_file(tensors, tmp, metadata=metadata)
        except SafetensorError as exc:
            # The Rust writer reports I/O failures (a full disk) as its own error type: make them OSErrors.
            found = re.search(r"os error (\d+)", str(exc))
            code = int(found.group(1)) if found else errno.EIO
            raise OSError(code, os.strerror(code)) from exc
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _file_tensors(
    keys: list[str], items: list[dict], rows: list[torch.Tensor], header: dict[str, str], dtype: torch.dtype
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    width = rows[0].shape[1] if rows else 0
    embeddings = torch.cat(rows) if rows else torch.zeros((0, width), dtype=dtype)
    counts = torch.tensor([0] + [r.shape[0] for r in rows], dtype=torch.int64)
    metadata = {
        **header,
        "format": FORMAT,
        "created_by": f"gemma-embed {__version__}",
        "dtype": str(dtype).removeprefix("torch."),
        # ASCII JSON: file names that are not UTF-8 (surrogate-escaped by Python) survive the round trip.
        "keys": json.dumps(keys, ensure_ascii=True),
        "items": json.dumps(items, ensure_ascii=True),
    }
    return {"embeddings": embeddings, "offsets": torch.cumsum(counts, 0)}, metadata


class EmbeddingWriter:
    """Collects items and writes one gemma-embed/1 file in the order `close` is given.

    Finished items are flushed to part files (`OUT.parts/part-NNNNNN.safetensors`, each written atomically) every
    `flush_every` items and at least every `flush_seconds`, so a killed run loses at most that much. With
    `resume`, items already in those parts (or in an existing output) are known by key and content hash, and
    `close` assembles the final file from parts and new items alike.
    """

    def __init__(
        self,
        path: Path,
        header: dict[str, str],
        output_dtype: str = "float32",
        flush_every: int | None = None,
        flush_seconds: float = 60.0,
        resume: bool = False,
        shard_size: int | None = None,
    ):
        self.path = Path(path)
        self.parts = parts_folder(self.path)
        self.dtype = DTYPES[str(output_dtype)]
        self.header = {**header, "dtype": str(self.dtype).removeprefix("torch.")}
        self.flush_every = flush_every
        self.flush_seconds = flush_seconds
        self.shard_size = shard_size
        self.pending: dict[str, tuple[dict, torch.Tensor]] = {}
        self.order: dict[str, int] = {}  # key -> input position, for this run's items (added or kept), in order
        self.saved: dict[str, tuple[Path, int, dict]] = {}  # key -> (file, position, item meta); latest wins
        self.part_count = 0
        self.last_flush = time.monotonic()
        self._cached_file: Path | None = None  # the saved file whose rows close() read last
        self._cached_rows: tuple[torch.Tensor, list[int]] | None = None
        if resume:
            self._index_previous_work()
        elif self.parts.exists():
            shutil.rmtree(self.parts)  # --overwrite: start over

    # ------------------------------------------------------------------------------------------ resume
    def _index_previous_work(self) -> None:
        sources = output_files(self.path) + sorted(self.parts.glob("part-*.safetensors"))
        for file in sources:
            try:
                meta = read_header(file)
            except ValueError as exc:
                raise UsageError(f"cannot resume: {exc}") from exc
            for field in FINGERPRINT:
                if meta.get(field, "") != self.header.get(field, ""):
                    raise UsageError(
                        f"{file}: made with {field}={meta.get(field)!r}, this run has "
                        f"{self.header.get(field)!r}; use the same settings or --overwrite"
                    )
            for position, (key, item) in enumerate(
                zip(json.loads(meta["keys"]), json.loads(meta["items"]), strict=True)
            ):
                self.saved[key] = (file, position, item)
        numbers = [int(p.stem.split("-")[1]) for p in self.parts.glob("part-*.safetensors")]
        self.part_count = max(numbers, default=-1) + 1

    def is_done(self, key: str, sha256: str) -> bool:
        """Whether this key's rows are already saved for this exact content."""
        entry = self.saved.get(key)
        return entry is not None and entry[2].get("sha256") == sha256

    # ------------------------------------------------------------------------------------------- writing
    def keep(self, key: str, position: int = 0) -> None:
        """An item whose saved rows (from earlier work) go into this run's output here."""
        if key not in self.saved:
            raise KeyError(key)
        self.order[key] = position

    def add(self, key: str, rows: torch.Tensor, meta: dict, position: int = 0) -> None:
        rows = rows.detach().to("cpu", self.dtype).contiguous()
        if rows.dim() != 2:
            raise ValueError(f"{key}: rows must be 2-D, got shape {tuple(rows.shape)}")
        self.order[key] = position
        self.pending[key] = ({**meta, "rows": int(rows.shape[0])}, rows)
        if (
            self.flush_every and len(self.pending) >= self.flush_every
        ) or time.monotonic() - self.last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        """Move pending items into a new part file (atomically)."""
        self.last_flush = time.monotonic()
        if not self.pending:
            return
        self.parts.mkdir(exist_ok=True)
        part = self.parts / f"part-{self.part_count:06d}.safetensors"
        keys = list(self.pending)
        tensors, metadata = _file_tensors(
            keys, [m for m, _ in self.pending.values()], [r for _, r in self.pending.values()], self.header, self.dtype
        )
        atomic_save(tensors, metadata, part)
        self.part_count += 1
        for position, (key, (meta, _)) in enumerate(self.pending.items()):
            self.saved[key] = (part, position, meta)
        self.pending.clear()

    def __len__(self) -> int:
        return len(self.order)

    def close(self) -> Path:
        """Write this run's items in input order: one file, or shards plus an index when `shard_size` (or the
        metadata's size) calls for them. Then remove what the output replaces and the parts."""
        entries = [(key, *self._entry(key)) for key in self.order if key in self.pending or key in self.saved]
        sizes = [len(json.dumps(key)) + len(json.dumps(meta)) + 2 for key, meta, _ in entries]
        ranges = plan_shards(sizes, self.shard_size, HEADER_CAP)
        previous = output_files(self.path)
        if len(ranges) == 1:
            self._write(self.path, entries)
            written = [self.path]
        else:
            written = [self._write(shard_path(self.path, n), [entries[i] for i in r]) for n, r in enumerate(ranges)]
            if self.path.exists():
                self.path.unlink()  # an older single-file output: the index below replaces it
            write_index(self.path, written, [(entries[i][0], n) for n, r in enumerate(ranges) for i in r])
        for stale in set(previous) - set(written):
            stale.unlink(missing_ok=True)
        if len(ranges) == 1:
            index_path(self.path).unlink(missing_ok=True)
        if self.parts.exists():
            shutil.rmtree(self.parts)
        return self.path if len(ranges) == 1 else index_path(self.path)

    def _entry(self, key: str) -> tuple[dict, Callable[[], torch.Tensor]]:
        if key in self.pending:
            meta, tensor = self.pending[key]
            return meta, lambda: tensor
        file, position, meta = self.saved[key]
        return meta, lambda: self._saved_rows(file, position)

    def _saved_rows(self, file: Path, position: int) -> torch.Tensor:
        # Items come in input order, so consecutive ones mostly share a file: keep just the last file read.
        if self._cached_file != file:
            self._cached_file, self._cached_rows = file, _read_rows(file)
        embeddings, offsets = self._cached_rows
        return embeddings[offsets[position] : offsets[position + 1]].to(self.dtype)

    def _write(self, path: Path, entries: list) -> Path:
        tensors, metadata = _file_tensors(
            [k for k, _, _ in entries],
            [m for _, m, _ in entries],
            [rows() for _, _, rows in entries],
            self.header,
            self.dtype,
        )
        atomic_save(tensors, metadata, path)
        return path


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file whole or not at all (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_header(file: Path) -> dict:
    """A gemma-embed/1 file's string metadata, without reading any tensor."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as fh:
        meta = dict(fh.metadata() or {})
    if meta.get("format") != FORMAT:
        raise ValueError(f"{file}: not a {FORMAT} file (format={meta.get('format')!r})")
    return meta


def _read_rows(file: Path) -> tuple[torch.Tensor, list[int]]:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as fh:
        return fh.get_tensor("embeddings"), fh.get_tensor("offsets").tolist()


def write_index(output: Path, files: list[Path], located: list[tuple[str, int]]) -> Path:
    """`OUT.index.json`: the files that make up an output (paths relative to the index) and, in input order,
    each key with the number of the file that holds it."""
    path = index_path(output)
    index = {
        "format": FORMAT,
        "shards": [os.path.relpath(f, path.parent) for f in files],
        "keys": dict(located),
    }
    atomic_write_text(path, json.dumps(index, ensure_ascii=True))
    return path


def write_manifest(slice_output: Path, positions: dict[str, int]) -> None:
    atomic_write_text(manifest_path(slice_output), json.dumps(positions, ensure_ascii=True))


def merge_slices(output: Path, count: int) -> Path | None:
    """Write OUT.index.json over every slice's files, keys in input order; None while a slice is unfinished."""
    output = Path(output)
    files: list[Path] = []
    located: list[tuple[int, str, int]] = []  # (input position, key, file number)
    for index in range(count):
        out = slice_path(output, index, count)
        manifest = manifest_path(out)
        slice_files = output_files(out)
        if not slice_files or not manifest.exists():
            return None
        positions = json.loads(manifest.read_text())
        for file in slice_files:
            for key in json.loads(read_header(file)["keys"]):
                located.append((positions[key], key, len(files)))
            files.append(file)
    located.sort()
    return write_index(output, files, [(key, number) for _, key, number in located])


def guarded_write(action: Callable, where):
    """Run a write; a full disk or unwritable folder ends the run with one clear line (parts stay intact)."""
    try:
        return action()
    except OSError as exc:
        raise RunError(
            f"{where}: cannot write: {exc.strerror or exc}; finished parts are kept, free space "
            f"and run again with --resume"
        ) from exc


def write_errors(output: Path, failures: list[dict]) -> Path | None:
    """`OUT.errors.jsonl`: one failure record per line (atomically); a stale one is removed when all went well."""
    path = errors_path(output)
    if not failures:
        path.unlink(missing_ok=True)
        return None
    atomic_write_text(path, "".join(json.dumps(record, ensure_ascii=True) + "\n" for record in failures))
    return path


# --------------------------------------------------------------------------------------------------- reader


def _files(path: Path) -> list[Path]:
    files = output_files(Path(path))
    if not files:
        raise FileNotFoundError(f"{path}: no such output (neither the file nor its .index.json)")
    return files


def _index_keys(path: Path) -> dict[str, int] | None:
    """key -> shard number, in input order, when `path` is (or names) an index that lists keys."""
    index = path if path.suffix == ".json" else index_path(path)
    if path.suffix != ".json" and path.exists():
        return None
    if not index.exists():
        return None
    return json.loads(index.read_text()).get("keys")


def _entries(path: Path, stack) -> Iterator[tuple[str, dict, Callable[[], torch.Tensor], dict]]:
    """(key, item metadata, rows reader, file header) in input order; rows are read only when asked."""
    from safetensors import safe_open

    opened = []
    for file in _files(path):
        fh = stack.enter_context(safe_open(str(file), framework="pt"))
        header = fh.metadata() or {}
        if header.get("format") != FORMAT:
            raise ValueError(f"{file}: not a {FORMAT} file (format={header.get('format')!r})")
        keys = json.loads(header["keys"])
        opened.append((fh, header, keys, json.loads(header["items"]), {k: i for i, k in enumerate(keys)}))
    order = _index_keys(path)
    if order is None:  # a single file, or shards whose concatenation is the input order
        order = {key: shard for shard, entry in enumerate(opened) for key in entry[2]}
    offsets: dict[int, list[int]] = {}
    for key, shard in order.items():
        fh, header, _, items, position = opened[shard]
        i = position[key]

        def rows(fh=fh, shard=shard, i=i) -> torch.Tensor:
            if shard not in offsets:
                offsets[shard] = fh.get_tensor("offsets").tolist()
            return fh.get_slice("embeddings")[offsets[shard][i] : offsets[shard][i + 1]]

        yield key, items[i], rows, header


def read_metadata(path: str | os.PathLike) -> dict:
    """The header of an output with `keys` and `items` decoded from JSON, in input order (for an index: the
    first shard's header with every shard's keys and items). Reads no embeddings."""
    from contextlib import ExitStack

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
    """Yield (key, rows, item metadata) one item at a time, reading only that item's rows, in input order."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        for key, item, rows, _ in _entries(Path(path), stack):
            yield key, rows(), item


def load(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every item's rows, keyed as in the output, in row order."""
    return {key: rows for key, rows, _ in iter_items(path)}


# ------------------------------------------------------------------------------------------ block reader


@dataclass(frozen=True)
class OutputFile:
    """One file of an output, without its embeddings: whose rows are where (row r of the file belongs to item i
    where offsets[i] <= r < offsets[i + 1]). Keys and items are decoded from the header when first asked for."""

    path: Path
    header: dict
    offsets: torch.Tensor  # int64 [N + 1]

    @functools.cached_property
    def keys(self) -> list[str]:
        return json.loads(self.header["keys"])

    @functools.cached_property
    def items(self) -> list[dict]:
        return json.loads(self.header["items"])


@dataclass(frozen=True)
class RowBlock:
    """Consecutive rows of one file: rows `start` .. `start + len(rows)` of `files[file]`."""

    file: int
    start: int
    rows: torch.Tensor  # (n, D), in the stored dtype


def output_index(path: str | os.PathLike) -> list[OutputFile]:
    """Every file of an output (a single file, or the shards its index lists, in that order) with its keys, items
    and offsets; reads no embeddings."""
    from safetensors import safe_open

    files = []
    for file in _files(Path(path)):
        with safe_open(str(file), framework="pt") as fh:
            header = dict(fh.metadata() or {})
            if header.get("format") != FORMAT:
                raise ValueError(f"{file}: not a {FORMAT} file (format={header.get('format')!r})")
            offsets = fh.get_tensor("offsets")
        files.append(OutputFile(file, header, offsets))
    return files


def iter_row_blocks(
    path: str | os.PathLike, rows: int = 65_536, files: list[OutputFile] | None = None
) -> Iterator[RowBlock]:
    """The output's embeddings in blocks of at most `rows` rows, file by file. safetensors maps each file and
    copies out only the block asked for, so an output far larger than memory is read with one block in RAM.
    `files`: the output's `output_index`, when the caller has it (saves reading a shard index again)."""
    from safetensors import safe_open

    size = max(1, int(rows))
    paths = [f.path for f in files] if files is not None else _files(Path(path))
    for number, file in enumerate(paths):
        with safe_open(str(file), framework="pt") as fh:
            embeddings = fh.get_slice("embeddings")
            total = embeddings.get_shape()[0]
            for start in range(0, total, size):
                yield RowBlock(number, start, embeddings[start : min(start + size, total)])
