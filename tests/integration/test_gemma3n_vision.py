"""Gemma 3n vision: gemma-embed's preparers and MobileNetV5 tower on the shared engine equal transformers' own
`Gemma3nForConditionalGeneration.get_image_features` per item, on a tiny random checkpoint written by transformers
with timm's own MobileNetV5 code (samples/make_tiny_checkpoint.py: build_gemma3n, GEMMA3N_TINY_VISION). Images
are decoded as the tool decodes them."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers import ROOT, record_batches, record_outputs, rel_error, spy_tensor_reads
from PIL import Image

from gemma_embed import numerics
from gemma_embed.engine import Engine, encode_items
from gemma_embed.errors import CheckpointError
from gemma_embed.media.image import decode_image
from gemma_embed.media.video import FramePolicy, decode_video
from gemma_embed.models.gemma3n_vision import (
    Gemma3nImagePreparer,
    Gemma3nVideoPreparer,
    Gemma3nVisionTower,
    is_gemma3n_vision,
)
from gemma_embed.models.loading import resolve_checkpoint

SAMPLES = ROOT / "samples" / "media"
MEDIA = ROOT / "tests" / "media"
# wide, 1x1, CMYK, EXIF-rotated. Every batch in this file holds 1 or 2 units: on the CPU the tiny MobileNetV5's
# first forward at each new batch size costs seconds (measured 3 s at 1, 10 s at 4; 0.6 s at 1 after that).
IMAGES = [
    SAMPLES / "images" / "panorama.jpg",
    SAMPLES / "images" / "pixel.png",
    MEDIA / "images" / "cmyk.jpg",
    MEDIA / "images" / "exif-rotated.jpg",
]
VIDEOS = {"clip-h264.mp4": 3, "one-frame.avi": 1}
TOLERANCE = 1e-5

pytestmark = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm (the gemma3n extra)")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from make_tiny_checkpoint import build_gemma3n

    return build_gemma3n(tmp_path_factory.mktemp("g3n") / "g3n", seed=5)


@pytest.fixture(scope="module")
def reference(folder):
    from transformers import AutoImageProcessor, Gemma3nForConditionalGeneration

    model = Gemma3nForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoImageProcessor.from_pretrained(folder)


@pytest.fixture(scope="module")
def checkpoint(folder):
    return resolve_checkpoint(str(folder))


@pytest.fixture(scope="module")
def tower(checkpoint):
    return Gemma3nVisionTower(checkpoint, "cpu", torch.float32)


def features(model, pixel_values) -> dict[str, torch.Tensor]:
    """transformers' get_image_features on one stacked batch, flattened, in both spaces: `pooler_output`
    (language) and the soft tokens it embedded (tower: its `last_hidden_state`, which it scales in place, seen as
    (B, tokens, 2048)). With the tool's CPU kernels (`numerics.aligned`: convolutions one item at a time, rsqrt
    through the vector code), so that a batch's bits can be compared; float32 comparisons hold either way."""
    with torch.no_grad(), numerics.aligned(pixel_values.device):
        out = model.get_image_features(pixel_values=pixel_values)
    hidden = out.last_hidden_state
    tower = hidden.reshape(hidden.shape[0], hidden.shape[1], -1).permute(0, 2, 1).reshape(-1, hidden.shape[1])
    return {"language": out.pooler_output.reshape(-1, out.pooler_output.shape[-1]), "tower": tower}


def encode(tower, items, space: str, batch_cap: int) -> list[torch.Tensor]:
    out: dict = {}
    encode_items(Engine(tower, space, batch_cap=batch_cap), items, [str(i) for i in range(len(items))], out.__setitem__)
    return [out[i] for i in range(len(items))]


def test_images_equal_get_image_features_per_item_in_both_spaces(checkpoint, tower, reference, monkeypatch):
    model, image_processor = reference
    decoded = [decode_image(str(path)) for path in IMAGES]
    batches = record_batches(monkeypatch, Gemma3nVisionTower)
    preparer = Gemma3nImagePreparer(checkpoint)
    items = [preparer.prepare(d) for d in decoded]
    ours = {space: encode(tower, items, space, batch_cap=2) for space in ("language", "tower")}
    assert max(len(batch) for batch in batches) == 2
    for i, (path, d) in enumerate(zip(IMAGES, decoded, strict=True)):
        expected = features(model, image_processor([d.image], return_tensors="pt")["pixel_values"])
        for space, width in (("language", 32), ("tower", 2048)):
            rows = ours[space][i]
            assert rows.shape == expected[space].shape == (checkpoint.config.vision_soft_tokens_per_image, width)
            assert rel_error(rows, expected[space]) < TOLERANCE, (path.name, space)


def test_video_frames_equal_the_per_frame_reference(checkpoint, tower, reference):
    model, image_processor = reference
    videos = [decode_video(str(SAMPLES / "video" / name), FramePolicy(num_frames=n)) for name, n in VIDEOS.items()]
    preparer = Gemma3nVideoPreparer(checkpoint)
    items = [preparer.prepare(v) for v in videos]
    ours = encode(tower, items, "language", batch_cap=2)  # the second chunk mixes the two videos
    for video, item, rows in zip(videos, items, ours, strict=True):
        assert len(item.units) == len(video.frames)
        expected = torch.cat(
            [
                features(model, image_processor([Image.fromarray(f)], return_tensors="pt")["pixel_values"])["language"]
                for f in video.frames
            ]
        )
        assert rel_error(rows, expected) < TOLERANCE


def test_only_vision_tower_and_embed_vision_tensors_are_read(folder, reference, monkeypatch):
    model, _ = reference
    read_keys = spy_tensor_reads(monkeypatch)
    checkpoint = resolve_checkpoint(str(folder))
    assert is_gemma3n_vision(checkpoint)
    tower = Gemma3nVisionTower(checkpoint, "cpu", torch.float32)
    assert read_keys and all(k.startswith(("model.vision_tower.", "model.embed_vision.")) for k in read_keys)
    theirs = model.model.vision_tower.state_dict()
    assert tower.tower.state_dict().keys() == theirs.keys()
    assert all(torch.equal(v, theirs[k]) for k, v in tower.tower.state_dict().items())


def test_without_timm_the_tower_is_refused_in_one_line(checkpoint, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "timm" else real(name, *a))
    with pytest.raises(CheckpointError, match=r"needs timm: pip install 'gemma-embed\[gemma3n\]'") as caught:
        Gemma3nVisionTower(checkpoint, "cpu", torch.float32)
    assert "\n" not in str(caught.value)


def test_bf16_device_batches_are_bit_equal_to_transformers_bf16_model(folder, checkpoint, monkeypatch):
    from transformers import Gemma3nForConditionalGeneration

    model = Gemma3nForConditionalGeneration.from_pretrained(folder, dtype=torch.bfloat16).eval()
    bf16 = Gemma3nVisionTower(checkpoint, "cpu", torch.bfloat16)
    calls = record_outputs(monkeypatch, Gemma3nVisionTower)
    preparer = Gemma3nImagePreparer(checkpoint)
    encode(bf16, [preparer.prepare(decode_image(str(path))) for path in IMAGES[:3]], "language", batch_cap=2)
    assert [len(units) for units, _ in calls] == [2, 1]  # a batch and a unit alone
    for units, rows in calls:
        expected = features(model, torch.stack([u.inputs["pixel_values"] for u in units]))["language"]
        assert expected.dtype == rows.dtype == torch.bfloat16
        assert torch.equal(rows, expected)


def test_the_images_command_on_a_gemma3n_folder_equals_get_image_features(tmp_path, folder, reference):
    """`gemma-embed images` on a Gemma 3n folder: the registry's Gemma 3n family now serves images (its audio as
    before), each item equal to the processor + get_image_features."""
    from helpers import run_images

    import gemma_embed

    model, image_processor = reference
    out = tmp_path / "g3n.safetensors"
    code, _, err = run_images(IMAGES[:2], folder, out, batch_size=2, space="tower")
    assert code == 0, err
    ours, meta = gemma_embed.load(out), gemma_embed.read_metadata(out)
    for key, item in zip(meta["keys"], meta["items"], strict=True):
        image = decode_image(item["path"]).image
        expected = features(model, image_processor([image], return_tensors="pt")["pixel_values"])["tower"]
        assert rel_error(ours[key], expected) < TOLERANCE, item["path"]
