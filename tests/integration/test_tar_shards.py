"""Tar shards in: webdataset's TarWriter and the `tar` program write them, gemma-embed streams them member by member;
the rows equal the extracted folder's bit for bit, captions join back, and broken shards are named, not fatal."""

from __future__ import annotations

import subprocess

import pytest
import torch
import webdataset
from collection_helpers import (
    IMAGES,
    MODEL,
    OPTIONS,
    assert_same_rows,
    caption,
    image_files,
    member_offsets,
    sidecar,
    write_shard,
)
from helpers import run_images

import gemma_embed
from gemma_embed.sources import iter_sources

NAMES = list(IMAGES)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> dict:
    """The images extracted to a folder, the same samples in two webdataset shards, in one shard made by `tar`,
    and the folder's own output."""
    root = tmp_path_factory.mktemp("tar")
    extracted = root / "extracted"
    images = image_files(extracted)
    shards = root / "shards"
    shards.mkdir()
    for shard, names in enumerate((NAMES[:4], NAMES[4:])):
        with webdataset.TarWriter(str(shards / f"{shard:05d}.tar")) as writer:
            for name in names:
                stem, ext = name.split(".")
                writer.write({"__key__": stem, ext: images[name], "txt": caption(name), "json": sidecar(name)})
    listed = sorted(p.name for p in extracted.iterdir())  # a sample's files together, as webdataset needs them
    subprocess.run(["tar", "-cf", str(root / "by-tar.tar"), *listed], cwd=extracted, check=True)
    reference = root / "folder.safetensors"
    code, _, err = run_images([extracted], MODEL, reference, **OPTIONS)
    assert code == 0, err
    return {"root": root, "extracted": extracted, "shards": shards, "reference": reference, "images": images}


def test_webdataset_and_tar_program_shards_embed_like_the_extracted_folder(dataset):
    shards, root = dataset["shards"], dataset["root"]
    pattern = f"{shards}/{{00000..00001}}.tar"  # as webdataset names a shard set
    out = root / "wds.safetensors"
    code, records, err = run_images([pattern], MODEL, out, **OPTIONS)
    assert code == 0, err
    key_of = {name: f"{shards}/{i // 4:05d}.tar:{name}" for i, name in enumerate(NAMES)}
    items = assert_same_rows(out, dataset["reference"], key_of)
    assert list(gemma_embed.load(out)) == [key_of[n] for n in NAMES]  # member order, shard by shard
    for name in NAMES:
        item = items[key_of[name]]
        assert item["caption"] == caption(name) and item["json"] == sidecar(name)
        assert item["member"] == name and item["path"] == key_of[name].rsplit(":", 1)[0]
    assert records[-1]["skipped"] == 0  # every .txt and .json was a sidecar

    made_by_tar = root / "tar.safetensors"
    code, _, err = run_images([root / "by-tar.tar"], MODEL, made_by_tar, **OPTIONS)
    assert code == 0, err
    items = assert_same_rows(made_by_tar, dataset["reference"], {n: f"{root / 'by-tar.tar'}:{n}" for n in NAMES})
    assert all(items[f"{root / 'by-tar.tar'}:{n}"]["caption"] == caption(n) for n in NAMES)


def test_a_folder_of_shards_is_walked_and_keyed_relative_to_it(dataset):
    sources = list(iter_sources([str(dataset["shards"])], "images"))
    assert [s.key for s in sources] == [f"{i // 4:05d}.tar:{name}" for i, name in enumerate(NAMES)]
    assert [s.position for s in sources] == list(range(len(NAMES)))
    assert all(bytes(s.data) == dataset["images"][s.meta["member"]] for s in sources)


def test_truncated_shard_names_its_lost_member_and_the_run_goes_on(dataset, tmp_path):
    images = dataset["images"]
    whole = write_shard(tmp_path / "00000.tar", [(n, images[n]) for n in NAMES[:3]])
    cut = write_shard(tmp_path / "00001.tar", [(n, images[n]) for n in NAMES[3:6]])
    _, data_at = member_offsets(cut)[NAMES[4]]
    cut.write_bytes(cut.read_bytes()[: data_at + 100])  # member 000004.png loses all but 100 bytes of its data
    after = write_shard(tmp_path / "00002.tar", [(n, images[n]) for n in NAMES[6:]])
    out = tmp_path / "out.safetensors"
    code, records, err = run_images([whole, cut, after], MODEL, out, **OPTIONS)
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {cut}:{NAMES[4]}: truncated shard: the member's data is cut after 100 of "
        f"{len(images[NAMES[4]])} bytes; nothing after it can be read"
    ]
    written = gemma_embed.load(out)
    expected = [f"{whole}:{n}" for n in NAMES[:3]] + [f"{cut}:{NAMES[3]}"] + [f"{after}:{n}" for n in NAMES[6:]]
    assert list(written) == expected
    reference = gemma_embed.load(dataset["reference"])
    assert all(torch.equal(written[key], reference[key.rsplit(":", 1)[1]]) for key in expected)


def test_resume_and_slices_over_shards_equal_one_run(dataset, tmp_path):
    pattern = f"{dataset['shards']}/{{00000..00001}}.tar"
    out = tmp_path / "out.safetensors"
    assert run_images([pattern], MODEL, out, **OPTIONS)[0] == 0
    code, records, err = run_images([pattern], MODEL, out, resume=True, overwrite=False, **OPTIONS)
    assert code == 0, err
    assert [r["status"] for r in records if r["type"] == "item"] == ["resumed"] * len(NAMES)
    assert records[-1]["resumed"] == len(NAMES) and records[-1]["rows"] == 0

    sliced = tmp_path / "sliced.safetensors"
    for index in (1, 0):
        code, _, err = run_images([pattern], MODEL, sliced, num_slices=2, slice_index=index, **OPTIONS)
        assert code == 0, err
    one, merged = gemma_embed.load(out), gemma_embed.load(sliced)
    assert list(merged) == list(one)
    assert all(torch.equal(merged[key], one[key]) for key in one)
    assert gemma_embed.read_metadata(sliced)["items"] == gemma_embed.read_metadata(out)["items"]
