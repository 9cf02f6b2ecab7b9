"""Files: paths as given, folders walked, lists of paths on stdin, and brace patterns of shard names. Every path is
a location of the seam (gemma_embed/locations): listed, walked and stat'ed there."""

from __future__ import annotations

import functools
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from gemma_embed.config import parse_extensions  # noqa: F401 - re-exported: sources.parse_extensions
from gemma_embed.locations import Location, UnsupportedLocation, location
from gemma_embed.locations.location import URL_PROTOCOLS

# What a folder walk takes for the text command (files named explicitly are taken whatever their extension).
TEXT_EXTENSIONS = frozenset({".txt", ".text", ".md"})


@functools.cache
def extensions(modality: str) -> frozenset[str]:
    """The extensions a folder walk takes for a modality: what its decoders register here (Pillow for images;
    FFmpeg's video containers for video; FFmpeg's audio formats, libsndfile's and the video containers, for
    their soundtracks, for audio). Lower case, with the dot."""
    if modality == "images":
        from gemma_embed.media.image import extensions as found
    elif modality == "video":
        from gemma_embed.media.video import extensions as found
    elif modality == "audio":
        from gemma_embed.media.audio import extensions as found
    elif modality == "text":
        return TEXT_EXTENSIONS
    else:
        raise ValueError(f"no such modality: {modality}")
    return frozenset(found())


def read_path_list(stream: IO[bytes] | IO[str], null_separated: bool) -> list[str]:
    return list(iter_path_list(stream, null_separated))


def iter_path_list(stream: IO[bytes] | IO[str], null_separated: bool) -> Iterator[str]:
    """The paths of a list (one a line, or NUL-separated), each as soon as it has arrived: `find | gemma-embed
    images -` starts on the first files while find is still looking, and a stop signal while the list waits for
    more saves what is done. Blank entries are no paths; a line's trailing CR goes."""
    for entry in split_stream(stream, b"\0" if null_separated else b"\n"):
        # Non-UTF-8 names must survive the round trip to os.open: decode like the OS does.
        path = os.fsdecode(entry) if isinstance(entry, bytes) else entry
        if not null_separated:
            path = path.rstrip("\r")
        if path.strip():
            yield path


_CHUNK = 1 << 16


def split_stream(stream: IO[bytes] | IO[str], sep: bytes) -> Iterator[bytes | str]:
    """The stream split at `sep`, read a chunk at a time: whatever has arrived (read1), never waiting for a
    whole chunk or the end. Splitting the bytes before decoding is safe: no UTF-8 sequence holds a NUL or a
    newline byte."""
    stream = getattr(stream, "buffer", stream)  # a text wrapper's read(n) would wait for n characters
    read = getattr(stream, "read1", None) or stream.read
    pending = None
    while chunk := read(_CHUNK):
        sep_here = sep if isinstance(chunk, bytes) else sep.decode()
        pending = chunk if pending is None else pending + chunk
        *complete, pending = pending.split(sep_here)
        yield from complete
    if pending:
        yield pending


def process_stdin() -> IO[bytes]:
    """The process's standard input, unbuffered: its file descriptor read by plain read calls, not through
    sys.stdin's buffer. A read of it may be left waiting in a helper thread when a stop signal ends the run
    (interrupts.responsive); inside sys.stdin's buffer it would hold the buffer's lock, which the interpreter takes
    to close sys.stdin at exit: "Fatal Python error: could not acquire lock for <stdin> at interpreter shutdown".
    (Nothing reads sys.stdin before: no buffered bytes are passed over.)"""
    try:
        return open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)  # noqa: SIM115 - the process's own
    except (AttributeError, OSError, ValueError):  # no stdin, or one without a descriptor (replaced in tests)
        return sys.stdin.buffer


# ------------------------------------------------------------------------------------------ brace patterns

_GROUP = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?")


def expand_braces(pattern: str) -> Iterator[str]:
    """`shards/{00000..00002}.tar` -> its three names, lazily, as webdataset (its `braceexpand`) and bash expand
    them: a numeric range keeps the width of a zero-padded end (`{08..10}`: 08 09 10), `{a,b}` is a list,
    several groups multiply in order. A group that is neither (`{x}`) stays as written."""
    match = _GROUP.search(pattern)
    if match is None:
        yield pattern
        return
    head, body, tail = pattern[: match.start()], match.group(1), pattern[match.end() :]
    numeric = _RANGE.fullmatch(body)
    if numeric:
        first, last = int(numeric.group(1)), int(numeric.group(2))
        step = abs(int(numeric.group(3) or 1)) or 1
        padded = any(re.match(r"-?0\d", end) for end in numeric.group(1, 2))
        width = max(len(numeric.group(1)), len(numeric.group(2))) if padded else 0
        direction = 1 if last >= first else -1
        choices: Iterable[str] = (f"{v:0{width}d}" for v in range(first, last + direction, step * direction))
    elif "," in body:
        choices = body.split(",")
    else:
        for rest in expand_braces(tail):
            yield f"{head}{{{body}}}{rest}"
        return
    for choice in choices:
        for rest in expand_braces(tail):
            yield head + choice + rest


def is_brace_pattern(given: str) -> bool:
    return _GROUP.search(given) is not None and not location(given).lexists()


_GLOB = re.compile(r"[*?\[]")


def is_glob_pattern(given: str) -> bool:
    """Whether an input is a glob pattern (`shards/*.tar`, `s3://bucket/**/*.jpg`) rather than a name: it has a
    wildcard and no file has that literal name. A URL is never one (its `?` starts a query)."""
    where = location(given)
    if where.protocol in URL_PROTOCOLS or _GLOB.search(where.path) is None:
        return False
    return not where.lexists()


def expand_patterns(given: str) -> Iterator[str]:
    """The names an input stands for: a brace pattern's expansions, a glob pattern's matches (sorted; spelled as
    given: a relative pattern gives relative names, a bucket's its URLs), or the input itself."""
    if is_brace_pattern(given):
        yield from expand_braces(given)
    elif is_glob_pattern(given):
        yield from (str(match) for match in location(given).matches())
    else:
        yield given


# ------------------------------------------------------------------------------------------ finding files


@dataclass(frozen=True)
class Found:
    """A file the input names (or a path that cannot be one, with the reason), keyed as the output will key it."""

    key: str
    path: Location
    error: str | None = None
    kind: str | None = None  # with `error`: what happened (errors.RECORD_KINDS)


def _walk(folder: Location, extensions: Iterable[str], skipped: Counter | None) -> Iterator[Location]:
    """The folder's files in sorted order, links to folders not followed; .jpg, and .jsonl.gz by its last two
    suffixes (compressed files are known by them)."""
    for root, dirs, files in folder.walk():
        dirs.sort()
        for name in sorted(files):
            file = root / name
            suffix = file.suffix.lower()
            if suffix in extensions or "".join(file.suffixes[-2:]).lower() in extensions:
                yield file
            elif skipped is not None:
                skipped[suffix or "(none)"] += 1


def find_files(
    inputs: Iterable[str],
    walked: frozenset[str],
    stdin: IO | None = None,
    null_separated: bool = False,
    skipped: Counter | None = None,
) -> Iterator[Found]:
    """Each file once, in input order; folders are walked recursively in sorted order for `walked` extensions.

    Keys: the path as given for files, the path relative to the folder for folder contents (prefixed with the
    folder as given when that name is already taken). Brace patterns (`shards/{00000..00099}.tar`) and glob
    patterns (`shards/*.tar`, `s3://bucket/**/*.jpg`), when no file has that literal name, stand for each name
    they expand to or match, as given. Files named explicitly are taken whatever
    their extension. Files a walk passes over are counted in `skipped` by extension. A path that cannot be an
    item (missing, dangling link, a protocol the tool cannot open) comes with an error, so the run reports it and
    goes on.
    """
    seen_paths: set[str] = set()
    seen_keys: set[str] = set()

    def expanded() -> Iterator[str]:
        for given in inputs:
            if given == "-":
                yield from iter_path_list(stdin if stdin is not None else process_stdin(), null_separated)
            else:
                yield from expand_patterns(given)

    def emit(key: str, path: Location, error: str | None = None, kind: str = "missing") -> Iterator[Found]:
        ident = str(path.realpath()) if error is None else str(path)
        if ident in seen_paths:
            return
        seen_paths.add(ident)
        seen_keys.add(key)
        yield Found(key, path, error, kind if error is not None else None)

    for given in expanded():
        path = location(given)
        try:
            is_dir = path.isdir()
        except UnsupportedLocation as exc:  # a path list's entry: data, so a failed item (arguments are checked)
            yield from emit(given, path, exc.reason, "unreadable")
            continue
        if is_dir:
            for file in _walk(path, walked, skipped):
                rel = file.relative_to(path).as_posix()
                key = rel if rel not in seen_keys else str(path / rel)
                yield from emit(key, file)
        elif path.exists():
            yield from emit(given, path)
        elif path.islink():
            yield from emit(given, path, "dangling symbolic link (its target does not exist)")
        else:
            yield from emit(given, path, "no such file or directory")
