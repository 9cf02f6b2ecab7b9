"""Inputs on the Hugging Face hub (`hf://`), offline: a fake hub on 127.0.0.1 (tests/hub_helpers.py) serves a local
folder as a private dataset repository through the endpoints huggingface_hub's HfFileSystem calls, and the tool
reaches it through `HF_ENDPOINT`, in its own process as a user runs it. The same images as loose files under
`images/`, as a webdataset shard and as a parquet table of their bytes give the local folder's rows bit for bit, in
input order; the HF_TOKEN in the environment reaches the hub as a Bearer header on every request and appears in no
file the run writes nor any line it prints; a shard is read by ranges, never downloaded whole; an output on the hub is
refused in one line."""

from __future__ import annotations

import os
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from collection_helpers import IMAGES, MODEL, caption, image_files, write_shard
from helpers import EXE, ROOT
from hub_helpers import COMMIT, FakeHub
from remote_helpers import files_under
from warm_cli import environment_with_server

import gemma_embed

NAMES = list(IMAGES)
REPO = "test-org/collection"
HF_TOKEN = "hf_FakeHubT0kenOfTheTest0123456789abcdef"
OPTIONS = ("--model", str(MODEL), "--max-soft-tokens", "70", "--batch-size", "4", "--cpu-threads", "1")


def _environment(hub: FakeHub, home, token: str | None = HF_TOKEN) -> dict[str, str]:
    """Reaching the fake hub through HF_ENDPOINT (huggingface_hub reads it at import), with the token and the
    home, cache and temporary folders under `home` (grepped with what the runs write)."""
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env |= {"HF_ENDPOINT": hub.endpoint, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    env |= {"TMPDIR": str(home / "tmp"), "PYTHONPATH": str(ROOT)}
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def _command(*args: str, env: dict[str, str], home) -> subprocess.CompletedProcess:
    """`gemma-embed ARGS` in its own process, in `env` (`_environment`), in `home`. The runs with the token share
    the module's home and fork from a server started in their environment (`hub`); the others start anew."""
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=300, env=env, cwd=home)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The repository (images/ with their .txt and .json beside them, shards/000.tar of the images and captions,
    tables/images.parquet of their bytes, broken/bad.jpg that no decoder takes) served privately (the token
    required), and the local folder's output, made by the same command line."""
    root = tmp_path_factory.mktemp("hub")
    repo = root / "repo"
    images = image_files(repo / "images")
    members = []
    for name in NAMES:
        members += [(name, images[name]), (name.split(".")[0] + ".txt", caption(name).encode())]
    (repo / "shards").mkdir()
    write_shard(repo / "shards" / "000.tar", members)
    (repo / "broken").mkdir()
    (repo / "broken" / "bad.jpg").write_bytes(b"\xff\xd8 not the rest of a JPEG")
    (repo / "tables").mkdir()
    table = pa.table({"id": NAMES, "image": [images[n] for n in NAMES]})
    pq.write_table(table, repo / "tables" / "images.parquet", row_group_size=3)
    home = root / "home"
    with (
        FakeHub({REPO: repo}, token=HF_TOKEN) as server,
        environment_with_server(root / "server", _environment(server, home)) as env,
    ):
        reference = root / "local" / "emb.safetensors"
        reference.parent.mkdir()
        done = _command("images", str(repo / "images"), *OPTIONS, "-o", str(reference), env=env, home=home)
        assert done.returncode == 0, done.stderr
        yield {"root": root, "repo": repo, "server": server, "reference": reference, "env": env, "home": home}


def _rows(output) -> list[torch.Tensor]:
    return [rows for _, rows, _ in gemma_embed.iter_items(output)]


def _leaks(text: str | bytes) -> bool:
    return (HF_TOKEN.encode() if isinstance(text, bytes) else HF_TOKEN) in text


@pytest.mark.parametrize(
    "inputs",
    [
        [f"hf://datasets/{REPO}/images/", f"hf://datasets/{REPO}/broken/bad.jpg"],  # and one that fails
        [f"hf://datasets/{REPO}/shards/000.tar"],
        [f"hf://datasets/{REPO}/tables/images.parquet", "--column", "image", "--key-column", "id"],
    ],
    ids=["loose-files", "shard", "parquet-bytes"],
)
def test_the_hub_gives_the_local_folders_rows_bit_for_bit_in_input_order(hub, inputs, tmp_path):
    """Each form of the collection on the hub: the local run's rows bit for bit, in input order, with the same
    content hashes; items recorded by their hf:// location (a file that fails is named by it, on stderr and in
    the errors file); every request the run made to the repository carried the token as a Bearer header (the
    private repository answers 401 without it), and the token is in no line printed and no file written (the
    output, its errors file, the run's home, cache and temporary folders)."""
    server = hub["server"]
    server.requests.clear()
    out = tmp_path / "out" / "emb.safetensors"
    out.parent.mkdir()
    home = hub["home"]
    done = _command("images", *inputs, *OPTIONS, "-o", str(out), "--jsonl", env=hub["env"], home=home)
    failing = inputs[-1].endswith("bad.jpg")
    assert done.returncode == (1 if failing else 0), done.stderr
    if failing:  # named on stderr and in the errors file, by its hf:// location
        assert f"hf://datasets/{REPO}/broken/bad.jpg" in done.stderr
        assert f"hf://datasets/{REPO}/broken/bad.jpg" in out.with_name("emb.errors.jsonl").read_text()

    reference = _rows(hub["reference"])
    ours = _rows(out)
    assert len(ours) == len(NAMES) and all(torch.equal(a, b) for a, b in zip(ours, reference, strict=True))
    theirs = {key: item for key, _, item in gemma_embed.iter_items(hub["reference"])}
    for name, (key, _, item) in zip(NAMES, gemma_embed.iter_items(out), strict=True):
        assert item["sha256"] == theirs[name]["sha256"]
        assert item["path"].startswith(f"hf://datasets/{REPO}/"), item["path"]
        if "images/" in inputs[0]:
            assert key == name  # keyed relative to the folder, as the local folder's files are
    if inputs[0].endswith(".tar"):
        assert [item["caption"] for _, _, item in gemma_embed.iter_items(out)] == [caption(n) for n in NAMES]
    if not inputs[0].endswith("/"):  # a shard and a table are read by ranges (a table: its footer first)
        assert any(r is not None for _, path, _, r in server.requests if "/resolve/" in path)

    asked = [(method, path, auth) for method, path, auth, _ in server.requests if "/datasets/" in path]
    assert asked and all(auth == f"Bearer {HF_TOKEN}" for _, _, auth in asked), asked
    assert {method for method, _, _ in asked} <= {"GET", "HEAD", "POST"}  # reads only (POST: paths-info)
    assert not _leaks(done.stdout) and not _leaks(done.stderr)
    written = [*files_under(out.parent), *files_under(home)]
    assert out in written and (not failing or out.with_name("emb.errors.jsonl") in written)
    assert [str(f) for f in written if _leaks(f.read_bytes())] == []


def test_without_the_token_the_private_repository_is_refused_in_one_line(hub, tmp_path):
    """The token is what opens the repository: without HF_TOKEN the hub answers 401 and the run stops before any
    work, in one line naming the location and saying what the hub's answer may mean (no such repository, or a
    private one and no token), not "no such file" (exit 2: an input named on the command line that cannot be
    read)."""
    hub["server"].requests.clear()
    out = tmp_path / "emb.safetensors"
    home = tmp_path / "home"
    env = _environment(hub["server"], home, token=None)
    done = _command("images", f"hf://datasets/{REPO}/images/", *OPTIONS, "-o", str(out), env=env, home=home)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: hf://datasets/{REPO}/images: "), done.stderr
    assert "no such repository" in lines[0] and "private" in lines[0] and "HF_TOKEN" in lines[0]
    assert any(auth is None for _, path, auth, _ in hub["server"].requests if f"/api/datasets/{REPO}" in path)
    assert not out.exists()


@pytest.mark.parametrize("command", ["images", "export"])
def test_an_output_on_the_hub_is_refused_in_one_line(hub, command, tmp_path):
    """hf:// is read-only here: an embedding output or an export there is refused before any work, in one line
    naming it (exit 2, usage), and nothing is sent to the hub that would write (no PUT, no commit POST)."""
    server = hub["server"]
    server.requests.clear()
    target = f"hf://datasets/{REPO}/out/emb." + ("safetensors" if command == "images" else "parquet")
    if command == "images":
        args = ("images", f"hf://datasets/{REPO}/images/", *OPTIONS, "-o", target)
    else:
        args = ("export", str(hub["reference"]), "--to", "parquet", "-o", target)
    done = _command(*args, env=hub["env"], home=hub["home"])
    assert done.returncode == 2, done.stderr
    said = f"error: {target}: hf:// locations are read-only here: write the output elsewhere"
    assert done.stderr.splitlines() == [said]
    assert [r for r in server.requests if r[0] not in ("GET", "HEAD") and "/paths-info/" not in r[1]] == []
    assert not any("/commit/" in path or "/preupload/" in path for _, path, _, _ in server.requests)


def test_a_hub_shard_is_streamed_by_ranges_never_downloaded_whole(hub, tmp_path, monkeypatch):
    """A shard whose first member is 48 MiB the command does not decode, at revision main named in the location:
    its images come out whole after a fraction of the shard crossed the network (ranged reads; the filler seeked
    over). In this process, with HF_ENDPOINT set after huggingface_hub was imported: the tool's hub filesystem
    follows the variable as it is now, not as the hub's constants read it at import."""
    import huggingface_hub.constants

    from gemma_embed.sources import iter_sources

    repo = tmp_path / "big-repo"
    (repo / "big").mkdir(parents=True)
    images = {n: (hub["repo"] / "images" / n).read_bytes() for n in NAMES[:3]}
    shard = write_shard(repo / "big" / "big.tar", [("000000.bin", b"\0" * (48 << 20)), *images.items()])
    with FakeHub({"test-org/big": repo}) as server:
        assert huggingface_hub.constants.ENDPOINT != server.endpoint
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        where = "hf://datasets/test-org/big@main/big/big.tar"
        found = [(s.key, s.error, bytes(s.data)) for s in iter_sources([where], "images")]
    assert found == [(f"{where}:{name}", None, data) for name, data in images.items()]
    size = shard.stat().st_size
    assert 0 < server.sent < size / 4, (server.sent, size)
    assert any(r is not None for _, path, _, r in server.requests if "/resolve/main/" in path)


def test_the_fake_hub_answers_as_hf_file_system_expects(hub):
    """The fake hub itself, through huggingface_hub's own HfFileSystem: listings (paginated, unsorted on the wire)
    sorted and complete, info of a file and a folder, a ranged read, a missing path, and the revision by commit."""
    from huggingface_hub import HfFileSystem

    server, repo = hub["server"], hub["repo"]
    fs = HfFileSystem(endpoint=server.endpoint, token=HF_TOKEN, skip_instance_cache=True)
    root = f"datasets/{REPO}"
    folders = sorted((f"{root}/{p.name}" for p in repo.iterdir()), reverse=True)
    assert fs.ls(root, detail=False) == folders  # in the hub's order (fsspec's ls keeps it; the tool sorts)
    expected = sorted(f"{root}/images/{p.name}" for p in (repo / "images").iterdir())
    assert fs.find(f"{root}/images") == expected and len(expected) > 4  # more than one page
    assert fs.info(f"{root}/images/{NAMES[1]}")["size"] == (repo / "images" / NAMES[1]).stat().st_size
    assert fs.info(f"{root}/images")["type"] == "directory"
    data = (repo / "shards" / "000.tar").read_bytes()
    with fs.open(f"{root}/shards/000.tar", "rb", block_size=1024) as fh:
        fh.seek(5000)
        assert fh.read(100) == data[5000:5100]
    assert fs.cat_file(f"datasets/{REPO}@{COMMIT}/shards/000.tar") == data
    with pytest.raises(FileNotFoundError):
        fs.info(f"{root}/images/missing.jpg")
    with pytest.raises(FileNotFoundError):
        HfFileSystem(endpoint=server.endpoint, token=False, skip_instance_cache=True).ls(root)
