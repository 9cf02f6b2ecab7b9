"""Several processes, one result: torchrun ranks (gloo on the CPU) and scheduler array slices."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import EXE, ROOT, SLOW_CLI, run_images, write_image
from warm_cli import environment_with_server

import gemma_embed
from gemma_embed import store

MODEL = ROOT / "samples" / "tiny-gemma4"
TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The environment torchrun starts with, one thread per rank as torchrun's own default for several ranks on a
    node (OMP_NUM_THREADS, read at import): the ranks (EXE, SLOW_CLI) fork from a server started in it
    (tests/warm_cli.py), which takes what torchrun gives each rank as read when the rank runs."""
    with environment_with_server(tmp_path_factory.mktemp("ranks"), {**os.environ, "OMP_NUM_THREADS": "1"}) as env:
        yield env


def _folder(tmp_path: Path, count: int = 9) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    sizes = [(64, 48), (48, 64), (100, 100), (300, 40)]
    for i in range(count):
        write_image(folder / f"img{i:02d}.png", *sizes[i % len(sizes)], seed=i)
    (folder / "broken.png").write_bytes(b"not a png")  # failures must not shift anything
    return folder


def _assert_same(merged: Path, single: Path) -> None:
    a, b = gemma_embed.load(merged), gemma_embed.load(single)
    assert list(a) == list(b)  # same keys, same (input) order
    for key in b:
        assert torch.equal(a[key], b[key]), key
    assert gemma_embed.read_metadata(merged)["items"] == gemma_embed.read_metadata(single)["items"]


def test_torchrun_two_ranks_equals_single_process(tmp_path, ranks):
    folder = _folder(tmp_path)
    single = tmp_path / "single.safetensors"
    assert run_images([folder], MODEL, single, max_soft_tokens=70)[0] == 1  # the broken file
    out = tmp_path / "ranks.safetensors"
    proc = subprocess.run(
        [
            TORCHRUN,
            "--standalone",  # a free port: other test runs on this machine may hold a fixed one
            "--nproc-per-node",
            "2",
            "--no-python",
            EXE,
            "images",
            str(folder),
            "--model",
            str(MODEL),
            "-o",
            str(out),
            "--max-soft-tokens",
            "70",
            "--device",
            "cpu",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=ranks,
    )
    assert proc.returncode != 0  # one rank saw the broken file: exit 1 there
    assert "broken.png" in proc.stderr or "broken.png" in proc.stdout
    assert (tmp_path / "ranks.index.json").exists()
    assert sorted(p.name for p in tmp_path.glob("ranks-rank*.safetensors")) == [
        "ranks-rank00000-of-00002.safetensors",
        "ranks-rank00001-of-00002.safetensors",
    ]
    _assert_same(out, single)


def test_torchrun_ranks_never_time_out_on_uneven_work(tmp_path, ranks):
    """One image, two ranks: rank 1 has no work at all and finishes at once; rank 0 is slowed (the real CLI whose
    encode waits until rank 1 has written its manifest, then sleeps twice a 2-second process-group timeout
    configured in both processes). A rank that waited on a torch.distributed group (the old gloo barrier) would time
    out and exit non-zero; the ranks must instead both exit 0, and the index must join both slices."""
    folder = tmp_path / "images"
    folder.mkdir()
    write_image(folder / "only.png", 64, 48, seed=0)
    single = tmp_path / "single.safetensors"
    assert run_images([folder], MODEL, single, max_soft_tokens=70)[0] == 0
    out = tmp_path / "uneven.safetensors"
    # fmt: off
    command = [
        TORCHRUN, "--standalone", "--nproc-per-node", "2", "--no-python", SLOW_CLI,
        "--encode", "4", "--encode-after", str(store.manifest_path(store.slice_path(out, 1, 2))),
        "images", str(folder), "--model", str(MODEL), "-o", str(out), "--max-soft-tokens", "70", "--device", "cpu",
    ]
    # fmt: on
    env = {**ranks, "SLOW_RANK": "0", "SHORT_PG_TIMEOUT_S": "2"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 1 of 2 done; waiting for the other ranks" in proc.stderr
    assert (tmp_path / "uneven.index.json").exists()
    assert gemma_embed.read_metadata(store.slice_path(out, 1, 2))["keys"] == []  # the rank without work
    _assert_same(out, single)


def test_array_slices_merge_when_the_last_one_finishes(tmp_path):
    folder = _folder(tmp_path)
    single = tmp_path / "single.safetensors"
    run_images([folder], MODEL, single, max_soft_tokens=70)
    out = tmp_path / "array.safetensors"
    code, records, err = run_images([folder], MODEL, out, max_soft_tokens=70, num_slices=3, slice_index=2)
    assert "the last slice to finish writes the index" in err
    assert not (tmp_path / "array.index.json").exists()
    for index in (0, 1):
        run_images([folder], MODEL, out, max_soft_tokens=70, num_slices=3, slice_index=index)
    assert (tmp_path / "array.index.json").exists()
    _assert_same(out, single)
