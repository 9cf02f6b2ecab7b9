"""`--ray` with its inputs in object storage (moto's S3 server on 127.0.0.1, a local Ray cluster started after the
environment points at it, as a cluster's nodes have their own credentials): the driver sends locations, never
bytes (loose objects by their URL; a tar shard, each row group of a parquet file and a JSON-lines file as a unit
whose items a find task reads itself), and the output equals the single-process run's item for item, bit for bit,
with the same failures in the same order, and the same rows as the run on the same files on disk.

Two counting proxies stand in front of the server: the cluster's processes reach it through one (their environment
when the cluster started), this process (the driver) through the other, so what each side fetched is measured
outside it."""

from __future__ import annotations

import io
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from collection_helpers import IMAGES, MODEL, caption, image_files, write_shard
from helpers import ROOT, start_ray
from remote_helpers import CountingProxy, s3_server, s3fs_client

import gemma_embed
from gemma_embed import RunConfig
from gemma_embed.errors import UsageError
from gemma_embed.ray_data import RayRunner
from gemma_embed.store import read_metadata

pytestmark = pytest.mark.slow

NAMES = list(IMAGES)
TEXT_MODEL = ROOT / "samples" / "tiny-embeddinggemma"
# The image table: a row group of 3 rows each (3 units), a key repeated across groups, a null cell.
IDS = ["p0", "p1", "p2", "p1", "p4", "p5", "p6"]
TEXTS = {
    "a.jsonl": [{"id": 1, "text": "a photo of a cat"}, {"id": 2, "text": "a tall building at night"}, "not json"],
    "b.jsonl": [{"id": 2, "text": "the sound of rain"}, {"id": 3, "text": "  "}, {"id": 4, "text": "a dog on a beach"}],
}


def _table(images: dict[str, bytes]) -> bytes:
    cells = [images[name] for name in NAMES[:7]]
    cells[5] = None
    table = pa.table({"image": pa.array(cells, pa.binary()), "id": IDS, "score": [float(i) for i in range(7)]})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=3)
    return sink.getvalue()


def _jsonl(records: list) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """The bucket (and the same files on disk), the cluster reaching the server through one proxy, this process
    through the other."""
    root = tmp_path_factory.mktemp("ray-s3")
    local = root / "local"
    images = image_files(root / "images")
    members = []
    for name in NAMES[4:]:
        members += [(name, images[name]), (name.split(".")[0] + ".txt", caption(name).encode())]
    members.append(("000007.cls", b"3"))  # no image: passed over, counted
    files = {f"loose/{name}": images[name] for name in NAMES[:4]}
    files["shards/00000.tar"] = write_shard(root / "s.tar", members).read_bytes()
    files["empty/00000.tar"] = write_shard(root / "e.tar", [("a.cls", b"1"), ("b.cls", b"2")]).read_bytes()
    files["tables/images.parquet"] = _table(images)
    files.update({f"texts/{name}": _jsonl(records) for name, records in TEXTS.items()})
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as endpoint:
        fs = s3fs_client()
        fs.mkdir("data")
        for name, data in files.items():
            fs.pipe_file(f"data/{name}", data)
            (local / name).parent.mkdir(parents=True, exist_ok=True)
            (local / name).write_bytes(data)
        with CountingProxy(endpoint) as cluster_side, CountingProxy(endpoint) as driver_side:
            patch.setenv("AWS_ENDPOINT_URL", cluster_side.endpoint)  # what the cluster's processes start with
            context = start_ray()
            patch.setenv("AWS_ENDPOINT_URL", driver_side.endpoint)  # this process: the driver (and the references)
            try:
                yield {
                    "root": root,
                    "local": local,
                    "files": files,
                    "images": images,
                    "address": context.address_info["gcs_address"],
                    "cluster_side": cluster_side,
                    "driver_side": driver_side,
                }
            finally:
                ray.shutdown()


def _ray_run(setting, monkeypatch, options: dict, name: str = "ray"):
    """The Ray run of `options`, with what the driver sent to the object store and what each side fetched."""
    sent = []
    blocks = RayRunner._blocks

    def recording(self, sources):
        def kept():
            for source in sources:
                sent.append(source)
                yield source

        return blocks(self, kept())

    monkeypatch.setattr(RayRunner, "_blocks", recording)
    setting["cluster_side"].reset()
    setting["driver_side"].reset()
    output = setting["root"] / f"{name}.safetensors"
    result = gemma_embed.run(RunConfig(output=output, ray=setting["address"], **options))
    monkeypatch.setattr(RayRunner, "_blocks", blocks)
    fetched = {
        side: {"requests": list(setting[side].requests), "by_path": dict(setting[side].by_path)}
        for side in ("driver_side", "cluster_side")
    }
    return result, sent, fetched


def _same(ours, reference) -> None:
    """The same items, in the same order, with the same metadata, rows bit for bit, and the same failures."""
    assert ours.failures == reference.failures
    mine, theirs = read_metadata(ours.output), read_metadata(reference.output)
    assert mine["keys"] == theirs["keys"] and mine["items"] == theirs["items"]
    rows, expected = gemma_embed.load(ours.output), gemma_embed.load(reference.output)
    for key, tensor in expected.items():
        assert rows[key].view(torch.int32).equal(tensor.view(torch.int32)), key


def _same_rows_as_on_disk(ours, on_disk, prefix: str, local_prefix: str) -> None:
    rows, expected = gemma_embed.load(ours.output), gemma_embed.load(on_disk.output)
    assert list(rows) == [key.replace(local_prefix, prefix) for key in expected]
    for key, tensor in expected.items():
        assert rows[key.replace(local_prefix, prefix)].view(torch.int32).equal(tensor.view(torch.int32)), key


def _driver_read_no_item(fetched: dict, files: dict[str, bytes], read: dict[str, int]) -> None:
    """Of each object holding items (`read`: name -> the bytes of its items), the driver fetched nothing but a
    parquet file's footer (its object facts and the listings hold no item), and the cluster's side fetched at least
    the items' bytes."""
    driver, cluster = fetched["driver_side"], fetched["cluster_side"]
    for method, path, ranged in driver["requests"]:
        name = path.split("?")[0].removeprefix("/data/")
        if method != "GET" or name not in files:
            continue  # a listing (GET /data?list-type=2...), a HEAD
        assert name.endswith(".parquet"), (method, path, ranged)
        assert ranged is not None and int(ranged.split("=")[1].split("-")[0]) >= _footer(files[name]), ranged
    for name, item_bytes in read.items():
        assert cluster["by_path"].get(f"/data/{name}", 0) >= item_bytes, name


def _footer(data: bytes) -> int:
    """Where a parquet file's footer begins."""
    return len(data) - 8 - int.from_bytes(data[-8:-4], "little")


@pytest.fixture(scope="module")
def image_runs(setting):
    inputs = ("s3://data/loose", "s3://data/shards/00000.tar", "s3://data/tables/images.parquet")
    options = {
        "modality": "images",
        "model": str(MODEL),
        "max_soft_tokens": 70,
        "overwrite": True,
        "column": "image",
        "key_column": "id",
        "keep_columns": ("score",),
    }
    with pytest.MonkeyPatch.context() as patch:
        ours, sent, fetched = _ray_run(setting, patch, {**options, "inputs": inputs})
    reference = gemma_embed.run(RunConfig(output=setting["root"] / "single.safetensors", inputs=inputs, **options))
    local = setting["local"]
    on_disk = gemma_embed.run(
        RunConfig(
            output=setting["root"] / "disk.safetensors",
            inputs=(str(local / "loose"), str(local / "shards" / "00000.tar"), str(local / "tables/images.parquet")),
            **options,
        )
    )
    return ours, sent, fetched, reference, on_disk


def test_images_from_loose_objects_a_shard_and_a_table_equal_the_single_process_run(setting, image_runs):
    ours, _, _, reference, on_disk = image_runs
    assert ours.ok == reference.ok == 4 + 4 + 5 and ours.failed == reference.failed == 2
    assert ours.skipped == reference.skipped == 1  # the shard's .cls member, counted where the shard was read
    assert [(f["key"], f["error"]) for f in ours.failures] == [
        ("s3://data/tables/images.parquet:3", "bad-key"),  # p1 again, in the next row group (another unit)
        ("p5", "missing"),  # its cell is null
    ]
    _same(ours, reference)
    _same_rows_as_on_disk(ours, on_disk, "s3://data/", f"{setting['local']}/")


def test_the_driver_sends_locations_and_units_and_reads_no_item_bytes(setting, image_runs):
    _, sent, fetched, _, _ = image_runs
    assert all(s.data is None for s in sent)
    assert [(s.path, type(s.unit).__name__) for s in sent] == [
        *((f"s3://data/loose/{name}", "NoneType") for name in NAMES[:4]),
        ("s3://data/shards/00000.tar", "Shard"),
        *(("s3://data/tables/images.parquet", "RowGroup") for _ in range(3)),
    ]
    files = setting["files"]
    read = {name: len(data) for name, data in files.items() if name.startswith(("loose/", "shards/"))}
    read["tables/images.parquet"] = sum(len(setting["images"][n]) for i, n in enumerate(NAMES[:7]) if i != 5)
    _driver_read_no_item(fetched, files, read)


def test_shards_without_an_item_are_no_input_as_in_the_single_process_run(setting, monkeypatch):
    """Every member passed over where the shard is read: the same one-line usage error, naming what was passed
    over, and no output."""
    options = {"modality": "images", "model": str(MODEL), "overwrite": True, "inputs": ("s3://data/empty",)}
    with pytest.raises(UsageError) as single:
        gemma_embed.run(RunConfig(output=setting["root"] / "empty.safetensors", **options))
    with pytest.raises(UsageError) as ours:
        _ray_run(setting, monkeypatch, options, "ray-empty")
    assert str(ours.value) == str(single.value) and ".cls x2" in str(single.value)
    assert not (setting["root"] / "ray-empty.safetensors").exists()


def test_a_text_table_from_the_bucket_equals_the_single_process_run(setting, monkeypatch):
    """JSON-lines files walked under a prefix (`gemma-embed text s3://data/texts/ --column text --key-column id`):
    a record that is no JSON, a blank text and a key repeated in the next file fail as in the single process."""
    options = {"modality": "text", "model": str(TEXT_MODEL), "overwrite": True, "column": "text", "key_column": "id"}
    inputs = ("s3://data/texts",)
    ours, sent, fetched = _ray_run(setting, monkeypatch, {**options, "inputs": inputs}, "ray-text")
    reference = gemma_embed.run(RunConfig(output=setting["root"] / "text.safetensors", inputs=inputs, **options))
    on_disk = gemma_embed.run(
        RunConfig(
            output=setting["root"] / "text-disk.safetensors", inputs=(str(setting["local"] / "texts"),), **options
        )
    )
    assert ours.ok == reference.ok == 3
    assert [(f["key"], f["error"]) for f in ours.failures] == [
        ("a.jsonl:2", "undecodable"),  # not JSON
        ("b.jsonl:0", "bad-key"),  # id 2 again, in the next file (another unit)
    ]
    assert ours.passed_over == reference.passed_over == {"blank": 1}  # the blank text
    assert ours.named == reference.named
    _same(ours, reference)
    _same_rows_as_on_disk(ours, on_disk, "s3://data/", f"{setting['local']}/")
    assert [(s.path, type(s.unit).__name__) for s in sent] == [
        ("s3://data/texts/a.jsonl", "JsonLines"),
        ("s3://data/texts/b.jsonl", "JsonLines"),
    ]
    _driver_read_no_item(fetched, setting["files"], {f"texts/{n}": len(setting["files"][f"texts/{n}"]) for n in TEXTS})


def test_a_text_file_is_read_where_its_lines_are_embedded(setting, monkeypatch, tmp_path):
    """Lines of a text file (here on disk: the cluster is on this machine) go as one unit, their blank run counted
    as its lines, as in the single process."""
    texts = tmp_path / "lines.txt"
    texts.write_text("a photo of a cat\n\n\n\na tall building at night\n")
    options = {"modality": "text", "model": str(TEXT_MODEL), "overwrite": True, "inputs": (str(texts),)}
    ours, sent, _ = _ray_run(setting, monkeypatch, options)
    reference = gemma_embed.run(RunConfig(output=tmp_path / "single.safetensors", **options))
    assert [type(s.unit).__name__ for s in sent] == ["TextFile"]
    assert ours.ok == reference.ok == 2 and ours.passed_over == reference.passed_over == {"blank": 3}
    _same(ours, reference)
    shutil.rmtree(tmp_path, ignore_errors=True)
