"""What the row checksums of parts cost: CRC-32 (and, for comparison, sha256) of each item's rows next to
writing the part itself.

    python -m bench.bench_part_checksum [--items 64] [--repeats 3]

For three item sizes (a pooled vector; 280 and 1120 soft tokens of a release-size Gemma 4 at hidden 1536, float32)
it times, per item, `row_checksum` (CRC-32) alone, sha256 of the same bytes (the alternative), and a part flush
(the writer's `flush`: checksums, bytes, atomic write with fsync) with and without the checksums, in a temporary
folder under the current one (the disk outputs usually go to).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
from pathlib import Path

import torch

from bench.common import Timer, emit
from gemma_embed.store import EmbeddingWriter
from gemma_embed.store import writer as writer_module
from gemma_embed.store.tensors_file import row_checksum

SIZES = {"pooled 1x768": (1, 768), "280 tokens x1536": (280, 1536), "1120 tokens x1536": (1120, 1536)}


def flush_seconds(folder: Path, rows: list[torch.Tensor], checksums: bool) -> float:
    writer = EmbeddingWriter(folder / "o.safetensors", {"model": "m"})
    for i, r in enumerate(rows):
        writer.pending[f"k{i}"] = ({"rows": r.shape[0]}, r)
    original = writer_module.row_checksum
    if not checksums:
        writer_module.row_checksum = lambda r: ""
    try:
        with Timer() as t:
            writer.flush()
    finally:
        writer_module.row_checksum = original
    return t.seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for name, shape in SIZES.items():
        rows = [torch.randn(*shape) for _ in range(args.items)]
        megabytes = sum(r.numel() * 4 for r in rows) / 1e6
        checksum_s, sha256_s, with_s, without_s = [], [], [], []
        for _ in range(args.repeats):
            with Timer() as t:
                for r in rows:
                    row_checksum(r)
            checksum_s.append(t.seconds)
            with Timer() as t:
                for r in rows:
                    hashlib.sha256(r.reshape(-1).view(torch.uint8).numpy()).hexdigest()
            sha256_s.append(t.seconds)
            with tempfile.TemporaryDirectory(dir=".") as folder:
                without_s.append(flush_seconds(Path(folder), rows, checksums=False))
            with tempfile.TemporaryDirectory(dir=".") as folder:
                with_s.append(flush_seconds(Path(folder), rows, checksums=True))
        crc, sha, with_, without = (statistics.median(v) for v in (checksum_s, sha256_s, with_s, without_s))
        emit(
            {
                "item": name,
                "items": args.items,
                "MB": round(megabytes, 1),
                "crc32_MB_per_s": round(megabytes / crc, 1),
                "crc32_ms_per_item": round(1e3 * crc / args.items, 3),
                "sha256_ms_per_item": round(1e3 * sha / args.items, 3),
                "flush_ms_per_item": round(1e3 * with_ / args.items, 3),
                "flush_without_checksums_ms_per_item": round(1e3 * without / args.items, 3),
                "checksums_share_of_flush": round(1 - without / with_, 3),
            }
        )


if __name__ == "__main__":
    main()
