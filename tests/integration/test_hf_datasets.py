"""Hugging Face datasets in (the optional extra): a dataset saved with `save_to_disk`, with an `Image` feature,
embeds to the same rows as the files, without a network call; without the extra, one line says how to get it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from collection_helpers import IMAGES, MODEL, OPTIONS, assert_same_rows, caption, image_files
from helpers import ROOT, run_images
from typer.testing import CliRunner

import gemma_embed
from gemma_embed.cli import app
from gemma_embed.errors import UsageError
from gemma_embed.sources import Collection, iter_sources

NAMES = list(IMAGES)
IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # how datasets stores an Image cell


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """One dataset of images given as bytes, a DatasetDict of two splits of images given as paths (save_to_disk
    embeds their bytes), and a folder of data files (parquet) whose image structs hold only paths."""
    root = tmp_path_factory.mktemp("hf")
    folder = root / "files"
    images = image_files(folder)
    features = datasets.Features(
        {"image": datasets.Image(), "id": datasets.Value("string"), "text": datasets.Value("string")}
    )
    rows = {
        "image": [{"bytes": images[n], "path": n} for n in NAMES],
        "id": [n.split(".")[0] for n in NAMES],
        "text": [caption(n) for n in NAMES],
    }
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(root / "one"))
    by_path = datasets.Dataset.from_dict(
        {"image": [str(folder / n) for n in NAMES], "id": rows["id"], "text": rows["text"]}, features=features
    )
    datasets.DatasetDict({"train": by_path.select(range(2)), "test": by_path}).save_to_disk(str(root / "splits"))
    (root / "data-files" / "data").mkdir(parents=True)
    structs = pa.array([{"bytes": None, "path": str(folder / n)} for n in NAMES], IMAGE_STRUCT)
    pq.write_table(pa.table({"image": structs, "id": rows["id"]}), root / "data-files" / "data" / "train.parquet")
    reference = root / "files.safetensors"
    code, _, err = run_images([folder], MODEL, reference, **OPTIONS)
    assert code == 0, err
    return {"root": root, "reference": reference}


def _no_network(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise OSError("test: no network call may be made for a local dataset")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_saved_dataset_with_an_image_feature_embeds_like_the_files(saved, monkeypatch):
    _no_network(monkeypatch)
    one = str(saved["root"] / "one")
    out = saved["root"] / "one.safetensors"
    code, _, err = run_images([], MODEL, out, dataset=one, column="image", keep_columns="id,text", **OPTIONS)
    assert code == 0, err
    key_of = {name: f"{one}:{row}" for row, name in enumerate(NAMES)}
    items = assert_same_rows(out, saved["reference"], key_of)
    assert list(gemma_embed.load(out)) == [key_of[n] for n in NAMES]
    for row, name in enumerate(NAMES):
        item = items[key_of[name]]
        assert (item["row"], item["name"], item["id"], item["text"]) == (row, name, name.split(".")[0], caption(name))
        assert item["path"] == one


def test_a_split_of_a_saved_dataset_dict_with_path_cells(saved, monkeypatch):
    _no_network(monkeypatch)
    splits = str(saved["root"] / "splits")
    out = saved["root"] / "test.safetensors"
    code, _, err = run_images([], MODEL, out, dataset=splits, split="test", column="image", key_column="id", **OPTIONS)
    assert code == 0, err
    items = assert_same_rows(out, saved["reference"], {n: n.split(".")[0] for n in NAMES})
    assert all(items[n.split(".")[0]]["path"] == splits and items[n.split(".")[0]]["name"] == n for n in NAMES)
    with pytest.raises(UsageError, match=r"no split 'validation' \(its splits: train, test\)"):
        run_images([], MODEL, out, dataset=splits, split="validation", column="image")
    with pytest.raises(UsageError, match="no column 'picture'"):
        run_images([], MODEL, out, dataset=splits, column="picture")


def test_a_folder_of_data_files_is_streamed_offline_and_path_cells_name_files(saved, monkeypatch):
    _no_network(monkeypatch)
    folder = str(saved["root"] / "data-files")
    out = saved["root"] / "data-files.safetensors"
    # The cells name files beside the dataset's folder, not in it: refused by key unless outside paths are allowed.
    refused = list(iter_sources([], "images", collection=Collection("image", dataset=folder)))
    assert [s.error.split(", outside ")[-1] for s in refused] == [
        f"{Path(folder).resolve()}: not opened (--allow-outside-paths opens paths outside the table's folder)"
    ] * len(NAMES)
    code, _, err = run_images([], MODEL, out, dataset=folder, column="image", allow_outside_paths=True, **OPTIONS)
    assert code == 0, err
    key_of = {name: f"{folder}:train:{row}" for row, name in enumerate(NAMES)}
    items = assert_same_rows(out, saved["reference"], key_of)
    # Cells that hold only a path are whole files: their facts are the files' own.
    assert all(
        items[key_of[n]]["path"] == str(saved["root"] / "files" / n) and "mtime" in items[key_of[n]] for n in NAMES
    )


def _cli(*args, prelude: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    """The console script's main, after `prelude` (to make an import fail in that process only)."""
    code = f"{prelude}\nimport sys\nfrom gemma_embed.cli import main\nsys.argv = ['gemma-embed', *sys.argv[1:]]\nmain()"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


def test_without_the_extra_dataset_is_one_line_and_exit_2(saved, tmp_path):
    proc = _cli(
        "images",
        "--dataset",
        saved["root"] / "one",
        "--column",
        "image",
        "--model",
        MODEL,
        "-o",
        tmp_path / "o.safetensors",
        prelude="import sys; sys.modules['datasets'] = None  # import datasets raises ImportError",
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: --dataset needs the datasets package: pip install 'gemma-embed[datasets]'"
    ]
    assert not (tmp_path / "o.safetensors").exists()


def test_a_hub_dataset_that_cannot_be_reached_is_one_line(tmp_path):
    proc = _cli(
        "images",
        "--dataset",
        "someone/not-in-the-cache",
        "--column",
        "image",
        "--model",
        MODEL,
        "-o",
        tmp_path / "o.safetensors",
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: --dataset someone/not-in-the-cache: not in the local cache and HF_HUB_OFFLINE is set; download it "
        "where there is a network (load_dataset) and run with HF_HUB_OFFLINE=1, or pass a saved dataset's folder"
    ]
    with pytest.raises(UsageError, match=r"^--dataset ./nope: no such folder \(and not a hub id\)$"):
        run_images([], MODEL, tmp_path / "o.safetensors", dataset="./nope", column="image")


def test_no_paths_and_no_dataset_is_a_usage_error():
    result = CliRunner().invoke(app, ["images"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: give PATH... (files, folders, tar shards, parquet files, - for a list on stdin) or --dataset NAME"
    ]
