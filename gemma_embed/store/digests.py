"""Content digests of the files a search index relies on (the output's files, the faiss file, the table itself):
the whole file's SHA-256, computed when the index is built, and a sampled one that a search can afford on every
open.

A search opens the index for every command run, and reading a whole file to hash it would cost more than the query:
measured on the 2-core AMD EPYC at 200,000 x 384 (a 156 MB IVF file), `faiss.read_index` took 32-120 ms and SHA-256
of the same bytes 90 ms (1.7 GB/s; CRC-32 35 ms). The sampled digest hashes the file's size, its first and last EDGE
bytes and BLOCKS blocks spread evenly between them (96 KiB in all: 85 us a file, opening it included, measured on
the same machine); a smaller file is hashed whole. It tells a file from a stale, foreign or truncated one (a faiss
file's first bytes hold its kind, width, count and its quantiser's centroids; an output's hold its header, keys and
first rows), not every flipped byte of a large file: the full digests in the record are the reference for that.
"""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

from gemma_embed.locations import Location, location

EDGE = 16 * 1024
BLOCK = 4096
BLOCKS = 16
WHOLE_BELOW = 2 * EDGE + BLOCKS * BLOCK  # 96 KiB: hashed whole
READ_BLOCK = 1 << 20


def sampled_sha256(fh: BinaryIO, size: int) -> str:
    """The sampled digest of an open file of `size` bytes (see the module's note), read with positioned reads."""
    digest = hashlib.sha256(size.to_bytes(8, "little"))
    if size <= WHOLE_BELOW:
        spans = [(0, size)]
    else:
        step = (size - 2 * EDGE - BLOCK) / (BLOCKS - 1)
        spans = [(0, EDGE), *((EDGE + round(n * step), BLOCK) for n in range(BLOCKS)), (size - EDGE, EDGE)]
    for start, length in spans:
        data = read_at(fh, length, start)
        if len(data) != length:
            raise OSError(f"shorter than its {size} bytes (truncated while read?)")
        digest.update(data)
    return digest.hexdigest()


def read_at(fh: BinaryIO, length: int, start: int) -> bytes:
    """`length` bytes from `start`: a positioned read (no seek) of a local file's descriptor, a seek and a read of
    a file object without one (object storage's: ranged requests)."""
    try:
        fd = fh.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        fh.seek(start)
        return fh.read(length)
    return os.pread(fd, length, start)


def full_sha256(fh: BinaryIO) -> str:
    """SHA-256 of the whole open file, read a block at a time from its start."""
    digest = hashlib.sha256()
    fh.seek(0)
    while block := fh.read(READ_BLOCK):
        digest.update(block)
    return digest.hexdigest()


def file_digests(file: str | os.PathLike | Location) -> dict[str, str | int]:
    """A file's size, whole and sampled digests, for an index record (the file opened as an input: a FIFO or a
    device is refused unopened)."""
    where = location(file)
    with where.open_input() as fh:
        size, _ = where.size_and_time(fh)
        return {"size": size, "sha256": full_sha256(fh), "sampled_sha256": sampled_sha256(fh, size)}
