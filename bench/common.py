"""Shared bits of the benchmarks: checkpoints, media, child processes that report time and peak RSS."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from bench import ROOT


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", text).group(1)) * 1024


def cpu_name() -> str:
    """The CPU's model name (the kernel's /proc/cpuinfo), for a benchmark's header line."""
    import platform

    from gemma_embed.cpu_threads import cpu_model

    return cpu_model() or platform.processor() or "unknown CPU"


def peak_rss() -> int:
    """This process's peak RSS in bytes: the kernel's VmHWM, the one peak-RSS measure every bench uses
    (ru_maxrss would inherit a parent's peak across fork, and sampling misses short peaks)."""
    return _status_kib("VmHWM")


def reset_peak_rss() -> int:
    """Start a new peak: the kernel resets VmHWM to the current RSS (Linux >= 4.0); returns that RSS."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


class PeakRss:
    """Peak RSS while a block runs (`peak`), and the RSS it started from (`start`)."""

    def __enter__(self):
        self.start = reset_peak_rss()
        return self

    def __exit__(self, *exc):
        self.peak = peak_rss()


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


def run_tool(config) -> dict:
    """One gemma-embed run through its library entry (silent): its load and embed seconds (the summary's seconds
    cover sources..write; the rest of the call is loading), items, peak RSS, compute dtype and why, chunking."""
    from gemma_embed.pipeline import run

    with Timer() as total:
        result = run(config)
    summary = result.summary()
    assert result.failed == 0, summary
    return {
        "load_s": total.seconds - summary["seconds"],
        "embed_s": summary["seconds"],
        "items": summary["ok"],
        "peak_rss": peak_rss(),
        "dtype": summary["dtype"],
        "dtype_reason": summary.get("dtype_reason", ""),
        "chunking": summary.get("chunking"),
    }


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)
