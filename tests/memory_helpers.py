"""Host-memory measurements the tests and bench/bench_memory.py share: peak RSS (the kernel's VmHWM) of a process of
its own, for a gemma-embed command (above the loaded process: forked from the tests' warm server or started anew, the
same growth, 22 against 18 MiB and 228 against 225 MiB in tests/cli/test_text_limits.py and
test_decode_waits_for_room.py) and for one file through a decoder and its preparer.

VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's peak across fork (the test runner's), VmHWM is
the peak of the process's own memory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from warm_cli import REPORT_VARIABLE, python_launcher, reported_pid

ROOT = Path(__file__).resolve().parents[1]
# `python SCRIPT ...`, forked from the warm server where a pytest session has one (tests/warm_cli.py), else anew.
PYTHON_CLI = python_launcher(ROOT / "tests")

# gemma-embed's console script, run in this process, that writes {"peak": VmHWM, "loaded": VmRSS when the decode
# stream starts} (bytes) to the file named by $GEMMA_EMBED_PEAK_FILE when it exits. The stream starts once the
# model is loaded: "loaded" is the process's baseline plus the model.
_CLI = textwrap.dedent("""
    import json, os, re, sys
    from pathlib import Path

    def status(field):
        return int(re.search(rf"{field}:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024

    from gemma_embed import decoding

    marks = {}
    windows = decoding._windows

    def measured(*args, **kwargs):
        marks.setdefault("loaded", status("VmRSS"))
        yield from windows(*args, **kwargs)

    decoding._windows = measured
    from gemma_embed.cli import main

    try:
        main()
    finally:
        Path(os.environ["GEMMA_EMBED_PEAK_FILE"]).write_text(json.dumps({"peak": status("VmHWM"), **marks}))
""")


def cli_peak(args: list[str], root: Path = ROOT, timeout: float = 900, cap: int | None = None) -> dict:
    """Run `gemma-embed ARGS` with the package of `root` in a process of its own (forked from the warm server
    when a test session has one and `root` is its package; anew otherwise): {"code", "stderr", "peak", "loaded"}
    (bytes; "loaded" is missing when the run never started decoding). With `cap` (bytes) the process is killed
    once its RSS passes it (sampled every 50 ms): then {"killed": True, "peak": at least cap}."""
    with tempfile.TemporaryDirectory() as tmp:
        marks, errors, script, report = (Path(tmp) / name for name in ("peak.json", "stderr", "cli.py", "report"))
        script.write_text(_CLI)
        path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)  # root's package first
        env = {**os.environ, "PYTHONPATH": path, "GEMMA_EMBED_PEAK_FILE": str(marks), REPORT_VARIABLE: str(report)}
        with open(errors, "w") as stderr:
            proc = subprocess.Popen(
                [PYTHON_CLI, script, *map(str, args)],
                env=env,
                cwd=root,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
            killed, started = False, time.monotonic()
            while proc.poll() is None:
                over = cap is not None and _rss(reported_pid(report) if report.exists() else proc.pid) > cap
                if over or time.monotonic() - started > timeout:
                    proc.kill()
                    killed = True
                time.sleep(0.05)
        measured = json.loads(marks.read_text()) if marks.exists() else {}
        result = {"code": proc.returncode, "stderr": errors.read_text(), **measured}
    if killed:
        result.update(killed=True, peak=max(cap or 0, result.get("peak", 0)))
    return result


def _rss(pid: int) -> int:
    try:
        return int(re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text()).group(1)) * 1024
    except (OSError, AttributeError):
        return 0


# One file through the modality's decoder and preparer (built as a run builds them), in a process whose mmap
# threshold is pinned as the CLI pins it; prints {"peak": bytes above the RSS before decoding, "pixels" or
# "samples": what the estimate is per, "estimate": memory's estimate for it}.
_DECODE = textwrap.dedent("""
    import json, re, sys
    from pathlib import Path

    def status(field):
        return int(re.search(rf"{field}:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024

    from gemma_embed.memory import allocator, decode_peaks
    allocator.configure_for_long_runs()
    import torch
    from gemma_embed.embedder import Embedder

    torch.set_num_threads(1)  # as in a decode thread
    model, modality, warm, paths = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    stages = Embedder(model, device="cpu", dtype="float32").stages(modality)  # no weights: decode and prepare only
    stages.preparer.prepare(stages.decode(warm))  # first-call costs (imports, processor caches) are not the file's
    for path in paths:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from the RSS now
        before = status("VmRSS")
        decoded = stages.decode(path)
        item = stages.preparer.prepare(decoded)
        peak = status("VmHWM") - before
        if modality == "images":
            from PIL import Image
            from gemma_embed.media.image import composited
            with Image.open(path) as img:
                size = {"pixels": img.width * img.height}
                estimate = decode_peaks.image_decode_peak(img.width, img.height, composited(img))
        elif modality == "video":
            frames, height, width, _ = decoded.frames.shape
            size = {"pixels": frames * height * width}
            estimate = decode_peaks.video_decode_peak(frames, width, height)
        else:
            size = {"samples": int(decoded.samples.size)}
            estimate = decode_peaks.audio_decode_peak(decoded.samples.size / decoded.sample_rate, decoded.sample_rate)
        print(json.dumps({"path": path, "peak": peak, "estimate": estimate, **size}), flush=True)
        del decoded, item
""")


def decode_peaks(model: Path, modality: str, warm: Path, paths: list[Path], root: Path = ROOT) -> list[dict]:
    """Peak host bytes of each file through `modality`'s decoder and preparer, with memory's estimate beside it."""
    proc = subprocess.run(
        [sys.executable, "-c", _DECODE, str(model), modality, str(warm), *map(str, paths)],
        env={**os.environ, "PYTHONPATH": str(root)},
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def write_flat_png(path: Path, width: int, height: int, shade: int = 0) -> Path:
    """A large PNG that is small on disk and quick to write: horizontal bands (zlib squeezes them to almost
    nothing), still a full RGB image once decoded."""
    import numpy as np
    from PIL import Image

    rows = (np.arange(height, dtype=np.uint16)[:, None] // 37 + shade).astype(np.uint8)
    pixels = np.empty((height, width, 3), np.uint8)
    pixels[..., 0] = rows
    pixels[..., 1] = 255 - rows
    pixels[..., 2] = 128
    Image.fromarray(pixels).save(path, compress_level=1)
    return path
