"""Where the time of one text run goes: `Embedder.encode` on bench_text's corpus, on a random EmbeddingGemma (2)
checkpoint of bench_text's width (issue 50).

    python -m bench.profile_text [--family embeddinggemma2|embeddinggemma] [--lines 600] [--corpus mixed]
                                 [--replays 3]

One process. The run is timed as a user's call is (model loaded first), with every forward's wall time and every
text's preparation (tokenization: the preparer's `prepare`, in the decode workers) recorded on the way. Then the
run's own batches are replayed, at the thread count the run used:
- under torch's profiler, for the forwards' operator time by kind: GEMMs (aten::addmm, mm, bmm: MKL),
  attention (the scaled-dot-product kernels, softmax), and every other operator (norms, GELU, rotary, masks,
  copies: "elementwise and other");
- without the profiler, alternately with and without `numerics.aligned()` (the TorchFunctionMode that keeps the
  bytes the same at every thread count: issue 46); the difference is what the mode costs;
Printed: the run's wall and CPU seconds; the forwards' share of the wall; within the forwards the kinds above and
"Python in the forward" (the forwards' unprofiled wall less their operators: transformers' modules, the mask
building, the mode); the mode's cost; tokenization (CPU seconds in the decode workers, which overlap the forwards)
and the Python between batches (the wall outside the forwards: batching, the tuner, moving rows to the writer,
waiting for windows); the run's system CPU time and minor page faults (fresh pages the kernel zeroes: glibc hands a
forward's freed activations back and the next forward faults them in again unless the heap is kept,
memory/allocator.py). `--allocator cli` runs with the command line's allocator settings
(`gemma_embed.configure_for_long_runs()`); the default is a Python caller's, glibc's own. The thread count and the
CPU name head the output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.bench_text import build_checkpoint, read_lines, write_corpus
from bench.common import cpu_name

GEMM_OPS = {"aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm"}
ATTENTION_MARKS = ("scaled_dot_product", "softmax", "flash_attention")
TOP_OPS = 12  # operators listed by their own time


def kind_of(op: str) -> str:
    if op in GEMM_OPS:
        return "GEMM"
    if any(mark in op for mark in ATTENTION_MARKS):
        return "attention"
    return "elementwise and other"


def profile(ckpt: str, lines: list[str], replays: int) -> dict:
    import torch

    from gemma_embed import Embedder, numerics
    from gemma_embed.engine import Engine
    from gemma_embed.memory import allocator

    embedder = Embedder(ckpt, device="cpu")
    command = embedder.load("text")
    engine = command.engines[0]
    preparer = command.stages.preparer

    forwards: list[tuple[list, int, float]] = []  # (units, threads, seconds)
    prepare_cpu = [0.0]
    lock = threading.Lock()
    encode = Engine._encode

    def timed_encode(self, batch):
        started = time.perf_counter()
        try:
            return encode(self, batch)
        finally:
            forwards.append((list(batch), torch.get_num_threads(), time.perf_counter() - started))

    def timed_prepare(original):
        def prepare(item):
            started = time.thread_time()
            try:
                return original(item)
            finally:
                with lock:
                    prepare_cpu[0] += time.thread_time() - started

        return prepare

    Engine._encode = timed_encode
    preparer.prepare = timed_prepare(preparer.prepare)
    usage_before, wall_before = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    embedder.encode(lines, modality="text")
    wall = time.perf_counter() - wall_before
    usage = resource.getrusage(resource.RUSAGE_SELF)  # CPU (user and system) and faults from the one reading
    cpu = usage.ru_utime + usage.ru_stime - usage_before.ru_utime - usage_before.ru_stime
    Engine._encode = encode

    tower = engine.tower
    threads = statistics.mode(t for _, t, _ in forwards)

    def replay(mode) -> float:
        torch.set_num_threads(threads)
        started = time.perf_counter()
        with torch.inference_mode(), mode, allocator.heap_kept():  # as a window's forwards run (the engine's scopes)
            for units, _, _ in forwards:
                with allocator.heap_only():
                    tower.encode(units, engine.space)
        return time.perf_counter() - started

    with_mode, without_mode = [], []
    for _ in range(replays):  # alternated: the machine's drift falls on both sides
        with_mode.append(replay(numerics.aligned(torch.device("cpu"))))
        without_mode.append(replay(contextlib.nullcontext()))

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        replay(numerics.aligned(torch.device("cpu")))
    top = {event.key: event.self_cpu_time_total / 1e6 for event in prof.key_averages()}
    kinds: dict[str, float] = {}
    for op, seconds in top.items():
        kinds[kind_of(op)] = kinds.get(kind_of(op), 0.0) + seconds
    forward_wall = sum(s for _, _, s in forwards)
    replay_wall = statistics.median(with_mode)
    scale = forward_wall / replay_wall  # the run's forwards against the replay's: the same batches
    ops = sum(kinds.values())
    return {
        "cpu": cpu_name(),
        "threads": threads,
        "batches": len(forwards),
        "wall_s": wall,
        "cpu_s": cpu,
        "system_cpu_s": usage.ru_stime - usage_before.ru_stime,
        "minor_faults": usage.ru_minflt - usage_before.ru_minflt,
        "forwards_s": forward_wall,
        "between_batches_s": wall - forward_wall,
        "tokenization_cpu_s": prepare_cpu[0],
        "replay_with_mode_s": with_mode,
        "replay_without_mode_s": without_mode,
        "mode_cost_s": (statistics.median(with_mode) - statistics.median(without_mode)) * scale,
        "kinds_s": {k: v * scale for k, v in kinds.items()},
        "python_in_forward_s": max(0.0, forward_wall - ops * scale),
        "top_ops_s": {k: v * scale for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:TOP_OPS]},
        "padding": engine.padding_share(),
    }


def table(result: dict) -> str:
    wall = result["wall_s"]

    def row(name: str, seconds: float) -> str:
        return f"| {name} | {seconds:.2f} s | {100 * seconds / wall:.0f}% |"

    lines = [
        f"{result['cpu']}, {result['threads']} threads, {result['batches']} batches, "
        f"padding {100 * result['padding']:.1f}%; run {wall:.2f} s wall, {result['cpu_s']:.2f} s CPU",
        "",
        "| part | seconds | share of the run's wall |",
        "|---|---|---|",
        row("forwards (all)", result["forwards_s"]),
    ]
    for kind in ("GEMM", "attention", "elementwise and other"):
        lines.append(row(f"- {kind} (operators)", result["kinds_s"].get(kind, 0.0)))
    lines += [
        row("- Python in the forward (modules, masks, the mode)", result["python_in_forward_s"]),
        row("  of it the dispatch mode (replay with - without)", result["mode_cost_s"]),
        row("Python between batches (wall outside the forwards)", result["between_batches_s"]),
        row("tokenization (CPU in the decode workers, overlapped)", result["tokenization_cpu_s"]),
        f"| system CPU (page faults, the allocator's calls) | {result['system_cpu_s']:.2f} s | "
        f"{100 * result['system_cpu_s'] / result['cpu_s']:.0f}% of the CPU time; "
        f"{result['minor_faults']:,} minor faults |",
    ]
    lines += ["", "operators by their own time: " + ", ".join(f"{k} {v:.2f} s" for k, v in result["top_ops_s"].items())]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["embeddinggemma2", "embeddinggemma"], default="embeddinggemma2")
    parser.add_argument("--lines", type=int, default=600)
    parser.add_argument("--corpus", default="mixed")
    parser.add_argument("--replays", type=int, default=3)
    parser.add_argument("--checkpoint", help="an existing checkpoint folder (else one is built)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON too")
    parser.add_argument("--allocator", choices=["python", "cli"], default="python", help="glibc's, or the CLI's")
    args = parser.parse_args()
    if args.allocator == "cli":
        import gemma_embed

        gemma_embed.configure_for_long_runs()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ckpt = args.checkpoint or build_checkpoint(args.family, folder / "ckpt")
        write_corpus(folder / "corpus.txt", args.corpus, args.lines)
        result = profile(ckpt, read_lines(str(folder / "corpus.txt")), args.replays)
    print(f"## {args.family}, {args.lines} {args.corpus} lines, {args.allocator} allocator")
    print(table(result))
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
