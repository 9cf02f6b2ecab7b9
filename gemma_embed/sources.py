"""Find sources: paths, folders and stdin lists -> ordered, de-duplicated items with stable keys."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

EXTENSIONS = {
    "images": {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"},
    "video": {".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts", ".gif"},
    "audio": {".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".m4a", ".aac", ".wma", ".aiff", ".aif"},
}


@dataclass(frozen=True)
class Source:
    """One input item. `key` names it in the output; `path` is what gets opened."""

    key: str
    path: str
    error: str | None = None  # set when the path cannot be an item (missing); reported, not fatal
    position: int = 0  # place in the whole input: orders the output and assigns distributed slices


def read_path_list(stream: IO[bytes] | IO[str], null_separated: bool) -> list[str]:
    data = stream.read()
    if isinstance(data, bytes):
        # Non-UTF-8 names must survive the round trip to os.open: decode like the OS does.
        data = os.fsdecode(data)
    sep = "\0" if null_separated else "\n"
    return [p.rstrip("\r") if not null_separated else p for p in data.split(sep) if p.strip()]


def _walk(folder: Path, extensions: set[str]) -> Iterator[Path]:
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            if Path(name).suffix.lower() in extensions:
                yield Path(root) / name


def iter_sources(
    inputs: Iterable[str],
    modality: str,
    stdin: IO | None = None,
    null_separated: bool = False,
) -> Iterator[Source]:
    """Yield each item once, in input order; folders are walked recursively in sorted order.

    Keys: the path as given for files, the path relative to the folder for folder contents (prefixed with the
    folder as given when that name is already taken). Folders on the command line are walked; entries of a
    stdin list must be files. A path that cannot be an item (missing, dangling link, a folder in a list) is
    yielded with an error so the run reports it and goes on.
    """
    extensions = EXTENSIONS[modality]
    seen_paths: set[str] = set()
    seen_keys: set[str] = set()

    def expanded() -> Iterator[tuple[str, bool]]:
        for given in inputs:
            if given == "-":
                stream = stdin if stdin is not None else sys.stdin.buffer
                yield from ((p, True) for p in read_path_list(stream, null_separated))
            else:
                yield given, False

    def emit(key: str, path: Path, error: str | None = None) -> Iterator[Source]:
        ident = os.path.realpath(path) if error is None else str(path)
        if ident in seen_paths:
            return
        seen_paths.add(ident)
        seen_keys.add(key)
        yield Source(key=key, path=str(path), error=error, position=len(seen_paths) - 1)

    for given, listed in expanded():
        path = Path(given)
        if path.is_dir() and listed:
            # A stdin list names files (find . -name '*.jpg' also prints folders called x.jpg).
            yield from emit(given, path, "is a directory, not a media file")
        elif path.is_dir():
            for file in _walk(path, extensions):
                rel = file.relative_to(path).as_posix()
                key = rel if rel not in seen_keys else (path / rel).as_posix()
                yield from emit(key, file)
        elif path.exists():
            yield from emit(given, path)
        elif path.is_symlink():
            yield from emit(given, path, "dangling symbolic link (its target does not exist)")
        else:
            yield from emit(given, path, "no such file or directory")
