"""What the search index's checks cost a query: the same query through an intact index, by the code before the checks
and by the code with them, side by side.

    python -m bench.bench_index_checks [--before REV] [--rows 200000] [--dim 384] [--kinds ivf,flat] [--shards 1,4]
        [--pairs 200]

The code before is `git archive REV gemma_embed` (default: the commit before the checks) unpacked in a temporary
folder; each side builds its own index (the earlier one writes gemma-embed-search/1 files, which the checks refuse)
over its own copy of the same output (ROWS x DIM float16 vectors, clustered, written by the tool's writer as one
file, and as 4 shards with an OUT.index.json: opening a sharded output's index parses the shard index, which the
code before did twice a query and the checks' code does once; one file shows the checks' own cost).

Each side is one long-lived process with that side's package first on its path; after one untimed search (the
files in the page cache, the imports done) the two are sent the same query in turn, one at a time (A B, then B A,
...), PAIRS times, and each times its own search: one query, opening the index anew as every `gemma-embed search`
command does (record, fingerprint, table, faiss file; with the checks: the record's fields and names, each file's
sampled content digest, the table's arrays and sampled norms, the faiss file's digest, kind, width and count),
answering it (k=10). Both sides must find the same keys. The model that embeds a command's queries is left out: it
is the same on both sides and larger than either. Taking the queries in turn puts the other processes of a shared
machine on both sides alike; the ratio is the median of the pairs' after/before ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bench_search import write_collection
from bench.common import cpu_name

ROOT = Path(__file__).resolve().parents[1]
BEFORE_REV = "51aaa22"  # the branch point of issue 31's first half: the index trusted size and time alone
PAIRS = 200
HEADER = {"model": "bench", "modality": "text", "space": "retrieval"}

CHILD = """
import json, sys, time
import numpy as np, torch
from gemma_embed.search import search_many
output, queries = sys.argv[1], torch.from_numpy(np.load(sys.argv[2]))
search_many(output, queries[:1], k=10)  # the files in the page cache, the imports done
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    start = time.perf_counter()
    hits = search_many(output, queries[n % len(queries)][None], k=10)
    took = time.perf_counter() - start
    assert len(hits[0]) == 10
    print(json.dumps({"s": took, "keys": [h.key for h in hits[0]]}), flush=True)
"""


class Side:
    """One side's long-lived process: it answers one query a line, timing the search inside itself."""

    def __init__(self, code: Path, output: Path, queries: Path):
        env = {**os.environ, "PYTHONPATH": str(code)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(output), str(queries)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=code,
        )
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{code}: the search process did not start")

    def query(self, n: int) -> dict:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _archive(rev: str, into: Path) -> Path:
    """The package as of `rev`, unpacked under `into` (a folder to put first on PYTHONPATH)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", rev, "gemma_embed"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _run(code: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, check=False, cwd=code)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _build(code: Path, output: Path, kind: str) -> None:
    build = "import sys; from gemma_embed.index import build_index; build_index(sys.argv[1], sys.argv[2]); print('{}')"
    _run(code, "-c", build, str(output), kind)


def _copy_and_index(source: Path, folder: Path, code: Path, kind: str) -> Path:
    """A copy of the output in `folder`, indexed by `code`."""
    folder.mkdir()
    for file in source.parent.glob("collection*"):
        shutil.copy2(file, folder / file.name)
    _build(code, folder / source.name, kind)
    return folder / source.name


def _alternate(sides: dict[str, Path], outputs: dict[str, Path], queries: Path, pairs: int) -> dict[str, list[float]]:
    """Each side's search times of the same queries, sent to them in turn."""
    running = {name: Side(sides[name], outputs[name], queries) for name in sides}
    times: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for n in range(pairs):
            order = list(sides) if n % 2 == 0 else list(reversed(sides))
            answers = {name: running[name].query(n) for name in order}
            assert answers["before"]["keys"] == answers["after"]["keys"], "the two sides answered differently"
            for name in sides:
                times[name].append(answers[name]["s"])
    finally:
        for side in running.values():
            side.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE_REV, help="the commit whose code is the side without checks")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--kinds", default="ivf,flat")
    parser.add_argument("--shards", default="1,4", help="output files: one, and shards with an OUT.index.json")
    parser.add_argument("--pairs", type=int, default=PAIRS)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-index-checks-"))
    try:
        sides = {"before": _archive(args.before, work / "before-code"), "after": ROOT}
        sys.path.insert(0, str(ROOT))
        queries = work / "queries.npy"
        import numpy as np
        import torch

        generator = torch.Generator().manual_seed(7)
        np.save(queries, torch.nn.functional.normalize(torch.randn(64, args.dim, generator=generator), dim=1).numpy())
        print(f"# {cpu_name()}, {os.cpu_count()} CPUs; {args.rows} x {args.dim} float16; before = {args.before}")
        print("# one query at a time to each side in turn (A B, B A, ...), each search opening the index anew")
        for shards in (int(n) for n in args.shards.split(",")):
            source = write_collection(work / f"data-{shards}", args.rows, args.dim, "clustered", HEADER, shards)
            for kind in args.kinds.split(","):
                outputs = {
                    name: _copy_and_index(source, work / f"{name}-{shards}-{kind}", code, kind)
                    for name, code in sides.items()
                }
                times = _alternate(sides, outputs, queries, args.pairs)
                ratios = [a / b for a, b in zip(times["after"], times["before"], strict=True)]
                before, after = statistics.median(times["before"]), statistics.median(times["after"])
                low, _, high = statistics.quantiles(ratios, n=4)
                print(
                    f"{shards} file(s) {kind:>4}: before {before * 1e3:7.2f} ms, after {after * 1e3:7.2f} ms a query "
                    f"(medians of {args.pairs}); after/before {statistics.median(ratios):.3f} (median of the pairs' "
                    f"ratios; quartiles {low:.3f}, {high:.3f})"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
