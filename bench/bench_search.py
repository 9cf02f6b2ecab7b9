"""Search latency: exact cosine top-10 over a synthetic 1,000,000 x 768 float16 index in gemma-embed's format.

    python -m bench.bench_search [--items 1000000] [--dim 768] [--shard-size 250000] [--folder DIR] [--repeats 3]

The index is written once through store.py's EmbeddingWriter (sharded, float16) into --folder and reused by later
runs. Prints, in one run: this machine's memory read bandwidth (a float16 -> float32 pass over a 1.5 GB tensor,
what a block costs before its matrix-vector product) and float32 matrix-vector rate as yardsticks; then the
search's latency (first run after the page cache was dropped where allowed, else the first run, and warm runs),
its effective read rate, and the block size's effect. Peak RSS shows the index is not held in memory.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from bench.common import PeakRss, Timer, emit
from gemma_embed import store
from gemma_embed.search import search
from gemma_embed.store import EmbeddingWriter, output_files


def build_index(folder: Path, items: int, dim: int, shard_size: int) -> Path:
    path = folder / "index.safetensors"
    if output_files(path):
        return path
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    writer = EmbeddingWriter(
        path,
        {"model": "synthetic", "space": "retrieval", "modality": "images", "pooling": "mean"},
        output_dtype="float16",
        shard_size=shard_size,
        flush_seconds=float("inf"),
    )
    block = 10_000
    with Timer() as timer:
        for start in range(0, items, block):
            rows = torch.nn.functional.normalize(
                torch.randn(min(block, items - start), dim, generator=generator), dim=1
            )
            for offset, row in enumerate(rows):
                position = start + offset
                writer.add(f"img/{position:07d}.jpg", row[None], {"path": f"/data/img/{position:07d}.jpg"}, position)
        written = writer.close()
    print(f"wrote {items} x {dim} float16 to {written} in {timer.seconds:.1f} s")
    return path


def read_bandwidth(rows: int = 65_536, dim: int = 768, blocks: int = 16) -> float:
    """Bytes/s of float16 read while converting into a reused float32 buffer: what the search does to each block
    (measured on 16 blocks of 65,536 x 768, about the index's size)."""
    sources = [torch.randn(rows, dim).to(torch.float16) for _ in range(blocks)]
    buffer = torch.empty(rows, dim)
    buffer.copy_(sources[0])
    with Timer() as timer:
        for source in sources:
            buffer.copy_(source)
    return blocks * rows * dim * 2 / timer.seconds


def matvec_rate(rows: int = 65_536, dim: int = 768, repeats: int = 20) -> float:
    a, x = torch.randn(rows, dim), torch.randn(dim)
    a @ x
    with Timer() as timer:
        for _ in range(repeats):
            a @ x
    return 2 * rows * dim * repeats / timer.seconds


def drop_page_cache(files: list[Path]) -> bool:
    """Evict the index's pages (posix_fadvise DONTNEED): the next read comes from disk, where the OS allows."""
    try:
        for file in files:
            with open(file, "rb") as fh:
                os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except (AttributeError, OSError):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--shard-size", type=int, default=250_000)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/gemma-embed-bench-search"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    index = build_index(args.folder, args.items, args.dim, args.shard_size)
    files = output_files(index)
    size = sum(f.stat().st_size for f in files)
    print(f"# {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads")
    bandwidth = read_bandwidth(dim=args.dim)
    rate = matvec_rate(dim=args.dim)
    print(f"float16 -> float32 copy:   {bandwidth / 1e9:6.2f} GB/s of float16 read")
    print(f"float32 matrix-vector:     {rate / 1e9:6.2f} GFLOP/s")
    floor = args.items * args.dim * 2 / bandwidth
    print(f"index: {len(files)} files, {size / 1e9:.2f} GB; one pass at that read rate: {floor * 1e3:.0f} ms")

    query = torch.nn.functional.normalize(torch.randn(args.dim, generator=torch.Generator().manual_seed(1)), dim=0)
    dropped = drop_page_cache(files)
    with PeakRss() as rss, Timer() as cold:
        hits = search(index, query, k=10)
    print(f"search top-10, {'page cache dropped' if dropped else 'first run'}: {cold.seconds * 1e3:.0f} ms")
    warm = []
    for _ in range(args.repeats):
        with Timer() as timer:
            again = search(index, query, k=10)
        warm.append(timer.seconds)
        assert [h.key for h in again] == [h.key for h in hits]
    best = min(warm)
    print(
        f"search top-10, warm: best {best * 1e3:.0f} ms, median {sorted(warm)[len(warm) // 2] * 1e3:.0f} ms "
        f"({args.items * args.dim * 2 / best / 1e9:.2f} GB/s effective, {best / floor:.1f}x the read pass)"
    )
    print(
        f"peak RSS during the cold search: {rss.peak / 2**20:.0f} MiB (started at {rss.start / 2**20:.0f} MiB); "
        f"after it, {_status_mib('RssAnon')} MiB anonymous + {_status_mib('RssFile')} MiB of mapped index pages "
        f"(page cache the kernel reclaims)"
    )
    blocks = {}
    for rows in (16_384, 65_536, 262_144):
        with Timer() as timer:
            search(index, query, k=10, block_rows=rows)
        blocks[rows] = timer.seconds
        print(f"block {rows:>7} rows: {timer.seconds * 1e3:.0f} ms")
    metadata_s = _timed(lambda: store.output_index(index))
    print(f"of which reading keys/items/offsets of every file: {metadata_s * 1e3:.0f} ms")
    emit(
        {
            "items": args.items,
            "dim": args.dim,
            "files": len(files),
            "bytes": size,
            "read_gb_s": bandwidth / 1e9,
            "matvec_gflop_s": rate / 1e9,
            "cold_ms": cold.seconds * 1e3,
            "page_cache_dropped": dropped,
            "warm_ms": [w * 1e3 for w in warm],
            "block_ms": {str(k): v * 1e3 for k, v in blocks.items()},
            "metadata_ms": metadata_s * 1e3,
            "peak_rss_mib": rss.peak / 2**20,
            "top": [(h.key, round(h.score, 4)) for h in hits[:3]],
        }
    )


def _status_mib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return -1


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
