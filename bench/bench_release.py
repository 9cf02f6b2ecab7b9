"""Release-size speed: gemma-embed against the per-item reference loop on a vision tower of real size, in float32
and bf16, with this machine's matmul rate as the yardstick.

    python -m bench.bench_release [--quick] [--rounds 3] [--budgets 70,280,1120] [--dtypes float32,bfloat16]
                                  [--images N] [--device cpu|cuda] [--checkpoint DIR] [--no-video] [--no-auto]

Builds a random Gemma 4 checkpoint whose vision tower has the release size (hidden 768, intermediate 3072,
16 layers, 12 heads, 10240 position embeddings: 167M parameters), stored in bf16 as real checkpoints are, and
prints in one run:
1. the CPU (or GPU), whether it has bf16 matrix units, and its matmul rate in float32 and bf16 at the tower's MLP
   shape;
2. per soft-token budget (70, 280, 1120) and on video, per dtype: the tool (`pipeline.run`, with the CLI's host
   memory settings) against the reference loop (processor + `get_image_features` per file on
   `Gemma4ForConditionalGeneration.from_pretrained`: transformers' default dtype, which reads bf16 from this
   checkpoint, for the bf16 rows; float32 asked for the float32 rows): items/s, patches/s, the share of the matmul
   rate that is, peak RSS, and the median over rounds of the per-round speed ratio;
3. the bare tower: `get_image_features` alone on inputs prepared beforehand, one image a call, at the same
   shapes and dtype, and the tool's patches/s as a share of it (issue 13 asks >= 85% in bf16);
4. `--dtype auto` against `--dtype float32` on 8 images at 140 soft tokens, several sharing a bucket.
Every side runs in its own fresh process (peak RSS is its own) and the sides alternate within each round, because a
shared machine slows whichever runs during a burst. Tool and reference see the same files.

FLOPs are counted from the shapes (per patch and layer: 2 x (4 D^2 + 3 D I) for the projections and the gated MLP,
plus 4 N D for attention over N patches), so "of matmul" is achieved FLOP/s over the GEMM rate in the same dtype
that the same process measured just before its timed part (`matmul_rate`). The full run took 29 minutes on
a 2-core Xeon with AMX; `--quick` (1 round, fewer images) about 8.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Timer, cpu_name, emit, peak_rss, run_child, run_tool

RELEASE_VISION = dict(
    vision_hidden=768, vision_layers=16, vision_heads=12, vision_intermediate=3072, position_embedding_size=10240
)
# Images per budget: fewer at larger budgets, where one float32 image takes half a minute on 2 cores.
IMAGES = {70: 8, 140: 8, 280: 4, 1120: 2}
QUICK_IMAGES = {70: 4, 140: 8, 280: 2, 1120: 1}
VIDEO = (320, 240, 48)  # width, height, frames of the clip; the tool samples MAX_FRAMES of them
MAX_FRAMES = 8


def build_checkpoint(folder: Path) -> Path:
    import torch
    from make_tiny_checkpoint import build_gemma4

    return build_gemma4(folder, seed=0, audio=False, dtype=torch.bfloat16, **RELEASE_VISION)


# The auto-vs-float32 case: 8 photos of three aspect ratios, so at 140 tokens they fall into 3 buckets (4, 2, 2).
SHARED_BUCKETS = [(640, 480), (800, 600), (1024, 768), (1280, 960), (480, 640), (720, 960), (512, 512), (900, 900)]


def make_inputs(tmp: Path, counts: dict[int, int]) -> dict[str, Path]:
    """A folder of images per budget (bench_images.ASPECTS: twelve aspect ratios, 1x1 to 4000x300), the 140-token
    folder of SHARED_BUCKETS, and one video clip."""
    from helpers import write_image
    from make_video_samples import write_video

    from bench.bench_images import make_images

    folders = {}
    for budget, count in counts.items():
        folders[str(budget)] = tmp / f"images-{budget}"
        if budget == 140:
            folders["140"].mkdir()
            for i, (w, h) in enumerate(SHARED_BUCKETS[:count]):
                write_image(folders["140"] / f"photo{i}.jpg", w, h, seed=i)
        else:
            make_images(folders[str(budget)], count)
    video = tmp / "video"
    video.mkdir()
    write_video(video / "clip.mp4", "libx264", *VIDEO, seed=0)
    folders["video"] = video
    return folders


# ---- children: each prints one JSON line --------------------------------------------------------------------------


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def _reference_model(ckpt: str, dtype: str, device: str):
    import torch
    from transformers import Gemma4ForConditionalGeneration

    torch.set_grad_enabled(False)
    # bf16 rows: transformers' default dtype (it reads the checkpoint's bf16); float32 rows: asked for.
    kwargs = {} if dtype == "bfloat16" else {"dtype": _torch_dtype(dtype)}
    model = Gemma4ForConditionalGeneration.from_pretrained(ckpt, **kwargs).to(device).eval()
    assert model.dtype == _torch_dtype(dtype), (model.dtype, dtype)
    return model


def _video_indices(path: str) -> list[int]:
    from gemma_embed.media.video import FramePolicy, decode_video

    return list(decode_video(path, FramePolicy(num_frames=MAX_FRAMES)).frame_indices)


def child_reference(ckpt: str, folder: str, budget: str, dtype: str, device: str) -> dict:
    """The per-item loop a user writes: decode, processor, get_*_features, one file at a time."""
    from PIL import Image, ImageOps
    from transformers import AutoImageProcessor, AutoVideoProcessor

    with Timer() as load:
        model = _reference_model(ckpt, dtype, device)
        video = budget == "video"
        processor = (AutoVideoProcessor if video else AutoImageProcessor).from_pretrained(ckpt)
    files = sorted(Path(folder).iterdir())
    indices = {str(f): _video_indices(str(f)) for f in files} if video else {}
    patches = []  # real (unpadded) patches of each image or frame: what every side encodes
    limit = matmul_rate(_torch_dtype(dtype), device)
    with Timer() as embed:
        for file in files:
            if video:
                import numpy as np
                from transformers.video_utils import read_video_pyav

                wanted = np.array(indices[str(file)])
                frames, _ = read_video_pyav(str(file), sample_indices_fn=lambda **_: wanted)  # noqa: B023
                inputs = processor(videos=[frames], do_sample_frames=False, return_tensors="pt").to(device)
                out = model.model.get_video_features(
                    pixel_values_videos=inputs["pixel_values_videos"],
                    video_position_ids=inputs["video_position_ids"],
                    num_frames_per_video=inputs["num_frames_per_video"],
                )
                positions = inputs["video_position_ids"].reshape(-1, *inputs["video_position_ids"].shape[-2:])
            else:
                with Image.open(file) as img:
                    image = ImageOps.exif_transpose(img).convert("RGB")
                inputs = processor([image], return_tensors="pt", max_soft_tokens=int(budget)).to(device)
                out = model.get_image_features(
                    pixel_values=inputs["pixel_values"], image_position_ids=inputs["image_position_ids"]
                )
                positions = inputs["image_position_ids"]
            out.pooler_output[0].float().cpu()  # the rows on the host, as the tool's: waits for a GPU
            patches += [int(n) for n in (positions[..., 0] >= 0).sum(dim=-1)]  # padding positions are -1
    return {
        "load_s": load.seconds,
        "embed_s": embed.seconds,
        "items": len(files),
        "peak_rss": peak_rss(),
        "patches": sum(patches),
        "patches_per_image": patches,
        "matmul": limit,
    }


def child_bare(ckpt: str, folder: str, budget: str, dtype: str, device: str) -> dict:
    """The tower alone: inputs prepared before the clock starts, one image a call."""
    import torch
    from PIL import Image, ImageOps
    from transformers import AutoImageProcessor

    model = _reference_model(ckpt, dtype, device)
    processor = AutoImageProcessor.from_pretrained(ckpt)
    prepared = []
    for file in sorted(Path(folder).iterdir()):
        with Image.open(file) as img:
            image = ImageOps.exif_transpose(img).convert("RGB")
        prepared.append(processor([image], return_tensors="pt", max_soft_tokens=int(budget)).to(device))
    call = lambda p: model.get_image_features(  # noqa: E731
        pixel_values=p["pixel_values"], image_position_ids=p["image_position_ids"]
    )
    call(prepared[0])  # first-call costs (oneDNN primitive creation) out of the timing
    limit = matmul_rate(_torch_dtype(dtype), device)
    with Timer() as embed:
        for p in prepared:
            call(p).pooler_output[0].float().cpu()
    return {"embed_s": embed.seconds, "items": len(prepared), "threads": torch.get_num_threads(), "matmul": limit}


def child_ours(ckpt: str, folder: str, budget: str, dtype: str, device: str, out: str) -> dict:
    """gemma-embed through its library entry, with the host-memory settings its CLI makes (memory/allocator.py)."""

    from gemma_embed.config import RunConfig
    from gemma_embed.memory.allocator import configure_for_long_runs

    limit = matmul_rate(_torch_dtype("float32" if dtype == "auto" else dtype), device)  # before the settings below
    configure_for_long_runs()  # (pinned, each product's output would be a fresh mmap faulted in)
    video = budget == "video"
    options = {"max_frames": MAX_FRAMES} if video else {"max_soft_tokens": int(budget)}
    config = RunConfig(
        modality="video" if video else "images",
        inputs=(folder,),
        output=Path(out),
        model=ckpt,
        dtype=dtype,
        device=device,
        overwrite=True,
        **options,
    )
    return {**run_tool(config), "matmul": limit}


CHILDREN = {"reference": child_reference, "bare": child_bare, "ours": child_ours}


# ---- the parent ---------------------------------------------------------------------------------------------------


def matmul_rate(dtype, device: str = "cpu", m: int = 2304, k: int = 768, n: int = 3072, seconds: float = 1.0) -> float:
    """FLOP/s of (m x k) @ (k x n): the tower's MLP up-projection over a 280-token image's patches. Every child
    measures it just before its timed part, because this machine's rate drifts by up to 2x within minutes (float32
    294 then 411 GFLOP/s, bf16 1664 then 3368, half an hour apart)."""
    import torch

    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
    a @ b
    sync()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        sync()
        count += 10
    return 2 * m * k * n * count / (time.perf_counter() - start)


def flops_per_patch(n: int, d: int = 768, i: int = 3072, layers: int = 16) -> float:
    """FLOPs per patch in an image of n patches (module docstring)."""
    return layers * (2 * (4 * d * d + 3 * d * i) + 4 * n * d)


def image_flops(patches_per_image: list[int]) -> float:
    return sum(n * flops_per_patch(n) for n in patches_per_image)


def run_case(ckpt: Path, folder: Path, budget: str, dtype: str, device: str, rounds: int, out: Path) -> dict:
    """Reference, tool and (for images) bare tower, each round in a rotated order; each side's best round, and the
    medians of the per-round ratios: reference/tool time (`ratios`) and bare/tool time (`shares`: the tool's
    patches/s as a share of the bare tower's)."""
    sides = ["reference", "ours"] + ([] if budget == "video" else ["bare"])
    runs: dict[str, list] = {side: [] for side in sides}
    for round_ in range(rounds):
        for side in sides[round_ % len(sides) :] + sides[: round_ % len(sides)]:
            args = [str(ckpt), str(folder), budget, dtype, device, *([str(out)] if side == "ours" else [])]
            runs[side].append(run_child("bench_release", "--child", side, *args))
    ratios = [r["embed_s"] / o["embed_s"] for r, o in zip(runs["reference"], runs["ours"], strict=True)]
    shares = [b["embed_s"] / o["embed_s"] for b, o in zip(runs.get("bare", []), runs["ours"], strict=False)]
    best = {side: min(rs, key=lambda r: r["embed_s"]) for side, rs in runs.items()}
    return {**best, "ratio": statistics.median(ratios), "ratios": ratios, "shares": shares}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round and fewer images (about 8 minutes here)")
    parser.add_argument("--rounds", type=int, default=None, help="alternated rounds (default 3, --quick 1)")
    parser.add_argument("--budgets", default="70,280,1120")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--images", type=int, help="images per budget (default 8/4/2 at 70/280/1120, fewer --quick)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--checkpoint", type=Path, help="reuse a checkpoint this script built before")
    parser.add_argument("--no-video", action="store_true")
    parser.add_argument("--no-auto", action="store_true", help="skip the --dtype auto vs float32 case")
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        emit(CHILDREN[kind](*rest))
        return 0

    import torch

    from gemma_embed.device import cpu_bf16_units

    rounds = args.rounds or (1 if args.quick else 3)
    counts = QUICK_IMAGES if args.quick else IMAGES
    if args.images:
        counts = dict.fromkeys(counts, args.images) | {140: 8}
    budgets = [int(b) for b in args.budgets.split(",")]
    dtypes = args.dtypes.split(",")
    rates = {name: matmul_rate(_torch_dtype(name), args.device) for name in ("float32", "bfloat16")}
    if torch.device(args.device).type == "cuda":
        print(f"# {torch.cuda.get_device_name(args.device)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    else:
        print(
            f"# {cpu_name()}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads); "
            f"bf16 units: {', '.join(cpu_bf16_units()) or 'none'}"
        )
    print(
        "# matmul 2304x768 @ 768x3072 now: "
        + ", ".join(f"{name} {rate / 1e9:.0f} GFLOP/s" for name, rate in rates.items())
        + f" (each side's share below is of the rate its own process measured); {rounds} round(s), sides rotated"
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        started = time.perf_counter()
        ckpt = args.checkpoint or build_checkpoint(tmp / "ckpt")
        folders = make_inputs(tmp, {b: counts[b] for b in {*budgets, 140}})
        print(f"# release-size vision tower (167M parameters, stored bf16) at {ckpt}")
        header = (
            f"{'case':>9} {'dtype':>8} {'side':>11} {'items':>5} {'items/s':>8} {'patches/s':>9} "
            f"{'of matmul':>9} {'peak RSS':>8}"
        )
        print(header)
        cases = [str(b) for b in budgets] + ([] if args.no_video else ["video"])
        for case in cases:
            for dtype in dtypes:
                result = run_case(ckpt, folders[case], case, dtype, args.device, rounds, tmp / "out.safetensors")
                reference = result["reference"]
                patches = reference["patches"]
                flops = image_flops(reference["patches_per_image"])
                rows = [("reference", reference), ("gemma-embed", result["ours"])]
                if "bare" in result:
                    rows.append(("bare tower", result["bare"]))
                for side, r in rows:
                    seconds = r["embed_s"]
                    print(
                        f"{case:>9} {dtype:>8} {side:>11} {r['items']:>5} {r['items'] / seconds:>8.2f} "
                        f"{patches / seconds:>9.0f} {100 * flops / seconds / r['matmul']:>8.1f}% "
                        + (f"{r['peak_rss'] / 2**20:>7.0f}M" if "peak_rss" in r else f"{'':>8}")
                    )
                shares = result["shares"]
                each = ", ".join(f"{x:.0%}" for x in shares)
                middle = statistics.median(shares) if shares else 0
                share = f"; tool at {middle:.0%} of the bare tower (median of {each})" if shares else ""
                print(
                    f"{case:>9} {dtype:>8} {'ratio':>11} tool {result['ratio']:.2f}x the reference (median of "
                    f"{', '.join(f'{x:.2f}' for x in result['ratios'])}){share}; chunking {result['ours']['chunking']}",
                    flush=True,
                )
        if not args.no_auto:
            folder = folders["140"]
            runs = {"auto": [], "float32": []}
            for round_ in range(rounds):
                for dtype in ("auto", "float32") if round_ % 2 == 0 else ("float32", "auto"):
                    runs[dtype].append(
                        run_child(
                            "bench_release", "--child", "ours", str(ckpt), str(folder), "140", dtype, args.device,
                            str(tmp / "out.safetensors"),
                        )
                    )  # fmt: skip
            ratios = [f["embed_s"] / a["embed_s"] for a, f in zip(runs["auto"], runs["float32"], strict=True)]
            auto, fp32 = (min(runs[d], key=lambda r: r["embed_s"]) for d in ("auto", "float32"))
            print(
                f"# --dtype auto vs --dtype float32, {auto['items']} images at 140 tokens: auto ran {auto['dtype']} "
                f"({auto['dtype_reason']}); {auto['items'] / auto['embed_s']:.2f} vs "
                f"{fp32['items'] / fp32['embed_s']:.2f} images/s, {statistics.median(ratios):.2f}x (median of "
                f"{', '.join(f'{x:.2f}' for x in ratios)}); chunking {auto['chunking']}"
            )
        print(f"# {time.perf_counter() - started:.0f} s in all", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
