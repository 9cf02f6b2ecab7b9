"""Images: gemma-embed against the per-item reference loop, same files and checkpoint, in one run.

    python -m bench.bench_images [--images 48] [--budgets 70,280,1120] [--vision-hidden 256 --vision-layers 4]
                                 [--device cpu|cuda] [--dtype auto]

Each side runs in its own fresh process (so peak RSS is its own): the reference loads the full model with
`from_pretrained` and calls the processor + `get_image_features` per image; gemma-embed runs its pipeline on
the same folder. Prints load and embed seconds, images/s, the speed ratio and peak RSS of each. Both sides use
the same device and dtype (auto: the tool's choice for the device); the reference's timing waits for the GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench.common import Timer, emit, peak_rss, run_child, run_tool

ASPECTS = [
    (640, 480),
    (480, 640),
    (1920, 1080),
    (1080, 1920),
    (512, 512),
    (4000, 300),
    (300, 1200),
    (1280, 960),
    (800, 600),
    (1024, 768),
    (720, 1280),
    (1, 1),
]


def make_images(folder: Path, count: int) -> None:
    from helpers import write_image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        w, h = ASPECTS[i % len(ASPECTS)]
        write_image(folder / f"img{i:04d}.{'jpg' if i % 2 else 'png'}", w, h, seed=i)


def child_reference(ckpt: str, folder: str, budget: int, device: str = "cpu", dtype: str = "auto") -> dict:
    import torch
    from PIL import Image, ImageOps
    from transformers import AutoImageProcessor, Gemma4ForConditionalGeneration

    from gemma_embed.device import resolve_device, resolve_dtype

    torch.set_grad_enabled(False)
    with Timer() as load:
        torch_dtype = resolve_dtype(dtype, resolve_device(device))
        model = Gemma4ForConditionalGeneration.from_pretrained(ckpt, dtype=torch_dtype).to(device).eval()
        processor = AutoImageProcessor.from_pretrained(ckpt)
    files = sorted(Path(folder).iterdir())
    with Timer() as embed:
        for file in files:
            with Image.open(file) as img:
                image = ImageOps.exif_transpose(img).convert("RGB")
            inputs = processor([image], return_tensors="pt", max_soft_tokens=budget).to(device)
            out = model.get_image_features(
                pixel_values=inputs["pixel_values"], image_position_ids=inputs["image_position_ids"]
            )
            out.pooler_output[0].cpu()  # the rows on the host, as the tool's: waits for a GPU
    return {"load_s": load.seconds, "embed_s": embed.seconds, "items": len(files), "peak_rss": peak_rss()}


def child_ours(
    ckpt: str, folder: str, budget: int, out: str, overlap: str = "off", device: str = "cpu", dtype: str = "auto"
) -> dict:

    from gemma_embed import pipeline
    from gemma_embed.config import RunConfig

    pipeline.OVERLAP_ON_CPU = overlap == "on"

    config = RunConfig(
        modality="images",
        inputs=(folder,),
        output=Path(out),
        model=ckpt,
        device=device,
        dtype=dtype,
        overwrite=True,
        max_soft_tokens=budget,
    )
    return run_tool(config)


def compare(
    ckpt: Path,
    images: Path,
    budget: int,
    out: Path,
    repeats: int,
    overlap: str = "off",
    device: str = "cpu",
    dtype: str = "auto",
) -> tuple:
    """Reference and gemma-embed runs alternated `repeats` times (a busy machine slows both alike); each side's
    fastest run, and the median of the per-round ratios."""
    refs, ours, ratios = [], [], []
    for _ in range(repeats):
        ref = run_child("bench_images", "--child", "reference", str(ckpt), str(images), str(budget), device, dtype)
        own = run_child(
            "bench_images", "--child", "ours", str(ckpt), str(images), str(budget), str(out), overlap, device, dtype
        )
        refs.append(ref)
        ours.append(own)
        ratios.append(ref["embed_s"] / own["embed_s"])
    best = lambda runs: min(runs, key=lambda r: r["embed_s"])  # noqa: E731
    return best(refs), best(ours), sorted(ratios)[len(ratios) // 2], ratios


def workload_arguments(parser: argparse.ArgumentParser, images: int) -> None:
    """The options both image benches share: how many images, which budgets, the tower's size, rounds."""
    parser.add_argument("--images", type=int, default=images)
    parser.add_argument("--budgets", default="70,280,1120")
    parser.add_argument("--vision-hidden", type=int, default=256)
    parser.add_argument("--vision-layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)


def build_workload(tmp: Path, args) -> Path:
    """A random vision checkpoint of the asked size in tmp/ckpt and the images in tmp/images."""
    from make_tiny_checkpoint import build_gemma4

    ckpt = build_gemma4(
        tmp / "ckpt", seed=0, audio=False, vision_hidden=args.vision_hidden, vision_layers=args.vision_layers
    )
    make_images(tmp / "images", args.images)
    return ckpt


def main() -> None:
    parser = argparse.ArgumentParser()
    workload_arguments(parser, images=48)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="both sides' compute dtype; auto: the tool's choice")
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        fn = child_reference if kind == "reference" else child_ours
        emit(fn(rest[0], rest[1], int(rest[2]), *rest[3:]))
        return

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ckpt = build_workload(tmp, args)
        print(
            f"# {args.images} images, vision tower D={args.vision_hidden} L={args.vision_layers}, "
            f"{os.cpu_count()} CPUs, torch threads default, device {args.device}, dtype {args.dtype}",
            file=sys.stderr,
        )
        print(f"{'budget':>6} {'side':>10} {'load s':>7} {'embed s':>8} {'img/s':>7} {'peak RSS MiB':>13}")
        for budget in [int(b) for b in args.budgets.split(",")]:
            ref, ours, ratio, ratios = compare(
                ckpt, tmp / "images", budget, tmp / "out.safetensors", args.repeats, "off", args.device, args.dtype
            )
            for side, r in (("reference", ref), ("gemma-embed", ours)):
                print(
                    f"{budget:>6} {side:>10} {r['load_s']:>7.2f} {r['embed_s']:>8.2f} "
                    f"{r['items'] / r['embed_s']:>7.2f} {r['peak_rss'] / 2**20:>13.0f}"
                )
            print(
                f"{budget:>6} {'ratio':>10} {'':>7} {ratio:>7.2f}x faster (median of {len(ratios)} alternated "
                f"rounds: {', '.join(f'{x:.2f}' for x in ratios)}; chunking {ours['chunking']})",
                flush=True,
            )


if __name__ == "__main__":
    main()
