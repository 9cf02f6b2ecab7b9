"""Gemma 3 vision: gemma-embed's preparers and SigLIP tower on the shared engine equal transformers' own
`Gemma3ForConditionalGeneration.get_image_features` per item, on a tiny random checkpoint written by transformers
(samples/make_tiny_checkpoint.py: build_gemma3). Images are decoded as the tool decodes them."""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers import ROOT, record_batches, record_outputs, rel_error, spy_tensor_reads
from PIL import Image

from gemma_embed.engine import Engine, encode_items
from gemma_embed.errors import CheckpointError
from gemma_embed.media.image import decode_image
from gemma_embed.media.video import FramePolicy, decode_video
from gemma_embed.models.gemma3 import (
    Gemma3ImagePreparer,
    Gemma3VideoPreparer,
    Gemma3VisionTower,
    is_gemma3,
    rows_per_image,
)
from gemma_embed.models.loading import resolve_checkpoint

SAMPLES = ROOT / "samples" / "media"
MEDIA = ROOT / "tests" / "media"
# wide, tall, 1x1, grayscale, CMYK, alpha, palette, EXIF-rotated, and a camera JPEG
MIXED = {
    "wide": SAMPLES / "images" / "panorama.jpg",
    "tall": SAMPLES / "images" / "tall.png",
    "1x1": SAMPLES / "images" / "pixel.png",
    "grayscale": MEDIA / "images" / "python.pgm",
    "cmyk": MEDIA / "images" / "cmyk.jpg",
    "alpha": MEDIA / "images" / "rgba.png",
    "palette": MEDIA / "images" / "python.gif",
    "exif-rotated": MEDIA / "images" / "exif-rotated.jpg",
    "camera": MEDIA / "images" / "flower.jpg",
}
VIDEOS = {"clip-h264.mp4": 4, "short-vp9.webm": 3, "one-frame.avi": 1}
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from make_tiny_checkpoint import build_gemma3

    return build_gemma3(tmp_path_factory.mktemp("g3") / "g3", seed=4)


@pytest.fixture(scope="module")
def reference(folder):
    from transformers import AutoImageProcessor, AutoProcessor, Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoImageProcessor.from_pretrained(folder), AutoProcessor.from_pretrained(folder)


@pytest.fixture(scope="module")
def checkpoint(folder):
    return resolve_checkpoint(str(folder))


@pytest.fixture(scope="module")
def tower(checkpoint):
    return Gemma3VisionTower(checkpoint, "cpu", torch.float32)


def features(model, pixel_values, space: str) -> torch.Tensor:
    """transformers' get_image_features on one stacked batch: every image's rows, in order, flattened."""
    with torch.no_grad():
        out = model.get_image_features(pixel_values=pixel_values)
    rows = out.pooler_output if space == "language" else out.last_hidden_state
    return rows.reshape(-1, rows.shape[-1])


def encode(tower, items, space: str, batch_cap: int = 4) -> list[torch.Tensor]:
    out: dict = {}
    encode_items(Engine(tower, space, batch_cap=batch_cap), items, [str(i) for i in range(len(items))], out.__setitem__)
    return [out[i] for i in range(len(items))]


@pytest.mark.parametrize("space", ["language", "tower"])
def test_a_mixed_set_of_images_equals_get_image_features_per_item(space, checkpoint, tower, reference, monkeypatch):
    model, image_processor, _ = reference
    decoded = {name: decode_image(str(path)) for name, path in MIXED.items()}
    assert {"L", "CMYK", "RGBA", "P"} <= {d.mode for d in decoded.values()}
    with Image.open(MIXED["exif-rotated"]) as raw:  # stored sideways: the tool's decoding turns it upright
        assert raw.size == (decoded["exif-rotated"].height, decoded["exif-rotated"].width)
    batches = record_batches(monkeypatch, Gemma3VisionTower)
    preparer = Gemma3ImagePreparer(checkpoint, space=space)
    items = [preparer.prepare(d) for d in decoded.values()]
    ours = encode(tower, items, space)
    assert max(len(batch) for batch in batches) == 4  # full batches of the one bucket
    for name, d, rows, item in zip(decoded, decoded.values(), ours, items, strict=True):
        expected = features(model, image_processor([d.image], return_tensors="pt")["pixel_values"], space)
        assert rows.shape == expected.shape == (rows_per_image(checkpoint.config, space), expected.shape[-1])
        assert rel_error(rows, expected) < TOLERANCE, name
        assert item.meta["width"] == d.image.width and item.meta["resized_width"] == 224


def test_pan_and_scan_crops_equal_the_processors_crops_through_get_image_features(checkpoint, tower, reference):
    model, _, processor = reference
    wide = decode_image(str(MIXED["wide"]))
    square = decode_image(str(SAMPLES / "images" / "square.webp"))
    preparer = Gemma3ImagePreparer(checkpoint, pan_and_scan=True)
    items = [preparer.prepare(wide), preparer.prepare(square)]
    assert items[0].meta["crops"] == 4 and len(items[0].units) == 5
    assert items[1].meta["crops"] == 0 and len(items[1].units) == 1  # not wide enough to be cut
    ours = encode(tower, items, "language", batch_cap=3)  # chunks of 3: crops of one image cross chunks
    # The reference: Gemma3Processor itself (its pan-and-scan defaults, its order: the whole image, then crops).
    for d, rows in zip((wide, square), ours, strict=True):
        out = processor(images=[[d.image]], text=[processor.boi_token], do_pan_and_scan=True, return_tensors="pt")
        expected = features(model, out["pixel_values"], "language")
        assert rows.shape == expected.shape
        assert rel_error(rows, expected) < TOLERANCE
    without = Gemma3ImagePreparer(checkpoint).prepare(wide)
    assert len(without.units) == 1 and "crops" not in without.meta
    assert torch.equal(without.units[0].inputs["pixel_values"], items[0].units[0].inputs["pixel_values"])


def test_video_frames_equal_the_per_frame_reference(checkpoint, tower, reference):
    model, image_processor, _ = reference
    videos = [decode_video(str(SAMPLES / "video" / name), FramePolicy(num_frames=n)) for name, n in VIDEOS.items()]
    preparer = Gemma3VideoPreparer(checkpoint)
    items = [preparer.prepare(v) for v in videos]
    ours = encode(tower, items, "language", batch_cap=5)  # chunks mix frames of different videos
    for video, item, rows in zip(videos, items, ours, strict=True):
        assert len(item.units) == len(video.frames) and item.rows_per_unit == 16
        expected = torch.cat(
            [
                features(model, image_processor([Image.fromarray(f)], return_tensors="pt")["pixel_values"], "language")
                for f in video.frames
            ]
        )
        assert rel_error(rows, expected) < TOLERANCE
    tiny = decode_video(str(MEDIA / "video" / "one-pixel.mp4"), FramePolicy(num_frames=2))
    (rows,) = encode(tower, [preparer.prepare(tiny)], "language")
    expected = features(
        model, image_processor([Image.fromarray(tiny.frames[0])], return_tensors="pt")["pixel_values"], "language"
    )
    assert rel_error(rows[:16], expected) < TOLERANCE  # a 1x1 frame is not read as channels-first


def test_no_language_model_tensor_is_read(folder, monkeypatch):
    read_keys = spy_tensor_reads(monkeypatch)
    checkpoint = resolve_checkpoint(str(folder))
    assert is_gemma3(checkpoint)
    Gemma3VisionTower(checkpoint, "cpu", torch.float32)
    assert read_keys and all(k.startswith(("vision_tower.", "multi_modal_projector.")) for k in read_keys)
    assert any(k.startswith("multi_modal_projector.") for k in read_keys)


def test_loader_matches_transformers_and_reads_the_hub_layout(tmp_path, folder, checkpoint, tower, reference):
    """The hub repositories store `vision_tower.vision_model.` and `language_model.model.`; transformers 5 maps them
    onto its modules itself. A copy in that layout loads to the same weights and rows."""
    from safetensors.torch import load_file, save_file

    model, image_processor, _ = reference
    theirs = model.model.vision_tower.state_dict() | {
        f"projector.{k}": v for k, v in model.model.multi_modal_projector.state_dict().items()
    }
    ours = tower.tower.state_dict() | {f"projector.{k}": v for k, v in tower.embed.state_dict().items()}
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)

    hub = tmp_path / "hub-layout"
    shutil.copytree(folder, hub)
    tensors = load_file(str(hub / "model.safetensors"))
    renamed = {
        k.replace("vision_tower.", "vision_tower.vision_model.", 1) if k.startswith("vision_tower.") else k: v
        for k, v in tensors.items()
    }
    save_file(renamed, str(hub / "model.safetensors"), metadata={"format": "pt"})
    image = decode_image(str(MIXED["camera"]))
    pixels = image_processor([image.image], return_tensors="pt")["pixel_values"]
    hub_tower = Gemma3VisionTower(resolve_checkpoint(str(hub)), "cpu", torch.float32)
    with torch.inference_mode():
        assert torch.equal(
            hub_tower.encode([Gemma3ImagePreparer(checkpoint).prepare(image).units[0]], "language"),
            features(model, pixels, "language"),
        )


def test_a_checkpoint_without_a_vision_tower_is_refused(tmp_path):
    from make_tiny_checkpoint import build_embeddinggemma

    checkpoint = resolve_checkpoint(str(build_embeddinggemma(tmp_path / "text-only")))
    assert not is_gemma3(checkpoint)
    with pytest.raises(CheckpointError, match="no vision tower"):
        Gemma3VisionTower(checkpoint, "cpu", torch.float32)


def test_bf16_device_batches_are_bit_equal_to_transformers_bf16_model(folder, checkpoint, monkeypatch):
    from transformers import Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.bfloat16).eval()
    bf16 = Gemma3VisionTower(checkpoint, "cpu", torch.bfloat16)
    calls = record_outputs(monkeypatch, Gemma3VisionTower)
    preparer = Gemma3ImagePreparer(checkpoint, pan_and_scan=True)
    items = [preparer.prepare(decode_image(str(MIXED[name]))) for name in ("wide", "cmyk", "alpha")]
    encode(bf16, items, "language", batch_cap=4)
    assert [len(units) for units, _ in calls] == [4, 3]
    for units, rows in calls:
        pixels = torch.stack([u.inputs["pixel_values"] for u in units])
        expected = features(model, pixels, "language")
        assert expected.dtype == rows.dtype == torch.bfloat16
        assert torch.equal(rows, expected)


def test_the_images_command_with_pan_and_scan_equals_the_processors_crops(tmp_path, folder, reference):
    """`gemma-embed images --pan-and-scan` on a Gemma 3 folder (the registry's Gemma 3 family, the writer): each
    item's rows are Gemma3Processor's crops through get_image_features, in its order."""
    from helpers import run_images

    import gemma_embed

    model, _, processor = reference
    paths = [MIXED["wide"], MIXED["cmyk"], MIXED["1x1"]]
    out = tmp_path / "g3.safetensors"
    code, _, err = run_images(paths, folder, out, pan_and_scan=True, batch_size=4)
    assert code == 0, err
    ours, meta = gemma_embed.load(out), gemma_embed.read_metadata(out)
    crops = {}
    for key, item in zip(meta["keys"], meta["items"], strict=True):
        image = decode_image(item["path"]).image
        batch = processor(images=[[image]], text=[processor.boi_token], do_pan_and_scan=True, return_tensors="pt")
        expected = features(model, batch["pixel_values"], "language")
        assert ours[key].shape == expected.shape
        assert rel_error(ours[key], expected) < TOLERANCE, item["path"]
        crops[item["path"]] = item["crops"]
    assert crops == {str(MIXED["wide"]): 4, str(MIXED["cmyk"]): 0, str(MIXED["1x1"]): 0}
