"""The opener seam (gemma_embed/locations): locations parsed as fsspec parses URLs, path arithmetic as pathlib's
(and right where pathlib collapses `s3://`), fsspec's operations on local files checked against the OS, fsspec and
pyarrow, the one line that refuses a remote protocol, and the safety of what it creates and opens."""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import sys
import threading
from pathlib import Path

import fsspec.core
import numpy as np
import pytest

from gemma_embed.errors import UsageError
from gemma_embed.locations import Location, NotPlain, NotRegularFile, location, split_protocol

LOCAL_NAMES = ["a.jpg", "./a.jpg", "photos/", "photos//sub/./x.tar", "/abs/x.safetensors", ".", "", "a/../b.png"]


def test_a_local_path_is_normalised_and_derived_as_pathlib_does():
    for text in LOCAL_NAMES:
        ours, theirs = location(text), Path(text)
        assert (str(ours), ours.name, ours.suffix, ours.stem) == (str(theirs), theirs.name, theirs.suffix, theirs.stem)
        assert str(ours.parent) == str(theirs.parent) and os.fspath(ours) == os.fspath(theirs)
        assert ours == theirs and hash(ours) == hash(theirs) and ours.is_local
        if theirs.name:
            assert str(ours.with_name("o.lock")) == str(theirs.with_name("o.lock"))
            assert str(ours.with_suffix(".npy")) == str(theirs.with_suffix(".npy"))
        assert str(ours / "c.txt") == str(theirs / "c.txt")
    assert location(Path("x/y.tar")) == location("x/y.tar") == location("file://x/y.tar")
    assert {location("x/y"), Path("x/y")} == {Path("x/y")}  # equal and hashed alike
    assert location("x/y/z.png").relative_to(location("x")).as_posix() == "y/z.png"
    assert isinstance(location("x"), Path)  # a local location is the pathlib.Path it was
    assert location("x/y").expanduser() == location("x/y")
    assert str(location("~/x").expanduser()) == os.path.expanduser("~/x")


def test_a_remote_location_keeps_its_protocol_where_pathlib_collapses_it():
    shard = location("s3://bucket/a/b.tar")
    assert str(Path("s3://bucket/a/b.tar")) == "s3:/bucket/a/b.tar"  # what pathlib does with it
    assert (shard.protocol, shard.path) == fsspec.core.split_protocol("s3://bucket/a/b.tar") == ("s3", "bucket/a/b.tar")
    assert split_protocol("s3://bucket/a/b.tar") == ("s3", "bucket/a/b.tar")
    assert (shard.name, shard.suffix, shard.stem) == ("b.tar", ".tar", "b")
    assert str(shard.parent) == "s3://bucket/a"
    assert str(shard.with_name("b.lock")) == "s3://bucket/a/b.lock"
    assert str(shard.parent / "c" / "d.parquet") == "s3://bucket/a/c/d.parquet"
    assert str(location("hf://datasets/org/name/train-000.parquet").with_suffix(".jsonl")) == (
        "hf://datasets/org/name/train-000.jsonl"
    )
    assert not shard.is_local and shard != Path("s3:/bucket/a/b.tar") and shard.is_absolute()
    assert shard.relative_to(location("s3://bucket")).as_posix() == "a/b.tar"
    with pytest.raises(ValueError):
        location("gs://bucket/a").relative_to(location("s3://bucket"))
    with pytest.raises(TypeError, match="not a local file"):
        os.fspath(shard)  # a library that opens by name never gets a remote location
    # One letter before :// is no protocol (fsspec's rule too: a Windows drive).
    assert location("c://x").is_local and fsspec.core.split_protocol("c://x")[0] is None


def test_an_output_named_as_a_folder_is_the_default_name_in_it_wherever_an_output_is_named():
    """A trailing slash names a folder, and the embedding output is -o's default name in it: for -o (RunConfig,
    from the command line or Python), serve's --output and the readers (output_location); a name without the
    slash, a path object and export's -o (a file of another format) are taken as they are."""
    from gemma_embed.config import RunConfig, parse_outputs
    from gemma_embed.locations.written import output_location

    for given, meant in (
        ("s3://bucket/run/", "s3://bucket/run/embeddings.safetensors"),
        ("s3://bucket/", "s3://bucket/embeddings.safetensors"),
        ("hf://datasets/org/name/out/", "hf://datasets/org/name/out/embeddings.safetensors"),
        ("run/", "run/embeddings.safetensors"),
        ("run", "run"),
        ("s3://bucket/run", "s3://bucket/run"),
        (Path("run/"), "run"),
    ):
        assert str(output_location(given)) == meant, given
    assert output_location("s3://bucket/run/").protocol == "s3"
    assert str(RunConfig(modality="images", inputs=("x",), output="s3://bucket/run/").output) == (
        "s3://bucket/run/embeddings.safetensors"
    )
    assert [str(o) for o in parse_outputs(["run/", "a.safetensors"])] == ["run/embeddings.safetensors", "a.safetensors"]


def test_a_location_is_a_small_picklable_value():
    for text in ("photos/a.jpg", "s3://bucket/shards/00001.tar"):
        value = location(text)
        again = pickle.loads(pickle.dumps(value))
        assert again == value and str(again) == text and type(again) is type(value) and text in repr(again)
        assert len(pickle.dumps(value)) < 120
    with pytest.raises(AttributeError):
        location("a").path = "b"


@pytest.fixture
def no_clients(monkeypatch):
    """The object-storage clients not installed: importing them fails, as on a machine without the extras."""
    for module in ("s3fs", "gcsfs", "aiohttp"):
        monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize(
    "text, needs",
    [
        ("s3://bucket/shards/{00000..00009}.tar", "s3:// locations need s3fs: pip install 'gemma-embed[s3]'"),
        ("gs://bucket/a.parquet", "gs:// locations need gcsfs: pip install 'gemma-embed[gcs]'"),
        (
            "https://example.org/a.jpg",
            "https:// locations need fsspec's HTTP filesystem (aiohttp): pip install 'gemma-embed[http]'",
        ),
        ("ftp2://host/a", "ftp2:// locations are not supported (local paths, gcs, gs, hf, http, https, s3, s3a)"),
    ],
)
def test_a_protocol_without_its_client_is_refused_in_one_line_naming_the_extra(no_clients, text, needs):
    where = location(text)  # parsing checks nothing
    for use in (where.exists, where.isdir, where.open_input, lambda: where.with_name("x.lock").open_lock()):
        with pytest.raises(UsageError) as refused:
            use()
        assert str(refused.value).endswith(needs) and "\n" not in str(refused.value)
    assert str(refused.value).startswith(str(where.with_name("x.lock")))


# ------------------------------------------------------------------------------------------ local files


def test_local_operations_agree_with_the_os_and_fsspec(tmp_path):
    from fsspec.implementations.local import LocalFileSystem

    data = bytes(range(256)) * 40
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.bin").write_bytes(data)
    (tmp_path / "a.txt").write_bytes(b"one\r\ntwo\n")
    os.symlink("b.bin", tmp_path / "link.bin")
    folder = location(tmp_path)
    info, theirs = (folder / "link.bin").info(), LocalFileSystem().info(str(tmp_path / "link.bin"))
    for field in ("size", "type", "mtime", "islink", "mode"):
        assert info[field] == theirs[field], field
    assert info["mtime_ns"] == os.stat(tmp_path / "b.bin").st_mtime_ns
    assert [e.name for e in folder.ls()] == sorted(os.listdir(tmp_path))
    assert [e.name for e in folder.glob("*.bin")] == ["b.bin", "link.bin"]
    assert [(str(root), d, f) for root, d, f in folder.walk()] == list(os.walk(tmp_path))
    for start, end in ((None, None), (10, 20), (1000, None), (None, 7), (9000, 20000)):
        assert (folder / "b.bin").cat_file(start, end) == data[start:end]
    with (folder / "b.bin").open("rb") as fh:  # seekable: ranged reads
        fh.seek(300)
        assert fh.read(5) == data[300:305]
    assert (folder / "a.txt").read_text(encoding="utf-8") == (tmp_path / "a.txt").read_text(encoding="utf-8")
    assert (folder / "sub").isdir() and (folder / "b.bin").isfile() and (folder / "link.bin").islink()
    os.symlink("gone", tmp_path / "dangling")
    assert not (folder / "dangling").exists() and (folder / "dangling").lexists()
    (folder / "sub" / "deep").makedirs()
    (folder / "sub" / "deep" / "f").write_bytes(b"x")
    with pytest.raises(IsADirectoryError):
        (folder / "sub").rm()
    (folder / "sub").rm(recursive=True)
    (folder / "dangling").rm_file()
    (folder / "dangling").rm_file(missing_ok=True)
    with pytest.raises(FileNotFoundError):
        (folder / "dangling").rm_file()
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.bin", "link.bin"]


def test_pyarrow_reads_through_the_fsspec_filesystem_a_location_gives(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "t.parquet")
    fs, path = location(tmp_path / "t.parquet").fsspec()
    assert pq.read_table(path, filesystem=fs).equals(pq.read_table(tmp_path / "t.parquet"))


def test_facts_are_the_size_mtime_and_sha256_of_the_content(tmp_path):
    file = tmp_path / "x.png"
    file.write_bytes(b"\x89PNG" * 1000)
    st = os.stat(file)
    assert location(file).facts() == {
        "bytes": st.st_size,
        "mtime": st.st_mtime,
        "sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
    }


def test_an_input_that_is_no_regular_file_once_open_is_refused_without_blocking(tmp_path):
    """What a FIFO swapped in after the stat would do: opened without blocking, refused by its descriptor."""
    os.mkfifo(tmp_path / "pipe")
    done = []
    opener = threading.Thread(target=lambda: done.append(_refusal(location(tmp_path / "pipe"))), daemon=True)
    opener.start()
    opener.join(5)
    assert done == ["not a regular file (a FIFO); not read"]
    with pytest.raises(IsADirectoryError):
        location(tmp_path).open_input()
    (tmp_path / "f").write_bytes(b"abc")
    with location(tmp_path / "f").open_input() as fh:
        assert fh.read() == b"abc" and fh.name == str(tmp_path / "f")
        assert os.get_blocking(fh.fileno())  # O_NONBLOCK is cleared again: reads are as on any file


def _refusal(where: Location) -> str:
    with pytest.raises(NotRegularFile) as refused:
        where.open_input()
    return str(refused.value)


# ------------------------------------------------------------------------------------------ what it creates


def test_an_atomic_write_appears_whole_with_the_umask_or_not_at_all(tmp_path):
    target = location(tmp_path / "out.json")
    previous = os.umask(0o022)
    try:
        with target.atomic_write() as fh:
            fh.write(b"{}")
            assert os.listdir(tmp_path) != ["out.json"]  # only the temporary file, beside it
        assert (tmp_path / "out.json").read_bytes() == b"{}"
        assert stat.S_IMODE(os.stat(tmp_path / "out.json").st_mode) == 0o644
        with pytest.raises(RuntimeError), target.atomic_write() as fh:
            fh.write(b"half")
            raise RuntimeError("stopped")
    finally:
        os.umask(previous)
    assert os.listdir(tmp_path) == ["out.json"] and (tmp_path / "out.json").read_bytes() == b"{}"


def test_an_atomic_write_replaces_a_link_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"keep")
    os.symlink(victim, tmp_path / "out.json")
    with location(tmp_path / "out.json").atomic_write() as fh:
        fh.write(b"new")
    assert victim.read_bytes() == b"keep"
    assert not os.path.islink(tmp_path / "out.json") and (tmp_path / "out.json").read_bytes() == b"new"


def test_an_atomic_write_lands_in_the_folder_it_opened_when_the_path_changes_meanwhile(tmp_path):
    (tmp_path / "a").mkdir()
    with location(tmp_path / "a" / "out.bin").atomic_write() as fh:
        fh.write(b"data")
        os.rename(tmp_path / "a", tmp_path / "moved")  # someone swaps the folder under the path
        (tmp_path / "a").mkdir()
    assert (tmp_path / "moved" / "out.bin").read_bytes() == b"data"
    assert os.listdir(tmp_path / "a") == []


def test_a_temp_path_is_a_new_file_beside_the_target_that_becomes_it(tmp_path):
    target = location(tmp_path / "rows.npy")
    with target.temp_path() as tmp:
        (beside,) = os.listdir(tmp_path)  # the temporary file, created by the seam beside the target
        assert beside.endswith(".tmp") and os.path.samefile(tmp, tmp_path / beside) and os.path.getsize(tmp) == 0
        array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(3, 2))
        array[:] = 1.5
        array.flush()
        del array
    assert os.listdir(tmp_path) == ["rows.npy"] and np.load(tmp_path / "rows.npy").sum() == 9.0
    with pytest.raises(KeyboardInterrupt), target.temp_path():
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["rows.npy"]


def test_a_link_swapped_in_for_a_temp_file_redirects_nothing_and_is_never_renamed_into_place(tmp_path):
    victim = tmp_path / "elsewhere" / "victim.npy"
    victim.parent.mkdir()
    victim.write_bytes(b"keep")
    out = tmp_path / "out"
    out.mkdir()
    with (
        pytest.raises(NotPlain, match="was replaced while it was written"),
        location(out / "rows.npy").temp_path() as tmp,
    ):
        (name,) = os.listdir(out)
        os.unlink(out / name)
        os.symlink(victim, out / name)  # an attacker's link under the temporary name, before the writer opens it
        np.save(open(tmp, "wb"), np.ones(3))  # noqa: SIM115 - a writer that opens the name it was given
    assert victim.read_bytes() == b"keep" and not (out / "rows.npy").exists()
    assert os.path.islink(out / name)  # the attacker's entry is left alone, not removed as if it were ours


def test_the_lock_file_is_never_opened_through_a_link_nor_a_hard_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"keep")
    os.symlink(victim, tmp_path / "out.lock")
    with pytest.raises(NotPlain, match=f"a symbolic link to {victim}; not followed"):
        location(tmp_path / "out.lock").open_lock()
    os.link(victim, tmp_path / "hard.lock")
    with pytest.raises(NotPlain, match="a file with 2 names"):
        location(tmp_path / "hard.lock").open_lock()
    os.mkfifo(tmp_path / "fifo.lock")
    with pytest.raises(NotPlain, match="is a FIFO"):  # and no wait for a writer
        location(tmp_path / "fifo.lock").open_lock()
    assert victim.read_bytes() == b"keep"
    fd = location(tmp_path / "new.lock").open_lock()
    try:
        assert location(tmp_path / "new.lock").names(fd) and not location(tmp_path / "victim.txt").names(fd)
    finally:
        os.close(fd)


def test_an_own_folder_is_a_plain_folder_of_this_user_and_files_go_in_it_without_following_a_link(
    tmp_path, monkeypatch
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    parts = location(tmp_path / "out.parts")
    parts.own_folder()  # created
    assert os.path.isdir(parts) and not os.path.islink(parts)
    with (parts / "part-0").atomic_write(own_folder=True) as fh:
        fh.write(b"rows")
    assert (tmp_path / "out.parts" / "part-0").read_bytes() == b"rows"
    os.rename(parts, tmp_path / "old.parts")
    os.symlink(elsewhere, parts)
    with pytest.raises(NotPlain, match=f"a symbolic link to {elsewhere}; not followed"):
        parts.own_folder(create=False)
    # Checked, then swapped for a link: the write itself opens the folder without following it.
    for write in (lambda: (parts / "part-1").atomic_write(own_folder=True), lambda: (parts / "x").temp_path(True)):
        with pytest.raises(NotPlain, match="a symbolic link"), write():
            pytest.fail("written through the link")
    assert os.listdir(elsewhere) == []
    os.unlink(parts)
    parts.write_bytes(b"")
    with pytest.raises(NotPlain, match="is a file"):
        parts.own_folder()
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(tmp_path / "old.parts").st_uid + 1)  # another user's
    with pytest.raises(NotPlain, match="owned by user"):
        location(tmp_path / "old.parts").own_folder()


def test_a_folder_that_takes_no_new_file_fails_the_probe_and_nothing_is_left(tmp_path):
    location(tmp_path).probe_folder("out.safetensors")
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError):
        location(tmp_path / "missing").probe_folder("out.safetensors")


# ------------------------------------------------------------------------------------------ without the clients


def test_a_remote_input_without_its_client_is_a_usage_error_as_an_argument_and_a_failed_item_as_data(
    tmp_path, no_clients
):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from gemma_embed.sources import Collection, check_given_paths, iter_sources

    for given in ("s3://bucket/x.jpg", "s3://bucket/{00000..00009}.tar"):
        with pytest.raises(UsageError) as refused:
            check_given_paths([given])
        assert str(refused.value) == f"{given}: s3:// locations need s3fs: pip install 'gemma-embed[s3]'"
    (tmp_path / "a.png").write_bytes(b"\x89PNG")
    listed = io.StringIO(f"gs://bucket/x.jpg\n{tmp_path / 'a.png'}\n")
    assert [(s.key, s.error) for s in iter_sources(["-"], "images", stdin=listed)] == [
        ("gs://bucket/x.jpg", "gs:// locations need gcsfs: pip install 'gemma-embed[gcs]'"),
        (str(tmp_path / "a.png"), None),
    ]
    pq.write_table(pa.table({"image": ["s3://bucket/x.jpg", "a.png"]}), tmp_path / "t.parquet")
    rows = list(
        iter_sources(
            [str(tmp_path / "t.parquet")], "images", collection=Collection(column="image", allow_outside_paths=True)
        )
    )
    assert [(s.error, s.path) for s in rows] == [
        (
            "row 0 names 's3://bucket/x.jpg': s3:// locations need s3fs: pip install 'gemma-embed[s3]'",
            str(tmp_path / "t.parquet"),
        ),
        (None, str(tmp_path / "a.png")),
    ]


@pytest.mark.parametrize(
    "command, named",
    [
        (["images", "s3://bucket/photos/", "-o", "OUT"], "s3://bucket/photos"),
        (["images", "IMAGES", "-o", "s3://bucket/out.safetensors"], "s3://bucket/out.safetensors"),
        (["text", "-", "-o", "gs://bucket/out.safetensors"], "gs://bucket/out.safetensors"),
        (["inspect", "gs://bucket/name/out.safetensors"], "gs://bucket/name/out.safetensors"),
        (["export", "gs://bucket/out.safetensors", "--to", "npy"], "gs://bucket/out.safetensors"),
        (["export", "OUT", "--to", "parquet", "-o", "s3://bucket/out.parquet"], "s3://bucket/out.parquet"),
        (["index", "s3://bucket/out.safetensors"], "s3://bucket/out.safetensors"),
        (["search", "s3://bucket/out.safetensors", "a cat"], "s3://bucket/out.safetensors"),
    ],
    ids=["input", "output", "text-output", "inspect", "export", "export-to", "index", "search"],
)
def test_every_command_refuses_a_location_without_its_client_in_one_line_before_any_work(
    tmp_path, no_clients, command, named
):
    from typer.testing import CliRunner

    from gemma_embed.cli import app

    images = Path(__file__).resolve().parents[2] / "samples" / "media" / "images"
    given = [str(tmp_path / "out.safetensors") if a == "OUT" else str(images) if a == "IMAGES" else a for a in command]
    result = CliRunner().invoke(app, given, catch_exceptions=False)
    protocol = named.split("://")[0]
    client, extra = ("s3fs", "s3") if protocol == "s3" else ("gcsfs", "gcs")
    assert result.exit_code == 2
    assert (
        result.stderr == f"error: {named}: {protocol}:// locations need {client}: pip install 'gemma-embed[{extra}]'\n"
    )
    assert result.stdout == "" and os.listdir(tmp_path) == []


def test_an_output_on_a_read_only_protocol_is_refused_in_one_line(tmp_path):
    from gemma_embed.store import check_output_folder

    for output in ("https://example.org/out.safetensors", "hf://datasets/org/name/out.safetensors"):
        with pytest.raises(UsageError) as refused:
            check_output_folder(output)
        protocol = output.split(":")[0]
        assert str(refused.value) == f"{output}: {protocol}:// locations are read-only here: write the output elsewhere"


# ------------------------------------------------------------------------------------------ a store out of reach


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: a connection there is refused at once


def test_a_store_out_of_reach_or_without_credentials_is_one_line_naming_the_location(monkeypatch, tmp_path):
    pytest.importorskip("s3fs")
    from gemma_embed.errors import kind_of, one_line

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example-secret-of-the-test")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(ConnectionError) as refused:
        location("s3://bucket/photos").exists()
    line = one_line(refused.value)
    assert line.startswith("s3://bucket/photos: cannot reach the store (Could not connect to the endpoint URL")
    assert "\n" not in line and kind_of(refused.value).code == 1

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(PermissionError) as refused:
        location("s3://bucket/photos").isdir()
    assert one_line(refused.value) == "s3://bucket/photos: no credentials for the store (Unable to locate credentials)"
    assert kind_of(refused.value).code == 2
