"""What reading a collection costs before the model: the same images as a folder, webdataset tar shards, a parquet
file and a saved Hugging Face dataset, through the find stage (`iter_sources`), the content hash (`facts`, what
--resume keys on) and the image decoder. Prints items/s and MB/s of each, side by side, and the peak RSS of each
pass (the sources stream: it must not grow with the collection).

    python -m bench.bench_collections [--images 2000] [--size 256]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import tempfile
from pathlib import Path

import numpy as np

from bench.common import PeakRss, Timer


def make_collection(root: Path, count: int, size: int) -> dict[str, list[str]]:
    """count JPEGs (size x size, photo-like noise) as a folder, 4 tar shards, one parquet file and one saved
    dataset; returns each kind's inputs and the --column it needs."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset
    from PIL import Image

    rng = np.random.default_rng(0)
    folder = root / "folder"
    folder.mkdir()
    blobs = []
    for i in range(count):
        base = rng.integers(0, 255, (size // 8, size // 8, 3), dtype=np.uint8)
        image = Image.fromarray(base).resize((size, size), Image.BILINEAR)
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=90)
        blobs.append(buffer.getvalue())
        (folder / f"{i:06d}.jpg").write_bytes(blobs[-1])
    shards = root / "shards"
    shards.mkdir()
    per_shard = (count + 3) // 4
    for shard in range(4):
        with webdataset.TarWriter(str(shards / f"{shard:05d}.tar")) as writer:
            for i in range(shard * per_shard, min(count, (shard + 1) * per_shard)):
                writer.write({"__key__": f"{i:06d}", "jpg": blobs[i], "txt": f"caption {i}"})
    pq.write_table(pa.table({"image": pa.array(blobs, pa.binary())}), root / "images.parquet", row_group_size=256)
    datasets.disable_progress_bars()
    features = datasets.Features({"image": datasets.Image()})
    rows = {"image": [{"bytes": b, "path": f"{i:06d}.jpg"} for i, b in enumerate(blobs)]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(root / "saved"))
    return {
        "folder": ([str(folder)], None, None),
        "tar shards": ([f"{shards}/{{00000..00003}}.tar"], None, None),
        "parquet": ([str(root / "images.parquet")], "image", None),
        "saved dataset": ([], "image", str(root / "saved")),
    }, sum(len(b) for b in blobs)


def measure(inputs, column, dataset, decode: bool) -> tuple[int, float, int]:
    from gemma_embed.media.image import decode_image
    from gemma_embed.sources import Collection, iter_sources

    collection = Collection(column=column, dataset=dataset)
    items = 0
    with PeakRss() as rss, Timer() as timer:
        for source in iter_sources(inputs, "images", collection=collection):
            source.facts()
            if decode:
                decode_image(source.content)
            items += 1
    return items, timer.seconds, rss.peak - rss.start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()
    print(f"# {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        kinds, total_bytes = make_collection(Path(tmp), args.images, args.size)
        measure(*kinds["folder"], decode=True)  # warm-up: imports, Pillow's plugins, the page cache
        print(f"## {args.images} JPEGs of {args.size}x{args.size}, {total_bytes / 2**20:.1f} MiB")
        print(f"{'source':<14} {'find+hash items/s':>18} {'MiB/s':>8} {'+decode items/s':>16} {'peak RSS growth':>16}")
        for name, (inputs, column, dataset) in kinds.items():
            items, seconds, _ = measure(inputs, column, dataset, decode=False)
            decoded, decode_seconds, grown = measure(inputs, column, dataset, decode=True)
            assert items == decoded == args.images, (name, items, decoded)
            print(
                f"{name:<14} {items / seconds:>18.0f} {total_bytes / 2**20 / seconds:>8.0f} "
                f"{decoded / decode_seconds:>16.0f} {grown / 2**20:>13.1f} MiB"
            )


if __name__ == "__main__":
    main()
