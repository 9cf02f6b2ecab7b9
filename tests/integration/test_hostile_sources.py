"""Collections as an attacker (or an unlucky user) makes them: members and cells larger than an item may be, sparse
tar members, links and devices inside a shard, a FIFO or /dev/zero where a shard or a table should be, path cells
that lead out of their table's folder. Each is one failure under its key or a counted skip, quickly, unread."""

from __future__ import annotations

import os
import subprocess
import tarfile
import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from collection_helpers import MODEL, OPTIONS
from helpers import ROOT, run_images
from tar_helpers import gnu_sparse_member, gnu_tar, regular, sparse_file, special, write_tar

import gemma_embed
from gemma_embed.errors import UsageError
from gemma_embed.sources import Collection, count_sources, iter_sources, skipped_note
from gemma_embed.sources import tar as tar_source
from gemma_embed.sources.base import SkippedMember

PNG = (ROOT / "samples" / "media" / "images" / "pixel.png").read_bytes()
NOT_OPENED = "not opened (--allow-outside-paths opens paths outside the table's folder)"


def _listed(inputs, timeout: float = 60.0, **kwargs) -> list:
    """iter_sources to the end in a thread, failing the test (not hanging it) past `timeout` seconds (only against
    a hang: a read of a FIFO or /dev/zero never ends; what is checked takes milliseconds); what it raises is raised
    here."""
    found: list = []
    raised: list[BaseException] = []

    def read() -> None:
        try:
            found.extend(iter_sources(inputs, "images", **kwargs))
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            raised.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    assert not reader.is_alive(), f"reading {inputs} took over {timeout} s"
    if raised:
        raise raised[0]
    return found


# ------------------------------------------------------------------------------------------ bounded reads


def test_a_member_over_the_limit_fails_by_key_without_being_read(tmp_path, monkeypatch):
    shard = write_tar(tmp_path / "s.tar", [regular("a.png", PNG), regular("b.png", b"\1" * 5000)])
    reads = []
    real_read = tar_source._read_data
    monkeypatch.setattr(tar_source, "_read_data", lambda fh, data: reads.append(data.size) or real_read(fh, data))
    found = _listed([str(shard)], collection=Collection(max_item_bytes=4096))
    assert [(s.key, s.error) for s in found] == [
        (f"{shard}:a.png", None),
        (
            f"{shard}:b.png",
            "the member is 4.9 KiB (5000 bytes), over the 4.0 KiB an item may have; not read (--max-item-bytes "
            "raises the limit)",
        ),
    ]
    assert bytes(found[0].data) == PNG
    assert reads == [len(PNG)]  # b.png's data was never read
    assert count_sources([str(shard)], "images", collection=Collection(max_item_bytes=4096)) == 2


def test_a_sparse_member_over_the_limit_is_refused_unread_and_the_shard_goes_on(tmp_path):
    """A 40 KB shard declaring a 10 GiB member (the holes are not stored): refused from its header, at once."""
    big = gnu_sparse_member("huge.png", 10 << 30, [(0, b"\x89PNG" + b"\0" * 4000), (5 << 30, b"x" * 30000)])
    shard = write_tar(tmp_path / "s.tar", [big, regular("ok.png", PNG)])
    assert shard.stat().st_size < 40_000
    with tarfile.open(shard) as archive:  # the reference reader agrees on what the header declares
        declared = archive.getmember("huge.png")
        assert declared.size == 10 << 30 and declared.sparse[:3] == [(0, 4004), (5 << 30, 30000), (10 << 30, 0)]
    found = _listed([str(shard)], collection=Collection(max_item_bytes=256 << 20))
    assert [(s.key, s.error) for s in found] == [
        (
            f"{shard}:huge.png",
            "the sparse member (34004 bytes stored) is 10.0 GiB (10737418240 bytes), over the 256.0 MiB an item "
            "may have; not read (--max-item-bytes raises the limit)",
        ),
        (f"{shard}:ok.png", None),
    ]
    assert bytes(found[1].data) == PNG


def _sparse_shards(tmp_path: Path, size: int, chunks: list[tuple[int, bytes]]) -> dict[str, Path]:
    """The same sparse member in each form a shard may hold it: crafted old-GNU headers, and GNU tar's own
    output in its gnu format and the POSIX (pax) sparse versions 0.0, 0.1 and 1.0, where GNU tar is here."""
    shards = {"crafted": write_tar(tmp_path / "crafted.tar", [gnu_sparse_member("m.png", size, chunks)])}
    tar = gnu_tar()
    if tar is None:
        return shards
    folder = tmp_path / "files"
    folder.mkdir()
    sparse_file(folder / "m.png", size, chunks)
    for name, flags in {
        "gnu": ["--format=gnu"],
        "pax-0.0": ["--format=posix", "--sparse-version=0.0"],
        "pax-0.1": ["--format=posix", "--sparse-version=0.1"],
        "pax-1.0": ["--format=posix", "--sparse-version=1.0"],
    }.items():
        shards[name] = tmp_path / f"{name}.tar"
        subprocess.run([tar, "--sparse", *flags, "-cf", str(shards[name]), "m.png"], cwd=folder, check=True)
    return shards


def test_a_sparse_member_within_the_limit_reads_as_its_expanded_bytes(tmp_path):
    """Each sparse form reads to the bytes tarfile's reader expands it to, and the bytes GNU tar extracts. (Chunks
    but the last are whole blocks, as GNU tar writes them: GNU tar starts each stored chunk on a block, tarfile
    reads them back to back, and the two agree only then.)"""
    chunks = [(0, b"\x89PNG" + os.urandom(508)), (100_000, os.urandom(9216)), (300_000, b"tail")]
    expected = bytearray(400_000)
    for offset, data in chunks:
        expected[offset : offset + len(data)] = data
    shards = _sparse_shards(tmp_path, len(expected), chunks)
    for form, shard in shards.items():
        with tarfile.open(shard) as archive:
            info = archive.getmember("m.png")
            assert info.sparse is not None, form  # each form really is sparse
            assert archive.extractfile(info).read() == expected, form
        (found,) = _listed([str(shard)], collection=Collection(max_item_bytes=1 << 20))
        assert found.error is None and bytes(found.data) == expected, form
        assert found.data.name == "m.png"
    if gnu_tar():
        out = tmp_path / "extracted"
        out.mkdir()
        subprocess.run([gnu_tar(), "-xf", str(shards["crafted"])], cwd=out, check=True)
        assert (out / "m.png").read_bytes() == expected  # GNU tar reads the crafted header as we do


# ------------------------------------------------------------------------------------------ members that are no files


def test_links_devices_fifos_and_folders_in_a_shard_are_counted_and_noted(tmp_path):
    shard = write_tar(
        tmp_path / "shard.tar",
        [
            special("imgs", tarfile.DIRTYPE),
            regular("imgs/a.png", PNG),
            special("imgs/same.png", tarfile.SYMTYPE, "a.png"),  # to a member before it: followed
            special("hard.png", tarfile.LNKTYPE, "imgs/a.png"),  # a hard link: followed
            special("up.png", tarfile.SYMTYPE, "../../etc/hostname"),  # out of the shard: never followed
            special("abs.png", tarfile.SYMTYPE, "/etc/hostname"),
            special("later.png", tarfile.SYMTYPE, "z.png"),  # to a member that comes later: not followed
            special("lost.png", tarfile.LNKTYPE, "nowhere.png"),
            special("pipe.png", tarfile.FIFOTYPE),
            special("zero.png", tarfile.CHRTYPE),
            special("disk.png", tarfile.BLKTYPE),
            regular("z.png", PNG),
        ],
    )
    skipped: Counter = Counter()
    found = _listed([str(shard)], skipped=skipped)
    assert [(s.key, s.error) for s in found] == [
        (f"{shard}:{name}", None) for name in ("imgs/a.png", "imgs/same.png", "hard.png", "z.png")
    ]
    assert all(bytes(s.data) == PNG for s in found)
    key = str(shard)
    assert skipped == Counter(
        {
            SkippedMember(key, "directory"): 1,
            SkippedMember(key, "symlink"): 3,
            SkippedMember(key, "hardlink"): 1,
            SkippedMember(key, "fifo"): 1,
            SkippedMember(key, "character device"): 1,
            SkippedMember(key, "block device"): 1,
        }
    )
    assert skipped_note("images", skipped) == (
        f"{shard}: skipped 8 members: 3 symlinks, 1 directory, 1 hardlink, 1 fifo, 1 character device, 1 block device"
    )
    assert count_sources([str(shard)], "images") == len(found)

    # In a run: the items embed, the summary counts the members skipped, and one note names them.
    out = tmp_path / "out.safetensors"
    code, records, err = run_images([shard], MODEL, out, **OPTIONS)
    assert code == 0, err
    assert list(gemma_embed.load(out)) == [s.key for s in found]
    assert records[-1]["skipped"] == 8
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {skipped_note('images', skipped)}"], err


def test_several_shards_and_walked_files_share_one_note(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    write_tar(folder / "a.tar", [special("d", tarfile.DIRTYPE), regular("d/x.png", PNG)])
    write_tar(folder / "b.tar", [special("p.png", tarfile.FIFOTYPE), special("q.png", tarfile.FIFOTYPE)])
    (folder / "notes.md").write_text("not an image")
    skipped: Counter = Counter()
    _listed([str(folder)], skipped=skipped)
    assert skipped_note("images", skipped) == (
        "skipped 1 file the folder walk does not take for images (.md x1); --ext chooses the extensions; "
        "skipped 3 tar members that are no regular files: 2 fifos, 1 directory (in a.tar 1, b.tar 2)"
    )


# ------------------------------------------------------------------------------------------ inputs that are no files


def test_a_fifo_as_a_shard_and_dev_zero_as_a_table_fail_at_once_and_the_run_goes_on(tmp_path):
    os.mkfifo(tmp_path / "pipe.tar")  # opening it for reading would wait for a writer forever
    os.symlink("/dev/zero", tmp_path / "zero.parquet")  # reading it would never end
    os.mkfifo(tmp_path / "pipe.parquet")
    good = tmp_path / "good.png"
    good.write_bytes(PNG)
    inputs = [str(tmp_path / n) for n in ("pipe.tar", "zero.parquet", "pipe.parquet", "good.png")]
    found = _listed(inputs, collection=Collection("image"))
    assert [(s.key, s.error) for s in found] == [
        (inputs[0], "not a regular file (a FIFO); not opened"),
        (inputs[1], "not a regular file (a symbolic link to /dev/zero, a character device); not opened"),
        (inputs[2], "not a regular file (a FIFO); not opened"),
        (inputs[3], None),
    ]
    # The progress count (a second walk, in the background) does not wait on them either.
    counted = []
    collection = Collection("image")
    counter = threading.Thread(
        target=lambda: counted.append(count_sources(inputs, "images", None, collection)), daemon=True
    )
    counter.start()
    counter.join(60)  # only against a hang
    assert counted == [4]


def test_a_dataset_folder_holding_a_fifo_is_one_usage_error(tmp_path):
    pytest.importorskip("datasets")
    folder = tmp_path / "ds" / "data"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"image": pa.array([PNG], pa.binary())}), folder / "train-0.parquet")
    os.mkfifo(folder / "train-1.parquet")
    with pytest.raises(UsageError) as raised:
        _listed([], collection=Collection("image", dataset=str(tmp_path / "ds")))
    assert str(raised.value) == (
        f"--dataset {tmp_path / 'ds'}: {folder / 'train-1.parquet'}: not a regular file (a FIFO); not opened"
    )
    with pytest.raises(UsageError, match="a file, not a dataset's folder"):
        _listed([], collection=Collection("image", dataset=str(folder / "train-0.parquet")))


# ------------------------------------------------------------------------------------------ table cells


def test_a_cell_over_the_limit_fails_by_key(tmp_path):
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "raw": pa.array([PNG, b"\0" * 3000], pa.large_binary()),
            "image": pa.array([{"bytes": b"\0" * 3000, "path": "x.png"}, {"bytes": PNG, "path": "y.png"}], struct),
        }
    )
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    over = "its cell is 2.9 KiB (3000 bytes), over the 2.0 KiB an item may have; not read (--max-item-bytes raises "
    expected = {"raw": [None, f"row 1: {over}the limit)"], "image": [f"row 0: {over}the limit)", None]}
    for column, errors in expected.items():
        found = _listed([str(path)], collection=Collection(column, max_item_bytes=2048))
        assert [s.error for s in found] == errors, column
        assert [bytes(s.data) for s in found if s.error is None] == [PNG]


@pytest.fixture
def outside_paths(tmp_path) -> dict:
    """A table in its folder whose path cells name files in it, beside it, and anywhere."""
    folder = tmp_path / "table"
    (folder / "sub").mkdir(parents=True)
    (folder / "inside.png").write_bytes(PNG)
    (tmp_path / "beside.png").write_bytes(PNG)
    os.symlink(tmp_path / "beside.png", folder / "link.png")  # inside by name, outside once resolved
    cells = [
        "inside.png",
        "sub/../inside.png",
        "/etc/hostname",  # exists
        "/nonexistent/x.png",  # does not
        "../beside.png",  # exists
        "../missing.png",  # does not
        "sub/../../beside.png",
        "link.png",
    ]
    path = folder / "t.parquet"
    pq.write_table(pa.table({"file": cells}), path)
    return {"folder": folder, "path": path, "cells": cells, "beside": tmp_path / "beside.png"}


def test_path_cells_outside_the_table_folder_are_refused_alike_whether_they_exist_or_not(outside_paths):
    path, cells, folder = outside_paths["path"], outside_paths["cells"], outside_paths["folder"]
    found = _listed([str(path)], collection=Collection("file"))
    assert [s.key for s in found] == [f"{path}:{row}" for row in range(len(cells))]
    assert [s.error for s in found[:2]] == [None, None]
    assert Path(found[1].path).resolve() == folder / "inside.png"
    for row, source in enumerate(found[2:], start=2):
        assert source.error == f"row {row} names {cells[row]!r}, outside {folder}: {NOT_OPENED}"
        assert source.path == str(path)  # the file named is not even recorded


def test_allow_outside_paths_opens_them(outside_paths):
    path, cells = outside_paths["path"], outside_paths["cells"]
    found = _listed([str(path)], collection=Collection("file", allow_outside_paths=True))
    errors = {cells[row]: s.error for row, s in enumerate(found)}
    assert errors == {
        **{cell: None for cell in cells},
        "/nonexistent/x.png": "row 3 names /nonexistent/x.png: no such file or directory",
        "../missing.png": f"row 5 names {outside_paths['folder'] / '../missing.png'}: no such file or directory",
    }
    # In a run the refused cells are failures by key; allowed, the image beside the folder is embedded.
    out = path.with_name("out.safetensors")
    code, _, err = run_images([path], MODEL, out, column="file", **OPTIONS)
    assert code == 1
    assert sorted(gemma_embed.load(out)) == [f"{path}:0", f"{path}:1"]
    assert sum(f"{path}:{row}: row {row} names" in line for row in range(2, 8) for line in err.splitlines()) == 6
    code, _, err = run_images([path], MODEL, out, column="file", allow_outside_paths=True, **OPTIONS)
    embedded = gemma_embed.load(out)
    assert {f"{path}:{row}" for row in (0, 1, 4, 6, 7)} <= set(embedded), err
    assert f"error: {path}:2: not a recognised image format" in err.splitlines()  # /etc/hostname was opened
