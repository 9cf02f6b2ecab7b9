"""Every image's rows equal transformers' per-item reference, however the engine batched it (DESIGN §6).
bfloat16 is held to transformers' own bf16 path in test_bf16.py."""

from __future__ import annotations

import pytest
import torch
from helpers import IMAGE_SIZES, record_batches, reference_image_rows, rel_error, run_images

import gemma_embed
from gemma_embed.models.gemma4 import Gemma4VisionTower


@pytest.fixture
def batch_log(monkeypatch):
    """The units of every device batch the vision tower runs."""
    return record_batches(monkeypatch, Gemma4VisionTower)


@pytest.mark.parametrize("max_soft_tokens", [70, 280])
@pytest.mark.parametrize("batch_size", [1, 4], ids=["chunk1", "chunk4"])
def test_rows_match_reference(
    tmp_path, gemma4_dir, image_dir, reference_model, reference_processor, batch_log, max_soft_tokens, batch_size
):
    out = tmp_path / "out.safetensors"
    code, records, err = run_images(
        [image_dir], gemma4_dir, out, max_soft_tokens=max_soft_tokens, batch_size=batch_size
    )
    assert code == 0, err
    result = gemma_embed.load(out)
    assert sorted(result) == sorted(IMAGE_SIZES)

    buckets = {batch[0].length for batch in batch_log}
    assert len(buckets) >= 2, "the test images must span several buckets"
    sizes = [len(batch) for batch in batch_log]
    if batch_size == 1:
        assert max(sizes) == 1
    else:
        assert max(sizes) > 1, "images sharing a patch count must share a device batch"
    assert sum(sizes) == len(IMAGE_SIZES)

    for name in IMAGE_SIZES:
        ref = reference_image_rows(reference_model, reference_processor, image_dir / name, max_soft_tokens)
        ours = result[name]
        assert ours.shape == ref.shape, name
        assert rel_error(ours, ref) < 1e-5, name


def test_pool_mean_and_tower_space(tmp_path, gemma4_dir, image_dir, reference_model, reference_processor):
    pooled_out, tower_out = tmp_path / "mean.safetensors", tmp_path / "tower.safetensors"
    assert run_images([image_dir], gemma4_dir, pooled_out, pool="mean", max_soft_tokens=140)[0] == 0
    assert run_images([image_dir], gemma4_dir, tower_out, space="tower", max_soft_tokens=140)[0] == 0
    pooled, tower = gemma_embed.load(pooled_out), gemma_embed.load(tower_out)
    for name in IMAGE_SIZES:
        ref = reference_image_rows(reference_model, reference_processor, image_dir / name, 140)
        assert pooled[name].shape == (1, ref.shape[1])
        assert rel_error(pooled[name][0], ref.mean(dim=0)) < 1e-5, name
        ref_tower = reference_image_rows(reference_model, reference_processor, image_dir / name, 140, space="tower")
        assert tower[name].shape == ref_tower.shape
        assert rel_error(tower[name], ref_tower) < 1e-5, name


def test_output_dtype_and_metadata(tmp_path, gemma4_dir, image_dir):
    out = tmp_path / "half.safetensors"
    code, records, _ = run_images(
        [image_dir / "wide.jpg", image_dir / "one.png"], gemma4_dir, out, output_dtype="float16", max_soft_tokens=70
    )
    assert code == 0
    meta = gemma_embed.read_metadata(out)
    assert meta["format"] == "gemma-embed/1" and meta["dtype"] == "float16"
    assert meta["modality"] == "images" and meta["space"] == "language" and meta["pooling"] == "none"
    assert meta["model"] == str(gemma4_dir)
    assert "Gemma4ImageProcessor" in meta["preprocessing"]
    wide, one = meta["items"]
    assert (wide["width"], wide["height"]) == (4000, 300) and (one["width"], one["height"]) == (1, 1)
    assert wide["max_soft_tokens"] == 70 and wide["resized_width"] > wide["resized_height"]
    for item, name in zip(meta["items"], ["wide.jpg", "one.png"], strict=True):
        data = (image_dir / name).read_bytes()
        import hashlib

        assert item["sha256"] == hashlib.sha256(data).hexdigest() and item["bytes"] == len(data)
        assert item["path"].endswith(name) and item["rows"] > 0 and item["mtime"] > 0
    rows = gemma_embed.load(out)
    assert all(t.dtype == torch.float16 for t in rows.values())
    summary = records[-1]
    assert summary["type"] == "summary" and summary["ok"] == 2 and summary["failed"] == 0


def test_exif_orientation_is_applied(tmp_path, gemma4_dir):
    from PIL import Image

    from gemma_embed.media.image import decode_image

    path = tmp_path / "sideways.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.new("RGB", (320, 240), (200, 10, 10)).save(path, exif=exif.tobytes())
    decoded = decode_image(str(path))
    assert decoded.image.size == (240, 320) and decoded.mode == "RGB" and decoded.frames_in_file == 1
