"""Each part records a CRC-32 of every item's rows; --resume checks them, and an item whose rows changed on
disk (a flipped bit) is computed again with a warning naming the part, never reused (issue 20)."""

from __future__ import annotations

import os
import signal
import struct
from pathlib import Path

import torch
from helpers import SAMPLE_MODEL, run_images, write_image

import gemma_embed
from gemma_embed.models.gemma4 import Gemma4VisionTower


def interrupt_after(monkeypatch, batches: int) -> None:
    """SIGINT to this process after `batches` device batches: the run stops at the next chunk, as after ^C."""
    original = Gemma4VisionTower.encode
    calls = []

    def encode(self, units, space):
        rows = original(self, units, space)
        calls.append(len(units))
        if len(calls) == batches:
            os.kill(os.getpid(), signal.SIGINT)
        return rows

    monkeypatch.setattr(Gemma4VisionTower, "encode", encode)


def flip_a_bit_in_rows(part: Path, item: int) -> None:
    """Flip one bit inside the embedding rows of item `item` of a part (read from its own header and offsets)."""
    meta = gemma_embed.read_metadata(part)
    first_row = sum(i["rows"] for i in meta["items"][:item])
    data = bytearray(part.read_bytes())
    (header_length,) = struct.unpack("<Q", data[:8])
    width = gemma_embed.load(part)[meta["keys"][0]].shape[1]
    position = 8 + header_length + first_row * width * 4 + 5  # float32 rows; byte 5 of the item's first row
    data[position] ^= 0x10
    part.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_part_is_found_and_that_item_computed_again(tmp_path, monkeypatch):
    images = tmp_path / "images"
    images.mkdir()
    for i, (w, h) in enumerate([(64, 48), (48, 64), (100, 100), (80, 40), (40, 80), (60, 60)]):
        write_image(images / f"img{i}.png", w, h, i)
    reference = tmp_path / "reference.safetensors"
    assert run_images([images], SAMPLE_MODEL, reference, max_soft_tokens=70)[0] == 0

    out = tmp_path / "out.safetensors"
    with monkeypatch.context() as patch:
        interrupt_after(patch, 4)
        code, _, err = run_images([images], SAMPLE_MODEL, out, max_soft_tokens=70, flush_every=2, batch_size=1)
    assert code == 130, err
    parts = sorted((tmp_path / "out.safetensors.parts").glob("part-*.safetensors"))
    assert len(parts) == 2  # four items saved, two per part
    saved = [key for part in parts for key in gemma_embed.read_metadata(part)["keys"]]
    damaged_part = parts[1]
    damaged_key = gemma_embed.read_metadata(damaged_part)["keys"][1]
    flip_a_bit_in_rows(damaged_part, 1)
    assert not torch.equal(gemma_embed.load(damaged_part)[damaged_key], gemma_embed.load(reference)[damaged_key])

    code, records, err = run_images([images], SAMPLE_MODEL, out, max_soft_tokens=70, resume=True, overwrite=False)
    assert code == 0, err
    status = {r["key"]: r["status"] for r in records if r["type"] == "item"}
    assert sorted(k for k, s in status.items() if s == "resumed") == sorted(k for k in saved if k != damaged_key)
    assert status[damaged_key] == "ok"  # computed again, not reused
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: {damaged_part}: the rows of 1 of its 2 items do not match their checksum (changed on disk); "
        f"they are computed again"
    ]
    ours, theirs = gemma_embed.load(out), gemma_embed.load(reference)
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
