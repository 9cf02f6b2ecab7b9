"""The fetch stage's byte ranges (sources/fetch.py): a shard read with `spans` names where each member lies
instead of reading it; reading those ranges gives exactly the bytes tarfile extracts, and a range cut short by a
truncated shard fails by key."""

from __future__ import annotations

import io
import tarfile

from gemma_embed.sources import iter_sources
from gemma_embed.sources.base import Collection
from gemma_embed.sources.fetch import FetchPolicy, fetch_ahead, needs_fetch


def _shard(path, members):
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_member_spans_read_back_the_bytes_tarfile_extracts(tmp_path):
    members = [("a.png", b"\x89PNG" + bytes(range(256)) * 9), ("a.txt", b"a caption"), ("b.jpg", b"\xff\xd8" * 700)]
    _shard(tmp_path / "s.tar", members)
    lazy = list(iter_sources([str(tmp_path / "s.tar")], "images", collection=Collection(member_spans=True)))
    assert [s.data for s in lazy] == [None, None] and all(needs_fetch(s) for s in lazy)
    assert lazy[0].meta["caption"] == "a caption"  # sidecars are still read where the shard is
    with tarfile.open(tmp_path / "s.tar") as archive:
        extracted = [archive.extractfile(name).read() for name in ("a.png", "b.jpg")]
    read = list(fetch_ahead(lazy, FetchPolicy()))
    assert [bytes(s.data) for s in read] == extracted and [s.data.name for s in read] == ["a.png", "b.jpg"]
    eager = list(iter_sources([str(tmp_path / "s.tar")], "images"))
    assert [s.data for s in eager] == [s.data for s in read] and [s.key for s in eager] == [s.key for s in read]

    data = (tmp_path / "s.tar").read_bytes()
    (tmp_path / "s.tar").write_bytes(data[: lazy[1].span[0] + 100])  # the shard loses b.jpg's tail afterwards
    cut = list(fetch_ahead(lazy, FetchPolicy()))
    assert cut[0].error is None and cut[1].error == "truncated shard: the member's data is cut after 100 of 1400 bytes"
    assert cut[1].failed_at == "fetch"
