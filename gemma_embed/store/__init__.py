"""Every file layout of an output, written and read here and nowhere else (the `gemma-embed/1` format).

- `tensors_file`: one embedding file (safetensors layout: `embeddings`, `offsets`, string metadata);
- `safetensors_header`: the safetensors header, built (in a fixed order) and read for every file written by hand;
- `row_table`: the search index's row table (`OUT.search-index`) and the output's fingerprint;
- `digests`: the whole and sampled SHA-256 of the files an index relies on;
- `atomic`: whole-file writes of small files (through the seam, gemma_embed/locations) and the one-line error for a
  failed write;
- `damage`: `DamagedFile`, the one-line error for a file that is not what it should be, and the checks before a
  file of an output is opened;
- `layout`: the names of parts, shards, slices, manifests, the index, the errors file and the lock;
- `lock`: `output_lock`, one writer per output;
- `writer`: `EmbeddingWriter` (parts, resume, the final order, shards);
- `reader`: `load`, `iter_items`, `read_metadata` (and `item_shapes`, which like it imports no torch) over every
  layout; `output_index` and `iter_row_blocks` for
  readers that scan every row in blocks (search).

Names are resolved on first use: the writer imports torch when an `EmbeddingWriter` is made (`check_output_path`
needs none), and the reader imports it for tensors only (headers,
keys, items and shapes come through safetensors' numpy reader: `gemma-embed inspect` starts in well under a
second); the command line takes the output's lock (`layout` and `lock` need no torch) before it imports torch, so
that a second run into a busy output fails at once.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "FINGERPRINT": "writer",
    "EmbeddingWriter": "writer",
    "OutputFile": "reader",
    "RowBlock": "reader",
    "iter_items": "reader",
    "item_shapes": "reader",
    "iter_row_blocks": "reader",
    "load": "reader",
    "output_index": "reader",
    "read_metadata": "reader",
    "read_header": "tensors_file",
    "write_embedding_file": "tensors_file",
    "output_lock": "lock",
    "DamagedFile": "damage",
    "guarded_write": "atomic",
    "atomic_write_text": "atomic",
    "check_output_path": "writer",
    "check_resumable": "writer",
    **{
        name: "layout"
        for name in (
            "check_destination",
            "check_output_folder",
            "errors_path",
            "index_path",
            "lock_path",
            "manifest_path",
            "merge_slices",
            "output_files",
            "parts_folder",
            "plan_shards",
            "refuse_existing",
            "shard_path",
            "slice_path",
            "write_errors",
            "write_index",
            "write_manifest",
        )
    },
}

__all__ = ["make_header", *_LAZY]


def make_header(**fields: object) -> dict[str, str]:
    """The run-level metadata every file of an output carries, as strings (None becomes ""). The FINGERPRINT
    fields among them must match for --resume to reuse earlier work."""
    return {name: "" if value is None else str(value) for name, value in fields.items()}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(f"gemma_embed.store.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'gemma_embed.store' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
