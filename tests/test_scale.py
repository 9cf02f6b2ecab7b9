"""Memory stays flat in the number of files: the window, not the input, bounds what is held."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ROOT
from PIL import Image

MODEL = ROOT / "samples" / "tiny-gemma4"

CHILD = textwrap.dedent(r"""
    import io, json, re, sys
    from pathlib import Path
    from gemma_embed.config import RunConfig
    from gemma_embed.pipeline import run
    from gemma_embed.progress import Reporter
    folder, model, out, count = sys.argv[1:5]
    files = sorted(Path(folder).iterdir())[: int(count)]
    stdin = io.BytesIO("".join(f"{f}\n" for f in files).encode())
    config = RunConfig(modality="images", inputs=("-",), output=Path(out), model=model, device="cpu",
                       max_soft_tokens=70, flush_every=100, overwrite=True)
    stdout = io.StringIO()
    code = run(config, Reporter(quiet=True, stdout=stdout), stdin=stdin)
    peak = int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
    print(json.dumps({"code": code, "peak": peak, "summary": json.loads(stdout.getvalue().splitlines()[-1])}))
""")


@pytest.mark.slow
def test_peak_rss_flat_from_200_to_2000_images(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2000):
        w, h = [(24, 16), (16, 24), (20, 20), (40, 10)][i % 4]
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(folder / f"{i:05d}.png")
    peaks = {}
    for count in (200, 2000):
        proc = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(MODEL), str(tmp_path / f"{count}.st"),
                               str(count)], capture_output=True, text=True, cwd=ROOT, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["code"] == 0 and result["summary"]["ok"] == count
        peaks[count] = result["peak"]
    growth = peaks[2000] - peaks[200]
    print(f"peak RSS: 200 images {peaks[200] / 2**20:.0f} MiB, 2000 images {peaks[2000] / 2**20:.0f} MiB")
    # 10x the files may add the output rows themselves (2000 x 64 x 32 float32 = 16 MiB) and little else.
    assert growth < 48 * 2**20, peaks
