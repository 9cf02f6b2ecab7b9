"""Where one batch of the release-size vision tower spends its time: the share in matmuls, attention, elementwise
kernels, layout copies, the rest, and the preprocessing beside it.

    python -m bench.bench_profile [--dtype bfloat16] [--budget 280] [--images 4] [--checkpoint DIR] [--repeats 3]
                                  [--tower release|small]

The random release-size Gemma 4 vision tower of bench_release (hidden 768, 16 layers, stored bf16), or with
`--tower small` bench_images' D=256 tower (4 layers, float32), `--images` photos of one size (one resolution
bucket). The tool's own path, in this process: `Embedder(ckpt,
dtype=...).encode(files)` once to warm up (oneDNN primitives, the allocator), then `--repeats` more under
torch.profiler; each operator's self CPU time is put in a category by its name (`CATEGORIES`), and the shares are
of the profiled operators' total. Beside it: the batch's wall time per encode, its FLOP/s as a share of this
process's matmul rate in the same dtype (`bench_release.matmul_rate` at the MLP's shape, measured just before;
the FLOPs and that shape from the checkpoint's own vision config),
and the preprocessing alone (the checkpoint's image processor on the same files, the tool's decode path) per image.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.common import cpu_name

# Categories by operator name, first match wins. Matmuls include the GEMMs inside linear and the patch embedder;
# attention is SDPA's fused CPU kernel (or the math path's batched products and softmax); layout copies are the
# operators that move bytes without computing (copy_, cat, contiguous, index, pad, to).
CATEGORIES = (
    ("attention", r"scaled_dot_product|flash_attention|_softmax|softmax|baddbmm"),
    ("matmul", r"^aten::(mm|addmm|bmm|matmul|linear|_mkl|mkldnn_|_addmm|addmv|mv)\b|onednn|mkldnn"),
    ("layout copies", r"copy_|^aten::(cat|contiguous|clone|index|index_select|gather|pad|constant_pad_nd|to|_to_copy|"
                      r"stack|narrow_copy|expand_as|repeat|flip|roll)$|empty_strided|new_zeros"),
    ("elementwise", r"^aten::(add|add_|mul|mul_|sub|sub_|div|div_|rsqrt|pow|mean|sum|gelu|silu|tanh|sigmoid|neg|exp|"
                    r"cos|sin|where|clamp|clamp_|masked_fill|maximum|minimum|sqrt|reciprocal|abs|fill_|zero_|zeros|"
                    r"ones|full|arange|ne|eq|lt|gt|ge|le|logical_and|logical_or|any|all|norm|layer_norm|"
                    r"native_layer_norm|square|float|type_as|rms_norm|_fused_rms_norm)$"),
)  # fmt: skip


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if re.search(pattern, name):
            return label
    return "other"


def attention_rate(dtype, heads: int, n: int, head_dim: int, seconds: float = 1.0) -> float:
    """FLOP/s (4 n^2 head_dim a head) of torch's fused attention on one image of n patches: the kernel both the
    tool and the per-item loop run, so the bound on what batching can gain where attention is most of the work."""
    import torch
    import torch.nn.functional as F

    q = torch.randn(1, heads, n, head_dim, dtype=dtype)
    F.scaled_dot_product_attention(q, q, q)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        F.scaled_dot_product_attention(q, q, q)
        count += 1
    return 4 * n * n * head_dim * heads * count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--budget", type=int, default=280, help="soft tokens an image")
    parser.add_argument("--images", type=int, default=4, help="photos of one size: one batch")
    parser.add_argument("--size", default="1024x768")
    parser.add_argument("--repeats", type=int, default=3, help="profiled encodes after the warm-up")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint bench_release built before")
    parser.add_argument("--tower", default="release", choices=["release", "small"], help="small: D=256, 4 layers")
    parser.add_argument("--top", type=int, default=12, help="operators listed by self time")
    args = parser.parse_args()

    import torch
    from helpers import write_image
    from make_tiny_checkpoint import build_gemma4
    from PIL import Image
    from transformers import AutoImageProcessor

    from bench.bench_release import build_checkpoint, flops_per_patch, matmul_rate
    from gemma_embed import Embedder
    from gemma_embed.device import cpu_bf16_units

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    width, height = (int(x) for x in args.size.split("x"))
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        tmp = Path(tmp)
        if args.checkpoint:
            ckpt = args.checkpoint
        elif args.tower == "small":  # bench_images' tower, stored float32
            ckpt = build_gemma4(tmp / "ckpt", seed=0, audio=False, vision_hidden=256, vision_layers=4)
        else:
            ckpt = build_checkpoint(tmp / "ckpt")
        vision = json.loads((Path(ckpt) / "config.json").read_text())["vision_config"]
        d, inner, layers = vision["hidden_size"], vision["intermediate_size"], vision["num_hidden_layers"]
        heads = vision["num_attention_heads"]
        files = []
        for i in range(args.images):
            files.append(tmp / f"photo{i}.jpg")
            write_image(files[-1], width, height, seed=i)
        embedder = Embedder(str(ckpt), device="cpu", dtype=args.dtype, max_soft_tokens=args.budget)
        embedder.encode([str(f) for f in files], modality="images")  # warm-up (and the model's load)
        limit = matmul_rate(dtype, k=d, n=inner)

        processor = AutoImageProcessor.from_pretrained(str(ckpt))
        patches_per_image = []
        start = time.perf_counter()
        for file in files:
            with Image.open(file) as img:
                prepared = processor([img.convert("RGB")], return_tensors="pt", max_soft_tokens=args.budget)
            patches_per_image.append(int((prepared["image_position_ids"] != -1).all(dim=-1).sum()))  # no padding
        patches = sum(patches_per_image)
        preprocessing = (time.perf_counter() - start) / len(files)

        walls = []
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities) as profile:
            for _ in range(args.repeats):
                start = time.perf_counter()
                embedder.encode([str(f) for f in files], modality="images")
                walls.append(time.perf_counter() - start)
        events = profile.key_averages()
        shares: Counter[str] = Counter()
        for event in events:
            shares[category(event.key)] += event.self_cpu_time_total
        total = sum(shares.values())
        flops = sum(n * flops_per_patch(n, d, inner, layers) for n in patches_per_image)
        wall = min(walls)
        print(
            f"# {cpu_name()}, {torch.get_num_threads()} threads, bf16 units {', '.join(cpu_bf16_units()) or 'none'}; "
            f"torch {torch.__version__}; vision tower D={d} I={inner} L={layers} in {args.dtype}; "
            f"{args.images} images of {width}x{height} at {args.budget} soft tokens "
            f"({patches // args.images} patches each): one bucket"
        )
        # The fused kernel's calls (its wrapper, aten::scaled_dot_product_attention, is counted apart): one a layer.
        forwards = max((e.count for e in events if category(e.key) == "attention"), default=0) // layers / args.repeats
        print(
            f"encode {wall:.3f} s for the {args.images} images ({forwards:g} tower forwards each; best of "
            f"{args.repeats}), {flops / wall / 1e9:.0f} GFLOP/s = "
            f"{100 * flops / wall / limit:.0f}% of this process's {args.dtype} matmul rate ({limit / 1e9:.0f} GFLOP/s "
            f"at 2304x{d} @ {d}x{inner}); preprocessing {1000 * preprocessing:.0f} ms an image alone "
            f"({100 * preprocessing * args.images / (preprocessing * args.images + wall):.0f}% of a batch's work)"
        )
        n = max(patches_per_image)
        attention = attention_rate(dtype, heads, n, d // heads)
        print(
            f"the attention kernel alone (SDPA, {heads} heads x {n} patches x {d // heads}): "
            f"{attention / 1e9:.0f} GFLOP/s = {100 * attention / limit:.0f}% of the matmul rate"
        )
        print("share of the profiled operators' self CPU time:")
        for label, value in shares.most_common():
            print(f"  {label:>14} {100 * value / total:5.1f}%")
        print(f"top {args.top} operators by self CPU time:")
        for event in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
            print(
                f"  {100 * event.self_cpu_time_total / total:5.1f}% {event.count:>6} calls  {category(event.key):>14}  "
                f"{event.key}"
            )


if __name__ == "__main__":
    main()
