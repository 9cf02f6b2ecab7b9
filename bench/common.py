"""Shared bits of the benchmarks: checkpoints, media, child processes that report time and peak RSS."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "samples"))
sys.path.insert(0, str(ROOT / "tests"))


def peak_rss() -> int:
    """This process's peak RSS (VmHWM; ru_maxrss would inherit a parent's peak across fork)."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", text).group(1)) * 1024


def run_child(module: str, *args: str) -> dict:
    """Run `python -m bench.MODULE args` in a fresh process; it prints one JSON line last."""
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)
