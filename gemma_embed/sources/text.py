"""Text for EmbeddingGemma 2: every line of a text file (or of stdin) is one item, or every file with --per-file;
every row of a table (parquet, JSON lines, a --dataset: the cell of --column, sources/table.py) is one item.

Keys are `FILE:ROW` (FILE as the file's own key would be: as given, or relative to a walked folder) and `stdin:ROW`
for lines read from `-`, ROW counting the file's lines from 0, as a table's rows count (sources/table.py) and as
Python indexes them (`text.splitlines()[ROW]`); each item's metadata has `row` too. Line breaks are not part of an
item; blank lines are no items (their numbers are kept, so keys still point at the right line). Each line carries
its own bytes, so --resume knows it by content like any other item. A line that is not UTF-8 is a
failed item, named by its key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import IO

from gemma_embed.interrupts import responsive
from gemma_embed.locations import NotRegularFile, location
from gemma_embed.models.base import TokenIds
from gemma_embed.sources.base import Collection, Source
from gemma_embed.sources.expand import Collections
from gemma_embed.sources.files import TEXT_EXTENSIONS, find_files, process_stdin, split_stream


def numbered_lines(stream: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(row: the line's number from 0, line without its line break) for every line that is not blank."""
    for number, line in enumerate(stream):
        line = line.rstrip(b"\r\n")
        if line.strip():
            yield number, line


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

    def lines(file: Source) -> Iterator[Source]:
        try:
            where = location(file.path)
            where.regular_file("a text file")
            with where.open_input() as fh:
                for row, line in numbered_lines(fh):
                    yield Source(f"{file.key}:{row}", file.path, data=line, meta={"row": row})
        except NotRegularFile as exc:
            yield replace(file, error=str(exc))
        except OSError as exc:
            yield replace(file, error=f"cannot read: {exc.strerror or exc}")

    def files() -> Iterator[Source]:
        for found in find_files(pending, walked | collections.walked(), None, False, skipped):
            whole_file = found.error is None and not collections.is_collection(found.path)
            for item in collections.expand(found):
                yield from map(numbered, lines(item) if whole_file and not per_file else (item,))
        pending.clear()

    for given in inputs:
        if given != "-":
            pending.append(given)
            continue
        yield from files()
        stream = split_stream(process_stdin(), b"\n") if stdin is None else _binary(stdin)
        for row, line in numbered_lines(stream):
            yield numbered(Source(f"stdin:{row}", "-", data=line, meta={"row": row}))
    yield from files()
    yield from map(numbered, collections.dataset_rows())


def _binary(stream) -> IO[bytes]:
    """stdin as bytes whether it was given as text (tests) or bytes (the command line)."""
    if hasattr(stream, "buffer"):
        return stream.buffer
    if isinstance(getattr(stream, "read", lambda n=0: b"")(0), str):
        return (line.encode("utf-8", "surrogateescape") for line in stream)
    return stream


def decode_text(content: str | bytes | TokenIds) -> str | TokenIds:
    """A line's bytes, or (--per-file) the file at a path, as text without trailing line breaks; token ids given
    for a text (the server's token arrays) pass as they are, for the preparer."""
    if isinstance(content, TokenIds):
        return content
    if isinstance(content, bytes):
        data = content
    else:
        with location(content).open_input() as fh:
            data = fh.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})") from None
    text = text.rstrip("\r\n")
    if not text.strip():
        raise ValueError("empty text")
    return text
