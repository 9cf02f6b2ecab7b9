"""Every file layout of an output, written and read here and nowhere else (the `gemma-embed/1` format).

- `tensors_file`: one embedding file (safetensors layout: `embeddings`, `offsets`, string metadata);
- `atomic`: whole-file writes (a temporary file renamed into place) and the one-line error for a failed write;
- `layout`: the names of parts, shards, slices, manifests, the index and the errors file;
- `writer`: `EmbeddingWriter` (parts, resume, the final order, shards);
- `reader`: `load`, `iter_items`, `read_metadata` over every layout; `output_index` and `iter_row_blocks` for
  readers that scan every row in blocks (search).
"""

from gemma_embed.store.atomic import atomic_path, atomic_write_text, guarded_write
from gemma_embed.store.layout import (
    check_output_path,
    errors_path,
    index_path,
    manifest_path,
    merge_slices,
    output_files,
    parts_folder,
    plan_shards,
    shard_path,
    slice_path,
    write_errors,
    write_index,
    write_manifest,
)
from gemma_embed.store.reader import (
    OutputFile,
    RowBlock,
    iter_items,
    iter_row_blocks,
    load,
    output_index,
    read_metadata,
)
from gemma_embed.store.tensors_file import read_header, write_embedding_file
from gemma_embed.store.writer import FINGERPRINT, EmbeddingWriter


def make_header(**fields: object) -> dict[str, str]:
    """The run-level metadata every file of an output carries, as strings (None becomes ""). The FINGERPRINT
    fields among them must match for --resume to reuse earlier work."""
    return {name: "" if value is None else str(value) for name, value in fields.items()}


__all__ = [
    "FINGERPRINT",
    "EmbeddingWriter",
    "OutputFile",
    "RowBlock",
    "iter_row_blocks",
    "output_index",
    "atomic_path",
    "atomic_write_text",
    "check_output_path",
    "errors_path",
    "guarded_write",
    "index_path",
    "iter_items",
    "load",
    "make_header",
    "manifest_path",
    "merge_slices",
    "output_files",
    "parts_folder",
    "plan_shards",
    "read_header",
    "read_metadata",
    "shard_path",
    "slice_path",
    "write_embedding_file",
    "write_errors",
    "write_index",
    "write_manifest",
]
