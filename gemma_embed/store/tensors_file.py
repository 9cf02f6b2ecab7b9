"""One gemma-embed/1 file: the safetensors layout, written here and read with the safetensors library.

The header is built in a fixed order by `safetensors_header.build_header` (`safetensors.torch.save_file` would
write the same layout, but it orders the metadata differently on every call, creates 0600 files and needs every
tensor in memory at once), and the rows are streamed to the file item by item. Reading stays with
`safetensors.safe_open` (tests/unit/test_store.py checks the files against `safetensors.torch.load_file`).

Tensors: `embeddings` [total_rows, D] (every item's rows, in order) and `offsets` int64 [N+1] (item i is
`embeddings[offsets[i]:offsets[i+1]]`). Metadata: the run header, `format`, `created_by`, `dtype`, and `keys`
and `items` as ASCII JSON lists in row order; parts also carry `rows_crc32` (one checksum per item, `row_checksum`).

Files are read as untrusted: anything where such a file should be that is not one (a folder, a FIFO, a pickle,
metadata that is not the JSON lists it should be, offsets that do not match the items) is a `DamagedFile`, one
line naming the file, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gemma_embed import FORMAT, __version__, nested_json
from gemma_embed.config import DTYPE_CODES
from gemma_embed.locations import Location, NotRegularFile, location
from gemma_embed.store.damage import FORMAT_NAME, NOT_AN_OUTPUT, DamagedFile, looks_ours, require_regular_file
from gemma_embed.store.safetensors_header import TensorEntry, build_header

if TYPE_CHECKING:
    import torch

# torch is imported by the functions that write or read tensors: reading a file's header, keys, items and shapes
# (`gemma-embed inspect`, `read_metadata`) goes through safetensors' numpy reader and never imports it.
EMBEDDING_CODES = {name: code for name, code in DTYPE_CODES.items() if name != "float64"}  # by torch dtype name
FORMAT_FILE = f"{FORMAT} file"  # the kind a damaged or other-version output is told as


def file_metadata(
    header: dict[str, str],
    dtype: torch.dtype,
    keys: list[str],
    items: list[dict],
    row_checksums: list[str] | None = None,
) -> dict[str, str]:
    """The string metadata of one file, in a fixed order; `row_checksums` (parts) are checked by --resume."""
    from gemma_embed.device import dtype_name

    meta = {
        **header,
        "format": FORMAT,
        "created_by": f"gemma-embed {__version__}",
        "dtype": dtype_name(dtype),
        # ASCII JSON: file names that are not UTF-8 (surrogate-escaped by Python) survive the round trip.
        "keys": json.dumps(keys, ensure_ascii=True),
        "items": json.dumps(items, ensure_ascii=True),
    }
    if row_checksums is not None:
        meta["rows_crc32"] = json.dumps(row_checksums)
    return meta


def row_checksum(rows: torch.Tensor) -> str:
    """CRC-32 of one item's rows as stored (their bytes in the file's dtype), computed in place, as 8 hex digits.

    What it guards against is change by accident (a flipped bit, a torn or edited file), what CRC-32 is made for;
    whoever can rewrite a part can rewrite any checksum in it too. Measured (`python -m bench.bench_part_checksum`,
    2-core AMD EPYC): 0.56 ms for the 1.7 MB rows of a 280-token image at hidden 1536 (3.1 GB/s), a quarter more
    on the part's own write (1.7 ms per item), where sha256 took 1.9 ms."""
    import torch

    flat = rows.detach().to("cpu").contiguous().reshape(-1)
    data: Any = flat.view(torch.uint8).numpy()  # a buffer: no copy
    return f"{zlib.crc32(data):08x}"


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    import torch

    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.numel() == 0:
        return b""
    return tensor.reshape(-1).view(torch.uint8).numpy().tobytes()


def write_embedding_file(
    path: str | os.PathLike | Location,
    metadata: dict[str, str],
    row_counts: list[int],
    width: int,
    dtype: torch.dtype,
    row_blocks: Iterable[torch.Tensor],
    own_folder: bool = False,
) -> Location:
    """Write one file atomically: `row_blocks` are the items' rows in order (each [rows_i, width], any dtype;
    cast to `dtype` here), read one at a time, so the whole embedding matrix is never in memory. `own_folder`:
    the file goes in a folder of the tool's own (parts: `Location.own_folder`)."""
    import torch

    total_rows = sum(row_counts)
    element = torch.empty((), dtype=dtype).element_size()
    embedding_bytes = total_rows * width * element
    offsets = torch.tensor([0, *row_counts], dtype=torch.int64).cumsum(0)
    code = EMBEDDING_CODES[str(dtype).removeprefix("torch.")]
    tensors = {
        "embeddings": TensorEntry(code, [total_rows, width], embedding_bytes),
        "offsets": TensorEntry("I64", [len(row_counts) + 1], 8 * (len(row_counts) + 1)),
    }
    path = location(path)
    with path.atomic_write(own_folder) as fh:
        fh.write(build_header(tensors, metadata))
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


def _safe_open(file: Location, framework: str = "pt") -> Any:
    """safetensors' reader on a regular file (a FIFO would block the open; a folder gives "No such device"),
    with its own error type (a file that is not safetensors at all, such as a pickle) as a `DamagedFile`. It
    memory-maps the file by a name that is the checked file's own (`Location.input_by_name`). `framework="numpy"`:
    tensors come as numpy arrays, and torch is not imported."""
    from safetensors import SafetensorError, safe_open

    require_regular_file(file)
    try:
        with file.input_by_name() as (_, name):
            return safe_open(name, framework=framework)
    except (SafetensorError, NotRegularFile) as exc:  # NotRegularFile: swapped in after the check above
        raise DamagedFile(file, str(exc), FORMAT_FILE if looks_ours(file) else NOT_AN_OUTPUT) from None


def _metadata(file: Location, handle: Any) -> dict[str, str]:
    """The file's string metadata, when it is a gemma-embed/1 file: a safetensors file without gemma-embed's format
    field is someone else's (`NOT_AN_OUTPUT`); one of another gemma-embed format an older (or newer) output."""
    meta = dict(handle.metadata() or {})
    found = meta.get("format")
    if found != FORMAT:
        if found is None:
            raise DamagedFile(file, "a safetensors file without gemma-embed's metadata", NOT_AN_OUTPUT)
        ours = str(found).startswith(FORMAT_NAME)
        raise DamagedFile(file, f"format={found!r}", FORMAT_FILE if ours else NOT_AN_OUTPUT)
    return meta


def read_header(file: str | os.PathLike | Location) -> dict:
    """A gemma-embed/1 file's string metadata, without reading any tensor."""
    file = location(file)
    with _safe_open(file, "numpy") as fh:
        return _metadata(file, fh)


# A metadata list's own nesting: the list, an item, its fields (an item's kept JSON-lines fields nest up to
# nested_json.MAX_DEPTH below those).
LIST_DEPTH = nested_json.MAX_DEPTH + 4


def json_list(file: Location, meta: dict, field: str, element: type) -> list:
    """Metadata field `field`: a JSON list of `element`s (keys: str, items: dict, checksums: str)."""
    if field not in meta:
        raise DamagedFile(file, f"no {field} field")
    try:
        value = nested_json.loads(meta[field], LIST_DEPTH)
    except nested_json.TooDeep as exc:
        raise DamagedFile(file, f"{field} is {exc}, which no gemma-embed output is") from None
    except json.JSONDecodeError as exc:
        raise DamagedFile(file, f"{field} is not valid JSON: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(v, element) for v in value):
        raise DamagedFile(file, f"{field} is not a JSON list of {element.__name__} values")
    return value


def listing(file: Location, meta: dict) -> tuple[list[str], list[dict]]:
    """The keys and items of a file, checked against each other."""
    keys, items = json_list(file, meta, "keys", str), json_list(file, meta, "items", dict)
    if len(keys) != len(items):
        raise DamagedFile(file, f"{len(keys)} keys but {len(items)} items")
    if len(set(keys)) != len(keys):
        raise DamagedFile(file, "a key appears twice")
    if not all(type(item.get("rows")) is int and item["rows"] >= 0 for item in items):
        raise DamagedFile(file, "an item without a row count")
    return keys, items


def checked_offsets(file: Location, handle: Any, count: int | None = None, rows: list[int] | None = None) -> Any:
    """The `offsets` tensor (a torch tensor, or a numpy array from a numpy handle), checked against the
    embeddings' rows and, when given, the item count and rows."""
    import numpy as np
    from safetensors import SafetensorError

    try:
        offsets = handle.get_tensor("offsets")
        shape = handle.get_slice("embeddings").get_shape()
    except SafetensorError as exc:
        raise DamagedFile(file, str(exc)) from None
    values = np.asarray(offsets)
    if values.dtype != np.int64 or values.ndim != 1 or len(values) == 0 or len(shape) != 2:
        raise DamagedFile(file, f"offsets of shape {tuple(values.shape)}, embeddings of shape {tuple(shape)}")
    if count is not None and len(values) != count + 1:
        raise DamagedFile(file, f"{len(values)} offsets for {count} items")
    if int(values[0]) != 0 or int(values[-1]) != shape[0] or bool((np.diff(values) < 0).any()):
        raise DamagedFile(file, f"offsets do not cover the {shape[0]} embedding rows")
    if rows is not None and np.diff(values).tolist() != rows:
        raise DamagedFile(file, "offsets do not match the items' row counts")
    return offsets


class FileRows:
    """Rows of one item at a time from an open file (memory-mapped slices, nothing else is read); its keys,
    items and offsets are checked on opening. `framework="numpy"`: rows as numpy arrays, torch never imported
    (for readers of the listing alone)."""

    def __init__(self, file: str | os.PathLike | Location, stack: contextlib.ExitStack, framework: str = "pt") -> None:
        self.file = location(file)
        self.handle = stack.enter_context(_safe_open(self.file, framework))
        self.metadata = _metadata(self.file, self.handle)
        self.keys, self.items = listing(self.file, self.metadata)
        rows = [item["rows"] for item in self.items]
        self._offsets: list[int] = checked_offsets(self.file, self.handle, len(self.keys), rows).tolist()

    @property
    def width(self) -> int:
        """The embeddings' width (columns), from the file's header."""
        return int(self.handle.get_slice("embeddings").get_shape()[1])

    def rows(self, position: int) -> torch.Tensor:
        return self.handle.get_slice("embeddings")[self._offsets[position] : self._offsets[position + 1]]
