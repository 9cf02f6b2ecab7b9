"""`gemma-embed dedup` and `gemma-embed map` at collection scale: time and peak memory.

    python -m bench.bench_dedup_map dedup --items 100000 [--width 768] [--method auto|exact|index] [--threshold 0.95]
    python -m bench.bench_dedup_map map   --items 100000 [--width 768]

Each run writes (once, reused, in a process of its own) an output of ITEMS unit float32 vectors of WIDTH in the
tool's layout (`output_for`): 100 Gaussian clusters (noise 0.8 around unit centres) with 1% exact and 1% near
repeats appended (`planted.with_repeats`, noise 0.1: cosine about 0.995 to their originals). Then, in a
fresh process (its VmHWM is the peak), the library call itself (`dedup` or `layout`) from reading the output to
the table; one JSON line with seconds, peak RSS, the vectors' bytes and the ratio of the two, and for dedup the
groups, items to drop, the method, the index path's recall (measured by the call, against the exact scan of
sampled items) and each stage's CPU and wall seconds (`dedup(timings=...)`: read, same content, train, cells and
codes, search, rescore, groups, table; or exact scan). The machine is shared with other agents: times are what
this run saw.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from bench.common import cpu_name, peak_rss

DATA = Path("/tmp/gemma-embed-bench-collection")


CLUSTERS = 100
CHUNK = 10_000
SHARD_ITEMS = 250_000


def output_for(items: int, width: int) -> Path:
    """The planted output of `items` vectors, written once (in a process of its own: `main`), a chunk at a time:
    CLUSTERS Gaussian clusters (unit centres, noise 0.8), then 1% exact and 1% near (noise 0.1) repeats of rows of
    the first chunk."""
    import torch

    from gemma_embed import FORMAT
    from gemma_embed.collection import planted
    from gemma_embed.store import output_files, shard_path, write_index
    from gemma_embed.store.tensors_file import write_embedding_file

    path = DATA / f"planted-{items}x{width}.safetensors"
    if output_files(path):
        return path
    DATA.mkdir(parents=True, exist_ok=True)
    repeats = items // 100
    base = items - 2 * repeats
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((CLUSTERS, width)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)

    def chunks():
        first = None
        for begin in range(0, base, CHUNK):
            count = min(CHUNK, base - begin)
            labels = (np.arange(begin, begin + count) * CLUSTERS) // base  # clusters in runs, as a walk finds them
            rows = centres[labels] + rng.standard_normal((count, width), dtype=np.float32) * (0.8 / width**0.5)
            rows /= np.linalg.norm(rows, axis=1, keepdims=True)
            first = rows if first is None else first
            yield rows
        copies, _ = planted.with_repeats(first, repeats, repeats, 0.1, seed=1)
        yield copies[len(first) :]

    def item_rows():
        for rows in chunks():
            tensor = torch.from_numpy(rows)
            yield from (tensor[i : i + 1] for i in range(len(tensor)))

    # shards of SHARD_ITEMS items and an index, as `--shard-size` writes them: safetensors refuses a header over
    # 100 MB, which 1M items' keys and metadata in one file would be
    keys = [f"i{i:07d}" for i in range(items)]
    rows = item_rows()
    files, located = [], []
    for number, begin in enumerate(range(0, items, SHARD_ITEMS)):
        part = keys[begin : begin + SHARD_ITEMS]
        metadata = {
            "format": FORMAT,
            **planted.HEADER,
            "keys": json.dumps(part),
            "items": json.dumps(
                [{"path": f"{k}.jpg", "sha256": f"{begin + j:064x}", "rows": 1} for j, k in enumerate(part)]
            ),
        }
        shard_rows = (next(rows) for _ in part)
        files.append(
            write_embedding_file(shard_path(path, number), metadata, [1] * len(part), width, torch.float32, shard_rows)
        )
        located += [(key, number) for key in part]
    write_index(path, files, located)
    return path


def run(args) -> dict:
    import gemma_embed
    from gemma_embed.collection import dedup, layout, tables  # noqa: F401 - imported before the baseline
    from gemma_embed.collection.tables import read_record

    path = output_for(args.items, args.width)
    from bench.common import reset_peak_rss

    baseline = reset_peak_rss()  # the interpreter with numpy, pyarrow and the tool imported: before any vector
    started, cpu = time.perf_counter(), time.process_time()
    stages: dict = {}
    if args.what == "dedup":
        table = gemma_embed.dedup(path, threshold=args.threshold, method=args.method, timings=stages)
    else:
        table = gemma_embed.layout(path, seed=0)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    record = read_record(table)
    vector_bytes = args.items * args.width * 4
    result = {
        "what": args.what,
        "items": args.items,
        "width": args.width,
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),  # both cores' CPU time: what a busy shared machine does not inflate
        "load_average": round(os.getloadavg()[0], 1),
        "peak_rss_mib": round(peak_rss() / 2**20),
        "vectors_mib": round(vector_bytes / 2**20),
        "peak_over_vectors": round(peak_rss() / vector_bytes, 2),
        "baseline_rss_mib": round(baseline / 2**20),
        "growth_over_vectors": round((peak_rss() - baseline) / vector_bytes, 2),
        "cpu": cpu_name(),
    }
    if stages:  # dedup's stages (`StageClock`): CPU seconds of every thread, and wall seconds
        result["stages_cpu"] = {name: round(spent["cpu"], 1) for name, spent in stages.items()}
        result["stages_wall"] = {name: round(spent["wall"], 1) for name, spent in stages.items()}
    keep = ("method", "threshold", "groups", "drop", "pairs", "recall", "settings", "clusters", "fitted_on")
    result.update({name: record[name] for name in keep if name in record})
    if args.what == "map":
        from sklearn.metrics import adjusted_rand_score  # against the planted clusters (repeats left out)

        base = args.items - 2 * (args.items // 100)
        planted_labels = (np.arange(base) * CLUSTERS) // base
        found = table["cluster"].to_numpy()[:base]
        result["adjusted_rand"] = round(float(adjusted_rand_score(planted_labels, found)), 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("dedup", "map"))
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--method", default="auto")
    parser.add_argument("--prepare", action="store_true", help="only write the output")
    args = parser.parse_args()
    if args.prepare:
        print(output_for(args.items, args.width))
        return
    from gemma_embed.store import output_files

    if not output_files(DATA / f"planted-{args.items}x{args.width}.safetensors"):  # in a process of its own
        import subprocess
        import sys

        command = [sys.executable, "-m", "bench.bench_dedup_map", args.what, "--prepare"]
        subprocess.run([*command, "--items", str(args.items), "--width", str(args.width)], check=True)
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
