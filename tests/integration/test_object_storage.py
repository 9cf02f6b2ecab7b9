"""Inputs in object storage: moto's S3 server on 127.0.0.1 (a real S3 HTTP API), reached by s3fs through
AWS_ENDPOINT_URL, and URLs on Python's http.server. The same images as a local folder, as loose objects under a
prefix (walked as a folder), as tar shards in the bucket (brace and glob patterns), as a parquet table of their
bytes, as a JSON-lines table of their paths and as a parquet column of their (signed) http URLs give the same rows
bit for bit, in input order; shards are streamed and tables read by ranges, as the bytes
that crossed a counting proxy in front of the server show."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from collection_helpers import IMAGES, MODEL, OPTIONS, caption, image_files, write_shard
from helpers import run_images
from remote_helpers import SIGNATURE, CountingProxy, MediaServer, s3_server, s3fs_client

import gemma_embed
from gemma_embed.sources import Collection, iter_sources

NAMES = list(IMAGES)
BUCKET = "media"


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """The images in a local folder and, in the bucket: loose under photos/, in two shards under shards/, as a
    parquet table of their bytes and a JSON-lines table of their names under tables/; the folder's own output."""
    root = tmp_path_factory.mktemp("s3")
    folder = root / "images"
    images = image_files(folder)
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as endpoint, MediaServer(folder) as web:
        fs = s3fs_client()
        fs.mkdir(BUCKET)
        for name in NAMES:
            fs.pipe_file(f"{BUCKET}/photos/{name}", images[name])
        for shard, names in enumerate((NAMES[:5], NAMES[5:])):
            members = []
            for name in names:
                members += [(name, images[name]), (name.split(".")[0] + ".txt", caption(name).encode())]
            fs.put_file(str(write_shard(root / f"{shard:05d}.tar", members)), f"{BUCKET}/shards/{shard:05d}.tar")
        table = pa.table({"id": NAMES, "image": [images[n] for n in NAMES]})
        buffer = io.BytesIO()
        pq.write_table(table, buffer, row_group_size=3)
        fs.pipe_file(f"{BUCKET}/tables/images.parquet", buffer.getvalue())
        lines = "".join(json.dumps({"file": name}) + "\n" for name in NAMES)
        fs.pipe_file(f"{BUCKET}/photos/list.jsonl", lines.encode())
        # LAION-style: a table of signed URLs of the same images (the server ignores the query)
        urls = [web.url(f"{name}?X-Amz-Signature={SIGNATURE}&X-Amz-Expires=600") for name in NAMES]
        pq.write_table(pa.table({"url": urls, "caption": [caption(n) for n in NAMES]}), root / "urls.parquet")
        reference = root / "folder.safetensors"
        code, _, err = run_images([folder], MODEL, reference, **OPTIONS)
        assert code == 0, err
        port = web.server.server_address[1]
        yield {"root": root, "folder": folder, "reference": reference, "endpoint": endpoint, "port": port}


def rows_in_order(output) -> list[torch.Tensor]:
    return [rows for _, rows, _ in gemma_embed.iter_items(output)]


@pytest.mark.parametrize(
    "inputs, options",
    [
        ([f"s3://{BUCKET}/photos/"], {}),
        ([f"s3://{BUCKET}/shards/{{00000..00001}}.tar"], {}),
        ([f"s3://{BUCKET}/shards/*.tar"], {}),
        ([f"s3://{BUCKET}/tables/images.parquet"], {"column": "image", "key_column": "id"}),
        ([f"s3://{BUCKET}/photos/list.jsonl"], {"column": "file"}),
        (["ROOT/urls.parquet"], {"url_column": "url", "keep_columns": ("caption",)}),
    ],
    ids=["prefix", "brace-shards", "glob-shards", "parquet-bytes", "jsonl-paths", "url-column"],
)
def test_the_bucket_and_urls_give_the_local_folders_rows_bit_for_bit_in_input_order(bucket, inputs, options):
    out = bucket["root"] / "out.safetensors"
    inputs = [i.replace("ROOT", str(bucket["root"])) for i in inputs]
    code, records, err = run_images(inputs, MODEL, out, **OPTIONS, **options)
    assert code == 0, err
    reference = rows_in_order(bucket["reference"])
    ours = rows_in_order(out)
    assert len(ours) == len(NAMES) and all(torch.equal(a, b) for a, b in zip(ours, reference, strict=True))
    theirs = {key: item for key, _, item in gemma_embed.iter_items(bucket["reference"])}
    for name, (_, _, item) in zip(NAMES, gemma_embed.iter_items(out), strict=True):
        assert item["sha256"] == theirs[name]["sha256"]  # the content hash of the same bytes, wherever they were
        if "url_column" in options:  # recorded without the signed query string
            assert item["path"] == f"http://127.0.0.1:{bucket['port']}/{name}"
        else:
            assert item["path"].startswith(f"s3://{BUCKET}/")
    if inputs[0].endswith("photos/"):
        assert list(gemma_embed.load(out)) == NAMES  # keyed relative to the prefix, as a folder's files are
    if "shards" in inputs[0]:
        assert [item["caption"] for _, _, item in gemma_embed.iter_items(out)] == [caption(n) for n in NAMES]


def test_a_shard_is_streamed_member_by_member_never_downloaded_whole(bucket, tmp_path, monkeypatch):
    """A shard whose first member is 48 MiB the command does not decode: the first image is yielded, and the whole
    shard read, after a fraction of that crossed the network (its data is seeked over, never fetched)."""
    filler = b"\0" * (48 << 20)
    members = [("000000.bin", filler)] + [(n, (bucket["folder"] / n).read_bytes()) for n in NAMES[:3]]
    shard = write_shard(tmp_path / "big.tar", members)
    fs = s3fs_client()
    fs.put_file(str(shard), f"{BUCKET}/big/big.tar")
    with CountingProxy(bucket["endpoint"]) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        sources = iter_sources([f"s3://{BUCKET}/big/big.tar"], "images")
        first = next(sources)
        at_first = proxy.sent
        rest = list(sources)
    assert [(s.key, s.error) for s in [first, *rest]] == [(f"s3://{BUCKET}/big/big.tar:{n}", None) for n in NAMES[:3]]
    assert first.data == (bucket["folder"] / NAMES[0]).read_bytes()
    size = shard.stat().st_size
    assert at_first < size / 4 and proxy.sent < size / 4, (at_first, proxy.sent, size)
    assert any(r is not None for _, _, r in proxy.requests)  # ranged GETs


def test_a_parquet_table_is_read_by_ranges_only_the_columns_asked_for(bucket, tmp_path, monkeypatch):
    """A table with a 32 MiB column the run does not ask for: reading its `image` column fetches a fraction of the
    file (the footer, then that column's pages)."""
    images = [(bucket["folder"] / n).read_bytes() for n in NAMES]
    blobs = [bytes([i]) * (4 << 20) for i in range(len(NAMES))]
    buffer = io.BytesIO()
    pq.write_table(pa.table({"image": images, "blob": blobs}), buffer, compression="none")
    s3fs_client().pipe_file(f"{BUCKET}/wide/wide.parquet", buffer.getvalue())
    with CountingProxy(bucket["endpoint"]) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        rows = list(iter_sources([f"s3://{BUCKET}/wide/wide.parquet"], "images", collection=Collection(column="image")))
    assert [bytes(r.data) for r in rows] == images
    assert proxy.sent < len(buffer.getvalue()) / 4, (proxy.sent, len(buffer.getvalue()))
