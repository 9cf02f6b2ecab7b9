"""Export keeps names exactly: names that are not UTF-8 (os.fsdecode's surrogate escapes) and names with line
breaks round-trip through parquet (`key_bytes`) and keys.txt (`read_keys`) (issue 20)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import torch

import gemma_embed
from gemma_embed.export import escape_name, export, read_keys, unescape_name
from gemma_embed.store import EmbeddingWriter

NOT_UTF8 = os.fsdecode(b"caf\xe9 \xff\xfe.png")  # Latin-1 bytes, as an old camera or zip file names them
NAMES = [NOT_UTF8, "two\nlines.png", "back\\slash\\x41.png", "tab\tand\rcr", "plain.png", "ü/ß.jpg", "\x1b[2J"]


def _output(path, names):
    writer = EmbeddingWriter(path, {"model": "m", "modality": "images"})
    for i, name in enumerate(names):
        writer.add(name, torch.full((1, 3), float(i)), {"path": f"/data/{name}", "width": i}, i)
    return writer.close()


def test_escaping_is_reversible_and_gives_one_line_of_utf8():
    every_byte = [os.fsdecode(bytes([b])) for b in range(1, 256) if b != ord("/")]
    every_control = [chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029]]
    for name in [*NAMES, *every_byte, *every_control, "\\", "\\\\n", "\\x", "\ud800"]:
        line = escape_name(name)
        line.encode("utf-8")  # always valid UTF-8
        assert len(line.splitlines()) <= 1 and not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in line)
        assert unescape_name(line) == name
    assert escape_name("plain/ü.png") == "plain/ü.png"  # ordinary names stay readable as they are
    assert escape_name(NOT_UTF8) == "caf\\xe9 \\xff\\xfe.png"
    assert escape_name("a\nb\\c\x07") == "a\\nb\\\\c\\x07"
    assert os.fsencode(unescape_name("caf\\xe9.png")) == b"caf\xe9.png"


def test_parquet_keeps_the_bytes_of_names_that_are_not_utf8(tmp_path):
    out = _output(tmp_path / "o.safetensors", NAMES)
    table = pq.read_table(export(out, "parquet")["files"][0])
    assert table.schema.field("key_bytes").type == "binary" and table.schema.field("path_bytes").type == "binary"
    rows = table.to_pylist()
    for name, row in zip(NAMES, rows, strict=True):
        if name == NOT_UTF8:
            assert os.fsdecode(row["key_bytes"]) == name and row["key_bytes"] == b"caf\xe9 \xff\xfe.png"
            assert row["key"] == escape_name(name)
            assert os.fsdecode(row["path_bytes"]) == f"/data/{name}"
        else:
            assert row["key"] == name and row["key_bytes"] is None and row["path_bytes"] is None
            assert row["path"] == f"/data/{name}"
    loaded = gemma_embed.load(out)
    np.testing.assert_array_equal(
        np.stack([np.array(r["embedding"]) for r in rows]), torch.cat(list(loaded.values())).numpy()
    )


def test_parquet_of_utf8_names_has_no_bytes_column(tmp_path):
    table = pq.read_table(export(_output(tmp_path / "o.safetensors", ["a\nb", "c"]), "parquet")["files"][0])
    assert table.column_names == ["key", "path", "rows", "width", "embedding"]
    assert table.column("key").to_pylist() == ["a\nb", "c"]


def test_keys_txt_is_one_escaped_line_per_key_and_reads_back_exactly(tmp_path):
    out = _output(tmp_path / "o.safetensors", NAMES)
    written = export(out, "npy")
    keys_file = tmp_path / "o.keys.txt"
    text = keys_file.read_bytes().decode("utf-8")  # strict: valid UTF-8
    assert text.count("\n") == len(NAMES) and text.splitlines() == [escape_name(n) for n in NAMES]
    assert read_keys(keys_file) == NAMES == list(gemma_embed.load(out))
    array = np.load(written["files"][0])
    assert array[:, 0].tolist() == [float(i) for i in range(len(NAMES))]
