"""Write and read the `gemma-embed/1` format (DESIGN §3).

One `.safetensors` file: `embeddings` [total_rows, D] with every item's rows in input order, `offsets` int64
[N+1], and string metadata (`keys` and `items` as JSON lists in row order). The final file appears atomically:
it is written to a temporary file in the same folder, flushed to disk, then renamed.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from gemma_embed import FORMAT, __version__
from gemma_embed.errors import UsageError

OUTPUT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_output_path(path: Path, overwrite: bool) -> None:
    """Fail before any work if the output exists (without --overwrite) or its folder is not writable."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path}: output path is a folder")
    if path.exists() and not overwrite:
        raise UsageError(f"{path}: output exists; pass --overwrite to replace it")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{folder}: output folder does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.", suffix=".probe"):
            pass
    except OSError as exc:
        raise UsageError(f"{folder}: cannot write the output here: {exc.strerror or exc}") from exc


def atomic_save(tensors: dict[str, torch.Tensor], metadata: dict[str, str], path: Path) -> None:
    from safetensors.torch import save_file

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class EmbeddingWriter:
    """Collects items in input order and writes them as one gemma-embed/1 file on `close`."""

    def __init__(self, path: Path, header: dict[str, str], output_dtype: str = "float32"):
        self.path = Path(path)
        self.header = dict(header)
        self.dtype = OUTPUT_DTYPES[output_dtype]
        self.keys: list[str] = []
        self.items: list[dict] = []
        self.rows: list[torch.Tensor] = []

    def add(self, key: str, rows: torch.Tensor, meta: dict) -> None:
        rows = rows.detach().to("cpu", self.dtype).contiguous()
        if rows.dim() != 2:
            raise ValueError(f"{key}: rows must be 2-D, got shape {tuple(rows.shape)}")
        self.keys.append(key)
        self.items.append({**meta, "rows": int(rows.shape[0])})
        self.rows.append(rows)

    def __len__(self) -> int:
        return len(self.keys)

    def close(self) -> Path:
        width = self.rows[0].shape[1] if self.rows else 0
        embeddings = torch.cat(self.rows) if self.rows else torch.zeros((0, width), dtype=self.dtype)
        counts = torch.tensor([0] + [r.shape[0] for r in self.rows], dtype=torch.int64)
        metadata = {
            **self.header,
            "format": FORMAT,
            "created_by": f"gemma-embed {__version__}",
            "dtype": str(self.dtype).removeprefix("torch."),
            "keys": json.dumps(self.keys, ensure_ascii=False),
            "items": json.dumps(self.items, ensure_ascii=False),
        }
        atomic_save({"embeddings": embeddings, "offsets": torch.cumsum(counts, 0)}, metadata, self.path)
        return self.path


# --------------------------------------------------------------------------------------------------- reader


def _files(path: Path) -> list[Path]:
    """The safetensors files behind an output: itself, or the shards its index lists."""
    path = Path(path)
    index = path if path.suffix == ".json" else path.with_name(path.name.removesuffix(".safetensors") + ".index.json")
    if path.suffix == ".json" or (not path.exists() and index.exists()):
        shards = json.loads(index.read_text())["shards"]
        return [index.parent / s for s in shards]
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such output file")
    return [path]


def read_metadata(path: str | os.PathLike) -> dict:
    """The header of an output file with `keys` and `items` decoded from JSON (first shard for an index)."""
    from safetensors import safe_open

    files = _files(Path(path))
    keys: list[str] = []
    items: list[dict] = []
    meta: dict = {}
    for file in files:
        with safe_open(str(file), framework="pt") as fh:
            meta = dict(fh.metadata() or {})
        if meta.get("format") != FORMAT:
            raise ValueError(f"{file}: not a {FORMAT} file (format={meta.get('format')!r})")
        keys += json.loads(meta["keys"])
        items += json.loads(meta["items"])
    meta["keys"] = keys
    meta["items"] = items
    return meta


def iter_items(path: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor, dict]]:
    """Yield (key, rows, item metadata) one item at a time, reading only that item's rows."""
    from safetensors import safe_open

    for file in _files(Path(path)):
        with safe_open(str(file), framework="pt") as fh:
            meta = fh.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"{file}: not a {FORMAT} file")
            keys = json.loads(meta["keys"])
            items = json.loads(meta["items"])
            offsets = fh.get_tensor("offsets").tolist()
            embeddings = fh.get_slice("embeddings")
            for i, key in enumerate(keys):
                yield key, embeddings[offsets[i]:offsets[i + 1]], items[i]


def load(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every item's rows, keyed as in the output, in row order."""
    return {key: rows for key, rows, _ in iter_items(path)}
