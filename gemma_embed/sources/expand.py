"""What a run reads from collections, for every command: a found file becomes a tar shard's members, a table's rows
(parquet, JSON lines) or itself, and a --dataset's rows follow the paths' items.

`Collections.open` does what would make the whole run wrong before the first item (so before a model is loaded):
a table named on the command line that lacks the columns, a --dataset that cannot be opened. One `Collections` per
run holds the --key-column values seen, so keys stay unique across every table of the run. The media commands and
the text command (whose other files are read line by line, sources/text.py) share it.

With `Collection.deferred` (a Ray run) a collection is not read here: a tar shard, each row group of a parquet
file (its footer is read, for the groups and the columns) and a JSON-lines file are one Source each, whose `unit`
gives the items where it is read, with these same readers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from gemma_embed.locations import Location, location
from gemma_embed.sources import table, tar
from gemma_embed.sources.base import MEDIA_MODALITIES, Collection, Source
from gemma_embed.sources.files import Found, expand_patterns


def _given_files(inputs: Iterable[str]) -> Iterator[Location]:
    """The files named on the command line (not found by a walk or on stdin), brace and glob patterns expanded."""
    for given in inputs:
        if given == "-":
            continue
        for name in expand_patterns(given):
            path = location(name)
            if path.isfile():
                yield path


@dataclass
class Collections:
    modality: str
    collection: Collection
    wanted: frozenset[str]  # the extensions the command's decoders read (members of shards are filtered by them)
    skipped: Counter | None = None
    read: bool = True  # False: count items cheaply (headers, footers), reading no data
    opened: table.OpenedDataset | None = None
    keys: table.Keys = field(default_factory=table.Keys)

    @classmethod
    def open(
        cls,
        inputs: Iterable[str],
        modality: str,
        collection: Collection,
        wanted: frozenset[str],
        skipped: Counter | None = None,
        read: bool = True,
    ) -> Collections:
        media = modality in MEDIA_MODALITIES
        collection = collection.with_item_limit() if media else collection
        if read:
            for path in _given_files(inputs):
                if table.is_json_lines(path):
                    if collection.column is not None or media:  # for text, without --column: lines of text
                        table.check_json_lines(path, collection)
                elif table.is_table(path):
                    table.check_parquet(path, collection)
        opened = table.open_dataset(collection) if collection.dataset and read else None
        return cls(modality, collection, wanted, skipped, read, opened)

    @property
    def media(self) -> bool:
        return self.modality in MEDIA_MODALITIES

    def walked(self) -> frozenset[str]:
        """The suffixes a folder walk takes as collections: tar shards (media), and tables when --column says
        which column holds the items."""
        shards = tar.SUFFIXES if self.media else ()
        return frozenset(shards + (table.SUFFIXES if self.collection.column else ()))

    def is_collection(self, path: Location) -> bool:
        """Whether this found file gives items of its own (members, rows) rather than being one. For text a
        JSON-lines file without --column is lines of text, as any text file."""
        if self.media and tar.is_shard(path):
            return True
        if table.is_json_lines(path):
            return self.media or self.collection.column is not None
        return table.is_table(path)

    def expand(self, found: Found) -> Iterator[Source]:
        """The items of one found file: its members or rows, or the file itself."""
        path, collection = found.path, self.collection
        if found.error is not None or not self.is_collection(path):
            yield Source(found.key, str(path), error=found.error, kind=found.kind)
        elif self.media and tar.is_shard(path):
            if collection.deferred:
                shard = tar.Shard(str(path), found.key, self.wanted, collection.max_item_bytes)
                yield Source(found.key, str(path), unit=shard)
            else:
                yield from tar.members(path, found.key, self.wanted, self.skipped, self.read, collection.max_item_bytes)
        elif not self.read:
            count = table.json_lines_row_count(path) if table.is_json_lines(path) else None
            if count is None:
                count = table.parquet_row_count(path, collection)
            yield from (Source(found.key, str(path)) for _ in range(count))
        elif table.is_json_lines(path):
            if collection.deferred:
                yield Source(found.key, str(path), unit=table.JsonLines(str(path), found.key, collection))
            else:
                yield from table.json_lines_rows(path, found.key, collection, self.keys)
        elif collection.deferred:
            yield from table.parquet_units(path, found.key, collection)  # the footer is read here, no row
        else:
            yield from table.parquet_rows(path, found.key, collection, self.keys)

    def dataset_rows(self) -> Iterator[Source]:
        if self.opened is not None:
            yield from table.dataset_rows(self.opened, self.collection, self.keys)
