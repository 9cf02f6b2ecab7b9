"""JSON lines as tables, read one record at a time: for the media commands a string field names a file (kept inside
the table's folder), for text it is the text; what cannot be a record fails by key, and the rest is read."""

from __future__ import annotations

import gzip
import json

import pytest

from gemma_embed.errors import UsageError
from gemma_embed.sources import Collection, iter_sources
from gemma_embed.sources.text import iter_text_sources


def test_path_fields_name_files_in_the_tables_folder_and_bad_records_fail_by_key(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"x")
    path = tmp_path / "t.jsonl"
    lines = [
        json.dumps({"file": "a.jpg", "id": "one", "n": 1}),
        "{not json",
        json.dumps({"file": "/etc/passwd", "id": "two"}),
        json.dumps([1, 2]),
        json.dumps({"file": 7, "id": "three"}),
        json.dumps({"id": "four"}),
        json.dumps({"file": "a.jpg", "id": "one"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    found = list(iter_sources([str(path)], "images", collection=Collection("file", "id", ("n",))))
    # A repeated key's failure is keyed by FILE:ROW, so that its line names the file.
    assert [s.key for s in found] == ["one", f"{path}:1", "two", f"{path}:3", "three", "four", f"{path}:6"]
    assert found[0].error is None and found[0].path == str(tmp_path / "a.jpg") and found[0].meta == {"row": 0, "n": 1}
    errors = [s.error for s in found[1:]]
    assert errors[0].startswith("row 1 is not JSON (")
    assert "outside" in errors[1] and errors[2] == "row 3 is not a JSON object"
    # Keyed by --key-column values (which do not name the file), a row's line says where it is.
    assert errors[3] == f"row 4 of {path}: field 'file' holds int, not text" and "has no media" in errors[4]
    assert "repeats the key 'one' of an earlier row" in errors[5]
    assert [s.kind for s in found[1:]] == ["undecodable", "outside", "undecodable", "bad-cell", "missing", "bad-key"]


def test_text_fields_are_the_items_bytes_and_a_gzipped_file_streams_the_same(tmp_path):
    records = [{"t": "héllo wörld"}, {"t": None}, {"t": " "}, {"t": "second"}]
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    plain, packed = tmp_path / "t.jsonl", tmp_path / "t.jsonl.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data))
    for path in (plain, packed):
        found = list(iter_text_sources([str(path)], collection=Collection("t", column_holds_text=True)))
        assert [s.key for s in found] == [f"{path}:{row}" for row in range(4)]
        assert [s.data for s in found] == ["héllo wörld".encode(), None, None, b"second"]
        assert "null" in found[1].error and "is blank" in found[2].error
        assert found[1].kind == found[2].kind == "blank"
    # A folder walk takes both only with --column; without it, a .jsonl file given to text is lines of text.
    walked = list(iter_text_sources([str(tmp_path)], collection=Collection("t", column_holds_text=True)))
    assert len(walked) == 8
    assert [s.data for s in iter_text_sources([str(plain)])] == [line for line in data.splitlines()]


def test_a_json_lines_file_without_the_columns_is_a_usage_error_before_the_first_item(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(UsageError, match=r"t.jsonl: no column 'text' \(its columns: body\)"):
        iter_text_sources([str(path)], collection=Collection("text", column_holds_text=True))
    with pytest.raises(UsageError, match=r"give --column NAME, the column of media or file paths"):
        next(iter_sources([str(path)], "images"))
