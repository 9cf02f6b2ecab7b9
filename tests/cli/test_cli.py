"""The command as a user runs it: the installed `gemma-embed`, pipes, exit codes, one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch
from helpers import EXE, ROOT, SAMPLE_MODEL, invoke, summary

import gemma_embed

SAMPLE_IMAGES = ROOT / "samples" / "media" / "images"


def test_installed_command_on_the_samples(tmp_path):
    out = tmp_path / "emb.safetensors"
    proc = subprocess.run(
        [EXE, "images", str(SAMPLE_IMAGES), "--model", str(SAMPLE_MODEL), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = summary(proc.stdout)
    n = len(list(SAMPLE_IMAGES.iterdir()))
    assert result["ok"] == n and result["failed"] == 0 and result["output"] == str(out)
    assert len(gemma_embed.load(out)) == n
    assert "\x1b[" not in proc.stderr  # no live progress bar when stderr is not a terminal


def test_installed_command_reads_paths_from_stdin_and_names_bad_files(tmp_path):
    bad = tmp_path / "not-an-image.jpg"
    bad.write_text("this is text, not a JPEG\n")
    good = sorted(SAMPLE_IMAGES.iterdir())[:2]
    listing = "\n".join(str(p) for p in [good[0], bad, good[1]]) + "\n"
    out = tmp_path / "emb.safetensors"
    proc = subprocess.run(
        [EXE, "images", "-", "--model", str(SAMPLE_MODEL), "-o", str(out), "--jsonl"],
        input=listing,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and str(bad) in error_lines[0]
    assert "Traceback" not in proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["status"] for r in records if r["type"] == "item"] == ["ok", "failed", "ok"]
    assert summary(proc.stdout)["failed"] == 1
    assert list(gemma_embed.load(out)) == [str(good[0]), str(good[1])]


def test_cli_pool_mean_inspect_and_plan(tmp_path):
    out = tmp_path / "mean.safetensors"
    result = invoke(
        "images",
        SAMPLE_IMAGES,
        "--model",
        SAMPLE_MODEL,
        "-o",
        out,
        "--pool",
        "mean",
        "-q",
        "--max-soft-tokens",
        "140",
        "--batch-size",
        "3",
    )
    assert result.exit_code == 0
    rows = gemma_embed.load(out)
    assert all(t.shape == (1, 32) and t.dtype == torch.float32 for t in rows.values())

    shown = invoke("inspect", out, "--json")
    meta = json.loads(shown.stdout)
    assert meta["pooling"] == "mean" and len(meta["keys"]) == len(rows)
    assert "landscape.jpg" in invoke("inspect", out).stdout

    planned = invoke("plan", SAMPLE_IMAGES, "--model", SAMPLE_MODEL, "--max-soft-tokens", "70", "-q")
    plan = json.loads(planned.stdout)
    assert plan["items"] == len(rows) and plan["device"] == "cpu"
    assert sum(b["units"] for b in plan["buckets"]) == len(rows)
    assert all(b["chunk"] >= 1 and b["cost_per_unit"] > 0 for b in plan["buckets"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-soft-tokens", "100"], "max-soft-tokens"),
        (["--batch-size", "zero"], "batch-size"),
        (["--dtype", "float64"], "dtype"),
    ],
)
def test_usage_errors_exit_2(tmp_path, args, message):
    result = invoke("images", SAMPLE_IMAGES, "--model", SAMPLE_MODEL, "-o", tmp_path / "x.safetensors", *args)
    assert result.exit_code == 2
    assert message in result.output


def test_refuses_to_overwrite_and_bad_model_exit_2(tmp_path):
    out = tmp_path / "x.safetensors"
    out.write_bytes(b"precious")
    result = invoke("images", SAMPLE_IMAGES, "--model", SAMPLE_MODEL, "-o", out)
    assert result.exit_code == 2 and "--overwrite" in result.output
    assert out.read_bytes() == b"precious"
    result = invoke("images", SAMPLE_IMAGES, "--model", tmp_path, "-o", tmp_path / "y.safetensors")
    assert result.exit_code == 2 and "config.json" in result.output


def test_on_error_stop_keeps_work_done(tmp_path):
    bad = tmp_path / "b-broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.png", "c.png"):
        shutil.copy(SAMPLE_IMAGES / "portrait.png", folder / name)
    shutil.move(bad, folder / bad.name)
    out = tmp_path / "o.safetensors"
    result = invoke("images", folder, "--model", SAMPLE_MODEL, "-o", out, "--on-error", "stop")
    assert result.exit_code == 1
    assert "b-broken.png" in result.output
    assert list(gemma_embed.load(out)) == ["a.png"]
