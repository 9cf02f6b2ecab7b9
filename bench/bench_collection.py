"""`gemma-embed dedup` and `gemma-embed map` at collection scale: time and peak memory.

    python -m bench.bench_collection dedup --items 100000 [--width 768] [--method auto|exact|index] [--threshold 0.95]
    python -m bench.bench_collection map   --items 100000 [--width 768]

Each run writes (once, reused) an output of ITEMS unit float32 vectors of WIDTH in the tool's layout
(`collection.planted.write_vectors`): 100 Gaussian clusters (`planted.gaussian_clusters`, spread 0.8) with 1% exact
and 1% near repeats appended (`planted.with_repeats`, noise 0.1: cosine about 0.995 to their originals). Then, in a
fresh process (its VmHWM is the peak), the library call itself (`dedup` or `layout`) from reading the output to
the table; one JSON line with seconds, peak RSS, the vectors' bytes and the ratio of the two, and for dedup the
groups, items to drop, the method and the index path's recall (measured by the call, against the exact scan of
sampled items). The machine is shared with other agents: times are what this run saw.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import cpu_name, peak_rss

DATA = Path("/tmp/gemma-embed-bench-collection")


def output_for(items: int, width: int) -> Path:
    """The planted output of `items` vectors (99% clustered, 1% exact, 1% near repeats), written once."""
    from gemma_embed.collection import planted

    path = DATA / f"planted-{items}x{width}.safetensors"
    if path.exists():
        return path
    DATA.mkdir(parents=True, exist_ok=True)
    repeats = items // 100
    base, _ = planted.gaussian_clusters(100, -(-(items - 2 * repeats) // 100), width, spread=0.8, seed=0)
    base = base[: items - 2 * repeats]
    vectors, _ = planted.with_repeats(base, repeats, repeats, 0.1, seed=1)
    planted.write_vectors(path, vectors)
    return path


def run(args) -> dict:
    import gemma_embed
    from gemma_embed.collection.tables import read_record

    path = output_for(args.items, args.width)
    started = time.perf_counter()
    if args.what == "dedup":
        table = gemma_embed.dedup(path, threshold=args.threshold, method=args.method)
    else:
        table = gemma_embed.layout(path, seed=0)
    seconds = time.perf_counter() - started
    record = read_record(table)
    vector_bytes = args.items * args.width * 4
    result = {
        "what": args.what,
        "items": args.items,
        "width": args.width,
        "seconds": round(seconds, 1),
        "peak_rss_mib": round(peak_rss() / 2**20),
        "vectors_mib": round(vector_bytes / 2**20),
        "peak_over_vectors": round(peak_rss() / vector_bytes, 2),
        "cpu": cpu_name(),
    }
    keep = ("method", "threshold", "groups", "drop", "pairs", "recall", "settings", "clusters", "fitted_on")
    result.update({name: record[name] for name in keep if name in record})
    if args.what == "map":
        from sklearn.metrics import adjusted_rand_score  # against the planted clusters (repeats left out)

        repeats = args.items // 100
        planted_labels = np.repeat(np.arange(100), -(-(args.items - 2 * repeats) // 100))[: args.items - 2 * repeats]
        found = table["cluster"].to_numpy()[: len(planted_labels)]
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
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
