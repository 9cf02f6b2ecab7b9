"""A table of URLs (`--url-column`, as img2dataset reads LAION's parquet files): each URL fetched from Python's
http.server on 127.0.0.1 with a timeout, retries with backoff for what may pass (5xx, a stalled or cut body), none
for what will not (404), at most `--per-host` at once from one host, under the item size limit; every URL that
fails is a named skip in the errors file, with its status or reason, and the run goes on."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from collection_helpers import IMAGES, MODEL, OPTIONS, image_files
from helpers import invoke, run_images
from remote_helpers import MediaServer

import gemma_embed
from gemma_embed.sources import Collection, iter_sources
from gemma_embed.sources.fetch import FetchPolicy, fetch_ahead

NAMES = list(IMAGES)


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    root = tmp_path_factory.mktemp("urls")
    folder = root / "images"
    image_files(folder)
    reference = root / "folder.safetensors"
    code, _, err = run_images([folder], MODEL, reference, **OPTIONS)
    assert code == 0, err
    with MediaServer(folder, gate_width=2) as server:
        yield {"root": root, "folder": folder, "reference": reference, "server": server}


def test_every_failing_url_is_a_named_skip_with_its_status_or_reason_and_the_run_goes_on(web):
    server, root = web["server"], web["root"]
    big = max(NAMES, key=lambda n: (web["folder"] / n).stat().st_size)
    limit = (web["folder"] / big).stat().st_size - 1  # the largest image is over it, every other one within
    rows = {
        "ok": NAMES[0],
        "missing": "status/404/a.jpg",
        "broken": "status/500/b.jpg",
        "stalled": "stall/c.jpg",
        "cut": f"cut/{NAMES[1]}",
        "flaky": f"flaky/1/{NAMES[2]}",  # one 503, then the image: a retry gets it
        "big": big,
        "not-a-url": "file:///etc/passwd",
    }
    urls = [server.url(path) if not path.startswith("file:") else path for path in rows.values()]
    pq.write_table(pa.table({"id": list(rows), "url": urls}), root / "mixed.parquet")
    out = root / "mixed.safetensors"
    options = {**OPTIONS, "max_item_bytes": limit, "url_timeout": 1.0, "url_retries": 1}
    code, records, err = run_images([root / "mixed.parquet"], MODEL, out, url_column="url", key_column="id", **options)
    assert code == 1  # some items failed, the rest written
    assert sorted(gemma_embed.load(out)) == ["flaky", "ok"]
    reference = gemma_embed.load(web["reference"])
    assert torch.equal(gemma_embed.load(out)["ok"], reference[NAMES[0]])
    assert torch.equal(gemma_embed.load(out)["flaky"], reference[NAMES[2]])
    failures = {r["key"]: r for r in map(json.loads, (root / "mixed.errors.jsonl").read_text().splitlines())}
    assert sorted(failures) == ["big", "broken", "cut", "missing", "not-a-url", "stalled"]
    assert {r["stage"] for k, r in failures.items() if k != "not-a-url"} == {"fetch"}
    kinds = {key: record["error"] for key, record in failures.items()}  # what happened (errors.RECORD_KINDS)
    assert kinds == {
        "missing": "missing",
        "broken": "fetch-failed",
        "stalled": "fetch-failed",
        "cut": "fetch-failed",
        "big": "too-large",
        "not-a-url": "unreadable",
    }
    message = {key: record["message"] for key, record in failures.items()}
    assert message["missing"] == f"cannot fetch {server.url('status/404/a.jpg')}: HTTP 404 Not Found"
    assert (
        message["broken"]
        == f"cannot fetch {server.url('status/500/b.jpg')}: HTTP 500 Internal Server Error (tried 2 times)"
    )
    assert message["stalled"].endswith("timed out (no answer within 1 s) (tried 2 times)")
    size = (web["folder"] / NAMES[1]).stat().st_size
    assert message["cut"].endswith(
        f"the body was cut short after {size // 2} bytes of the {size} declared (tried 2 times)"
    )
    assert f"over the {limit / 1024:.1f} KiB an item may have" in message["big"]
    table = root / "mixed.parquet"  # with --key-column, the row is told with its table, as every table row is
    assert message["not-a-url"] == f"row 7 of {table}: 'file:///etc/passwd' is no http(s) URL (--url-column)"
    asked = server.asked
    assert asked["/status/404/a.jpg"] == 1 and asked["/status/500/b.jpg"] == 2  # 404 is final, 500 may pass
    assert all(f"error: {key}:" in err for key in failures)  # each named on stderr as well


def test_no_more_than_per_host_fetches_at_once_from_one_host(web):
    """Eight URLs whose answers wait until two requests are in flight together: with --per-host 2 and sixteen fetch
    threads, the server sees exactly two at once (more would break the limit; fewer would never open the gate)."""
    server = web["server"]
    server.gate_expected = len(NAMES)
    sources = list(_url_sources(web, [f"gate/{name}" for name in NAMES]))
    fetched = list(fetch_ahead(sources, FetchPolicy(per_host=2, threads=16, timeout_s=30)))
    assert [bytes(s.data) for s in fetched] == [(web["folder"] / n).read_bytes() for n in NAMES]  # in order
    assert server.peak == 2


def _url_sources(web, paths: list[str]):
    table = web["root"] / "gate.parquet"
    pq.write_table(pa.table({"url": [web["server"].url(p) for p in paths]}), table)
    return iter_sources([str(table)], "images", collection=Collection(column="url", column_holds_urls=True))


def test_a_url_column_and_a_column_together_are_one_usage_error(web):
    table = web["root"] / "gate.parquet"
    result = invoke("images", table, "--url-column", "url", "--column", "url", "-o", web["root"] / "x.safetensors")
    assert result.exit_code == 2
    assert result.stderr == "error: --url-column names the column of URLs: leave out --column\n"
