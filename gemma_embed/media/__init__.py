"""Decode stage: file -> decoded media, plus the facts about the file that go into the output metadata.

Decoders take what `Source.content` gives them: a location string (a whole file), or the item's own bytes (a tar
member, a parquet cell, a dataset row). Bytes from a collection come as `MediaBytes`, which carries the name the
item has there (a member's name, a cell's file name), so a decoder that routes by extension does so as for a file.
A location is opened through the seam (gemma_embed/locations): a local one is handed to Pillow, PyAV and soundfile
by its name, as given (they read a real file faster than a Python file object), any other kind as the seam's
seekable file (`as_file`). The regular-file refusal (`regular_file`, `NotRegularFile`) is the seam's.
"""

from __future__ import annotations

import io
import os

from gemma_embed.locations import NotRegularFile, location, regular_file  # noqa: F401 - re-exported

# Pillow's decompression-bomb limit (about 89 megapixels), for images and video frames alike.
MAX_PIXELS = 89_478_485
# av.open timeouts (open, read) in seconds: a stalled read (network mount) must not hang the run.
OPEN_TIMEOUT_S = (30.0, 30.0)


def refuse_nothing_to_decode(content: str | bytes, what: str, error: type[Exception]) -> None:
    """The checks audio and video decoding make before opening anything: a folder, or no bytes at all, is a
    one-line `error` (`what`: "an audio file", "a video file")."""
    if isinstance(content, str):
        where = location(content)
        if where.isdir():
            raise error(f"is a directory, not {what}")
        if where.size() == 0:
            raise error("empty file (0 bytes)")
    elif len(content) == 0:
        raise error("empty (0 bytes)")


def ffmpeg_extensions(formats: tuple[str, ...], leave_out: frozenset[str] = frozenset()) -> set[str]:
    """The file extensions FFmpeg (through PyAV) registers for these formats, demuxer and muxer of each name
    (a demuxer often lists none and relies on probing: WAV, ASF, MPEG-TS), less `leave_out`."""
    import av

    found: set[str] = set()
    for name in formats:
        if name not in av.formats_available:
            continue
        for mode in ("r", "w"):
            try:
                found |= {f".{e.lower()}" for e in av.ContainerFormat(name, mode).extensions}
            except ValueError:
                pass  # no muxer (or no demuxer) of that name
    return found - leave_out


class MediaBytes(bytes):
    """An item's bytes and the name it has in its collection ("" when it has none, as in a bare bytes column).

    A `bytes` like any other (hashing, slicing, `len`); the name only tells a decoder which extension to route
    by, as a path's would."""

    name: str

    def __new__(cls, data: bytes, name: str = "") -> MediaBytes:
        self = super().__new__(cls, data)
        self.name = name
        return self


def as_file(content: str | bytes):
    """What a library's open() takes (Pillow, PyAV and soundfile read both): a local location's path as given, a
    file object over an item's bytes, or the seam's seekable file for any other kind of location. The file object
    over bytes bears their name: FFmpeg's probe weighs the name's extension, as it does a path's (a headerless .raw
    member probes as FFmpeg probes a .raw file)."""
    if isinstance(content, str):
        where = location(content)
        return content if where.is_local else where.open("rb")
    if not isinstance(content, (bytes, bytearray)):
        return content
    file = io.BytesIO(content)
    if getattr(content, "name", ""):
        file.name = content.name
    return file


def content_extension(content: str | bytes) -> str:
    """The lower-case extension a decoder routes by: the path's, or the name's of an item's bytes ("" if none)."""
    name = content if isinstance(content, str) else getattr(content, "name", "")
    return os.path.splitext(name)[1].lower()
