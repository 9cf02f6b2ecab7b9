"""Names and whole-file writes of everything an output consists of, beside the embedding files themselves.

- `OUT.safetensors.parts/part-NNNNNN.safetensors`: an unfinished run's flushed items;
- output shards `OUT-00000.safetensors`, ... and `OUT.index.json` (file list, key -> file, in order);
- slices (`--num-slices`, torchrun ranks) `OUT-rank00001-of-00004.safetensors` with a positions manifest
  `OUT-rank00001-of-00004.positions.json`, joined by the same kind of index;
- `OUT.errors.jsonl`: one failure record per line;
- `OUT.lock`: held by the one run writing the output (`lock.py`).

Every file appears atomically (a temporary file in the same folder, flushed, fsynced, renamed) and, like any
other tool's output, with the permissions the umask gives (0644 under umask 022).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from gemma_embed import FORMAT
from gemma_embed.errors import RunError, UsageError


class DamagedFile(UsageError, ValueError):
    """A file that should be one of an output's (or a part) and is not: `FILE: not a KIND (REASON); FIX`.

    A usage error (exit 2: the run cannot start on it) and a ValueError (what readers raised before)."""

    def __init__(self, file: Path, reason: str, kind: str = f"{FORMAT} file", fix: str = ""):
        self.file, self.reason, self.kind, self.fix = Path(file), " ".join(str(reason).split()), kind, fix
        super().__init__(f"{file}: not a {kind} ({self.reason})" + (f"; {fix}" if fix else ""))

    def told(self, kind: str | None = None, fix: str = "") -> DamagedFile:
        """The same finding, for a caller that knows what the file was meant to be and how to get past it."""
        return DamagedFile(self.file, self.reason, kind or self.kind, fix)


_NOT_REGULAR = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def require_regular_file(file: Path, kind: str = f"{FORMAT} file", fix: str = "") -> None:
    """Before opening a file of an output: a folder would fail oddly ("No such device") and a FIFO would block
    the open. A missing file is a FileNotFoundError naming it."""
    mode = os.stat(file).st_mode
    if not stat.S_ISREG(mode):
        raise DamagedFile(file, f"is {_NOT_REGULAR.get(stat.S_IFMT(mode), 'not a regular file')}", kind, fix)


def read_json(file: Path, kind: str, fix: str = ""):
    """A small JSON file of an output (index, manifest), or a `DamagedFile` naming it."""
    require_regular_file(file, kind, fix)
    try:
        return json.loads(Path(file).read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedFile(file, f"not valid JSON: {exc}", kind, fix) from None


PARTS_SUFFIX = ".parts"
# safetensors refuses headers over 100 MB; shard well before an output's JSON metadata gets there.
HEADER_CAP = 50_000_000


def parts_folder(output: Path) -> Path:
    """Where an unfinished run keeps its flushed parts: beside the output, named after it."""
    output = Path(output)
    return output.with_name(output.name + PARTS_SUFFIX)


def errors_path(output: Path) -> Path:
    output = Path(output)
    return output.with_name(output.name.removesuffix(".safetensors") + ".errors.jsonl")


def lock_path(output: Path) -> Path:
    """The advisory lock of the run writing `output` (`lock.py`)."""
    output = Path(output)
    return output.with_name(output.name.removesuffix(".safetensors") + ".lock")


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
    """The files an existing output consists of: itself, or the files its index lists; [] if none."""
    output = Path(output)
    if output.suffix == ".json":
        index = output
    elif output.exists():
        return [output]
    else:
        index = index_path(output)
    if not index.exists():
        return []
    return [index.parent / name for name in read_index(index)["shards"]]


def read_index(index: Path) -> dict:
    """An `OUT.index.json`, checked: `shards` a list of file names, `keys` (when present) key -> file number."""
    kind = f"{FORMAT} index"
    content = read_json(index, kind)
    shards = content.get("shards") if isinstance(content, dict) else None
    if not isinstance(shards, list) or not all(isinstance(name, str) for name in shards):
        raise DamagedFile(index, "no list of files under shards", kind)
    keys = content.get("keys", {})
    if not isinstance(keys, dict) or not all(isinstance(n, int) and 0 <= n < len(shards) for n in keys.values()):
        raise DamagedFile(index, "keys is not a map of key to file number", kind)
    return content


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


def check_output_path(path: Path, overwrite: bool, resume: bool = False) -> None:
    """Fail before any work if the run would clobber something, or the output folder is not writable."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path}: output path is a folder")
    parts = parts_folder(path)
    if resume:  # before a model loads: a damaged part or output is one line now, not minutes later
        from gemma_embed.store.writer import check_resumable

        check_resumable(path)
    if not resume and not overwrite:
        if parts.exists():
            raise UsageError(
                f"{parts}: an unfinished run left parts here; pass --resume to finish it or --overwrite to start over"
            )
        if output_files(path):
            raise UsageError(f"{path}: output exists; pass --overwrite to replace it or --resume to add to it")
    folder = output_folder(path)
    probe = folder / f".{path.name}.{secrets.token_hex(4)}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as exc:
        raise cannot_write_here(folder, exc) from exc


def output_folder(path: Path) -> Path:
    """The folder an output goes in; a usage error when it does not exist."""
    folder = Path(path).parent if str(Path(path).parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{folder}: output folder does not exist")
    return folder


def cannot_write_here(folder: Path, exc: OSError) -> UsageError:
    return UsageError(f"{folder}: cannot write the output here: {exc.strerror or exc}")


# ------------------------------------------------------------------------------------------ atomic writes


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator:
    """A binary file handle whose content appears at `path` whole when the block ends, or not at all.

    The temporary file is created with mode 0666 less the umask, as `open()` would create `path` itself (a
    `mkstemp` file is always 0600, and would stay so after the rename).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` for a writer that wants a file name (numpy's memmap, pyarrow); it becomes
    `path` when the block ends without error, or is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file whole or not at all."""
    with atomic_file(path) as fh:
        fh.write(text.encode("utf-8"))


def guarded_write(action: Callable, where):
    """Run a write; a full disk or unwritable folder ends the run with one clear line (parts stay intact)."""
    try:
        return action()
    except OSError as exc:
        raise RunError(
            f"{where}: cannot write: {exc.strerror or exc}; finished parts are kept, free space "
            f"and run again with --resume"
        ) from exc


# ---------------------------------------------------------------------------------- index, manifests, errors


def write_index(output: Path, files: list[Path], located: list[tuple[str, int]]) -> Path:
    """`OUT.index.json`: the files that make up an output (paths relative to the index) and, in order, each key
    with the number of the file that holds it."""
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
    from gemma_embed.store.tensors_file import json_list, read_header

    output = Path(output)
    files: list[Path] = []
    located: list[tuple[int, str, int]] = []  # (input position, key, file number)
    for index in range(count):
        out = slice_path(output, index, count)
        manifest = manifest_path(out)
        slice_files = output_files(out)
        if not slice_files or not manifest.exists():
            return None
        positions = _read_manifest(manifest)
        for file in slice_files:
            for key in json_list(file, read_header(file), "keys", str):
                if key not in positions:
                    raise DamagedFile(manifest, f"no position for {key!r} of {file}", "positions manifest", RESLICE)
                located.append((positions[key], key, len(files)))
            files.append(file)
    located.sort()
    return write_index(output, files, [(key, number) for _, key, number in located])


# How to get past a slice's damaged manifest: the slice's own run writes it again.
RESLICE = "run that slice again with --resume"


def _read_manifest(manifest: Path) -> dict[str, int]:
    positions = read_json(manifest, "positions manifest", RESLICE)
    if not isinstance(positions, dict) or not all(type(n) is int for n in positions.values()):
        raise DamagedFile(manifest, "not a map of key to input position", "positions manifest", RESLICE)
    return positions


def write_errors(output: Path, failures: list[dict]) -> Path | None:
    """`OUT.errors.jsonl`: one failure record per line (atomically); a stale one is removed when all went well."""
    path = errors_path(output)
    if not failures:
        path.unlink(missing_ok=True)
        return None
    atomic_write_text(path, "".join(json.dumps(record, ensure_ascii=True) + "\n" for record in failures))
    return path
