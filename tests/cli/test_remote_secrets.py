"""No secret leaves the tool: with the store's secret key, a session token and a Hugging Face token in the
environment, signed URLs (their signature in the query string) and a password in a URL among the inputs, and failures
among them, none appears in any file a run writes (its output, parts, errors file and lock, locally and in the bucket,
the search index, an export, and anything under its home, cache and temporary folders) nor in any line it prints on
stdout or stderr (embed runs, index, inspect, search and export of the output in the bucket), the embed runs'
--debug tracebacks included. The signed URLs were fetched as given: the server saw the signature; only what is
recorded lost it."""

from __future__ import annotations

import os
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from collection_helpers import IMAGES, MODEL, image_files
from helpers import EXE
from remote_helpers import SECRET_KEY, SIGNATURE, MediaServer, files_under, s3_server, s3fs_client
from warm_cli import environment_with_server

import gemma_embed

NAMES = list(IMAGES)[:4]
PASSWORD = "pa55-w0rd-0f-the-test-42"
SESSION_TOKEN = "Sess10n-T0ken-0f-the-test-1a2b3c4d5e"
HF_TOKEN = "hf_T0kenOfTheTestNotARealOne0123456789"
SECRETS = (SECRET_KEY, SIGNATURE, PASSWORD, SESSION_TOKEN, HF_TOKEN)


def _environment(root) -> dict[str, str]:
    """The runs' environment: the tokens, and their home, cache and temporary folders under `root/private-home`
    (grepped with the rest)."""
    home = root / "private-home"
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    secrets = {"AWS_SESSION_TOKEN": SESSION_TOKEN, "HF_TOKEN": HF_TOKEN}
    folders = {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "TMPDIR": str(home / "tmp")}
    return {**os.environ, **secrets, **folders}


def _command(*args: str, env) -> subprocess.CompletedProcess:
    """The command in its own process, forked from the module's server, which was started in `env` (the tokens and
    folders are read at import: the session's server would start each run anew)."""
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=300, env=env)


def _run(*args: str, env) -> subprocess.CompletedProcess:
    return _command(*args, "--model", str(MODEL), "--max-soft-tokens", "70", env=env)


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    root = tmp_path_factory.mktemp("secrets")
    folder = root / "images"
    images = image_files(folder)
    with pytest.MonkeyPatch.context() as patch, s3_server(patch), MediaServer(folder) as web:
        fs = s3fs_client()
        fs.mkdir("private")
        for name in NAMES:
            fs.pipe_file(f"private/photos/{name}", images[name])
        host = web.url("").removeprefix("http://").rstrip("/")
        urls = [web.url(f"{name}?X-Amz-Credential=AKIA%2Fx&X-Amz-Signature={SIGNATURE}") for name in NAMES[:2]]
        urls += [
            web.url(f"status/403/denied.jpg?X-Amz-Signature={SIGNATURE}"),  # fails, with its signed URL
            web.url(f"cut/{NAMES[2]}?sig={SIGNATURE}"),  # fails after retries
            f"http://user:{PASSWORD}@{host}/{NAMES[3]}",  # credentials in the URL itself
            f"htp://{host}/{NAMES[0]}?X-Amz-Signature={SIGNATURE}",  # a mistyped scheme: no URL to fetch
        ]
        pq.write_table(pa.table({"url": urls}), root / "signed.parquet")
        with environment_with_server(root / "server", _environment(root)) as env:
            yield {"root": root, "web": web, "fs": fs, "env": env}


def _leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def test_no_secret_in_any_file_written_or_line_printed(setting):
    root, fs, web, env = setting["root"], setting["fs"], setting["web"], setting["env"]
    local = root / "out" / "emb.safetensors"
    local.parent.mkdir()
    runs = [
        _run("images", "s3://private/photos", str(root / "signed.parquet"), "--url-column", "url", "-o", str(local),
             "--url-retries", "1", "--debug", "--jsonl", "--flush-every", "1", env=env),
        _run("images", "s3://private/photos", str(root / "signed.parquet"), "--url-column", "url",
             "-o", "s3://private/run/emb.safetensors", "--url-retries", "1", "--debug", "--jsonl", "--shard-size", "3",
             env=env),
    ]  # fmt: skip
    for run in runs:
        assert run.returncode == 1, run.stderr  # the failing URLs, named; the rest written
        assert "error: signed.parquet" not in run.stderr and "cannot fetch" in run.stderr
        assert _leaks(run.stdout) == [] and _leaks(run.stderr) == [], run.stderr
    remote = "s3://private/run/emb.safetensors"
    readers = [
        ("index", remote),
        ("inspect", remote),
        ("search", remote, "--image", str(root / "images" / NAMES[0]), "--model", str(MODEL), "--jsonl"),
        ("export", remote, "--to", "parquet", "-o", str(root / "out" / "emb.parquet")),
    ]
    for args in readers:
        done = _command(*args, env=env)
        assert done.returncode == 0, (args[0], done.stderr)
        assert _leaks(done.stdout + done.stderr) == [], (args[0], done.stderr)

    written = {str(p): p.read_bytes() for p in [*files_under(root / "out"), *files_under(root / "private-home")]}
    written.update({key: fs.cat_file(key) for key in fs.find("private/run")})
    assert any(name.endswith("emb.errors.jsonl") for name in written) and len(written) >= 7
    assert any(name.endswith("emb.parquet") for name in written)
    for name, data in written.items():
        assert [s for s in SECRETS if s.encode() in data] == [], name

    items = gemma_embed.read_metadata(local)["items"]
    recorded = [item["path"] for item in items if item["path"].startswith("http")]
    assert recorded == [web.url(NAMES[0]), web.url(NAMES[1]), web.url(NAMES[3])]  # the URLs without secrets
    assert any(SIGNATURE in request for request in web.requests)  # fetched as given, signature and all
