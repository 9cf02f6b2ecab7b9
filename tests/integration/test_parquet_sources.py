"""Parquet in: a file pyarrow writes (an image-bytes column, two row groups) embeds to the same rows as the files;
keys, kept columns, path columns, and rows that cannot be items, each named."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from collection_helpers import IMAGES, MODEL, OPTIONS, assert_same_rows, caption, image_files
from helpers import EXE, ROOT, run_images

import gemma_embed
from gemma_embed.errors import UsageError
from gemma_embed.sources import Collection, count_sources, iter_sources
from gemma_embed.sources.table import RESERVED

NAMES = list(IMAGES)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("parquet")
    folder = root / "files"
    images = image_files(folder)
    table = pa.table(
        {
            "image": pa.array([images[n] for n in NAMES], pa.binary()),
            "file": [f"files/{n}" for n in NAMES],  # relative to the parquet file's folder
            "id": [f"id-{n.split('.')[0]}" for n in NAMES],
            "label": list(range(len(NAMES))),
            "score": [0.5, float("nan"), 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            "caption": [caption(n) for n in NAMES],
        }
    )
    path = root / "images.parquet"
    pq.write_table(table, path, row_group_size=4)
    assert pq.ParquetFile(path).num_row_groups == 2
    reference = root / "files.safetensors"
    code, _, err = run_images([folder], MODEL, reference, **OPTIONS)
    assert code == 0, err
    return {"root": root, "parquet": path, "reference": reference, "images": images}


def test_bytes_column_in_two_row_groups_embeds_like_the_files(dataset):
    out = dataset["root"] / "bytes.safetensors"
    parquet = dataset["parquet"]
    code, _, err = run_images([parquet], MODEL, out, column="image", keep_columns="id,label,score,caption", **OPTIONS)
    assert code == 0, err
    key_of = {name: f"{parquet}:{row}" for row, name in enumerate(NAMES)}
    items = assert_same_rows(out, dataset["reference"], key_of)
    assert list(gemma_embed.load(out)) == [key_of[n] for n in NAMES]
    for row, name in enumerate(NAMES):
        item = items[key_of[name]]
        assert (item["row"], item["id"], item["label"], item["caption"]) == (
            row,
            f"id-{name.split('.')[0]}",
            row,
            caption(name),
        )
        assert item["path"] == str(parquet) and "mtime" not in item
    assert items[key_of[NAMES[1]]]["score"] is None  # NaN is no JSON number
    # Every field the tool wrote itself is one a kept column may not have: nothing is overwritten.
    own = {field for item in items.values() for field in item} - {"id", "label", "score", "caption"}
    assert own <= RESERVED, own - RESERVED


def test_key_column_and_path_column(dataset):
    out = dataset["root"] / "paths.safetensors"
    code, _, err = run_images([dataset["parquet"]], MODEL, out, column="file", key_column="id", **OPTIONS)
    assert code == 0, err
    items = assert_same_rows(out, dataset["reference"], {n: f"id-{n.split('.')[0]}" for n in NAMES})
    # A path column names whole files: their facts are the files' own, as when they are given as paths.
    for name in NAMES:
        item = items[f"id-{name.split('.')[0]}"]
        assert item["path"] == str(dataset["root"] / "files" / name) and "mtime" in item


def test_resume_over_a_parquet_file_reuses_every_row(dataset, tmp_path):
    out = tmp_path / "out.safetensors"
    options = {"column": "image", **OPTIONS}
    assert run_images([dataset["parquet"]], MODEL, out, **options)[0] == 0
    code, records, err = run_images([dataset["parquet"]], MODEL, out, resume=True, overwrite=False, **options)
    assert code == 0, err
    assert records[-1]["resumed"] == len(NAMES) and records[-1]["rows"] == 0


def test_rows_that_cannot_be_items_are_named(tmp_path):
    png = (ROOT / "samples" / "media" / "images" / "pixel.png").read_bytes()
    path = tmp_path / "t.parquet"
    table = pa.table(
        {
            "image": pa.array([png, None, b"not an image", png], pa.binary()),
            "key": ["a", "b", "c", "a"],
        }
    )
    pq.write_table(table, path)
    found = [(s.key, s.error) for s in iter_sources([str(path)], "images", collection=Collection("image", "key"))]
    # Keyed by --key-column values, a row's line says where it is; a repeated key fails keyed by FILE:ROW.
    assert found == [
        ("a", None),
        ("b", f"row 1 of {path} has no media (column 'image' is empty)"),
        ("c", None),  # fails when decoded, like a broken file
        (f"{path}:3", "row 3 repeats the key 'a' of an earlier row (--key-column values must be unique)"),
    ]
    out = tmp_path / "out.safetensors"
    code, _, err = run_images([path], MODEL, out, column="image", **OPTIONS)
    assert code == 1
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: {path}:1: row 1 has no media (column 'image' is empty)",
        f"error: {path}:2: not a recognised image format",
    ]
    assert list(gemma_embed.load(out)) == [f"{path}:0", f"{path}:3"]


def test_wrong_columns_are_usage_errors_before_the_model_loads(dataset, tmp_path):
    parquet = dataset["parquet"]
    with pytest.raises(UsageError, match=r"give --column NAME, the column of media or file paths \(its columns: image"):
        run_images([parquet], tmp_path / "no-model", tmp_path / "o.safetensors")
    with pytest.raises(UsageError, match="no column 'nope'"):
        run_images([parquet], tmp_path / "no-model", tmp_path / "o.safetensors", column="nope")
    with pytest.raises(UsageError, match="column 'label' holds int64: --column needs bytes"):
        run_images([parquet], tmp_path / "no-model", tmp_path / "o.safetensors", column="label")
    with pytest.raises(ValueError, match="width: the tool writes this field itself"):
        run_images([parquet], MODEL, tmp_path / "o.safetensors", column="image", keep_columns="id,width")
    # The command line says the same in one line, exit 2.
    proc = subprocess.run(
        [EXE, "images", str(parquet), "--column", "image", "--keep-columns", "path"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "path: the tool writes this field itself" in proc.stderr


def test_count_matches_and_walks_take_parquet_files_only_with_a_column(dataset):
    root = dataset["root"]
    collection = Collection("image")
    assert count_sources([str(dataset["parquet"])], "images", collection=collection) == len(NAMES)
    walked = [s.key for s in iter_sources([str(root)], "images", collection=collection)]
    # A folder's own files come before its subfolders'.
    assert walked == [f"images.parquet:{row}" for row in range(len(NAMES))] + [f"files/{n}" for n in NAMES]
    assert [s.key for s in iter_sources([str(root)], "images")] == [f"files/{n}" for n in NAMES]


@pytest.mark.slow
def test_peak_rss_is_flat_from_1_to_10_row_groups(tmp_path):
    """The same row group (4 incompressible 1 MB images) once and ten times: reading row group by row group, a
    record batch at a time, the peak RSS of the command must not grow with the file (reading it whole adds about
    40 MB, twice that as Python bytes; measured with 8 images a row group: +218 MiB whole, +2 MiB as done)."""
    import numpy as np
    from helpers import PEAK_RSS_WRAPPER
    from PIL import Image

    rng = np.random.default_rng(0)
    blobs = []
    for _ in range(4):
        image = Image.fromarray(rng.integers(0, 255, (600, 600, 3), dtype=np.uint8))
        path = tmp_path / "x.png"
        image.save(path)
        blobs.append(path.read_bytes())
    peaks = {}
    for groups in (1, 10):
        parquet = tmp_path / f"{groups}.parquet"
        column = pa.array(blobs * groups, pa.binary())
        pq.write_table(pa.table({"image": column}), parquet, row_group_size=len(blobs), compression="none")
        assert pq.ParquetFile(parquet).num_row_groups == groups
        # fmt: off
        args = [
            EXE, "images", str(parquet), "--column", "image", "--model", str(MODEL), "-o",
            str(tmp_path / f"{groups}.safetensors"), "--max-soft-tokens", "70", "--batch-size", "4",
            "--flush-every", "4", "-q",
        ]
        # fmt: on
        listing = tmp_path / "empty.txt"
        listing.write_text("")
        proc = subprocess.run(
            [sys.executable, "-c", PEAK_RSS_WRAPPER, str(listing), *args], capture_output=True, text=True, timeout=600
        )
        result = __import__("json").loads(proc.stdout)
        assert result["code"] == 0, result["stderr"]
        peaks[groups] = result["peak"]
    growth = peaks[10] - peaks[1]
    print(f"peak RSS: 1 row group {peaks[1] / 2**20:.0f} MiB, 10 row groups {peaks[10] / 2**20:.0f} MiB")
    assert growth < 24 * 2**20, peaks


def test_audio_bytes_without_names_embed_like_the_files(tmp_path):
    """A bare bytes column carries no file names: each clip still reaches the decoder the file would (soundfile for
    wav/flac/ogg by their headers, PyAV for mp3 and m4a), so the rows are the files' own."""
    clips = sorted((ROOT / "samples" / "media" / "audio").iterdir())
    path = tmp_path / "audio.parquet"
    pq.write_table(pa.table({"audio": pa.array([c.read_bytes() for c in clips], pa.binary())}), path)
    reference = tmp_path / "files.safetensors"
    code, _, err = run_images(clips, MODEL, reference, modality="audio")
    assert code == 0, err
    out = tmp_path / "table.safetensors"
    code, _, err = run_images([path], MODEL, out, modality="audio", column="audio")
    assert code == 0, err
    ours, theirs = gemma_embed.load(out), gemma_embed.load(reference)
    items = {key: item for key, _, item in gemma_embed.iter_items(reference)}
    for row, clip in enumerate(clips):
        assert torch.equal(ours[f"{path}:{row}"], theirs[str(clip)]), clip.name
    decoders = [item["decoder"] for _, _, item in gemma_embed.iter_items(out)]
    assert decoders == [items[str(c)]["decoder"] for c in clips] and {"soundfile", "pyav"} <= set(decoders)
