"""Bounded line reading (sources/bounded.py) and JSON records read as far as they go (sources/records.py), against
Python's own readers: a file object's lines, json.loads."""

from __future__ import annotations

import gzip
import io
import json
import zlib

import pytest

from gemma_embed import nested_json
from gemma_embed.errors import ItemProblem
from gemma_embed.locations import location
from gemma_embed.sources import bounded, records

SAMPLES = [
    b"",
    b"\n",
    b"one",
    b"one\ntwo\n",
    b"one\r\ntwo\r\n\r\n  \nlast without a break",
    b"caf\xc3\xa9 \xe2\x82\xac\n" * 3 + b"x" * 50 + b"\n\n" + b" " * 30 + b"y\n",
    b"\n\n  \n\r\n\t\n" * 5 + b"after blanks\n" + b" " * 9,
    b"a\n" + b"\n" * 40 + b"b",
]


def reference_lines(data: bytes, limit: int) -> list[tuple[int, bytes, int, bool, int]]:
    """What a Python file object's line iteration gives, the line break (and a CR before it) removed, and each
    run of blank lines as one (number, b"", 0, True, count)."""
    found: list[tuple[int, bytes, int, bool, int]] = []
    for number, line in enumerate(io.BytesIO(data), start=1):
        line = line.removesuffix(b"\n")
        if len(line) <= limit:
            line = line.rstrip(b"\r")
        if line.strip():
            found.append((number, line[:limit], len(line), False, 1))
        elif found and found[-1][3]:
            found[-1] = (*found[-1][:4], found[-1][4] + 1)
        else:
            found.append((number, b"", 0, True, 1))
    return found


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 20])
@pytest.mark.parametrize("limit", [0, 1, 4, 1000])
def test_lines_are_a_file_objects_lines_cut_at_the_limit_whatever_the_chunks(monkeypatch, chunk, limit):
    monkeypatch.setattr(bounded, "CHUNK", chunk)
    for data in SAMPLES:
        stream = io.BytesIO(data)
        got = [
            (line.number, line.data, line.size, line.blank, line.count) for line in bounded.lines(stream.read, limit)
        ]
        assert got == reference_lines(data, limit), data


def test_a_line_longer_than_the_limit_is_read_past_without_being_held(monkeypatch):
    """Of a 64 MiB line, the limit is kept and the size counted: Python's allocations peak near one chunk."""
    import tracemalloc

    monkeypatch.setattr(bounded, "CHUNK", 1 << 16)
    size = 64 << 20
    piece = b"a" * (1 << 16)

    class Stream:
        sent = 0

        def read(self, n: int) -> bytes:
            if self.sent >= size:
                self.sent += 1
                return b"\nshort\n" if self.sent == size + 1 else b""
            self.sent += len(piece)
            return piece

    tracemalloc.start()
    try:
        lines = list(bounded.lines(Stream().read, 1000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(line.data, line.size, line.cut) for line in lines] == [(b"a" * 1000, size, True), (b"short", 5, False)]
    assert peak < 1 << 20, peak  # a few chunks' pieces, not the line


def test_a_gzip_bomb_stops_after_the_grace_and_an_ordinary_gzip_file_reads_whole(tmp_path):
    bomb = tmp_path / "bomb.txt.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as out:  # written in chunks: 256 MiB of one byte
        for _ in range(256):
            out.write(b"a" * (1 << 20))
    inflated = 0
    with pytest.raises(bounded.Inflation) as stopped, bounded.open_bytes(location(str(bomb))) as read:
        while data := read(1 << 20):
            inflated += len(data)
    assert stopped.value.kind == "too-large" and "gzip bomb" in str(stopped.value)
    assert bounded.INFLATE_GRACE - (1 << 20) <= inflated <= bounded.INFLATE_GRACE  # of 256 MiB: read no further
    text = b"".join(b"line %d of ordinary text\n" % i for i in range(100_000))
    plain = tmp_path / "plain.txt.gz"
    plain.write_bytes(gzip.compress(text))
    with bounded.open_bytes(location(str(plain))) as read:
        assert [line.data for line in bounded.lines(read, 100)] == text.splitlines()


def test_a_damaged_or_cut_gzip_stream_is_an_item_problem_not_zlib_error(tmp_path):
    packed = gzip.compress(b"".join(b"row %d\n" % i for i in range(5000)))
    damaged = bytearray(packed)
    damaged[len(damaged) // 2] ^= 0xFF
    for name, data in (("cut.txt.gz", packed[: len(packed) // 2]), ("damaged.txt.gz", bytes(damaged))):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ItemProblem) as failed, bounded.open_bytes(location(str(path))) as read:
            list(bounded.lines(read, 100))
        assert failed.value.kind == "unreadable" and "damaged gzip stream" in str(failed.value), name
    with pytest.raises((zlib.error, EOFError, gzip.BadGzipFile)):  # what gzip's reader raises for it
        gzip.decompress(bytes(damaged))


def test_utf8_prefix_never_ends_inside_a_character():
    text = "aé€😀b".encode()
    for end in range(len(text) + 1):
        kept = bounded.utf8_prefix(text[:end])
        assert text.startswith(kept) and end - len(kept) < 4
        kept.decode("utf-8")  # whole characters only
        assert len(kept) == len(text[:end].decode("utf-8", "ignore").encode())


def test_a_whole_record_parses_as_json_does_and_a_deep_one_is_refused_before_parsing():
    record = {"text": 'héllo \u2028 \\ "quoted"', "id": 3, "tags": [{"a": [1, 2]}], "ok": True}
    assert records.parse(json.dumps(record).encode(), 0) == record
    deep = b'{"text": "x", "n": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(RecursionError):
        json.loads(deep)  # what the tool ran into
    with pytest.raises(ItemProblem) as refused:
        records.parse(deep, 4)
    assert refused.value.kind == "too-deep" and str(refused.value) == "row 4 nests deeper than 128 levels: not read"
    limit = nested_json.MAX_DEPTH
    assert records.parse(b'{"n": ' + b"[" * (limit - 1) + b"]" * (limit - 1) + b"}", 0)
    brackets_in_strings = json.dumps({"text": "[" * 1000 + "{" * 1000}).encode()
    assert records.parse(brackets_in_strings, 0)["text"] == "[" * 1000 + "{" * 1000
    for not_an_object, kind in ((b"[1, 2]", "undecodable"), (b"{not json", "undecodable"), (b'"x"', "undecodable")):
        with pytest.raises(ItemProblem) as failed:
            records.parse(not_an_object, 1)
        assert failed.value.kind == kind


@pytest.mark.parametrize(
    "text",
    ["plain words " * 50, "caf\u00e9 \u20ac \U0001f600 " * 40, 'quotes " and \\ backslashes \n\t ' * 30, "\x01" * 200],
)
def test_a_record_cut_anywhere_gives_its_texts_beginning(text):
    """Every cut of `{"id": 7, "text": TEXT, "after": 1}` inside TEXT gives the id and a beginning of TEXT (json.dumps
    escapes it as JSON writers do: \\u escapes, surrogate pairs for the emoji)."""
    line = json.dumps({"id": 7, "text": text, "after": 1}).encode()
    start = line.index(b'"text": "') + len(b'"text": "')
    end = line.index(b'", "after"')
    longest = ""
    for cut in range(start, end):
        members, cut_in = records.parse_beginning(line[:cut], 0)
        assert members["id"] == 7 and cut_in == "text" and "after" not in members
        assert text.startswith(members["text"]) and len(members["text"]) >= len(longest)
        longest = members["text"]
        members["text"].encode("utf-8")  # no lone surrogate: a pair the cut splits is left out whole
    assert len(text) - len(longest) <= 1


def test_a_record_cut_outside_its_text_says_so():
    line = json.dumps({"text": "done", "id": 12345, "list": [1, 2, 3]}).encode()
    assert records.parse_beginning(line[: line.index(b"345")], 0) == ({"text": "done"}, None)  # a number it may cut
    assert records.parse_beginning(line[: line.index(b"2, 3")], 0) == ({"text": "done", "id": 12345}, None)
    with pytest.raises(ItemProblem):
        records.parse_beginning(b'["a list", "cut', 0)
