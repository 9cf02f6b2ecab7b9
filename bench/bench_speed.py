"""Speed toward the limit: achieved FLOP/s against this machine's matmul rate, and what changes it.

    python -m bench.bench_speed [--images 24] [--vision-hidden 256 --vision-layers 4]

Prints, in one run on the same files and checkpoint:
1. the machine's float32 and bfloat16 matmul rate (the practical limit);
2. the vision tower's FLOPs per image at each budget (torch's FlopCounterMode, one unpadded image);
3. gemma-embed vs the per-item reference loop at 70 / 280 / 1120 tokens: images/s, ratio, and the achieved
   FLOP/s of each as a fraction of the float32 limit;
4. variants of gemma-embed's encode on one bucket: float32 vs bfloat16 (speed and relative error), fixed chunk
   sizes, torch.compile (its compile time and steady speed), and intra-op threads.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.bench_images import build_workload, compare, workload_arguments


def matmul_rate(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - start)


def tower_flops(tower, unit) -> int:
    """FLOPs of one unit through tower + projection: torch's counter for the matmuls, plus attention, which the
    counter does not see inside the CPU's fused SDPA kernel (QK^T and AV: 4 * N^2 * heads * head_dim a layer)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        tower.encode([unit], "language")
    counted = counter.get_flop_counts()["Global"]
    cfg = tower.config
    attention = 0
    if not any("attention" in str(op) for op in counted):
        attention = cfg.num_hidden_layers * 4 * unit.length**2 * cfg.num_attention_heads * cfg.head_dim
    return counter.get_total_flops() + attention


def timed(fn, repeats: int = 3) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def variants(ckpt: Path, folder: Path, budget: int) -> None:
    from gemma_embed.media.image import decode_image
    from gemma_embed.models.gemma4 import Gemma4ImagePreparer, Gemma4VisionTower
    from gemma_embed.models.loading import resolve_checkpoint

    checkpoint = resolve_checkpoint(str(ckpt))
    preparer = Gemma4ImagePreparer(checkpoint, budget)
    units = [preparer.prepare(decode_image(str(f))).units[0] for f in sorted(folder.iterdir())]
    by_length: dict[int, list] = {}
    for u in units:
        by_length.setdefault(u.length, []).append(u)
    bucket = max(by_length.values(), key=len)[:8]
    print(f"\n## encode variants, one bucket of {len(bucket)} images x {bucket[0].length} patches ({budget} tokens)")
    fp32 = Gemma4VisionTower(checkpoint, "cpu", torch.float32)
    with torch.inference_mode():
        reference = fp32.encode(bucket, "language")
    base = None
    rows = []
    for label, tower, chunk in [
        ("float32 chunk 1", fp32, 1),
        ("float32 chunk 2", fp32, 2),
        ("float32 chunk 4", fp32, 4),
        ("float32 chunk 8", fp32, 8),
    ]:

        def run(tower=tower, chunk=chunk):
            with torch.inference_mode():
                return [tower.encode(bucket[i : i + chunk], "language") for i in range(0, len(bucket), chunk)]

        seconds = timed(run)
        base = base or seconds
        rows.append((label, seconds))
    bf16 = Gemma4VisionTower(checkpoint, "cpu", torch.bfloat16)
    with torch.inference_mode():
        out = bf16.encode(bucket, "language").float()
    error = float((out - reference).norm() / reference.norm())
    rows.append((f"bfloat16 chunk {len(bucket)} (rel err {error:.1e})", timed(lambda: bf16.encode(bucket, "language"))))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows.append(("float32 chunk 1, 1 intra-op thread", timed(lambda: [fp32.encode([u], "language") for u in bucket])))
    torch.set_num_threads(threads)
    compiled = Gemma4VisionTower(checkpoint, "cpu", torch.float32)
    start = time.perf_counter()
    compiled.tower = torch.compile(compiled.tower)
    with torch.inference_mode():
        compiled.encode(bucket[:1], "language")
    compile_s = time.perf_counter() - start
    rows.append(
        (
            f"torch.compile chunk 1 (compile {compile_s:.1f} s)",
            timed(lambda: [compiled.encode([u], "language") for u in bucket]),
        )
    )
    print(f"{'variant':<48} {'s per bucket':>12} {'img/s':>8} {'vs chunk 1':>10}")
    for label, seconds in rows:
        print(f"{label:<48} {seconds:>12.3f} {len(bucket) / seconds:>8.2f} {base / seconds:>9.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    workload_arguments(parser, images=24)
    parser.add_argument("--overlap", default="off,on", help="decode overlapping a CPU encode: off, on or both")
    parser.add_argument("--variants", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    print(
        f"# {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"capability {torch.backends.cpu.get_cpu_capability()}"
    )
    limits = {dtype: matmul_rate(dtype) for dtype in (torch.float32, torch.bfloat16)}
    for dtype, rate in limits.items():
        print(f"matmul 2048^3 {str(dtype)[6:]:>8}: {rate / 1e9:8.1f} GFLOP/s")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ckpt = build_workload(tmp, args)
        from gemma_embed.media.image import decode_image
        from gemma_embed.models.gemma4 import Gemma4ImagePreparer, Gemma4VisionTower
        from gemma_embed.models.loading import resolve_checkpoint

        checkpoint = resolve_checkpoint(str(ckpt))
        tower = Gemma4VisionTower(checkpoint, "cpu", torch.float32)
        print(
            f"\n## gemma-embed vs reference loop, {args.images} images, D={args.vision_hidden} L={args.vision_layers}"
        )
        print(
            f"{'budget':>6} {'decode':>7} {'ref img/s':>9} {'ours img/s':>10} {'ratio':>6} {'GFLOP/img':>9} "
            f"{'ref %limit':>10} {'ours %limit':>11}  rounds"
        )
        for budget in [int(b) for b in args.budgets.split(",")]:
            preparer = Gemma4ImagePreparer(checkpoint, budget)
            files = sorted((tmp / "images").iterdir())
            units = [preparer.prepare(decode_image(str(f))).units[0] for f in files]
            per_length = {u.length: tower_flops(tower, u) for u in {u.length: u for u in units}.values()}
            flops = sum(per_length[u.length] for u in units)  # FLOPs depend on the patch count alone
            for overlap in args.overlap.split(","):
                ref, ours, ratio, ratios = compare(
                    ckpt, tmp / "images", budget, tmp / "out.safetensors", args.repeats, overlap
                )
                limit = limits[torch.float32]
                print(
                    f"{budget:>6} {overlap:>7} {ref['items'] / ref['embed_s']:>9.2f} "
                    f"{ours['items'] / ours['embed_s']:>10.2f} {ratio:>5.2f}x {flops / args.images / 1e9:>9.2f} "
                    f"{100 * flops / ref['embed_s'] / limit:>9.1f}% {100 * flops / ours['embed_s'] / limit:>10.1f}%"
                    f"  {', '.join(f'{x:.2f}' for x in ratios)}",
                    flush=True,
                )
        if args.variants:
            variants(ckpt, tmp / "images", 280)


if __name__ == "__main__":
    sys.exit(main())
