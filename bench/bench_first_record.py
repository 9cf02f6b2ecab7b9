"""When the first record leaves (issue 34, goal 1): `gemma-embed images DIR --jsonl` on HD images, the time from
the start to the first JSON record on stdout and to the end, for this checkout and for another one (`--against`,
e.g. a worktree of the commit before), in fresh processes, alternated (A B A B ...), also with one busy process
beside them (`--busy`).

    python -m bench.bench_first_record [--images 64] [--size 1280x720] [--tokens 280] [--tower tiny|medium]
                                       [--against DIR] [--busy]

Each run also gives the first record's time after the model is loaded (the summary's `seconds` count from there)
against one batch's encode time (the batch size chosen over the tuner's measured rate at that size): the goal is
at most two batches. `--tower medium` is the issue's case (128 HD images on a medium Gemma 4 tower, a 34.6 s run
there): hidden 256, 4 layers, 4 heads, float32, random weights, whose run takes about as long here (hidden 384 and 8
layers took 156 s: first record at 5%, 0.6 batches after the load); `tiny` the sample tower, whose encode is fast,
so decoding is most of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import ROOT
from bench.common import cpu_name

MODEL = ROOT / "samples" / "tiny-gemma4"
MEDIUM_VISION = dict(vision_hidden=256, vision_layers=4, vision_heads=4, vision_intermediate=1024)


def medium_tower(folder: Path) -> Path:
    import torch
    from make_tiny_checkpoint import build_gemma4

    sys.path.insert(0, str(ROOT / "samples"))
    return build_gemma4(folder, seed=0, audio=False, dtype=torch.float32, **MEDIUM_VISION)


def make_images(folder: Path, count: int, width: int, height: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for n in range(count):
        base = np.linspace(0, 255, width, dtype=np.float32)[None, :, None] * np.ones((height, 1, 3), np.float32)
        noise = rng.normal(0, 20, (height, width, 3)).astype(np.float32)
        Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(folder / f"{n:04d}.jpg", quality=90)


def one_run(root: Path, images: Path, out: Path, tokens: int, model: Path = MODEL) -> dict:
    """One fresh process of `root`'s package: seconds to the first record and to the end, records, and from its
    summary the seconds after the model was loaded and one batch's encode time."""
    command = [sys.executable, "-c", "from gemma_embed.cli import main; main()", "images", str(images)]
    command += ["--model", str(model), "-o", str(out), "--overwrite", "--jsonl", "--max-soft-tokens", str(tokens)]
    started = time.perf_counter()
    proc = subprocess.Popen(
        command,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    first, records, summary, summary_at = None, 0, {}, 0.0
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(b'{"type": "item"'):
            records += 1
            if first is None:
                first = time.perf_counter() - started
        elif line.startswith(b'{"type": "summary"'):
            summary = json.loads(line)
            summary_at = time.perf_counter() - started
    proc.wait()
    end = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{root}: exit {proc.returncode}")
    first = first if first is not None else end
    # The summary's `seconds` run from the model's load to the summary (the process's exit comes after it).
    loaded = summary_at - float(summary.get("seconds", 0.0)) if summary else end
    return {"first": first, "end": end, "records": records, "after_load": first - loaded, "batch": _batch(summary)}


def _batch(summary: dict) -> float | None:
    """One batch's encode time: the chosen work a batch over the rate the tuner measured at that size."""
    chunking = summary.get("chunking") or {}
    chosen = chunking.get("chosen")
    found = re.search(rf"\b{chosen}: ([0-9.]+) ", chunking.get("reason", "")) if chosen else None
    return chosen / float(found.group(1)) if found and float(found.group(1)) > 0 else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--size", default="1280x720")
    parser.add_argument("--tokens", type=int, default=280)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout, run alternately with this one")
    parser.add_argument("--busy", action="store_true", help="one busy process beside the runs")
    parser.add_argument("--tower", choices=("tiny", "medium"), default="tiny")
    args = parser.parse_args()
    width, height = map(int, args.size.split("x"))
    sides = {"this": ROOT} | ({"against": args.against.resolve()} if args.against else {})
    print(f"CPU: {cpu_name()}; {args.images} images of {args.size} at {args.tokens} tokens, {args.tower} tower")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = medium_tower(Path(tmp) / "medium") if args.tower == "medium" else MODEL
            folder = Path(tmp) / "images"
            folder.mkdir()
            make_images(folder, args.images, width, height)
            results: dict[str, list[dict]] = {name: [] for name in sides}
            for _ in range(args.rounds):
                for name, root in sides.items():
                    run = one_run(root, folder, Path(tmp) / f"{name}.safetensors", args.tokens, model)
                    results[name].append(run)
                    batch = f"{run['batch']:.2f} s" if run["batch"] else "unknown"
                    print(
                        f"  {name}: first record {run['first']:.2f} s, end {run['end']:.2f} s "
                        f"({run['first'] / run['end']:.0%}), {run['records']} records; after the model loaded "
                        f"{run['after_load']:.2f} s, one batch {batch}",
                        flush=True,
                    )
            for name, runs in results.items():
                first = statistics.median(r["first"] for r in runs)
                end = statistics.median(r["end"] for r in runs)
                after = statistics.median(r["after_load"] for r in runs)
                batches = [r["after_load"] / r["batch"] for r in runs if r["batch"]]
                in_batches = f"{statistics.median(batches):.2f} batches" if batches else "batch time unknown"
                print(
                    f"{name}: median first record {first:.2f} s of {end:.2f} s ({first / end:.0%}); "
                    f"{after:.2f} s after the model loaded ({in_batches})"
                )
    finally:
        if busy is not None:
            busy.kill()


if __name__ == "__main__":
    main()
