"""The installed command: embed with --pool mean, then `gemma-embed export --to npy`, in input order."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import torch
from helpers import EXE, ROOT, SAMPLE_MODEL

import gemma_embed


def test_real_command_exports_a_pooled_index_to_npy_in_input_order(tmp_path):
    out = tmp_path / "emb.safetensors"
    images = ROOT / "samples" / "media" / "images"
    made = subprocess.run(
        [EXE, "images", str(images), "--model", str(SAMPLE_MODEL), "-o", str(out), "--pool", "mean", "-q"],
        capture_output=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    proc = subprocess.run([EXE, "export", str(out), "--to", "npy"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["items"] == 7 and report["files"] == [str(tmp_path / "emb.npy"), str(tmp_path / "emb.keys.txt")]
    array = np.load(tmp_path / "emb.npy")
    loaded = gemma_embed.load(out)
    assert (tmp_path / "emb.keys.txt").read_text().splitlines() == list(loaded)
    np.testing.assert_array_equal(array, torch.cat(list(loaded.values())).numpy())
    again = subprocess.run([EXE, "export", str(out), "--to", "npy"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and again.stderr.startswith("error: ") and "--overwrite" in again.stderr
