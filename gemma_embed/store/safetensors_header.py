"""The safetensors header, built and read here for every file the tool writes or reads by hand.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape and byte
range in the data section, plus string `__metadata__`), then the tensors' bytes. The output's files
(`tensors_file`) and the search index's table (`row_table`) are both written this way, with the header built in a
fixed order here: `safetensors.torch.save_file` orders the metadata differently on every call (two identical runs
gave different bytes) and needs every tensor in memory at once. The JSON is compact ASCII, padded with spaces so
that the data section starts HEADER_ALIGNMENT-aligned, as safetensors' own writer pads it (the tests hold the files
against safetensors' reader and writer).

Files are read as untrusted: a header length past the file's end, a header that is not a JSON object, or metadata
that is not one is a `DamagedFile` naming the file, and no more than the file holds is ever read.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from typing import Any, BinaryIO, NamedTuple

from gemma_embed import FORMAT
from gemma_embed.locations import Location
from gemma_embed.store.damage import DamagedFile
from gemma_embed.store.digests import read_at

HEADER_ALIGNMENT = 8  # the data section starts 8-byte aligned, as safetensors' own writer pads it
LENGTH = struct.Struct("<Q")  # the header's length, before it


class TensorEntry(NamedTuple):
    """One tensor of a file: its safetensors dtype name (F32, BF16, I64, ...), shape and size in bytes."""

    dtype: str
    shape: list[int]
    nbytes: int


def build_header(tensors: Mapping[str, TensorEntry], metadata: Mapping[str, str]) -> bytes:
    """The length and the header of a file whose tensors' bytes follow it in this order, one after the other."""
    entries: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for name, tensor in tensors.items():
        entries[name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    text = json.dumps(entries, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    text += b" " * (-len(text) % HEADER_ALIGNMENT)
    return LENGTH.pack(len(text)) + text


def read_header(
    fh: BinaryIO, file: Location, kind: str = f"{FORMAT} file"
) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(string metadata, tensor entries by name, byte offset of the data section) of `file`, open as `fh` (a local
    file or a remote one: positioned reads). The header is read only when its length fits in the file as opened;
    what is not a safetensors header is a `DamagedFile(file, ..., kind)`. What the entries hold is the caller's to
    check."""
    size = fh.seek(0, io.SEEK_END)
    head = read_at(fh, LENGTH.size, 0)
    if len(head) != LENGTH.size:
        raise DamagedFile(file, "shorter than a safetensors header", kind)
    (length,) = LENGTH.unpack(head)
    if length > size:
        raise DamagedFile(file, f"header length {length} past the end", kind)
    try:
        header = json.loads(read_at(fh, length, LENGTH.size))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedFile(file, str(exc), kind) from None
    if not isinstance(header, dict):
        raise DamagedFile(file, f"its header is a JSON {type(header).__name__}, not an object", kind)
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise DamagedFile(file, f"its metadata is a JSON {type(meta).__name__}, not an object", kind)
    return meta, header, LENGTH.size + length
