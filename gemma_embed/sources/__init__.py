"""Find sources: paths, folders and stdin lists -> ordered, de-duplicated items with stable keys."""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gemma_embed.errors import UsageError
from gemma_embed.media import file_facts


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
    else:
        raise ValueError(f"no such modality: {modality}")
    return frozenset(found())


def parse_extensions(text: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """ "jpg,PNG, .webp" -> (".jpg", ".png", ".webp"); None stays None (the modality's own set)."""
    if text is None:
        return None
    parts = text.split(",") if isinstance(text, str) else list(text)
    found = []
    for part in parts:
        ext = str(part).strip().lower()
        if not ext:
            continue
        ext = "." + ext.lstrip(".")
        if ext == "." or "/" in ext or os.sep in ext:
            raise ValueError(f"not a file extension: {part!r}")
        if ext not in found:
            found.append(ext)
    if not found:
        raise ValueError("give at least one extension, e.g. jpg,png")
    return tuple(found)


@dataclass(frozen=True)
class Source:
    """One input item. `key` names it in the output; `path` is the file that holds it.

    Most items are whole files, opened by path. An item that is part of something else (a line of a text file;
    later a tar member or a parquet cell) carries its own bytes in `data`, and what the collection says about it
    (a caption, sidecar JSON, kept columns) in `meta`, which joins the item's metadata. Decoders get `data` when
    there is some, else `path`, and never know which kind of source it was.
    """

    key: str
    path: str
    error: str | None = None  # set when the path cannot be an item (missing); reported, not fatal
    position: int = 0  # place in the whole input: orders the output and assigns distributed slices
    data: bytes | None = None  # the item's own bytes, when it is not a whole file
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def content(self) -> str | bytes:
        """What a decoder opens: the item's bytes, or the path of the file that is the item."""
        return self.data if self.data is not None else self.path

    def facts(self) -> dict:
        """Where the item is, its size and content hash (how --resume knows it), and a file's mtime."""
        if self.data is None:
            return {"path": self.path, **file_facts(self.path)}
        return {"path": self.path, "bytes": len(self.data), "sha256": hashlib.sha256(self.data).hexdigest()}


def read_path_list(stream: IO[bytes] | IO[str], null_separated: bool) -> list[str]:
    data = stream.read()
    if isinstance(data, bytes):
        # Non-UTF-8 names must survive the round trip to os.open: decode like the OS does.
        data = os.fsdecode(data)
    sep = "\0" if null_separated else "\n"
    return [p.rstrip("\r") if not null_separated else p for p in data.split(sep) if p.strip()]


def _walk(folder: Path, extensions: Iterable[str], skipped: Counter | None) -> Iterator[Path]:
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            suffix = Path(name).suffix.lower()
            if suffix in extensions:
                yield Path(root) / name
            elif skipped is not None:
                skipped[suffix or "(none)"] += 1


def iter_sources(
    inputs: Iterable[str],
    modality: str,
    stdin: IO | None = None,
    null_separated: bool = False,
    ext: Iterable[str] | None = None,
    skipped: Counter | None = None,
) -> Iterator[Source]:
    """Yield each item once, in input order; folders are walked recursively in sorted order.

    Keys: the path as given for files, the path relative to the folder for folder contents (prefixed with the
    folder as given when that name is already taken). Folders are walked for `ext` (default: the modality's
    `extensions`), whether given as arguments or listed on stdin; files named explicitly are taken whatever
    their extension. Files a walk passes over are counted in `skipped` by extension. A path that cannot be an
    item (missing, dangling link) is yielded with an error so the run reports it and goes on.
    """
    walked = frozenset(ext) if ext else extensions(modality)
    seen_paths: set[str] = set()
    seen_keys: set[str] = set()

    def expanded() -> Iterator[str]:
        for given in inputs:
            if given == "-":
                stream = stdin if stdin is not None else sys.stdin.buffer
                yield from read_path_list(stream, null_separated)
            else:
                yield given

    def emit(key: str, path: Path, error: str | None = None) -> Iterator[Source]:
        ident = os.path.realpath(path) if error is None else str(path)
        if ident in seen_paths:
            return
        seen_paths.add(ident)
        seen_keys.add(key)
        yield Source(key=key, path=str(path), error=error, position=len(seen_paths) - 1)

    for given in expanded():
        path = Path(given)
        if path.is_dir():
            for file in _walk(path, walked, skipped):
                rel = file.relative_to(path).as_posix()
                key = rel if rel not in seen_keys else (path / rel).as_posix()
                yield from emit(key, file)
        elif path.exists():
            yield from emit(given, path)
        elif path.is_symlink():
            yield from emit(given, path, "dangling symbolic link (its target does not exist)")
        else:
            yield from emit(given, path, "no such file or directory")


def require_input(
    sources: Iterator[Source], inputs: Iterable[str], modality: str, ext: Iterable[str] | None, skipped: Counter
) -> Iterator[Source]:
    """The same sources, lazily; UsageError before the first if there is none at all (a wrong folder or the
    wrong command: `gemma-embed images videos/` must not succeed with an empty output)."""
    first = next(sources, None)
    if first is None:
        raise UsageError(no_input_message(inputs, modality, ext, skipped))

    def chained() -> Iterator[Source]:
        yield first
        yield from sources

    return chained()


def no_input_message(inputs: Iterable[str], modality: str, ext: Iterable[str] | None, skipped: Counter) -> str:
    """One line: where it looked, for what, and what it passed over."""
    given = [i for i in inputs if i != "-"]
    where = ", ".join(given[:3]) + (f" and {len(given) - 3} more" if len(given) > 3 else "")
    if "-" in inputs:
        where = (where + " and " if where else "") + "the list on stdin"
    wanted = sorted(ext) if ext else sorted(extensions(modality))
    shown = " ".join(wanted[:12]) + (f" ... ({len(wanted)} extensions, see README)" if len(wanted) > 12 else "")
    noun = {"images": "image"}.get(str(modality), str(modality))
    line = f"no {noun} files found in {where or 'the arguments'}: looked for {shown}"
    if skipped:
        passed = ", ".join(f"{e} x{n}" for e, n in skipped.most_common(5))
        more = "" if len(skipped) <= 5 else f", {len(skipped) - 5} more kinds"
        line += f"; passed over {sum(skipped.values())} files ({passed}{more}); --ext chooses the extensions"
    return line


def skipped_note(modality: str, skipped: Counter) -> str | None:
    """A note for the end of a run: the files the walk passed over, by extension."""
    if not skipped:
        return None
    kinds = ", ".join(f"{e} x{n}" for e, n in skipped.most_common(5))
    more = "" if len(skipped) <= 5 else f", {len(skipped) - 5} more kinds"
    total = sum(skipped.values())
    return (
        f"skipped {total} file{'s' if total != 1 else ''} the folder walk does not take for {modality} "
        f"({kinds}{more}); --ext chooses the extensions"
    )
