"""Outputs and parts written with the store's own writer, and the ways tests damage them (issue 20)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gemma_embed.store import EmbeddingWriter

HEADER = {"model": "m", "modality": "images"}
RESUME_FIX = "remove it or run with --overwrite"
REBUILD = "embed the inputs again with --overwrite to rebuild it"
NOT_OURS = {"a pickle"}


def write_output(out: Path, count: int = 3) -> Path:
    writer = EmbeddingWriter(out, HEADER)
    for i in range(count):
        writer.add(f"k{i}", torch.full((i + 1, 4), float(i)), {"path": f"k{i}", "sha256": f"c{i}"}, i)
    return writer.close()


def write_part(out: Path, keys=("p0", "p1")) -> Path:
    """An interrupted run's part (flushed, never closed)."""
    writer = EmbeddingWriter(out, HEADER)
    for i, key in enumerate(keys):
        writer.add(key, torch.full((2, 4), float(i)), {"path": key, "sha256": f"s{key}"}, i)
    writer.flush()
    (part,) = writer.parts.glob("part-*.safetensors")
    return part


def rewrite_metadata(path: Path, change) -> None:
    """The same tensors with the metadata `change` made (safetensors' own writer)."""
    with safe_open(str(path), framework="pt") as fh:
        meta = dict(fh.metadata())
        tensors = {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118 - safe_open has no iteration
    change(meta)
    save_file(tensors, str(path), metadata=meta)


def _replace(path: Path, make) -> None:
    path.unlink()
    make(path)


# case -> (how to damage a gemma-embed/1 file at `path`, the reason the message gives). A case in NOT_OURS leaves
# something that is no gemma-embed file at all: readers call it "not a gemma-embed output" and advise no rebuild.
CASES = {
    "a directory": (lambda p: _replace(p, Path.mkdir), "is a directory"),
    "a FIFO": (lambda p: _replace(p, os.mkfifo), "is a FIFO"),
    "a pickle": (
        lambda p: p.write_bytes(pickle.dumps({"embeddings": torch.ones(2)})),
        "Error while deserializing header: header too large",
    ),
    "malformed items": (
        lambda p: rewrite_metadata(p, lambda m: m.update(items=m["items"][:-7])),
        "items is not valid JSON: ",
    ),
    "keys and items of different lengths": (
        lambda p: rewrite_metadata(p, lambda m: m.update(keys=json.dumps(json.loads(m["keys"])[:-1]))),
        "keys but",
    ),
    "no keys field": (lambda p: rewrite_metadata(p, lambda m: m.pop("keys")), "no keys field"),
    "rows that do not match the offsets": (
        lambda p: rewrite_metadata(
            p, lambda m: m.update(items=json.dumps([{**i, "rows": i["rows"] + 1} for i in json.loads(m["items"])]))
        ),
        "offsets do not match the items' row counts",
    ),
}
