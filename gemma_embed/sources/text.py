"""Text for EmbeddingGemma 2: every line of a text file (or of stdin) is one item, or every file with --per-file;
every row of a table (parquet, JSON lines, a --dataset: the cell of --column, sources/table.py) is one item.

Keys are `FILE:ROW` (FILE as the file's own key would be: as given, or relative to a walked folder) and `stdin:ROW`
for lines read from `-`, ROW counting the file's lines from 0, as a table's rows count (sources/table.py) and as
Python indexes them (`text.splitlines()[ROW]`); each item's metadata has `row` too. Line breaks are not part of an
item. Each line carries its own bytes, so --resume knows it by content like any other item. A line that is not
UTF-8 is a failed item, named by its key.

Lines are read a chunk at a time with a bound (sources/bounded.py): of a line longer than --max-text-bytes only
that much is kept, then cut at a character boundary or, with --long-text skip, passed over; a file named `.gz` is
inflated as it streams, a gzip bomb stopped. A blank line, like a blank table cell, is passed over with a named
reason (`blank`: counted in a note, a failure with --on-error stop); its row still counts, so later keys still
point at the right line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import IO

from gemma_embed.errors import ItemProblem
from gemma_embed.interrupts import responsive
from gemma_embed.locations import NotRegularFile, location
from gemma_embed.models.base import TokenIds
from gemma_embed.sources import bounded
from gemma_embed.sources.base import Collection, Source, text_source
from gemma_embed.sources.expand import Collections
from gemma_embed.sources.files import TEXT_EXTENSIONS, find_files, process_stdin


def line_sources(read: bounded.Read, prefix: str, path: str, collection: Collection) -> Iterator[Source]:
    """Every line of a stream as its item (`PREFIX:ROW`, from 0), blank ones passed over by name, long ones cut or
    passed over (`base.text_source`)."""
    for line in bounded.lines(read, collection.max_text_bytes):
        row = line.number - 1  # rows count from 0, as in tables and Python's lists; `bounded` counts lines from 1
        key, meta = f"{prefix}:{row}", {"row": row}
        if line.blank:  # a run of blank lines is one item passed over, counted as its lines
            where = f"row {row} is" if line.count == 1 else f"rows {row} to {line.last - 1} are"
            yield Source(key, path, error=f"{where} blank", kind="blank", meta={**meta, "lines": line.count})
        else:
            yield text_source(key, path, line.data, line.size, meta, collection, f"row {row}")


def iter_text_sources(
    inputs: Iterable[str],
    stdin: IO | None = None,
    per_file: bool = False,
    ext: Iterable[str] | None = None,
    skipped: Counter | None = None,
    collection: Collection | None = None,
) -> Iterator[Source]:
    """Text items in input order, lazily: lines of files and walked folders, `-` as lines, the rows of tables
    (parquet and JSON-lines files with --column, sources/expand.py) and then of a --dataset. A run's stop signal
    ends a wait for the next line however long it blocks (`interrupts.responsive`). A table or --dataset that
    cannot give the run's items is a UsageError before the first item."""
    inputs = list(inputs)
    walked = frozenset(ext) if ext else TEXT_EXTENSIONS
    collections = Collections.open(inputs, "text", collection or Collection(), walked, skipped)
    return responsive(_text_sources(inputs, stdin, per_file, walked, skipped, collections))


def _text_sources(
    inputs: list[str],
    stdin: IO | None,
    per_file: bool,
    walked: frozenset[str],
    skipped: Counter | None,
    collections: Collections,
) -> Iterator[Source]:
    position = 0

    def numbered(source: Source) -> Source:
        nonlocal position
        position += 1
        return replace(source, position=position - 1)

    pending: list[str] = []
    collection = collections.collection
    found_file = file_lines if not per_file else whole_file

    def files() -> Iterator[Source]:
        for found in find_files(pending, walked | collections.walked(), None, False, skipped):
            plain = found.error is None and not collections.is_collection(found.path)  # a file of text
            for item in collections.expand(found):
                if not plain:
                    yield numbered(item)
                elif collection.deferred:  # read where the unit is: only its location leaves here
                    yield numbered(replace(item, unit=TextFile(item.key, item.path, collection, per_file)))
                else:
                    yield from map(numbered, found_file(item, collection))
        pending.clear()

    for given in inputs:
        if given != "-":
            pending.append(given)
            continue
        yield from files()
        read = _reader(process_stdin() if stdin is None else stdin)
        try:
            yield from map(numbered, line_sources(read, "stdin", "-", collection))
        except OSError as exc:
            yield numbered(
                Source("stdin", "-", error=f"cannot read it to the end ({exc.strerror or exc})", kind="unreadable")
            )
    yield from files()
    yield from map(numbered, collections.dataset_rows())


def file_lines(file: Source, collection: Collection) -> Iterator[Source]:
    """Every line of a text file (`file`: the found file) as its item (`line_sources`); a file that cannot be read
    (to the end) fails by its key after the lines read."""
    try:
        where = location(file.path)
        where.regular_file("a text file")
        with bounded.open_bytes(where) as read:
            yield from line_sources(read, file.key, file.path, collection)
    except NotRegularFile as exc:
        yield replace(file, error=str(exc), kind="unreadable")
    except ItemProblem as exc:  # a damaged or bomb-like gzip stream: the lines before it are items
        yield replace(file, error=f"cannot read it to the end ({exc})", kind=exc.kind)
    except OSError as exc:
        yield replace(file, error=f"cannot read: {exc.strerror or exc}", kind="unreadable")


def whole_file(file: Source, collection: Collection) -> Iterator[Source]:
    """--per-file: the file as one item, at most --max-text-bytes of it read."""
    try:
        where = location(file.path)
        where.regular_file("a text file")
        with bounded.open_bytes(where) as read:
            data, more = bounded.read_at_most(read, collection.max_text_bytes)
            size = len(data) + int(more)
            if more and not bounded.compressed(where):
                size = max(size, where.size())
    except NotRegularFile as exc:
        yield replace(file, error=str(exc), kind="unreadable")
        return
    except ItemProblem as exc:
        yield replace(file, error=f"cannot read it ({exc})", kind=exc.kind)
        return
    except OSError as exc:
        yield replace(file, error=f"cannot read: {exc.strerror or exc}", kind="unreadable")
        return
    yield text_source(file.key, file.path, data, size, {}, collection, "the file")


@dataclass(frozen=True)
class TextFile:
    """A text file left whole (a `sources.base.Unit`): whoever reads it gives its lines as items (`file_lines`), or
    with --per-file the file as one (`whole_file`)."""

    key: str
    path: str
    collection: Collection
    per_file: bool = False

    def items(self, keys: object = None, skipped: Counter | None = None) -> Iterator[Source]:
        file = Source(self.key, self.path)
        return whole_file(file, self.collection) if self.per_file else file_lines(file, self.collection)


def _reader(stream) -> bounded.Read:
    """`read(n)` of stdin's bytes, whatever has arrived (read1: a list being written is read as it comes), whether
    it was given as text (tests) or bytes (the command line)."""
    raw = getattr(stream, "buffer", stream)
    read = getattr(raw, "read1", None) or raw.read
    if isinstance(read(0), str):
        return lambda size: read(size).encode("utf-8", "surrogateescape")
    return read


def decode_text(content: str | bytes | TokenIds) -> str | TokenIds:
    """A line's bytes, or (--per-file) the file at a path, as text without trailing line breaks; token ids given
    for a text (the server's token arrays) pass as they are, for the preparer."""
    if isinstance(content, TokenIds):
        return content
    if isinstance(content, bytes):
        data = content
    else:  # a caller's path (the command line's --per-file items carry their bytes, read with the bound)
        with location(content).open_input() as fh:
            data = fh.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ItemProblem(
            f"not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})", "undecodable"
        ) from None
    text = text.rstrip("\r\n")
    if not text.strip():
        raise ItemProblem("empty text", "blank")
    return text
