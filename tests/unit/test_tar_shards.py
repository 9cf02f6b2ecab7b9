"""Tar shards read member by member: cut, corrupt and concatenated shards named, not fatal; sidecars, skipped
members, webdataset keys and brace patterns."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from collection_helpers import (
    member_offsets,
    write_shard,
)

from gemma_embed.sources import count_sources, expand_braces, iter_sources
from gemma_embed.sources.tar import sample_key


def _problems(path: Path) -> list[tuple[str, str | None]]:
    return [(s.key, s.error) for s in iter_sources([str(path)], "images")]


def test_a_shard_cut_between_members_or_inside_a_header_says_so(tmp_path):
    shard = write_shard(tmp_path / "s.tar", [("a.jpg", b"x" * 700), ("b.jpg", b"y" * 10)])
    header_b, _ = member_offsets(shard)["b.jpg"]
    raw = shard.read_bytes()
    shard.write_bytes(raw[:header_b])  # ends where b.jpg's header would start: no end-of-archive marker
    assert _problems(shard) == [
        (f"{shard}:a.jpg", None),
        (
            str(shard),
            "truncated: the shard ends after member a.jpg without tar's end-of-archive marker; any later members "
            "are lost",
        ),
    ]
    shard.write_bytes(raw[: header_b + 200])
    assert _problems(shard)[-1] == (str(shard), f"truncated: the shard ends inside a member header at byte {header_b}")
    shard.write_bytes(b"")
    assert _problems(shard) == [(str(shard), "not a readable tar file (empty file)")]


def test_a_corrupt_header_is_named_and_reading_goes_on_at_the_next_one(tmp_path):
    members = [(f"{i}.jpg", bytes([i]) * (600 + i)) for i in range(4)]
    shard = write_shard(tmp_path / "s.tar", members)
    header, _ = member_offsets(shard)["1.jpg"]
    following, _ = member_offsets(shard)["2.jpg"]
    raw = bytearray(shard.read_bytes())
    raw[header + 148 : header + 156] = b"9999999\0"  # a wrong checksum: tarfile would take the shard as ended there
    shard.write_bytes(bytes(raw))
    found = list(iter_sources([str(shard)], "images"))
    assert [(s.key, s.error) for s in found] == [
        (f"{shard}:0.jpg", None),
        (
            str(shard),
            f"corrupt tar header at byte {header} (its name field reads '1.jpg'); {following - header} bytes skipped "
            f"to the next valid header (the members in them are lost)",
        ),
        (f"{shard}:2.jpg", None),
        (f"{shard}:3.jpg", None),
    ]
    assert [bytes(s.data) for s in found if s.data is not None] == [members[0][1], members[2][1], members[3][1]]


def test_archives_appended_to_a_shard_are_read_too(tmp_path):
    first = write_shard(tmp_path / "a.tar", [("a.jpg", b"a" * 10)])
    second = write_shard(tmp_path / "b.tar", [("b.jpg", b"b" * 10)])
    both = tmp_path / "both.tar"
    both.write_bytes(first.read_bytes() + second.read_bytes())  # cat a.tar b.tar
    assert _problems(both) == [(f"{both}:a.jpg", None), (f"{both}:b.jpg", None)]


def test_members_the_command_does_not_take_are_counted_and_sidecars_join_their_sample(tmp_path):
    shard = write_shard(
        tmp_path / "s.tar",
        [
            ("x/001.jpg", b"1"),
            ("x/001.txt", b"first"),
            ("x/001.json", b"{not json"),
            ("x/002.cls", b"7"),
            ("x/002.txt", b"no image in this sample"),
            ("x/003.seg.png", b"3"),
            ("x/003.json", b'{"a": [1, 2]}'),
            ("x/001.jpg", b"again"),
        ],
    )
    skipped: Counter = Counter()
    found = list(iter_sources([str(shard)], "images", skipped=skipped))
    assert [(s.key.split(":", 1)[1], s.meta, s.error) for s in found] == [
        ("x/001.jpg", {"member": "x/001.jpg", "caption": "first", "json": "{not json"}, None),
        ("x/003.seg.png", {"member": "x/003.seg.png", "json": {"a": [1, 2]}}, None),
        ("x/001.jpg", {}, "another member of this name comes earlier in the shard; this one is not embedded"),
    ]
    assert found[0].data.name == "001.jpg"  # the decoders route by the member's name
    assert skipped == Counter({".cls": 1, ".txt": 1})  # the sample without an image: its caption is no sidecar
    assert count_sources([str(shard)], "images") == len(found)
    assert list(iter_sources([str(shard)], "audio")) == []


def test_webdataset_sample_keys_and_brace_patterns():
    assert sample_key("a/000017.jpg") == ("a/000017", "jpg")
    assert sample_key("x.seg.png") == ("x", "seg.png")
    assert sample_key("dir.v2/x.txt") == ("dir.v2/x", "txt")
    assert list(expand_braces("s/{00008..00010}.tar")) == ["s/00008.tar", "s/00009.tar", "s/00010.tar"]
    assert list(expand_braces("{a,b}-{1..2}")) == ["a-1", "a-2", "b-1", "b-2"]
    assert list(expand_braces("{10..6..2}{x}")) == ["10{x}", "8{x}", "6{x}"]
    assert list(expand_braces("plain.tar")) == ["plain.tar"]
