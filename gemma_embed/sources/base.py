"""What every kind of source yields: a keyed item (`Source`), and what collections (tar shards, tables) report
about items they cannot give: too large to read, members that are no files. How collections give items
(`Collection`: columns, the item size limit, where path cells may lead) is an option, defined in config.py."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from gemma_embed.config import (  # noqa: F401 - re-exported
    ITEM_BYTES_FLOOR,
    MEDIA_MODALITIES,
    Collection,
    default_item_bytes,
    parse_item_bytes,
)
from gemma_embed.locations import location
from gemma_embed.redact import redact
from gemma_embed.sizes import human_bytes
from gemma_embed.sources.bounded import utf8_prefix


@dataclass(frozen=True)
class Source:
    """One input item. `key` names it in the output; `path` is the file that holds it.

    Most items are whole files, opened by path. An item that is part of something else (a line of a text file, a
    tar member, a parquet cell, a dataset row) carries its own bytes in `data`, and what the collection says about
    it (a caption, sidecar JSON, kept columns) in `meta`, which joins the item's metadata. Decoders get `data` when
    there is some, else `path`, and never know which kind of source it was.

    A Source with a `unit` is no item yet: a part of the input (a tar shard, a parquet row group, a JSON-lines or
    text file) left whole by a find stage whose items a worker finds itself (a Ray run: `Unit`).
    """

    key: str
    path: str
    error: str | None = None  # set when the path cannot be an item (missing); reported, not fatal
    kind: str | None = None  # with `error`: what happened (errors.RECORD_KINDS), the record's `error`
    failed_at: str = "find"  # the stage the error belongs to: find, or fetch (sources/fetch.py)
    position: int = 0  # place in the whole input: orders the output and assigns distributed slices
    data: bytes | None = None  # the item's own bytes, when it is not a whole file
    unit: Unit | None = None  # a part of the input whose items are found where it is read, not here
    # A table's row keyed by the --key-column value it took: the row's own key (FILE:ROW), for a run whose units are
    # found by several workers, each with its own keys (the run's are checked after: `table.checked_key`).
    row_key: str | None = None
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    # An in-memory value from a Python caller (a PIL image, audio samples with their rate): decoded as it is.
    value: Any = field(default=None, compare=False, hash=False)

    @property
    def content(self) -> Any:
        """What a decoder opens: an in-memory value, the item's bytes, or the path of the file that is the item."""
        if self.value is not None:
            return self.value
        return self.data if self.data is not None else self.path

    def facts(self) -> dict:
        """Where the item is (a URL without its query string: redact.py), its size and content hash (how --resume
        knows it), and a file's mtime."""
        where = redact(self.path)
        if self.value is not None:
            return {"path": where}  # nothing to resume from: it exists in the caller's memory only
        if self.data is None:
            return {"path": where, **location(self.path).facts()}
        return {"path": where, "bytes": len(self.data), "sha256": hashlib.sha256(self.data).hexdigest()}


class Unit(Protocol):
    """A part of the input that gives its items where it is read: the find stage's own readers (a tar shard's
    members, a row group's or a file's rows, a text file's lines), run by a worker that holds the location only. A
    unit is small (locations, numbers, the run's collection options) and travels to the worker as it is."""

    def items(self, keys: Any, skipped: Counter | None) -> Iterator[Source]:
        """Its items, in order, as the single-process find stage yields them (positions left to the caller);
        `keys`: the --key-column values seen (`table.Keys`: this unit's own), `skipped`: what it passes over."""
        ...


def row_place(source: Source) -> str | None:
    """`row 3 of FILE` for a table's row keyed by its --key-column value (a key that does not name the file), so
    that a line about it says where it is; None where the key says it (FILE:ROW, a path)."""
    row = source.meta.get("row")
    if row is None or source.key.endswith(f":{row}"):
        return None
    return f"row {row} of {source.path}"


def item_too_large(size: int, limit: int, what: str = "") -> str:
    """The one-line reason an item over the limit fails, unread."""
    return (
        f"{what or 'the item'} is {human_bytes(size)} ({size} bytes), over the {human_bytes(limit)} "
        f"an item may have; not read (--max-item-bytes raises the limit)"
    )


def text_source(key: str, where: str, data, size: int, meta: dict, collection: Collection, what: str) -> Source:
    """A text (a line, a table cell, a --per-file file) as its item: `data` holds its first bytes at least up to
    --max-text-bytes (bytes, or an Arrow buffer not copied yet), `size` its whole length. A longer text is cut
    there, at a character boundary, its metadata saying from how many bytes (`cut_from_bytes`), or with
    --long-text skip passed over (`too-long`); a blank text is passed over (`blank`)."""
    limit = collection.max_text_bytes
    if size > limit:
        if collection.long_text == "skip":
            return Source(
                key,
                where,
                error=f"{what} is {human_bytes(size)}, over --max-text-bytes {human_bytes(limit)}: "
                f"skipped (--long-text cut embeds its first {human_bytes(limit)})",
                kind="too-long",
            )
        data = utf8_prefix(_as_bytes(data[:limit]))
        meta = {**meta, "cut_from_bytes": size}
    else:
        data = _as_bytes(data)
    if not data.strip():
        return Source(key, where, error=f"{what} is blank", kind="blank")
    return Source(key, where, data=data, meta=meta)


def _as_bytes(data) -> bytes:
    return data.to_pybytes() if hasattr(data, "to_pybytes") else bytes(data)


class SkippedMember(NamedTuple):
    """A key of the `skipped` counter for a member of a shard that is no regular file (a directory, a link that
    is not followed, a device, a FIFO): counted by shard and kind, where skipped files are counted by extension."""

    shard: str
    kind: str
