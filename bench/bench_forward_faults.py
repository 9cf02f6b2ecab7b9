"""Page faults in CPU text forwards under glibc's allocator settings (issue 50).

    python -m bench.bench_forward_faults [--rounds 2] [--sizes]

One forward shape at a time, each allocator setting in its own fresh process (mallopt is process-wide and for good),
the settings alternated round by round, on bench_text's random 512-wide 8-layer text models (float32):
- "glibc's own": what a Python caller has unless it asks (`Embedder.encode` as is);
- "trim each": the command line's settings with the heap trimmed after every forward (as before issue 50);
- "kept": the command line's settings now: the heap kept for a decode window (`allocator.heap_kept()`).
Printed per shape and setting: the median wall time of 8 forwards after 2 warm ones, CPU and system CPU a forward,
minor page faults a forward. `--sizes` also sweeps the tokens a batch (512-16,384 at one rung) under glibc's own
settings and with the heap kept: tokens/s.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_text import build_checkpoint
from bench.common import cpu_name, emit, run_child

SETTINGS = ("glibc's own", "trim each", "kept")
SHAPES = ((37, 160), (28, 40))  # (texts, rung): a long rung's batch and a short one's, as 600 mixed lines make
SIZES = (512, 1024, 2048, 4096, 8192, 16384)


def forward_of(ckpt: str, setting: str):
    import torch

    from gemma_embed import Embedder, numerics
    from gemma_embed.memory import allocator

    if setting != "glibc's own":
        allocator.configure_for_long_runs()
    tower = Embedder(ckpt, device="cpu").load("text").engines[0].tower
    window = allocator.heap_kept() if setting == "kept" else contextlib.nullcontext()

    def forward(texts: int, rung: int) -> None:
        ids = torch.randint(5, 200, (texts, rung))
        mask = torch.ones(texts, rung, dtype=torch.long)
        mask[-1, rung // 2 :] = 0  # one padded text: the mask is built as in a ragged batch
        with allocator.heap_only(), torch.inference_mode(), numerics.aligned(torch.device("cpu")):
            tower.model(input_ids=ids, attention_mask=mask)

    return forward, window


def child_shape(ckpt: str, setting: str, texts: int, rung: int) -> dict:
    forward, window = forward_of(ckpt, setting)
    with window:
        for _ in range(2):
            forward(texts, rung)
        before, walls = resource.getrusage(resource.RUSAGE_SELF), []
        for _ in range(8):
            started = time.perf_counter()
            forward(texts, rung)
            walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / 8
    return {
        "wall_s": statistics.median(walls),
        "cpu_s": cpu,
        "system_s": (after.ru_stime - before.ru_stime) / 8,
        "faults": (after.ru_minflt - before.ru_minflt) / 8,
    }


def child_sizes(ckpt: str, setting: str, rung: int) -> dict:
    forward, window = forward_of(ckpt, setting)
    rates = {}
    with window:
        for tokens in SIZES:
            texts = max(1, tokens // rung)
            forward(texts, rung)
            repeats = max(2, SIZES[-1] // tokens)
            started = time.perf_counter()
            for _ in range(repeats):
                forward(texts, rung)
            rates[tokens] = texts * rung * repeats / (time.perf_counter() - started)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", action="store_true")
    parser.add_argument("--child", nargs="+")
    args = parser.parse_args()
    if args.child:
        kind, ckpt, setting, *numbers = args.child
        emit(
            child_shape(ckpt, setting, *map(int, numbers))
            if kind == "shape"
            else child_sizes(ckpt, setting, *map(int, numbers))
        )
        return
    print(f"# {cpu_name()}; random 512-wide 8-layer text models, float32; {args.rounds} rounds, settings alternated")
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        for family in ("embeddinggemma2", "embeddinggemma"):
            ckpt = build_checkpoint(family, Path(tmp) / family)
            print(f"\n## {family}")
            print("| batch | setting | wall a forward (rounds) | / glibc's own | CPU | system CPU | faults |")
            print("|---|---|---|---|---|---|---|")
            for texts, rung in SHAPES:
                runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
                for r in range(args.rounds):
                    for setting in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
                        record = run_child(
                            "bench_forward_faults", "--child", "shape", ckpt, setting, str(texts), str(rung)
                        )
                        runs[setting].append(record)
                own = statistics.median(x["wall_s"] for x in runs[SETTINGS[0]])
                for setting in SETTINGS:
                    xs = runs[setting]
                    wall = statistics.median(x["wall_s"] for x in xs)
                    print(
                        f"| {texts} x {rung} | {setting} | {1e3 * wall:.0f} ms "
                        f"({', '.join('%.0f' % (1e3 * x['wall_s']) for x in xs)}) | {wall / own:.2f} | "
                        f"{1e3 * statistics.median(x['cpu_s'] for x in xs):.0f} ms | "
                        f"{1e3 * statistics.median(x['system_s'] for x in xs):.0f} ms | "
                        f"{statistics.median(x['faults'] for x in xs):,.0f} |",
                        flush=True,
                    )
            if args.sizes:
                print(f"\n| rung | setting | {' | '.join(f'{t:,}' for t in SIZES)} |\n|---|---|{'---|' * len(SIZES)}")
                for rung in (64, 160):
                    for setting in ("glibc's own", "kept"):
                        rates = run_child("bench_forward_faults", "--child", "sizes", ckpt, setting, str(rung))
                        print(
                            f"| {rung} | {setting} | {' | '.join(f'{rates[str(t)]:,.0f}' for t in SIZES)} |", flush=True
                        )


if __name__ == "__main__":
    sys.exit(main())
