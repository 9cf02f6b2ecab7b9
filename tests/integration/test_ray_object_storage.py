"""`--ray` with its inputs in object storage (moto's S3 server on 127.0.0.1, a local Ray cluster started after the
environment points at it, as a cluster's nodes have their own credentials): the driver sends the decode tasks
locations, never bytes (whole objects by their URL, tar members by their byte range in the shard), the tasks read
them themselves, and the output equals the single-process run's item for item, bit for bit."""

from __future__ import annotations

import logging

import pytest
import ray
import torch
from collection_helpers import IMAGES, MODEL, caption, image_files, write_shard
from remote_helpers import s3_server, s3fs_client

import gemma_embed
from gemma_embed import RunConfig
from gemma_embed.ray_data import RayRunner
from gemma_embed.store import read_metadata

pytestmark = pytest.mark.slow

NAMES = list(IMAGES)


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    from gemma_embed.ray_data import _signal_handlers_kept

    root = tmp_path_factory.mktemp("ray-s3")
    folder = root / "images"
    images = image_files(folder)
    with pytest.MonkeyPatch.context() as patch, s3_server(patch):
        fs = s3fs_client()
        fs.mkdir("data")
        for name in NAMES[:4]:
            fs.pipe_file(f"data/loose/{name}", images[name])
        members = []
        for name in NAMES[4:]:
            members += [(name, images[name]), (name.split(".")[0] + ".txt", caption(name).encode())]
        fs.put_file(str(write_shard(root / "s.tar", members)), "data/shards/00000.tar")
        with _signal_handlers_kept():
            context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        try:
            yield {"root": root, "folder": folder, "address": context.address_info["gcs_address"]}
        finally:
            ray.shutdown()


INPUTS = ("s3://data/loose", "s3://data/shards/00000.tar")
OPTIONS = {"modality": "images", "inputs": INPUTS, "model": str(MODEL), "max_soft_tokens": 70, "overwrite": True}


def test_a_ray_run_on_inputs_in_the_bucket_equals_the_single_process_run(setting, monkeypatch):
    root = setting["root"]
    sent = []
    take = RayRunner.take

    def recording(self, sources):
        for source in take(self, sources):
            sent.append(source)
            yield source

    monkeypatch.setattr(RayRunner, "take", recording)
    ours = gemma_embed.run(RunConfig(output=root / "ray.safetensors", ray=setting["address"], **OPTIONS))
    reference = gemma_embed.run(RunConfig(output=root / "single.safetensors", **OPTIONS))
    assert ours.ok == reference.ok == len(NAMES) and ours.failed == 0
    # what the driver sent: locations and byte ranges, no item's bytes
    assert [s.data for s in sent] == [None] * len(NAMES)
    assert [s.path for s in sent] == [f"s3://data/loose/{n}" for n in NAMES[:4]] + [
        f"s3://{'data/shards/00000.tar'}"
    ] * 4
    assert [s.span is not None for s in sent] == [False] * 4 + [True] * 4

    mine, theirs = read_metadata(ours.output), read_metadata(reference.output)
    assert mine["keys"] == theirs["keys"] and mine["items"] == theirs["items"]  # captions and content hashes too
    rows, expected = gemma_embed.load(ours.output), gemma_embed.load(reference.output)
    assert all(torch.equal(rows[k], expected[k]) for k in expected)
    folder = gemma_embed.load(
        gemma_embed.run(
            RunConfig(output=root / "folder.safetensors", **{**OPTIONS, "inputs": (str(setting["folder"]),)})
        ).output
    )
    assert all(torch.equal(a, folder[n]) for a, n in zip(rows.values(), NAMES, strict=True))  # = the local files'
