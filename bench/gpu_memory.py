"""Peak device memory against the planned budget, and the chunk chosen per bucket, on a real device.

    python -m bench.gpu_memory [--device cuda] [--dtype auto] [--images 96] [--budgets 70,280,1120]
                               [--vision-hidden 768 --vision-layers 16] [--memory-budget auto] [--batch-size N]

Builds a random Gemma 4 checkpoint whose vision tower has the real size by default (hidden 768, intermediate
3072, 16 layers, 12 heads: 167M parameters), stored in bf16 as real ones are; writes images of twelve aspect ratios,
runs `pipeline.run` once per soft-token budget, and prints per bucket (patch count):
- units, the budget the planner had for it, the modelled cost per unit, the memory cap on the chunk;
- the chunk sizes the engine ran and the one the tuner's chosen work per batch gives at the bucket's length;
- the largest chunk's measured transient (peak allocated during the chunk less what was allocated before it) against
  its modelled cost and against the budget;
then the run's peak device memory against the weights plus the largest budget, the cost scale the engine learned,
and the allocator's state after the run (driver free, reserved, allocated, and the free memory the planner
counts). Exits 1 if a chunk's measured transient went over its budget. With the default rule a big GPU's budget
is far above what a few images per bucket need; `--memory-budget 1GiB --batch-size 64` makes chunks run at the
memory cap, so the measured transient is compared with a budget it actually reaches. On the CPU there are no
allocator statistics: the measured columns say n/a.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

import torch

MIB = 2**20


def human(n: int | None) -> str:
    return "n/a" if n is None else f"{n / MIB:,.0f} MiB"


class Recorder:
    """Wraps the engine's plan and _encode to record, per bucket length, the plan and each chunk's measurement."""

    def __init__(self):
        self.plans: dict[int, object] = {}
        self.units: dict[int, int] = {}
        self.chunks: dict[int, list[tuple[int, int, int | None]]] = {}  # length -> (size, modelled, transient)
        self.weights = 0
        self.length = 0  # the bucket the engine is running
        self.engine = None

    def install(self, engine_cls) -> None:
        recorder = self
        plan, encode, run = engine_cls.plan, engine_cls._encode, engine_cls.run

        def recorded_plan(self, length):
            chunk_plan = plan(self, length)
            recorder.plans[length] = chunk_plan
            return chunk_plan

        def recorded_run(self, units, group, keys, on_rows):
            recorder.units[group.length] = recorder.units.get(group.length, 0) + len(group.indices)
            recorder.weights = sum(p.numel() * p.element_size() for p in self.tower.tower.parameters())
            recorder.length, recorder.engine = group.length, self
            return run(self, units, group, keys, on_rows)

        def recorded_encode(self, batch):
            before = self.device_ops.allocated()
            rows = encode(self, batch)
            peak = self.device_ops.peak()
            transient = None if peak is None else peak - before
            modelled = sum(self.tower.unit_cost(u.length) for u in batch)
            recorder.chunks.setdefault(recorder.length, []).append((len(batch), modelled, transient))
            return rows

        engine_cls.plan, engine_cls._encode, engine_cls.run = recorded_plan, recorded_encode, recorded_run


def run_budget(ckpt: Path, images: Path, out: Path, budget: int, args) -> tuple[object, Recorder]:
    from gemma_embed import pipeline
    from gemma_embed.config import RunConfig
    from gemma_embed.engine import Engine
    from gemma_embed.progress import Reporter

    recorder = Recorder()
    saved = Engine.plan, Engine._encode, Engine.run
    recorder.install(Engine)
    config = RunConfig(
        modality="images",
        inputs=(str(images),),
        output=out,
        model=str(ckpt),
        device=args.device,
        dtype=args.dtype,
        overwrite=True,
        max_soft_tokens=budget,
        memory_budget=args.memory_budget,
        batch_size=args.batch_size,
    )
    try:
        result = pipeline.run(config, Reporter(quiet=True, stdout=io.StringIO()))
    finally:
        Engine.plan, Engine._encode, Engine.run = saved
    assert result.failed == 0, result.failures
    return result, recorder


def report(budget: int, result, recorder: Recorder) -> bool:
    """Print one budget's table; False if a chunk's measured transient went over its planned budget."""
    print(f"\n## {budget} soft tokens: {result.ok} images, {result.seconds:.1f} s, dtype {result.dtype}")
    print(
        f"{'patches':>8} {'units':>6} {'budget':>12} {'cost/unit':>11} {'cap':>5} {'chosen':>7}  "
        f"{'largest chunk: modelled':>24} {'measured':>12} {'of budget':>9}  chunks run"
    )
    within = True
    for length in sorted(recorder.plans):
        plan, chunks = recorder.plans[length], recorder.chunks.get(length, [])
        size, modelled, transient = max(chunks, key=lambda c: (c[2] or 0, c[0]))
        work = result.chunking.get("chosen")  # the tuned work (patches) a batch, one for the stage
        chosen = "fixed" if work is None else max(1, work // length)
        share = "n/a" if transient is None else f"{100 * transient / max(1, plan.budget):.0f}%"
        if transient is not None and transient > plan.budget:
            within = False
            share += " OVER"
        print(
            f"{length:>8} {recorder.units[length]:>6} {human(plan.budget):>12} {human(plan.cost_per_unit):>11} "
            f"{plan.chunk:>5} {chosen!s:>7}  {size:>4} units {human(modelled):>12} {human(transient):>12} "
            f"{share:>9}  {','.join(str(c[0]) for c in chunks)}"
        )
    largest = max(plan.budget for plan in recorder.plans.values())
    print(
        f"run peak device memory {human(result.peak_device_memory)}; weights {human(recorder.weights)} + largest "
        f"budget {human(largest)} = {human(recorder.weights + largest)}; out-of-memory back-offs "
        f"{result.oom_backoffs}; cost scale learned {recorder.engine.cost_scale:.2f}"
    )
    return within


def allocator_state(device: str) -> None:
    from gemma_embed.memory import readings

    if torch.device(device).type != "cuda":
        return
    driver_free, total = torch.cuda.mem_get_info(device)
    reserved, allocated = torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)
    planner_free, _ = readings.device_memory(device)
    print(
        f"allocator after the runs: driver free {human(driver_free)} of {human(total)}, reserved {human(reserved)}, "
        f"allocated {human(allocated)}; the planner counts {human(planner_free)} free (driver free + reserved - "
        f"allocated)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--budgets", default="70,280,1120")
    parser.add_argument("--vision-hidden", type=int, default=768)
    parser.add_argument("--vision-layers", type=int, default=16)
    parser.add_argument("--memory-budget", default=None, help="as --memory-budget (default: the planner's rule)")
    parser.add_argument("--batch-size", type=int, default=None, help="as --batch-size (default: tuned)")
    args = parser.parse_args()

    from make_tiny_checkpoint import build_gemma4

    from bench.bench_images import make_images

    heads = max(1, args.vision_hidden // 64)
    with tempfile.TemporaryDirectory(prefix="gpu-memory-") as tmp:
        tmp = Path(tmp)
        ckpt = build_gemma4(
            tmp / "ckpt",
            seed=0,
            audio=False,
            vision_hidden=args.vision_hidden,
            vision_layers=args.vision_layers,
            vision_heads=heads,
            vision_intermediate=4 * args.vision_hidden,
            position_embedding_size=10240,
            dtype=torch.bfloat16,  # stored as real Gemma 4 checkpoints are: --dtype auto runs it in bf16 on a GPU
        )
        make_images(tmp / "images", args.images)
        name = torch.cuda.get_device_name(args.device) if torch.device(args.device).type == "cuda" else "cpu"
        print(
            f"# {name}; torch {torch.__version__}; vision tower hidden {args.vision_hidden}, "
            f"{args.vision_layers} layers, {heads} heads; {args.images} images; memory budget "
            f"{args.memory_budget or 'min(free/2, total/10)'}; chunk {args.batch_size or 'tuned'}"
        )
        within = True
        for budget in (int(b) for b in args.budgets.split(",")):
            result, recorder = run_budget(ckpt, tmp / "images", tmp / "out.safetensors", budget, args)
            within &= report(budget, result, recorder)
        allocator_state(args.device)
    print("every chunk stayed within its planned budget" if within else "A CHUNK WENT OVER ITS PLANNED BUDGET")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
