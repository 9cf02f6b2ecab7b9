"""What the collection tests share: one set of real image files (several sizes and formats, each with a caption),
extracted to a folder as a user would have them, and the comparison of an output with the folder's."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import torch
from helpers import ROOT, write_image

import gemma_embed

MODEL = ROOT / "samples" / "tiny-gemma4"
# name -> (width, height): aspect ratios that land in different buckets, three formats.
IMAGES = {
    "000000.jpg": (64, 48),
    "000001.png": (48, 64),
    "000002.webp": (100, 100),
    "000003.jpg": (300, 40),
    "000004.png": (33, 77),
    "000005.jpg": (64, 48),
    "000006.png": (120, 90),
    "000007.webp": (40, 300),
}
OPTIONS = {"max_soft_tokens": 70, "batch_size": 4}


def image_files(folder: Path) -> dict[str, bytes]:
    """Write the images into `folder`, each with its caption (`.txt`) and JSON (`.json`) beside it, as a dataset
    extracted from shards looks; returns name -> image bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    found = {}
    for seed, (name, (width, height)) in enumerate(IMAGES.items()):
        path = write_image(folder / name, width, height, seed)
        stem = name.split(".")[0]
        (folder / f"{stem}.txt").write_text(caption(name))
        (folder / f"{stem}.json").write_text(json.dumps(sidecar(name)))
        found[name] = path.read_bytes()
    return found


def caption(name: str) -> str:
    return f"a test picture called {name}"


def sidecar(name: str) -> dict:
    return {"key": name.split(".")[0], "source": "collection-test"}


def assert_same_rows(output: Path, reference: Path, key_of: dict[str, str]) -> dict[str, dict]:
    """Every reference item (keyed by file name) has bit-identical rows and the same content hash in `output`
    under `key_of[name]`; returns the output's item metadata by its key."""
    ours = gemma_embed.load(output)
    theirs = gemma_embed.load(reference)
    items = {key: item for key, _, item in gemma_embed.iter_items(output)}
    reference_items = {key: item for key, _, item in gemma_embed.iter_items(reference)}
    assert sorted(ours) == sorted(key_of[name] for name in theirs)
    for name, rows in theirs.items():
        assert torch.equal(ours[key_of[name]], rows), name
        assert items[key_of[name]]["sha256"] == reference_items[name]["sha256"]
    return items


def write_shard(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A GNU tar file of (name, data) members, in order."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def member_offsets(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (offset of its header, offset of its data) in a tar file."""
    with tarfile.open(path) as archive:
        return {m.name: (m.offset, m.offset_data) for m in archive.getmembers()}
