"""Search at collection scale: gemma-embed's exact and indexed search against numpy and faiss on the same vectors.

    python -m bench.bench_search collection [--rows 100000] [--dim 768] [--data random|clustered] [--rounds 1]
    python -m bench.bench_search text200k   [--rows 200000]

`collection`: ROWS x DIM float16 vectors (random unit vectors, or a mixture of gaussians normalised) written in the
tool's layout with its own writer (4 shards), and 100 queries (random, or drawn from the same mixture). Each side
runs in its own process (its VmHWM is its peak RAM), sides one after another (`--rounds` alternates them again):
- tool-index: `gemma-embed index` (build time; auto's choice), then search through it;
- tool-flat: `gemma-embed index --kind flat` (the row table alone), then search (exact) through it;
- tool-exact: `search --exact` through the library (the row table written by `index`, rows memory-mapped);
- numpy: the rows as float32 in RAM, matrix-vector product + argpartition (100 queries: one matrix product);
- faiss-flat: IndexFlatIP, float32; faiss-sq16: IndexScalarQuantizer fp16 (faiss's flat float16).
Per side: build/load time, one-query latency (median of 7 queries), per-query time of 100 queries in one call,
recall@10 against numpy's exact top 10, VmHWM.

`text200k`: the issue's text collection: ROWS random unit float16 vectors of the tiny EmbeddingGemma 2 sample's
width, under the header of a real run of that model (so `search --queries` embeds real queries with it); then
`gemma-embed index`, and 100 `--queries` lines in one run of the command, with the index and with `--exact`
(recall@10 of the index against exact), and per query: the library's search of the same 100 query vectors with the
index and exact, against numpy float32 in RAM (matrix-vector product + argpartition, one query at a time).

The machine is shared with other agents: numbers are medians of what this run saw; ratios between sides measured
in the same run hold better than the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import cpu_name

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "tiny-embeddinggemma2"
QUERIES = 100
SINGLE_REPEATS = 7
K = 10


def _vmhwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return -1.0


# ------------------------------------------------------------------------------------------ data


def write_collection(folder: Path, rows: int, dim: int, data: str, header: dict, shards: int = 4) -> Path:
    """ROWS unit float16 vectors in the tool's layout (its writer), keys r0000000...; reused when present."""
    import torch

    from gemma_embed.store import EmbeddingWriter, output_files

    path = folder / "collection.safetensors"
    if output_files(path):
        return path
    folder.mkdir(parents=True, exist_ok=True)
    writer = EmbeddingWriter(
        path, header, output_dtype="float16", shard_size=-(-rows // shards), flush_seconds=float("inf")
    )
    generator = torch.Generator().manual_seed(0)
    centers = torch.randn(1000, dim, generator=generator)
    for start in range(0, rows, 10_000):
        count = min(10_000, rows - start)
        block = _draw(count, dim, data, centers, generator)
        for offset, row in enumerate(block):
            writer.add(f"r{start + offset:07d}", row[None], {"path": f"/data/{start + offset:07d}.txt"}, start + offset)
    writer.close()
    return path


def _draw(count: int, dim: int, data: str, centers, generator):
    import torch

    if data == "random":
        return torch.nn.functional.normalize(torch.randn(count, dim, generator=generator), dim=1)
    picks = torch.randint(0, len(centers), (count,), generator=generator)
    noise = torch.randn(count, dim, generator=generator)
    return torch.nn.functional.normalize(centers[picks] + 0.6 * noise, dim=1)


def write_queries(folder: Path, dim: int, data: str) -> Path:
    import torch

    path = folder / "queries.npy"
    if not path.exists():
        generator = torch.Generator().manual_seed(0)
        centers = torch.randn(1000, dim, generator=generator)  # the collection's mixture
        np.save(path, _draw(QUERIES, dim, data, centers, torch.Generator().manual_seed(99)).numpy())
    return path


def _stored_rows_float32(output: Path) -> np.ndarray:
    """Every row as float32 in RAM (one copy), read from the output's files."""
    from gemma_embed.store import output_files
    from gemma_embed.store.row_table import STORED_DTYPES, TableFile, read_file_header

    parts = []
    for file in output_files(output):
        _, tensors, start = read_file_header(file)
        entry = tensors["embeddings"]
        assert entry["dtype"] in STORED_DTYPES
        view = TableFile(file, start + entry["data_offsets"][0], entry["dtype"], *entry["shape"]).rows_view()
        parts.append(view)
    out = np.empty((sum(len(p) for p in parts), parts[0].shape[1]), np.float32)
    done = 0
    for part in parts:
        out[done : done + len(part)] = part
        done += len(part)
    return out


# ------------------------------------------------------------------------------------------ sides


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def side(name: str, output: Path, queries_file: Path) -> dict:
    queries = np.load(queries_file)
    queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    result: dict = {"side": name}
    if name in ("tool-index", "tool-flat", "tool-exact"):
        import torch

        from gemma_embed.index import build_index, open_index
        from gemma_embed.search import search_many

        exact = name == "tool-exact"
        if not exact:
            build_s, record = _timed(lambda: build_index(output, "flat" if name == "tool-flat" else "auto"))
            result.update(build_s=build_s, kind=record["kind"], settings=record["settings"])
            result["reason"] = record.get("reason")
        load_s, opened = _timed(lambda: open_index(output, exact=exact))
        result["load_s"] = load_s
        q = torch.from_numpy(queries).float()

        def ask(rows):
            return search_many(output, rows, K, exact=exact, opened=opened)

    elif name == "numpy":
        load_s, rows = _timed(lambda: _stored_rows_float32(output))
        result["load_s"] = load_s
        q = queries.astype(np.float32)

        def ask(batch):
            scores = batch @ rows.T if len(batch) > 1 else (rows @ batch[0])[None]
            top = np.argpartition(-scores, K, axis=1)[:, :K]
            order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1)
            return np.take_along_axis(top, order, 1)

    else:
        import faiss

        def build():
            rows = _stored_rows_float32(output)
            rows /= np.linalg.norm(rows, axis=1, keepdims=True)
            if name == "faiss-flat":
                index = faiss.IndexFlatIP(rows.shape[1])
            else:
                index = faiss.IndexScalarQuantizer(
                    rows.shape[1], faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
                )
            index.add(rows)
            return index

        load_s, index = _timed(build)
        result["load_s"] = load_s
        q = queries.astype(np.float32)

        def ask(batch):
            return index.search(np.ascontiguousarray(batch), K)[1]

    ask(q[:1])  # warm: page cache, first-call costs
    singles = [_timed(lambda i=i: ask(q[i : i + 1]))[0] for i in range(SINGLE_REPEATS)]
    many_s, found = _timed(lambda: ask(q))
    result["one_query_ms"] = statistics.median(singles) * 1e3
    result["per_query_of_100_ms"] = many_s / len(q) * 1e3
    result["ids"] = [
        [int(h.key[1:]) for h in hits] if not isinstance(hits, np.ndarray) else [int(i) for i in hits] for hits in found
    ]
    result["vmhwm_mib"] = _vmhwm_mib()
    return result


def _run_side(name: str, output: Path, queries: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_search", "side", name, str(output), str(queries)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"side {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def recall(found: list[list[int]], truth: list[list[int]]) -> float:
    return float(np.mean([len(set(a[:K]) & set(b[:K])) / K for a, b in zip(found, truth, strict=True)]))


def collection(args) -> None:
    folder = args.folder / f"{args.data}-{args.rows}x{args.dim}"
    header = {"model": "synthetic", "space": "retrieval", "modality": "text", "pooling": "mean", "dim": ""}
    with_time = _timed(lambda: write_collection(folder, args.rows, args.dim, args.data, header))
    output, queries = with_time[1], write_queries(folder, args.dim, args.data)
    print(
        f"# {cpu_name()}, {os.cpu_count()} CPUs (shared with other agents); {args.rows} x {args.dim} float16, "
        f"{args.data}; written in {with_time[0]:.0f} s",
        flush=True,
    )
    sides = args.sides.split(",")
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name in sides:
            runs[name].append(_run_side(name, output, queries))
            print(f"  {name}: done", flush=True)
    truth = runs["numpy"][0]["ids"] if "numpy" in runs else runs["tool-exact"][0]["ids"]
    print("| side | build/load s | one query ms | per query of 100 ms | recall@10 | VmHWM MiB |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for name, results in runs.items():
        row = {
            "build_s": statistics.median(r.get("build_s", r["load_s"]) for r in results),
            "one_query_ms": statistics.median(r["one_query_ms"] for r in results),
            "per_query_of_100_ms": statistics.median(r["per_query_of_100_ms"] for r in results),
            "recall_at_10": recall(results[0]["ids"], truth),
            "vmhwm_mib": max(r["vmhwm_mib"] for r in results),
            **{k: results[0][k] for k in ("kind", "settings", "reason") if k in results[0]},
        }
        summary[name] = row
        note = f" ({row['kind']})" if "kind" in row else ""
        print(
            f"| {name}{note} | {row['build_s']:.1f} | {row['one_query_ms']:.1f} | {row['per_query_of_100_ms']:.2f} | "
            f"{row['recall_at_10']:.3f} | {row['vmhwm_mib']:.0f} |"
        )
    print(json.dumps({"rows": args.rows, "dim": args.dim, "data": args.data, "sides": summary}))


def text200k(args) -> None:
    import torch

    from gemma_embed.embedder import Embedder
    from gemma_embed.search import search_many
    from gemma_embed.store import read_header

    folder = args.folder / f"text-{args.rows}"
    folder.mkdir(parents=True, exist_ok=True)
    real = folder / "real.safetensors"
    lines = [f"document {n} about topic {n % 7}" for n in range(20)]
    gemma = [sys.executable, "-m", "gemma_embed.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not real.exists():
        subprocess.run(
            [*gemma, "text", "-", "--model", str(SAMPLE), "-o", str(real), "-q", "--device", "cpu"],
            input="\n".join(lines),
            text=True,
            check=True,
            env=env,
            capture_output=True,
        )
    header = {k: v for k, v in read_header(real).items() if k not in ("keys", "items", "format", "created_by")}
    dim = int(header["dim"])
    output = write_collection(folder, args.rows, dim, "random", header)
    print(
        f"# {cpu_name()}, {os.cpu_count()} CPUs (shared); {args.rows} x {dim} float16 random unit vectors under the "
        f"header of a real {header['model_type']} run",
        flush=True,
    )
    built_s, built = _timed(
        lambda: subprocess.run(
            [*gemma, "index", str(output), "-q"], capture_output=True, text=True, env=env, check=True
        )
    )
    print(f"gemma-embed index: {built_s:.1f} s (process) -> {built.stdout.strip()}")
    query_file = folder / "queries.txt"
    query_file.write_text("".join(f"what is said about topic {n % 13}, question {n}?\n" for n in range(QUERIES)))
    answers = {}
    for extra in ([], ["--exact"]):
        took, proc = _timed(
            lambda extra=extra: subprocess.run(
                [*gemma, "search", str(output), "--queries", str(query_file), "--jsonl", "--device", "cpu", *extra],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
        )
        records = [json.loads(line) for line in proc.stdout.splitlines()]
        grouped = [[r["key"] for r in records if r["query_index"] == n] for n in range(QUERIES)]
        answers["exact" if extra else "index"] = grouped
        print(f"search --queries (100 lines){' --exact' if extra else ''}: {took:.1f} s for the whole process")
    index_recall = np.mean([len(set(a) & set(b)) / K for a, b in zip(answers["index"], answers["exact"], strict=True)])
    print(f"recall@10 of the index against --exact (the command's own answers): {index_recall:.3f}")
    # Per query, same vectors: the model's own query vectors for the 100 lines.
    embedder = Embedder(str(SAMPLE), device="cpu", prompt_name="query")
    vectors = torch.from_numpy(embedder.encode(query_file.read_text().splitlines(), prompt_name="query"))
    np.save(folder / "model-queries.npy", vectors.numpy())
    timings = {}
    for label, exact in (("index", False), ("exact", True)):
        search_many(output, vectors[:1], K, exact=exact)
        many = statistics.median(
            _timed(lambda exact=exact: search_many(output, vectors, K, exact=exact))[0] for _ in range(3)
        )
        timings[label] = many / QUERIES * 1e3
    numpy_side = _run_side("numpy", output, folder / "model-queries.npy")
    print(
        f"per query, 100 in one call: index {timings['index']:.2f} ms, exact {timings['exact']:.2f} ms; "
        f"numpy float32 in RAM one query at a time {numpy_side['one_query_ms']:.2f} ms "
        f"(exact / numpy = {timings['exact'] / numpy_side['one_query_ms']:.2f})"
    )
    print(
        json.dumps(
            {
                "rows": args.rows,
                "dim": dim,
                "index": json.loads(built.stdout),
                "recall_at_10": index_recall,
                "per_query_ms": timings,
                "numpy_one_query_ms": numpy_side["one_query_ms"],
            }
        )
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "side":
        print(json.dumps(side(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=["collection", "text200k"])
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--data", choices=["random", "clustered"], default="random")
    parser.add_argument("--sides", default="tool-index,tool-exact,numpy,faiss-flat,faiss-sq16")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/gemma-embed-bench-search"))
    args = parser.parse_args()
    if args.scenario == "collection":
        args.rows = args.rows or 100_000
        collection(args)
    else:
        args.rows = args.rows or 200_000
        text200k(args)


if __name__ == "__main__":
    main()
