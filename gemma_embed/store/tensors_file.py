"""One gemma-embed/1 file: the safetensors layout, written here and read with the safetensors library.

A safetensors file is an 8-byte little-endian header length, a JSON header (tensor dtypes, shapes and byte
ranges, plus string `__metadata__`), then the tensors' bytes. `safetensors.torch.save_file` would write the
same layout, but it orders the metadata differently on every call (two identical runs gave different bytes)
and creates 0600 files; it also needs every tensor in memory at once. So the header is written here, in a
fixed order, and the rows are streamed to the file item by item. Reading stays with `safetensors.safe_open`
(tests/unit/test_store.py checks the files against `safetensors.torch.load_file`).

Tensors: `embeddings` [total_rows, D] (every item's rows, in order) and `offsets` int64 [N+1] (item i is
`embeddings[offsets[i]:offsets[i+1]]`). Metadata: the run header, `format`, `created_by`, `dtype`, and `keys`
and `items` as ASCII JSON lists in row order.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gemma_embed import FORMAT, __version__
from gemma_embed.store.atomic import atomic_file

if TYPE_CHECKING:
    from safetensors import safe_open

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
HEADER_ALIGNMENT = 8  # the data section starts 8-byte aligned, as safetensors' own writer pads it


def file_metadata(header: dict[str, str], dtype: torch.dtype, keys: list[str], items: list[dict]) -> dict[str, str]:
    """The string metadata of one file, in a fixed order."""
    return {
        **header,
        "format": FORMAT,
        "created_by": f"gemma-embed {__version__}",
        "dtype": str(dtype).removeprefix("torch."),
        # ASCII JSON: file names that are not UTF-8 (surrogate-escaped by Python) survive the round trip.
        "keys": json.dumps(keys, ensure_ascii=True),
        "items": json.dumps(items, ensure_ascii=True),
    }


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.numel() == 0:
        return b""
    return tensor.reshape(-1).view(torch.uint8).numpy().tobytes()


def write_embedding_file(
    path: Path,
    metadata: dict[str, str],
    row_counts: list[int],
    width: int,
    dtype: torch.dtype,
    row_blocks: Iterable[torch.Tensor],
) -> Path:
    """Write one file atomically: `row_blocks` are the items' rows in order (each [rows_i, width], any dtype;
    cast to `dtype` here), read one at a time, so the whole embedding matrix is never in memory."""
    total_rows = sum(row_counts)
    element = torch.empty((), dtype=dtype).element_size()
    embedding_bytes = total_rows * width * element
    offsets = torch.tensor([0, *row_counts], dtype=torch.int64).cumsum(0)
    header = {
        "__metadata__": metadata,
        "embeddings": {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": [total_rows, width],
            "data_offsets": [0, embedding_bytes],
        },
        "offsets": {
            "dtype": "I64",
            "shape": [len(row_counts) + 1],
            "data_offsets": [embedding_bytes, embedding_bytes + 8 * (len(row_counts) + 1)],
        },
    }
    text = json.dumps(header, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    text += b" " * (-len(text) % HEADER_ALIGNMENT)
    with atomic_file(path) as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        written = 0
        for count, block in zip(row_counts, row_blocks, strict=True):
            if tuple(block.shape) != (count, width):
                raise ValueError(f"rows of shape {tuple(block.shape)} where ({count}, {width}) was planned")
            data = _raw_bytes(block.to(dtype))
            fh.write(data)
            written += len(data)
        if written != embedding_bytes:
            raise ValueError(f"wrote {written} bytes of embeddings where {embedding_bytes} were planned")
        fh.write(_raw_bytes(offsets))
    return path


def _safe_open(file: Path) -> safe_open:
    """safetensors' reader, with its own error type (a file that is not safetensors at all) as a ValueError
    naming the file."""
    from safetensors import SafetensorError, safe_open  # looked up at each call: tests spy on tensor reads

    try:
        return safe_open(str(file), framework="pt")
    except SafetensorError as exc:
        raise ValueError(f"{file}: not a {FORMAT} file ({' '.join(str(exc).split())})") from None


def read_header(file: Path) -> dict[str, str]:
    """A gemma-embed/1 file's string metadata, without reading any tensor."""
    with _safe_open(file) as fh:
        meta = dict(fh.metadata() or {})
    if meta.get("format") != FORMAT:
        raise ValueError(f"{file}: not a {FORMAT} file (format={meta.get('format')!r})")
    return meta


class FileRows:
    """Rows of one item at a time from an open file (memory-mapped slices, nothing else is read)."""

    def __init__(self, file: Path, stack: ExitStack):
        self.file = Path(file)
        self.handle = stack.enter_context(_safe_open(file))
        self.metadata = self.handle.metadata() or {}
        if self.metadata.get("format") != FORMAT:
            raise ValueError(f"{file}: not a {FORMAT} file (format={self.metadata.get('format')!r})")
        self.keys: list[str] = json.loads(self.metadata["keys"])
        self.items: list[dict] = json.loads(self.metadata["items"])
        self._offsets: list[int] | None = None

    def rows(self, position: int) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = self.handle.get_tensor("offsets").tolist()
        return self.handle.get_slice("embeddings")[self._offsets[position] : self._offsets[position + 1]]
