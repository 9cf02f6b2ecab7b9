"""Tar shards as hostile inputs are: sparse members (GNU's old `S` headers, crafted here byte for byte, and GNU tar's
own `--sparse` output when GNU tar is installed), links, devices and FIFOs as members."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

BLOCK = tarfile.BLOCKSIZE


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % BLOCK)


def member(info: tarfile.TarInfo, data: bytes = b"") -> bytes:
    """One member as tarfile writes it (GNU format): header, data, padding to the block."""
    info.size = len(data) if info.isreg() else 0
    return info.tobuf(tarfile.GNU_FORMAT) + _padded(data)


def gnu_sparse_member(name: str, size: int, chunks: list[tuple[int, bytes]]) -> bytes:
    """A member of `size` bytes when expanded that stores only `chunks` (offset, bytes; at most 4): an old GNU
    sparse header (type `S`: the map at byte 386, `realsize` at 483, as GNU tar's `--format=gnu --sparse`
    writes it, closed by an empty chunk at the end, which GNU tar needs to extend the file over a last hole), then
    the chunks' bytes one after the other."""
    chunks = [*chunks, (size, b"")]
    assert len(chunks) <= 4
    stored = b"".join(data for _, data in chunks)
    info = tarfile.TarInfo(name)
    info.type = tarfile.GNUTYPE_SPARSE
    info.mode = 0o644
    info.size = len(stored)
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    assert len(header) == BLOCK  # no long-name block before it
    for i, (offset, data) in enumerate(chunks):
        at = 386 + 24 * i
        header[at : at + 12] = tarfile.itn(offset, 12, tarfile.GNU_FORMAT)
        header[at + 12 : at + 24] = tarfile.itn(len(data), 12, tarfile.GNU_FORMAT)
    header[482] = 0  # no extension blocks of the map
    header[483:495] = tarfile.itn(size, 12, tarfile.GNU_FORMAT)
    header[148:156] = b" " * 8  # the checksum counts its own field as spaces
    header[148:155] = b"%06o\0" % sum(header)
    return bytes(header) + _padded(stored)


def write_tar(path: Path, members: list[bytes]) -> Path:
    """The members, then tar's end-of-archive marker (two zero blocks)."""
    path.write_bytes(b"".join(members) + b"\0" * (2 * BLOCK))
    return path


def regular(name: str, data: bytes) -> bytes:
    return member(tarfile.TarInfo(name), data)


def special(name: str, kind: bytes, linkname: str = "") -> bytes:
    """A member that is no regular file: tarfile.SYMTYPE, LNKTYPE, DIRTYPE, FIFOTYPE, CHRTYPE, BLKTYPE."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 5  # /dev/zero's numbers
    return member(info)


def gnu_tar() -> str | None:
    """The `tar` program when it is GNU tar (which writes sparse members), else None."""
    found = shutil.which("tar")
    if found is None:
        return None
    version = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
    return found if "GNU tar" in version else None


def sparse_file(path: Path, size: int, chunks: list[tuple[int, bytes]]) -> Path:
    """A file of `size` bytes with holes everywhere but `chunks` (truncate, then write: the file system keeps
    the holes)."""
    with open(path, "wb") as fh:
        fh.truncate(size)
        for offset, data in chunks:
            fh.seek(offset)
            fh.write(data)
    return path
