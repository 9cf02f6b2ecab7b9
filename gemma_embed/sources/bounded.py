"""Reading lines with a bound: a text file's lines, a JSON-lines file's records and stdin's lines are read a chunk
at a time, and of one line at most `limit` bytes are kept, whatever its length (the rest is read past, counted,
never held): a 500 MB line costs `limit` bytes of memory, not 500 MB (nor the GBs a whole-line `readline` and
its decode took). Files whose name ends `.gz` are inflated as they stream, and a file that inflates past
INFLATE_GRACE to more than INFLATE_RATIO times the compressed bytes read is a gzip bomb: reading stops there with
`Inflation` (its rest is not read), so a bomb costs neither memory nor the time to inflate it.
"""

from __future__ import annotations

import contextlib
import gzip
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from gemma_embed.errors import ItemProblem
from gemma_embed.locations import Location
from gemma_embed.sizes import human_bytes

CHUNK = 1 << 20  # bytes read at a time: a chunk's split pieces are the only other memory a line costs
# Real text and JSON lines compress 3 to 20 times (and Apache POI's zip-bomb check refuses past 100); deflate
# cannot pass about 1030. The first 64 MiB are never refused, so a small file of repeated lines is read whole.
INFLATE_GRACE = 64 << 20
INFLATE_RATIO = 200

Read = Callable[[int], bytes]


@dataclass(frozen=True, slots=True)
class Line:
    """One line: its number (from 1, every line counted), its first `limit` bytes without the line break, and
    its whole length in bytes; `blank` when the whole line (not only what was kept) is whitespace. Consecutive
    blank lines come as one (`count` of them, from `number` on): a file of a million blank lines is one of them,
    not a million items."""

    number: int
    data: bytes
    size: int
    blank: bool
    count: int = 1

    @property
    def cut(self) -> bool:
        return self.size > len(self.data)

    @property
    def last(self) -> int:
        return self.number + self.count - 1


class Inflation(ItemProblem):
    """A .gz input inflating like a gzip bomb: reading it stops (the rest of the file fails, named)."""

    def __init__(self, inflated: int, compressed: int):
        super().__init__(
            f"inflates past {human_bytes(inflated)} from {human_bytes(compressed)}, more than {INFLATE_RATIO} times "
            f"its compressed size (a gzip bomb?): the rest of the file is not read",
            "too-large",
        )


class _Counted:
    """A binary file whose reads are counted: the compressed bytes a gzip stream has taken."""

    def __init__(self, raw: BinaryIO):
        self.raw, self.count = raw, 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.count += len(data)
        return data


def _guarded(unzipped: gzip.GzipFile, counted: _Counted) -> Read:
    inflated = 0

    def read(size: int) -> bytes:
        nonlocal inflated
        try:
            data = unzipped.read1(size)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:  # cut short, damaged (zlib.error: no OSError)
            raise ItemProblem(f"a damaged gzip stream ({exc or type(exc).__name__})", "unreadable") from None
        inflated += len(data)
        if inflated > INFLATE_GRACE and inflated > INFLATE_RATIO * max(counted.count, 1):
            raise Inflation(inflated, counted.count)
        return data

    return read


def compressed(path: Location) -> bool:
    return path.name.lower().endswith(".gz")


@contextlib.contextmanager
def open_bytes(path: Location) -> Iterator[Read]:
    """`read(n)` of the file's bytes (at most n a call, b"" at the end), inflated as they stream for a .gz name.
    OSError (the file's own) and ItemProblem (a cut or damaged gzip stream, one that is no gzip at all,
    `Inflation`) say why reading stopped."""
    with path.open_input() as raw:
        if not compressed(path):
            yield getattr(raw, "read1", raw.read)
            return
        counted = _Counted(raw)
        with gzip.GzipFile(fileobj=counted, mode="rb") as unzipped:  # type: ignore[call-overload]
            yield _guarded(unzipped, counted)


def read_at_most(read: Read, limit: int) -> tuple[bytes, bool]:
    """(the first `limit` bytes, whether there are more), reading at most `limit` + 1 bytes."""
    parts, held = [], 0
    while held <= limit:
        data = read(min(CHUNK, limit + 1 - held))
        if not data:
            break
        parts.append(data)
        held += len(data)
    whole = b"".join(parts)
    return whole[:limit], len(whole) > limit


def lines(read: Read, limit: int, sep: bytes = b"\n") -> Iterator[Line]:
    """Every line of the stream, a chunk at a time, `limit` bytes of each kept (a trailing CR goes with the line
    break, as a text file from Windows has it); runs of blank lines as one `Line` of `count` lines. Memory: one
    chunk and `limit` bytes, whatever the lines' length; time: a chunk of blank lines is counted, not looped over."""
    kept: list[bytes] = []
    held = size = 0
    pending = False  # a line has begun and not ended
    filled = False  # a byte that is no whitespace was read past (beyond what is kept)
    number = 0  # lines ended so far
    blank_from = blank_count = 0  # the run of blank lines not yielded yet

    def take(piece: bytes) -> None:
        nonlocal held, size, filled, pending
        pending = True
        size += len(piece)
        if held < limit:
            piece, rest = piece[: limit - held], piece[limit - held :]
            kept.append(piece)
            held += len(piece)
        else:
            rest = piece
        if rest and not filled and rest.strip():
            filled = True

    def end() -> Line:
        nonlocal held, size, filled, pending
        data = b"".join(kept)
        if size == len(data):  # whole: its CR goes with the line break
            data = data.rstrip(b"\r")
            line = Line(number, data, len(data), not data.strip())
        else:
            line = Line(number, data, size, not filled and not data.strip())
        kept.clear()
        held = size = 0
        filled = pending = False
        return line

    def blank_run() -> Line:
        nonlocal blank_count
        line = Line(blank_from, b"", 0, True, blank_count)
        blank_count = 0
        return line

    def one_more_blank() -> None:
        """Line `number` is blank: it joins the run (or starts one)."""
        nonlocal blank_from, blank_count
        if not blank_count:
            blank_from = number
        blank_count += 1

    while chunk := read(CHUNK):
        if not pending and not chunk.strip():  # nothing but blank lines (and whitespace): count them
            ended = chunk.count(sep)
            if ended:
                blank_from, blank_count = (blank_from, blank_count + ended) if blank_count else (number + 1, ended)
                number += ended
            rest = chunk[chunk.rfind(sep) + 1 :] if ended else chunk
            if rest:
                take(rest)
            continue
        *complete, last = chunk.split(sep)
        for piece in complete:
            if not pending and not piece.strip():
                number += 1
                one_more_blank()
                continue
            take(piece)
            number += 1
            line = end()
            if line.blank:
                one_more_blank()
                continue
            if blank_count:
                yield blank_run()
            yield line
        if last:
            take(last)
    if pending:
        number += 1
        line = end()
        if line.blank:
            one_more_blank()
        else:
            if blank_count:
                yield blank_run()
            yield line
    if blank_count:
        yield blank_run()


def utf8_prefix(data: bytes) -> bytes:
    """`data` without a UTF-8 sequence its end cuts in two (what a cut at a byte count leaves)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:  # ASCII: the sequence before it is whole
            return data
        if byte >= 0xC0:  # a lead byte: whole if its sequence fits in what is left
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data
