"""When the first record leaves (issue 34, goal 1): `gemma-embed images DIR --jsonl` on HD images, the time from
the start to the first JSON record on stdout and to the end, for this checkout and for another one (`--against`,
e.g. a worktree of the commit before), in fresh processes, alternated (A B A B ...), also with one busy process
beside them (`--busy`).

    python -m bench.bench_first_record [--images 64] [--size 1280x720] [--tokens 280] [--against DIR] [--busy]

The case is scaled down from the issue's (128 HD images on a medium Gemma 4 tower) to the tiny sample tower, whose
encode is fast: decoding is most of the run, which is what a first window of many batches made everyone wait for.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import ROOT
from bench.common import cpu_name

MODEL = ROOT / "samples" / "tiny-gemma4"


def make_images(folder: Path, count: int, width: int, height: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for n in range(count):
        base = np.linspace(0, 255, width, dtype=np.float32)[None, :, None] * np.ones((height, 1, 3), np.float32)
        noise = rng.normal(0, 20, (height, width, 3)).astype(np.float32)
        Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(folder / f"{n:04d}.jpg", quality=90)


def one_run(root: Path, images: Path, out: Path, tokens: int) -> tuple[float, float, int]:
    """(seconds to the first record, seconds to the end, records) of one fresh process of `root`'s package."""
    command = [sys.executable, "-c", "from gemma_embed.cli import main; main()", "images", str(images)]
    command += ["--model", str(MODEL), "-o", str(out), "--overwrite", "--jsonl", "--max-soft-tokens", str(tokens)]
    started = time.perf_counter()
    proc = subprocess.Popen(
        command,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    first, records = None, 0
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(b'{"type": "item"'):
            records += 1
            if first is None:
                first = time.perf_counter() - started
    proc.wait()
    end = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{root}: exit {proc.returncode}")
    return (first if first is not None else end), end, records


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--size", default="1280x720")
    parser.add_argument("--tokens", type=int, default=280)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout, run alternately with this one")
    parser.add_argument("--busy", action="store_true", help="one busy process beside the runs")
    args = parser.parse_args()
    width, height = map(int, args.size.split("x"))
    sides = {"this": ROOT} | ({"against": args.against.resolve()} if args.against else {})
    print(f"CPU: {cpu_name()}; {args.images} images of {args.size} at {args.tokens} tokens, tiny-gemma4")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "images"
            folder.mkdir()
            make_images(folder, args.images, width, height)
            results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in sides}
            for _ in range(args.rounds):
                for name, root in sides.items():
                    first, end, records = one_run(root, folder, Path(tmp) / f"{name}.safetensors", args.tokens)
                    results[name].append((first, end, records))
                    share = first / end
                    print(f"  {name}: first record {first:.2f} s, end {end:.2f} s ({share:.0%}), {records} records")
            for name, runs in results.items():
                first = statistics.median(r[0] for r in runs)
                end = statistics.median(r[1] for r in runs)
                print(f"{name}: median first record {first:.2f} s of {end:.2f} s ({first / end:.0%})")
    finally:
        if busy is not None:
            busy.kill()


if __name__ == "__main__":
    main()
