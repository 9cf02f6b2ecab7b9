"""Outputs in object storage (moto's S3 server on 127.0.0.1): a sharded output written to a bucket, killed (SIGKILL)
after its first parts were uploaded, finished with --resume, then inspected, indexed, searched and exported there,
each equal to the same steps on a local output. Every shard is uploaded whole once complete and the index last, as
the requests that crossed a counting proxy show; a reader never sees a half-written file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pyarrow.parquet as pq
import pytest
import torch
from helpers import ROOT, SLOW_CLI, invoke, run_images, write_image
from remote_helpers import CountingProxy, s3_server, s3fs_client
from warm_cli import REPORT_VARIABLE, reported_pid

import gemma_embed

MODEL = ROOT / "samples" / "tiny-gemma4"
BUCKET = "outputs"
REMOTE = f"s3://{BUCKET}/run/emb.safetensors"
OPTIONS = {"max_soft_tokens": 70, "shard_size": 5}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote-out")
    images = root / "images"
    images.mkdir()
    sizes = [(64, 48), (48, 64), (100, 100), (300, 40), (40, 300)]
    for i in range(12):
        write_image(images / f"img{i:02d}.png", *sizes[i % len(sizes)], i)
    local = root / "local" / "emb.safetensors"
    local.parent.mkdir()
    assert run_images([images], MODEL, local, **OPTIONS)[0] == 0
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as endpoint:
        s3fs_client().mkdir(BUCKET)
        yield {"root": root, "images": images, "local": local, "endpoint": endpoint}


def _killed_after_two_parts(store) -> subprocess.CompletedProcess:
    """The run into the bucket, SIGKILLed once two parts (four items at --flush-every 2) are uploaded; its fifth
    device batch is held (slow_gemma_embed.py --gate) until then, so it is still running."""
    gate = store["root"] / "gate"
    gate.mkdir()
    for batch in range(4):
        (gate / str(batch)).touch()
    args = [SLOW_CLI, "--gate", str(gate), "images", str(store["images"]), "--model", str(MODEL)]
    args += ["-o", REMOTE, "--flush-every", "2", "--batch-size", "1", "--max-soft-tokens", "70", "--shard-size", "5"]
    report = store["root"] / "report.json"  # the command's PID, forked or not (tests/warm_cli.py): SIGKILL goes there
    env = {**os.environ, REPORT_VARIABLE: str(report)}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    fs = s3fs_client()
    deadline = time.monotonic() + 120  # only against a hang
    while len(fs.glob(f"{BUCKET}/run/emb.safetensors.parts/part-*.safetensors", refresh=True)) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no parts were uploaded"
        time.sleep(0.05)
    os.kill(reported_pid(report), signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(args, proc.returncode, stdout.decode(), stderr.decode())


def test_a_remote_output_killed_and_resumed_equals_the_local_one(store, monkeypatch):
    stopped = _killed_after_two_parts(store)
    assert stopped.returncode == -signal.SIGKILL
    fs = s3fs_client()
    assert not fs.exists(REMOTE.removeprefix("s3://")) and not fs.exists(f"{BUCKET}/run/emb.index.json")
    parts = fs.glob(f"{BUCKET}/run/emb.safetensors.parts/*")
    assert 2 <= len(parts) and all(p.endswith(".safetensors") for p in parts)  # whole parts, nothing half-written

    with CountingProxy(store["endpoint"]) as proxy:  # the resume in-process, every request through the proxy
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        code, records, err = run_images([store["images"]], MODEL, REMOTE, **OPTIONS, resume=True, overwrite=False)
        puts = [path.split("?")[0] for method, path, _ in proxy.requests if method == "PUT"]
    assert code == 0, err
    statuses = [r.get("status") for r in records if r.get("type") == "item"]
    assert statuses.count("resumed") >= 4 and len(statuses) == 12
    assert sorted(fs.ls(f"{BUCKET}/run", refresh=True)) == [
        f"{BUCKET}/run/emb-0000{n}.safetensors" for n in range(3)
    ] + [f"{BUCKET}/run/emb.index.json"]  # the parts are gone
    written = [p for p in puts if not p.endswith(".probe") and ".parts/" not in p]
    shards = [f"/{BUCKET}/run/emb-0000{n}.safetensors" for n in range(3)]
    assert written == [*shards, f"/{BUCKET}/run/emb.index.json"]  # each shard in one request, then the index

    ours, theirs = (
        gemma_embed.load(REMOTE.replace("emb.safetensors", "emb.index.json")),
        gemma_embed.load(store["local"]),
    )
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert gemma_embed.read_metadata(REMOTE) == gemma_embed.read_metadata(store["local"])


def test_inspect_index_search_and_export_read_the_remote_output_as_the_local_one(store):
    if not s3fs_client().exists(f"{BUCKET}/run/emb.index.json"):
        assert run_images([store["images"]], MODEL, REMOTE, **OPTIONS)[0] == 0
    local = store["local"]
    shown = [invoke("inspect", where, "--json") for where in (REMOTE, local)]
    assert all(r.exit_code == 0 for r in shown)
    remote_view, local_view = (json.loads(r.stdout) for r in shown)
    assert remote_view["keys"] == local_view["keys"] and remote_view["items"] == local_view["items"]

    for where in (REMOTE, local):
        built = invoke("index", where, "-q")
        assert built.exit_code == 0, built.stderr
    assert s3fs_client().glob(f"{BUCKET}/run/emb.search-index*") or s3fs_client().glob(f"{BUCKET}/run/emb.faiss*")
    query = str(store["images"] / "img03.png")
    hits = []
    for where in (REMOTE, local):
        found = invoke("search", where, "--image", query, "--model", MODEL, "--jsonl", "-k", "5")
        assert found.exit_code == 0, found.stderr
        hits.append([(r["key"], r["score"]) for r in map(json.loads, found.stdout.splitlines())])
    assert hits[0] == hits[1] and len(hits[0]) == 5

    exported = f"s3://{BUCKET}/run/emb.parquet"
    for where, to in ((REMOTE, exported), (local, local.with_suffix(".parquet"))):
        done = invoke("export", where, "--to", "parquet", "-o", to)
        assert done.exit_code == 0, done.stderr
    remote_table = pq.read_table(exported.removeprefix("s3://"), filesystem=s3fs_client())
    local_table = pq.read_table(local.with_suffix(".parquet"))
    assert remote_table.equals(local_table)


FOLDER = f"s3://{BUCKET}/folder/"


def test_a_folder_output_holds_its_shards_and_their_index_uploaded_after_every_shard(store, monkeypatch):
    """`-o s3://bucket/folder/` (a folder, named with the trailing slash) is the output folder/embeddings.safetensors:
    the folder holds its three shards and their index (OUT.index.json, the manifest naming them) and nothing else
    once done; each shard is uploaded whole in one PUT, and the index is sent only after the store answered every
    shard it names (the order of requests through a recording proxy), then the parts are removed; the rows equal
    the local output's, and inspect, index, search and export given the folder read it as the local output."""
    folder = FOLDER.removeprefix("s3://")
    with CountingProxy(store["endpoint"]) as proxy, monkeypatch.context() as patch:
        patch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)  # the embed run's requests only, through the proxy
        args = ("--model", MODEL, "--max-soft-tokens", "70", "--shard-size", "5", "--flush-every", "4", "-o", FOLDER)
        done = invoke("images", store["images"], *args)
        events = list(proxy.events)
    assert done.exit_code == 0, done.stderr
    assert done.stderr.rstrip().endswith(f"-> {FOLDER}embeddings.index.json"), done.stderr
    fs = s3fs_client()
    shards = [f"/{folder}embeddings-0000{n}.safetensors" for n in range(3)]
    index = f"/{folder}embeddings.index.json"
    assert sorted("/" + key for key in fs.find(folder, refresh=True)) == [*shards, index]

    def when(kind: str, method: str, path: str) -> list[int]:
        return [n for n, event in enumerate(events) if event == (kind, method, path)]

    puts = [path for kind, method, path in events if kind == "sent" and method == "PUT" and ".parts/" not in path]
    assert [p for p in puts if not p.endswith(".probe")] == [*shards, index]  # each shard once, the index once
    assert all(len(when("answered", "PUT", shard)) == 1 for shard in shards)
    (index_sent,) = when("sent", "PUT", index)
    assert index_sent > max(when("answered", "PUT", shard)[0] for shard in shards)
    assert any(method == "PUT" and ".parts/" in path for _, method, path in events)  # parts were flushed there
    removed = [  # and removed (one batch delete, POST /BUCKET?delete, or one DELETE each) after the index
        n
        for n, (kind, method, path) in enumerate(events)
        if kind == "sent" and ((method, path) == ("POST", f"/{BUCKET}") or (method == "DELETE" and ".parts/" in path))
    ]
    assert removed and min(removed) > when("answered", "PUT", index)[0]
    written = json.loads(fs.cat_file(index.lstrip("/")))
    assert written["shards"] == [s.rsplit("/", 1)[1] for s in shards]

    local = store["local"]
    ours, theirs = gemma_embed.load(FOLDER), gemma_embed.load(local)
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert list(written["keys"]) == list(theirs)

    shown = [invoke("inspect", where, "--json") for where in (FOLDER, local)]
    assert all(r.exit_code == 0 for r in shown), shown[0].stderr
    remote_view, local_view = (json.loads(r.stdout) for r in shown)
    assert remote_view["keys"] == local_view["keys"] and remote_view["items"] == local_view["items"]
    for where in (FOLDER, local):
        built = invoke("index", where, "-q")
        assert built.exit_code == 0, built.stderr
    assert fs.glob(f"{folder}embeddings.search-index*", refresh=True)  # beside the output, in the folder
    query = str(store["images"] / "img07.png")
    hits = []
    for where in (FOLDER, local):
        found = invoke("search", where, "--image", query, "--model", MODEL, "--jsonl", "-k", "4")
        assert found.exit_code == 0, found.stderr
        hits.append([(r["key"], r["score"]) for r in map(json.loads, found.stdout.splitlines())])
    assert hits[0] == hits[1] and len(hits[0]) == 4
    for where in (FOLDER, local):  # no -o: OUT.parquet beside the output, in the folder for the folder's
        exported = invoke("export", where, "--to", "parquet", "--overwrite")
        assert exported.exit_code == 0, exported.stderr
    remote_table = pq.read_table(f"{folder}embeddings.parquet", filesystem=s3fs_client())
    assert remote_table.equals(pq.read_table(local.with_suffix(".parquet")))
