"""What thread-count-independent bytes cost: the same text and image jobs with numerics.aligned() on and off (and,
with `--against CHECKOUT`, the same jobs run by another checkout's code, e.g. the commit before the padding ladder).

    python -m bench.bench_numerics [--rounds 5] [--busy off,on] [--against /path/to/other/checkout]
                                   [--jobs text,images,release] [--dtypes float32,bfloat16] [--no-unaligned]

Jobs (random checkpoints at a realistic width, built by samples/make_tiny_checkpoint.py):
- text: `Embedder(ckpt).encode(lines)`, 300 mixed lines (1-300 words, as bench_text's mixed corpus) on an
  EmbeddingGemma 2 text model, hidden 512 x 8 layers;
- images: `Embedder(ckpt).embed(paths)`, 24 images of 6 sizes on a Gemma 4 vision tower, hidden 384 x 4 layers;
- release: the same images on a vision tower of the release width (hidden 768, intermediate 3072, 12 heads;
  bench_release's tower) with 4 of its 16 layers: the same kernels at the same shapes, a quarter of the time.
Each job runs in each of `--dtypes` (`--dtype` of the Embedder). MKL_CBWR is taken out of every side's environment:
each side's own code decides MKL's mode, as it does for a user who never set it.
Each side runs in a fresh process (model loaded before the timer), the sides rotated every round; the busy rounds
start one `python -c "while True: pass"` beside each run and kill it by its PID after. Printed: each side's
median seconds and the median over rounds of each side's time over the aligned side's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT, cpu_name, emit

CHILD = r"""
import json, sys, time, contextlib
job, ckpt, inputs, aligned, dtype = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "on", sys.argv[5]
import gemma_embed
if not aligned:
    from gemma_embed import numerics
    numerics.aligned = lambda device: contextlib.nullcontext()
from gemma_embed import Embedder
embedder = Embedder(ckpt, device="cpu", dtype=dtype)
if job == "text":
    items = open(inputs).read().splitlines()
    embedder.load("text")
    start = time.perf_counter(); embedder.encode(items, modality="text"); seconds = time.perf_counter() - start
else:
    items = sorted(str(p) for p in __import__("pathlib").Path(inputs).iterdir())
    embedder.load("images")
    start = time.perf_counter(); embedder.embed(items); seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "items": len(items)}))
"""


def prepare(folder: Path) -> dict[str, tuple[str, str]]:
    sys.path.insert(0, str(ROOT / "samples"))
    import numpy as np
    from make_tiny_checkpoint import build_embeddinggemma2, build_gemma4
    from PIL import Image

    from bench.bench_text import write_corpus

    text_ckpt = build_embeddinggemma2(
        folder / "eg2", seed=0, vision=False, audio=False, text_hidden=512, text_layers=8, sliding_window=512
    )
    corpus = folder / "mixed.txt"
    write_corpus(corpus, "mixed", 300)
    image_ckpt = build_gemma4(
        folder / "g4", seed=0, audio=False, vision_hidden=384, vision_layers=4, vision_heads=6, vision_intermediate=1536
    )
    images = folder / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(24):
        w, h = [(640, 480), (480, 640), (512, 512), (1280, 720), (300, 900), (800, 600)][i % 6]
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(images / f"{i:02d}.png")
    release_ckpt = build_gemma4(
        folder / "g4-release",
        seed=0,
        audio=False,
        vision_hidden=768,
        vision_layers=4,
        vision_heads=12,
        vision_intermediate=3072,
    )
    return {
        "text": (str(text_ckpt), str(corpus)),
        "images": (str(image_ckpt), str(images)),
        "release": (str(release_ckpt), str(images)),
    }


def run_side(code_root: str, job: str, ckpt: str, inputs: str, aligned: bool, busy: bool, dtype: str) -> float:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        env = {**{k: v for k, v in os.environ.items() if k != "MKL_CBWR"}, "PYTHONPATH": code_root}
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, job, ckpt, inputs, "on" if aligned else "off", dtype],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--busy", default="off,on")
    parser.add_argument("--jobs", default="text,images")
    parser.add_argument("--against", help="another checkout whose code runs the same jobs (its own numerics)")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--no-unaligned", action="store_true", help="leave out this code with aligned() off")
    args = parser.parse_args()
    sides = [("aligned", str(ROOT), True)] + ([] if args.no_unaligned else [("unaligned", str(ROOT), False)])
    if args.against:
        sides.append(("against", str(Path(args.against).resolve()), True))
    emit({"cpu": cpu_name(), "threads": os.cpu_count(), "sides": [s[0] for s in sides]})
    with tempfile.TemporaryDirectory() as tmp:
        jobs = prepare(Path(tmp))
        for job, dtype in [(j, d) for j in args.jobs.split(",") for d in args.dtypes.split(",")]:
            ckpt, inputs = jobs[job]
            for busy in [b == "on" for b in args.busy.split(",")]:
                seconds: dict[str, list[float]] = {name: [] for name, _, _ in sides}
                for round_ in range(args.rounds):
                    order = sides[round_ % len(sides) :] + sides[: round_ % len(sides)]
                    for name, code_root, aligned in order:
                        seconds[name].append(run_side(code_root, job, ckpt, inputs, aligned, busy, dtype))
                ratios = {
                    name: statistics.median(s / a for s, a in zip(values, seconds["aligned"], strict=True))
                    for name, values in seconds.items()
                    if name != "aligned"
                }
                emit(
                    {
                        "job": job,
                        "dtype": dtype,
                        "busy": busy,
                        "median_s": {name: round(statistics.median(v), 3) for name, v in seconds.items()},
                        "time_over_aligned": {name: round(r, 3) for name, r in ratios.items()},
                    }
                )


if __name__ == "__main__":
    main()
