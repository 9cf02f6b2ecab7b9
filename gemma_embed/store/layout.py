"""Names and whole-file writes of everything an output consists of, beside the embedding files themselves.

- `OUT.safetensors.parts/part-NNNNNN.safetensors`: an unfinished run's flushed items;
- output shards `OUT-00000.safetensors`, ... and `OUT.index.json` (file list, key -> file, in order);
- slices (`--num-slices`, torchrun ranks) `OUT-rank00001-of-00004.safetensors` with a positions manifest
  `OUT-rank00001-of-00004.positions.json`, joined by the same kind of index;
- `OUT.errors.jsonl`: one failure record per line.

Every file is written whole or not at all (`atomic`).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from gemma_embed import FORMAT
from gemma_embed.errors import UsageError
from gemma_embed.store.atomic import atomic_write_text
from gemma_embed.store.tensors_file import read_header

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
    probe = folder / f".{path.name}.{secrets.token_hex(4)}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{folder}: cannot write the output here: {exc.strerror or exc}") from exc


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


def write_errors(output: Path, failures: list[dict]) -> Path | None:
    """`OUT.errors.jsonl`: one failure record per line (atomically); a stale one is removed when all went well."""
    path = errors_path(output)
    if not failures:
        path.unlink(missing_ok=True)
        return None
    atomic_write_text(path, "".join(json.dumps(record, ensure_ascii=True) + "\n" for record in failures))
    return path
