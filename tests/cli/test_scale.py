"""Memory stays flat in the number of files: the window, not the input, bounds what is held."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import EXE, PEAK_RSS_WRAPPER, ROOT
from PIL import Image

MODEL = ROOT / "samples" / "tiny-gemma4"


@pytest.mark.slow
def test_peak_rss_flat_from_200_to_2000_images(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    files = []
    for i in range(2000):
        w, h = [(24, 16), (16, 24), (20, 20), (40, 10)][i % 4]
        files.append(folder / f"{i:05d}.png")
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(files[-1])
    peaks = {}
    for count in (200, 2000):
        listing = tmp_path / f"list-{count}.txt"
        listing.write_text("".join(f"{f}\n" for f in files[:count]))
        # A fixed chunk: the tuner may otherwise settle on bigger chunks in a longer run, which is a choice
        # within the memory budget, not growth with the number of files.
        args = [
            EXE,
            "images",
            "-",
            "--model",
            str(MODEL),
            "-o",
            str(tmp_path / f"{count}.safetensors"),
            "--max-soft-tokens",
            "70",
            "--flush-every",
            "100",
            "--batch-size",
            "16",
            "-q",
        ]
        proc = subprocess.run(
            [sys.executable, "-c", PEAK_RSS_WRAPPER, str(listing), *args], capture_output=True, text=True, timeout=600
        )
        result = json.loads(proc.stdout)
        assert result["code"] == 0, result["stderr"]
        assert json.loads(result["stdout"].splitlines()[-1])["ok"] == count
        peaks[count] = result["peak"]
    growth = peaks[2000] - peaks[200]
    print(f"peak RSS: 200 images {peaks[200] / 2**20:.0f} MiB, 2000 images {peaks[2000] / 2**20:.0f} MiB")
    # 10x the files may add the output rows themselves (2000 x 64 x 32 float32 = 16 MiB, a few copies at the end)
    # and little else.
    assert growth < 64 * 2**20, peaks
