"""Memory stays flat in the number of files: the window, not the input, bounds what is held."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from helpers import EXE, ROOT
from PIL import Image
from warm_cli import REPORT_VARIABLE, peak_rss, reported_pid

MODEL = ROOT / "samples" / "tiny-gemma4"


@pytest.mark.slow
def test_peak_rss_flat_from_100_to_1000_images(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    files = []
    for i in range(1000):
        w, h = [(24, 16), (16, 24), (20, 20), (40, 10)][i % 4]
        files.append(folder / f"{i:05d}.png")
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(files[-1])
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{f}\n" for f in files))
    # One run of 1000: its peak RSS (the kernel's VmHWM) when the 100th item's record streams out (records leave
    # after each chunk) and when the 1000th does: the same counter, read the same way. A fixed chunk: the tuner
    # may otherwise settle on bigger chunks in a longer run, which is a choice within the memory budget, not
    # growth with the number of files. The whole run's ru_maxrss (the final write included) is printed: once, under
    # two parallel test workers, it read 1964 MiB against 999 at item 100 while VmHWM was not read at the end;
    # alone and beside two busy processes it stayed within 20 MiB of it.
    # The command's process (forked from the warm server, or started anew) reports its PID before it reads a path,
    # and its own VmHWM as it ends when it was forked (tests/warm_cli.py); the peak of a real start is its
    # ru_maxrss.
    # fmt: off
    args = [
        EXE, "images", "-", "--model", str(MODEL), "-o", str(tmp_path / "out.safetensors"),
        "--max-soft-tokens", "70", "--flush-every", "50", "--batch-size", "16", "--jsonl",
    ]
    # fmt: on
    stderr, report = tmp_path / "stderr.txt", tmp_path / "report.json"
    env = {**os.environ, REPORT_VARIABLE: str(report)}
    with open(listing, "rb") as stdin, open(stderr, "wb") as err:
        proc = subprocess.Popen(args, stdin=stdin, stdout=subprocess.PIPE, stderr=err, env=env)
    peaks, items, summary = {}, 0, None
    for line in proc.stdout:
        record = json.loads(line)
        if record["type"] == "item":
            items += 1
            if items in (100, 1000):
                peaks[items] = peak_rss(reported_pid(report))
        else:
            summary = record
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, stderr.read_text()[-2000:]
    assert summary["ok"] == items == 1000
    growth = peaks[1000] - peaks[100]
    whole = json.loads(report.read_text()).get("peak") or usage.ru_maxrss * 1024  # its peak over the whole run
    print(
        f"peak RSS: 100 images {peaks[100] / 2**20:.0f} MiB, 1000 images {peaks[1000] / 2**20:.0f} MiB, "
        f"whole run {whole / 2**20:.0f} MiB"
    )
    # 10x the files may add the output rows themselves (1000 x 64 x 32 float32 = 8 MiB, a few copies at the end)
    # and little else.
    assert growth < 64 * 2**20, peaks
