"""What every kind of source yields: a keyed item (`Source`), and the options that say how collections (tar shards,
tables) give items (`Collection`): which columns, how large an item read into memory may be, where path cells may
lead."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from gemma_embed import memory
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
    # The largest tar member or table cell read into memory (bytes); None: `default_item_bytes` of the host's
    # memory and `memory_budget` (--memory-budget, read against host memory: items are held there).
    max_item_bytes: int | None = None
    memory_budget: memory.BudgetSpec = memory.BudgetSpec()
    # Path cells may name files outside their table's folder (absolute paths, `..`, links leading out).
    allow_outside_paths: bool = False

    def with_item_limit(self) -> Collection:
        """This collection with `max_item_bytes` decided (the default measured now, once per run)."""
        if self.max_item_bytes is not None:
            return self
        import psutil

        host = psutil.virtual_memory()
        free, total = memory.host_memory(host.available, host.total, *memory.cgroup_memory())
        return replace(self, max_item_bytes=default_item_bytes(free, total, self.memory_budget))


# An item of a collection (a tar member, a parquet cell) is read whole into memory, where it stays while its
# decode window waits, and the decoder's file object copies it once more while it decodes; the decode stage keeps
# at least 2 x --workers items in flight. A quarter of the budget per item keeps the common case (2 workers) of a
# few such items within the budget; the floor keeps ordinary large media (a 200 MB video member) readable on a
# small host, where the default budget (total/10) would be below it.
ITEM_BUDGET_SHARE = 4
ITEM_BYTES_FLOOR = 256 << 20


def default_item_bytes(free: int, total: int, spec: memory.BudgetSpec = memory.BudgetSpec()) -> int:
    """The largest item read by default: a quarter of the memory budget applied to host memory (`memory.budget`:
    min(free/2, total/10), or --memory-budget capped at what is free), at least ITEM_BYTES_FLOOR."""
    return max(ITEM_BYTES_FLOOR, memory.budget(free, total, spec) // ITEM_BUDGET_SHARE)


def parse_item_bytes(value: str | int | None) -> int | None:
    """--max-item-bytes: '2GiB', '512MiB', '1.5GB' (memory.parse_budget's units) or a number of bytes -> bytes;
    None or 'auto' -> None (the default from memory)."""
    if value is None or isinstance(value, int):
        if value is not None and value <= 0:
            raise ValueError(f"must be a positive size, got {value}")
        return value
    try:
        spec = memory.parse_budget(value)
    except ValueError:
        raise ValueError(f"cannot read {value!r}: use a size like 2GiB or 512MiB") from None
    if spec.fraction_of_total is not None:
        raise ValueError(f"{value!r}: give a size like 2GiB or 512MiB, not a share")
    return spec.bytes


def item_too_large(size: int, limit: int, what: str = "") -> str:
    """The one-line reason an item over the limit fails, unread."""
    return (
        f"{what or 'the item'} is {memory.human_bytes(size)} ({size} bytes), over the {memory.human_bytes(limit)} "
        f"an item may have; not read (--max-item-bytes raises the limit)"
    )


class SkippedMember(NamedTuple):
    """A key of the `skipped` counter for a member of a shard that is no regular file (a directory, a link that
    is not followed, a device, a FIFO): counted by shard and kind, where skipped files are counted by extension."""

    shard: str
    kind: str
