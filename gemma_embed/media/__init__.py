"""Decode stage: file -> decoded media, plus the facts about the file that go into the output metadata.

Decoders take what `Source.content` gives them: a path (a whole file), or the item's own bytes (a tar member, a
parquet cell, a dataset row). Bytes from a collection come as `MediaBytes`, which carries the name the item has
there (a member's name, a cell's file name), so a decoder that routes by extension does so as for a file.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat

_HASH_BLOCK = 1 << 20
# Pillow's decompression-bomb limit (about 89 megapixels), for images and video frames alike.
MAX_PIXELS = 89_478_485
# av.open timeouts (open, read) in seconds: a stalled read (network mount) must not hang the run.
OPEN_TIMEOUT_S = (30.0, 30.0)


# What a file that is not a regular one is, by its stat mode, for messages.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularFile(ValueError):
    """An input that is neither a regular file nor a folder: a FIFO, a device, a socket."""


def regular_file(path: str | os.PathLike, what: str = "a media file") -> os.stat_result:
    """The file's stat (through symbolic links), after refusing what must not be opened for reading: a folder
    (IsADirectoryError, "is a directory, not `what`") and anything that is not a regular file (NotRegularFile,
    naming its kind and, through a link, where the link leads). Only stat is called, never open: opening a FIFO
    blocks until a writer comes, and /dev/zero or /dev/urandom never end. Every input the tool opens (media
    files, tar shards, parquet files, a dataset folder's files, text files) passes here first."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"is a directory, not {what}")
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
        if os.path.islink(path):
            kind = f"a symbolic link to {os.path.realpath(path)}, {kind}"
        raise NotRegularFile(f"not a regular file ({kind}); not opened")
    return st


def file_facts(path: str) -> dict:
    """Size, modification time and SHA-256 of the content: how `--resume` tells a changed file."""
    st = regular_file(path)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
    return {"bytes": st.st_size, "mtime": st.st_mtime, "sha256": digest.hexdigest()}


def refuse_nothing_to_decode(content: str | bytes, what: str, error: type[Exception]) -> None:
    """The checks audio and video decoding make before opening anything: a folder, or no bytes at all, is a
    one-line `error` (`what`: "an audio file", "a video file")."""
    if isinstance(content, str):
        if os.path.isdir(content):
            raise error(f"is a directory, not {what}")
        if os.path.getsize(content) == 0:
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


def as_file(content: str | bytes) -> str | io.BytesIO:
    """What a library's open() takes: the path itself, or a file object over the bytes (Pillow, PyAV and
    soundfile read both). The file object bears the bytes' name: FFmpeg's probe weighs the name's extension, as it
    does a path's (a headerless .raw member probes as FFmpeg probes a .raw file)."""
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
