"""Names and whole-file writes of everything an output consists of, beside the embedding files themselves.

- `OUT.safetensors.parts/part-NNNNNN.safetensors`: an unfinished run's flushed items;
- output shards `OUT-00000.safetensors`, ... and `OUT.index.json` (file list, key -> file, in order);
- slices (`--num-slices`, torchrun ranks) `OUT-rank00001-of-00004.safetensors` with a positions manifest
  `OUT-rank00001-of-00004.positions.json`, joined by the same kind of index;
- `OUT.errors.jsonl`: one failure record per line;
- `OUT.lock`: held by the one run writing the output (`lock.py`).

Every file appears atomically (a temporary file in the same folder, flushed, fsynced, renamed) and, like any
other tool's output, with the permissions the umask gives (0644 under umask 022). Names are derived with the seam's
path arithmetic (gemma_embed/locations), which keeps a location's protocol: every function takes a location (a
string, a path or a `Location`) and gives back `Location`s.
"""

from __future__ import annotations

import json
import os
import posixpath

from gemma_embed import FORMAT
from gemma_embed.errors import UsageError
from gemma_embed.locations import Location, filesystem_for, location
from gemma_embed.locations.written import Written, destination
from gemma_embed.store.atomic import atomic_write_text, guarded_write  # noqa: F401
from gemma_embed.store.damage import DamagedFile, read_json, require_regular_file  # noqa: F401

Where = str | os.PathLike | Location

PARTS_SUFFIX = ".parts"
# safetensors refuses headers over 100 MB; shard well before an output's JSON metadata gets there.
HEADER_CAP = 50_000_000


def parts_folder(output: Where) -> Location:
    """Where an unfinished run keeps its flushed parts: beside the output, named after it."""
    output = location(output)
    return output.with_name(output.name + PARTS_SUFFIX)


def errors_path(output: Where) -> Location:
    output = location(output)
    return output.with_name(output.name.removesuffix(".safetensors") + ".errors.jsonl")


def lock_path(output: Where) -> Location:
    """The advisory lock of the run writing `output` (`lock.py`)."""
    output = location(output)
    return output.with_name(output.name.removesuffix(".safetensors") + ".lock")


def index_path(output: Where) -> Location:
    output = location(output)
    return output.with_name(output.name.removesuffix(".safetensors") + ".index.json")


def shard_path(output: Where, number: int) -> Location:
    """Output shard `number` of a sharded output."""
    output = location(output)
    return output.with_name(f"{output.name.removesuffix('.safetensors')}-{number:05d}.safetensors")


def slice_path(output: Where, index: int, count: int) -> Location:
    """Where slice `index` of `count` (a --num-slices task or a torchrun rank) writes its own output."""
    output = location(output)
    if count <= 1:
        return output
    stem = output.name.removesuffix(".safetensors")
    return output.with_name(f"{stem}-rank{index:05d}-of-{count:05d}.safetensors")


def manifest_path(slice_output: Where) -> Location:
    """A slice's manifest: its items' positions in the whole input, so the index can restore input order."""
    slice_output = location(slice_output)
    return slice_output.with_name(slice_output.name.removesuffix(".safetensors") + ".positions.json")


def output_files(output: Where) -> list[Location]:
    """The files an existing output consists of: itself, or the files its index lists; [] if none."""
    output = location(output)
    if output.suffix == ".json":
        index = output
    elif output.exists():
        return [output]
    else:
        index = index_path(output)
    if not index.exists():
        return []
    return [index.parent / name for name in read_index(index)["shards"]]


def read_index(index: Location) -> dict:
    """An `OUT.index.json`, checked: `shards` a list of file names, `keys` (when present) key -> file number."""
    kind = f"{FORMAT} index"
    content = read_json(index, kind)
    shards = content.get("shards") if isinstance(content, dict) else None
    if not isinstance(shards, list) or not all(isinstance(name, str) for name in shards):
        raise DamagedFile(index, "no list of files under shards", kind)
    outside = next((name for name in shards if not inside_folder(name)), None)
    if outside is not None:
        raise DamagedFile(index, f"names {outside!r}, outside its folder", kind)
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


def output_folder(path: Where) -> Location:
    """The folder an output goes in; a usage error when it does not exist (on object storage: when its bucket does
    not), or when the output is on a protocol the tool cannot write (refused naming the output itself)."""
    output = location(path)
    if not filesystem_for(output).writable:
        raise UsageError(f"{output}: {output.protocol}:// locations are read-only here: write the output elsewhere")
    folder = output.parent
    if not folder.holds_files():
        what = "output folder" if folder.is_local else "bucket of the output"
        raise UsageError(f"{folder}: {what} does not exist")
    return folder


def cannot_write_here(folder: Location, exc: OSError) -> UsageError:
    return UsageError(f"{folder}: cannot write the output here: {exc.strerror or exc}")


def check_output_folder(path: Where) -> Location:
    """Before any work, for every command that writes a file (an embedding output, `search --html`, `export`,
    `index`): the folder `path` goes in exists and takes a new file, else the one usage error every command
    gives (`nodir: output folder does not exist`). Returns the folder."""
    path = location(path)
    folder = output_folder(path)
    try:
        folder.probe_folder(path.name)
    except OSError as exc:
        raise cannot_write_here(folder, exc) from exc
    return folder


def refuse_existing(place: Location, overwrite: bool, otherwise: str = "", exists: bool | None = None) -> None:
    """The one rule for a file the tool writes where one exists: replaced only when asked (`overwrite`), else one
    usage error naming the file and the option (`otherwise`: another way past it, as an embed output's
    `--resume`; `exists`: whether it is there, when that is more than the one name: a sharded output). Worded for
    the command line; the library's entry points reword it for Python callers (`config.python_spelling`:
    `overwrite=True`). A link there counts as a file."""
    if not overwrite and (place.lexists() if exists is None else exists):
        raise UsageError(f"{place}: exists; pass --overwrite to replace it{otherwise}")


def check_destination(where: Where, kind: Written, overwrite: bool, also: tuple[str, ...] = ()) -> Location | None:
    """Before any work, for every file the tool writes at a name the user gives (an embed command's output, an
    export, search's page): the name fits what goes there (`locations.written.destination`: its format's suffix,
    or `-` for standard output where the format streams), its folder exists and takes a new file, and an existing
    file is replaced only with `overwrite` (`refuse_existing`; `also`: suffixes of the files written beside it,
    each checked alike). Returns the location, or None for standard output."""
    place = destination(where, kind)
    if place is None:
        return None
    check_output_folder(place)
    for file in (place, *(place.with_suffix(suffix) for suffix in also)):
        refuse_existing(file, overwrite)
    return place


def relative_name(file: Location, folder: Location) -> str:
    """How a file of an output is named in a file beside it (an index, a search table): relative to its folder."""
    return posixpath.relpath(file.path, folder.path)


def inside_folder(name: str) -> bool:
    """Whether a file name read from a file beside an output (a table's record, an output's index) stays inside the
    output's folder: relative, and without `..`."""
    return bool(name) and not posixpath.isabs(name) and ".." not in name.split("/") and "\0" not in name


def write_index(output: Where, files: list[Location], located: list[tuple[str, int]]) -> Location:
    """`OUT.index.json`: the files that make up an output (paths relative to the index) and, in order, each key
    with the number of the file that holds it."""
    path = index_path(output)
    index = {
        "format": FORMAT,
        "shards": [relative_name(f, path.parent) for f in files],
        "keys": dict(located),
    }
    atomic_write_text(path, json.dumps(index, ensure_ascii=True))
    return path


def write_manifest(slice_output: Where, positions: dict[str, int]) -> None:
    atomic_write_text(manifest_path(slice_output), json.dumps(positions, ensure_ascii=True))


def merge_slices(output: Where, count: int) -> Location | None:
    """Write OUT.index.json over every slice's files, keys in input order; None while a slice is unfinished."""
    from gemma_embed.store.tensors_file import json_list, read_header

    output = location(output)
    files: list[Location] = []
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


def _read_manifest(manifest: Location) -> dict[str, int]:
    positions = read_json(manifest, "positions manifest", RESLICE)
    if not isinstance(positions, dict) or not all(type(n) is int for n in positions.values()):
        raise DamagedFile(manifest, "not a map of key to input position", "positions manifest", RESLICE)
    return positions


def write_errors(output: Where, failures: list[dict]) -> Location | None:
    """`OUT.errors.jsonl`: one failure record per line (atomically); a stale one is removed when all went well."""
    path = errors_path(output)
    if not failures:
        path.rm_file(missing_ok=True)
        return None
    atomic_write_text(path, "".join(json.dumps(record, ensure_ascii=True) + "\n" for record in failures))
    return path
