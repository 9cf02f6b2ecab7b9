"""The same bytes as a user sees them, each run `--repeat` times through the command line (issue 46's "must show"):

    python -m bench.bench_same_bytes [--repeat 5] [--skip-ray]

1. the samples: `gemma-embed images samples/media/images --model samples/tiny-gemma4 --cpu-threads 1` against
   `--cpu-threads 2` (and the same for text lines on samples/tiny-embeddinggemma2);
2. SIGHUP in the middle of a run at 2 threads (once its first part is on disk), then `--resume` at 1 thread, against
   an uninterrupted run;
3. `--ray local` against the single process, for images and for text.
Prints one JSON line per comparison: how many of the repeats wrote the same embeddings bytes, and the kernels the
output's header records (`cpu_kernels`). Outputs go to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, cpu_name, emit

IMAGES = ROOT / "samples" / "media" / "images"
IMAGE_MODEL = ROOT / "samples" / "tiny-gemma4"
TEXT_MODEL = ROOT / "samples" / "tiny-embeddinggemma2"


def embeddings(path: Path) -> bytes:
    from safetensors import safe_open

    with safe_open(str(path), "np") as fh:
        return fh.get_tensor("embeddings").tobytes()


def kernels(path: Path) -> dict:
    from gemma_embed.store import read_metadata

    return json.loads(read_metadata(path).get("cpu_kernels") or "{}")


def command(modality: str, inputs: Path, out: Path, *options: str) -> list[str]:
    model = TEXT_MODEL if modality == "text" else IMAGE_MODEL
    return ["gemma-embed", modality, str(inputs), "--model", str(model), "-o", str(out), "-q", *options]


def run(args: list[str]) -> None:
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")


def interrupted_then_resumed(inputs: Path, out: Path) -> None:
    """A run at 2 threads, SIGHUP once its first part is written, then --resume at 1 thread."""
    parts = out.with_name(out.name + ".parts")
    proc = subprocess.Popen(
        command("images", inputs, out, "--cpu-threads", "2", "--flush-every", "4"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    while proc.poll() is None and not list(parts.glob("part-*.safetensors")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate()
    if proc.returncode != 128 + signal.SIGHUP:
        raise RuntimeError(f"the interrupted run ended with {proc.returncode}: {err.decode()[-2000:]}")
    run(command("images", inputs, out, "--cpu-threads", "1", "--resume"))


def many_images(folder: Path, count: int) -> Path:
    import numpy as np
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        w, h = [(320, 240), (240, 320), (256, 256), (640, 360)][i % 4]
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    emit({"cpu": cpu_name(), "cpus": os.cpu_count(), "repeat": args.repeat})
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        lines = folder / "lines.txt"
        words = ["the red car", "a dog runs", "under the blue sky", "quickly over the river"]
        lines.write_text("\n".join(" ".join(words[i % 4] for _ in range(1 + i % 37)) for i in range(200)) + "\n")
        images = many_images(folder / "images", 120)
        cases = {
            "samples images, --cpu-threads 1 vs 2": lambda o: [
                command("images", IMAGES, o, "--cpu-threads", "1", "--overwrite"),
                command("images", IMAGES, o.with_suffix(".b.safetensors"), "--cpu-threads", "2", "--overwrite"),
            ],
            "samples text, --cpu-threads 1 vs 2": lambda o: [
                command("text", lines, o, "--cpu-threads", "1", "--overwrite"),
                command("text", lines, o.with_suffix(".b.safetensors"), "--cpu-threads", "2", "--overwrite"),
            ],
            "SIGHUP + --resume vs uninterrupted": None,
        }
        if not args.skip_ray:
            cases["--ray local vs single process, images"] = lambda o: [
                command("images", IMAGES, o, "--overwrite"),
                command("images", IMAGES, o.with_suffix(".b.safetensors"), "--ray", "local", "--overwrite"),
            ]
            cases["--ray local vs single process, text"] = lambda o: [
                command("text", lines, o, "--overwrite"),
                command("text", lines, o.with_suffix(".b.safetensors"), "--ray", "local", "--overwrite"),
            ]
        for name, commands in cases.items():
            same, recorded = 0, {}
            for attempt in range(args.repeat):
                out = folder / f"case-{attempt}.safetensors"
                other = out.with_suffix(".b.safetensors")
                if commands is None:
                    run(command("images", images, out, "--overwrite"))
                    for leftover in (other, other.with_name(other.name + ".parts")):
                        if leftover.exists() and leftover.is_file():
                            leftover.unlink()
                    interrupted_then_resumed(images, other)
                else:
                    for args_ in commands(out):
                        run(args_)
                same += embeddings(out) == embeddings(other)
                recorded = kernels(other)
                out.unlink()
                other.unlink()
            emit({"case": name, "same_bytes": f"{same} of {args.repeat}", "cpu_kernels": recorded})


if __name__ == "__main__":
    sys.exit(main())
