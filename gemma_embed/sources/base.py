"""What every kind of source yields: a keyed item (`Source`), and the options that say how table rows become items
(`Collection`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from gemma_embed.media import file_facts

# The commands whose items can sit in collections (tar shards, parquet files, datasets).
MEDIA_MODALITIES = frozenset({"images", "video", "audio"})


@dataclass(frozen=True)
class Source:
    """One input item. `key` names it in the output; `path` is the file that holds it.

    Most items are whole files, opened by path. An item that is part of something else (a line of a text file, a
    tar member, a parquet cell, a dataset row) carries its own bytes in `data`, and what the collection says about
    it (a caption, sidecar JSON, kept columns) in `meta`, which joins the item's metadata. Decoders get `data` when
    there is some, else `path`, and never know which kind of source it was.
    """

    key: str
    path: str
    error: str | None = None  # set when the path cannot be an item (missing); reported, not fatal
    position: int = 0  # place in the whole input: orders the output and assigns distributed slices
    data: bytes | None = None  # the item's own bytes, when it is not a whole file
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def content(self) -> str | bytes:
        """What a decoder opens: the item's bytes, or the path of the file that is the item."""
        return self.data if self.data is not None else self.path

    def facts(self) -> dict:
        """Where the item is, its size and content hash (how --resume knows it), and a file's mtime."""
        if self.data is None:
            return {"path": self.path, **file_facts(self.path)}
        return {"path": self.path, "bytes": len(self.data), "sha256": hashlib.sha256(self.data).hexdigest()}


@dataclass(frozen=True)
class Collection:
    """How the rows of a table (.parquet files, a Hugging Face dataset) become items: `column` holds the media
    (bytes, a file path, or datasets' struct of both), `key_column` names items instead of FILE:ROW,
    `keep_columns` go to each item's metadata; `dataset` (hub id or folder) and its `split` add that dataset's
    rows to the input."""

    column: str | None = None
    key_column: str | None = None
    keep_columns: tuple[str, ...] = ()
    dataset: str | None = None
    split: str | None = None
