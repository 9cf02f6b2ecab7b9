"""Decode stage: file -> decoded media, plus the facts about the file that go into the output metadata."""

from __future__ import annotations

import hashlib
import os
import stat

_HASH_BLOCK = 1 << 20
# Pillow's decompression-bomb limit (about 89 megapixels), for images and video frames alike.
MAX_PIXELS = 89_478_485
# av.open timeouts (open, read) in seconds: a stalled read (network mount) must not hang the run.
OPEN_TIMEOUT_S = (30.0, 30.0)


def file_facts(path: str) -> dict:
    """Size, modification time and SHA-256 of the content: how `--resume` tells a changed file."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError("is a directory, not a media file")
    if not stat.S_ISREG(st.st_mode):
        # A FIFO or device would block or never end: refuse before reading a byte.
        raise ValueError("not a regular file")
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
    return {"bytes": st.st_size, "mtime": st.st_mtime, "sha256": digest.hexdigest()}


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
