"""Units (sources/base.py `Unit`): with `Collection.deferred` the find stage leaves each collection whole (a tar
shard, a parquet row group, a JSON-lines or text file) and a worker finds its items; found so, unit by unit, each with
only its own --key-column values and the run's checked after (`table.checked_key`), they are the single-process
find stage's items: keys, order, bytes, metadata, failures and what was passed over."""

from __future__ import annotations

import io
import tarfile
from collections import Counter
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq

from gemma_embed.sources import iter_sources
from gemma_embed.sources.base import Collection, Source
from gemma_embed.sources.table import Keys, checked_key
from gemma_embed.sources.text import iter_text_sources


def _shard(path, members):
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:  # a folder
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
                continue
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def _view(source: Source) -> tuple:
    data = bytes(source.data) if source.data is not None else None
    name = getattr(source.data, "name", None)
    return (source.key, source.path, source.error, source.kind, source.failed_at, data, name, source.meta)


def _as_a_worker_finds(sources: list[Source]) -> tuple[list[Source], Counter]:
    """Each unit's items found by itself (its own keys), numbered, then checked against the run's keys in order: what
    a Ray run's find tasks and driver do together."""
    found, skipped, keys = [], Counter(), Keys()
    for source in sources:
        items = [source] if source.unit is None else list(source.unit.items(Keys(), skipped))
        for item in items:
            found.append(checked_key(replace(item, position=len(found)), keys))
    return found, skipped


def _same(deferred: list[Source], eager: list[Source]) -> None:
    assert all(s.data is None for s in deferred), "the driver read an item's bytes"
    found, _ = _as_a_worker_finds(deferred)
    assert [_view(s) for s in found] == [_view(s) for s in eager]
    assert [s.position for s in found] == [s.position for s in eager]


def test_a_shard_left_whole_gives_its_members_sidecars_failures_and_skips_where_it_is_read(tmp_path):
    shard = tmp_path / "s.tar"
    members = [
        ("a.png", b"\x89PNG" + bytes(range(256)) * 9),
        ("a.txt", b"a caption"),
        ("a.json", b'{"id": 1}'),
        ("folder", None),
        ("b.jpg", b"\xff\xd8" * 700),
        ("b.cls", b"7"),
        ("c.jpg", b"\xff\xd8" * 4000),  # over the item limit: fails unread
        ("d.jpg", b"\xff\xd8" * 300),
    ]
    _shard(shard, members)
    with tarfile.open(shard) as archive:
        cut_at = archive.getmember("d.jpg").offset_data + 100
    shard.write_bytes(shard.read_bytes()[:cut_at])  # d.jpg's data is cut
    collection = Collection(max_item_bytes=4000)
    skipped_here, skipped_there = Counter(), Counter()
    eager = list(iter_sources([str(shard)], "images", skipped=skipped_here, collection=collection))
    deferred = list(iter_sources([str(shard)], "images", collection=replace(collection, deferred=True)))
    assert len(deferred) == 1 and deferred[0].unit is not None and deferred[0].key == str(shard)
    found = list(deferred[0].unit.items(Keys(), skipped_there))
    assert [_view(s) for s in found] == [_view(s) for s in eager]
    assert [s.key.split(":")[-1] for s in eager] == ["a.png", "b.jpg", "c.jpg", "d.jpg"]
    assert eager[0].meta == {"member": "a.png", "caption": "a caption", "json": {"id": 1}}
    assert eager[2].kind == "too-large" and eager[3].error.startswith("truncated shard")
    assert skipped_there == skipped_here and sum(skipped_here.values()) == 2  # b.cls, the folder


def test_row_groups_and_json_lines_left_whole_give_the_rows_and_key_repeats_across_units(tmp_path):
    """A parquet file of three row groups (bytes, a key column repeated across groups, a kept column, a null cell)
    and two JSON-lines files (a key repeated across files, a record that is no JSON, a missing field)."""
    parquet = tmp_path / "t.parquet"
    blobs = [b"\x89PNG-" + bytes([i]) * 50 for i in range(6)]
    blobs[4] = None
    table = pa.table(
        {
            "image": pa.array(blobs, pa.binary()),
            "id": ["a", "b", "c", "a", "d", "e"],
            "score": [0.5, 1.0, 1.5, 2.0, 2.5, 3.0],
        }
    )
    pq.write_table(table, parquet, row_group_size=2)
    collection = Collection("image", key_column="id", keep_columns=("score",), max_item_bytes=1000)
    eager = list(iter_sources([str(parquet)], "images", collection=collection))
    deferred = list(iter_sources([str(parquet)], "images", collection=replace(collection, deferred=True)))
    assert len(deferred) == 3 and all(s.unit is not None for s in deferred)
    _same(deferred, eager)
    assert eager[3].key == f"{parquet}:3" and eager[3].kind == "bad-key" and "repeats the key 'a'" in eager[3].error
    assert eager[4].kind == "missing" and eager[0].meta == {"row": 0, "score": 0.5}

    first, second = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    first.write_text('{"id": 1, "text": "a cat"}\n{"id": 2, "text": "a dog"}\nnot json\n')
    second.write_text('{"id": 2, "text": "a bird"}\n{"id": 3}\n{"id": 4, "text": "   "}\n{"id": 5, "text": "rain"}\n')
    text = Collection("text", key_column="id", column_holds_text=True)
    inputs = [str(first), str(second)]
    eager = list(iter_text_sources(inputs, collection=text))
    deferred = list(iter_text_sources(inputs, collection=replace(text, deferred=True)))
    assert len(deferred) == 2
    _same(deferred, eager)
    assert [s.kind for s in eager] == [None, None, "undecodable", "bad-key", "blank", "blank", None]
    assert bytes(eager[-1].data) == b"rain" and eager[0].meta == {"row": 0}


def test_text_files_left_whole_give_their_lines_or_themselves(tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"first line\n\n\nsecond \xff line\n" + b"x" * 300 + b"\nlast")
    collection = Collection(max_text_bytes=100, column_holds_text=True)
    for per_file in (False, True):
        eager = list(iter_text_sources([str(lines)], per_file=per_file, collection=collection))
        deferred = list(
            iter_text_sources([str(lines)], per_file=per_file, collection=replace(collection, deferred=True))
        )
        assert len(deferred) == 1 and deferred[0].unit is not None
        _same(deferred, eager)
    assert [s.key for s in eager] == [f"{lines}"]  # --per-file: the file, cut at 100 bytes


def test_path_cells_and_url_cells_left_whole_name_the_same_files_and_refusals(tmp_path):
    """A parquet file of paths (one beside it, one leading out of its folder, one missing) and a JSON-lines file of
    URLs (one that is no http(s) URL): the same items and refusals wherever the unit is read."""
    (tmp_path / "a.png").write_bytes(b"\x89PNG")
    paths = tmp_path / "paths.parquet"
    pq.write_table(pa.table({"file": ["a.png", "../outside.png", "missing.png", None]}), paths)
    eager = list(iter_sources([str(paths)], "images", collection=Collection("file", max_item_bytes=1000)))
    collection = Collection("file", max_item_bytes=1000, deferred=True)
    _same(list(iter_sources([str(paths)], "images", collection=collection)), eager)
    assert [s.kind for s in eager] == [None, "outside", "missing", "missing"] and eager[0].path == str(
        tmp_path / "a.png"
    )

    urls = tmp_path / "urls.jsonl"
    urls.write_text('{"url": "https://example.org/a.jpg"}\n{"url": "file:///etc/passwd"}\n')
    collection = Collection("url", column_holds_urls=True, max_item_bytes=1000)
    eager = list(iter_sources([str(urls)], "images", collection=collection))
    _same(list(iter_sources([str(urls)], "images", collection=replace(collection, deferred=True))), eager)
    assert [s.path for s in eager][0] == "https://example.org/a.jpg" and eager[1].kind == "unreadable"
