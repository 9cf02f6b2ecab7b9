"""Shared fixtures: tiny random checkpoints saved with save_pretrained, real image files, the reference model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "samples"))

from make_tiny_checkpoint import build_gemma4  # noqa: E402

# Six aspect ratios, including the two extremes the issue names (1x1 and 4000x300).
IMAGE_SIZES = {
    "one.png": (1, 1),
    "wide.jpg": (4000, 300),
    "landscape.jpg": (640, 480),
    "portrait.png": (480, 640),
    "square.png": (512, 512),
    "tall.webp": (200, 1400),
    "landscape2.jpg": (1280, 960),
}


def write_image(path: Path, width: int, height: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([np.sin(x / 17.0 + seed), np.cos(y / 11.0), np.sin((x + y) / 23.0)], -1)
    noise = rng.normal(0, 0.15, (height, width, 3))
    pixels = ((base * 0.4 + 0.5 + noise).clip(0, 1) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, **({"quality": 90} if path.suffix == ".jpg" else {}))
    return path


@pytest.fixture(scope="session")
def gemma4_dir(tmp_path_factory) -> Path:
    """A single-file Gemma 4 checkpoint (vision + audio) with processor_config.json, seed 1."""
    return build_gemma4(tmp_path_factory.mktemp("ckpt") / "g4", seed=1)


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    for seed, (name, (w, h)) in enumerate(IMAGE_SIZES.items()):
        write_image(folder / name, w, h, seed)
    return folder


@pytest.fixture(scope="session")
def reference_model(gemma4_dir):
    from transformers import Gemma4ForConditionalGeneration

    return Gemma4ForConditionalGeneration.from_pretrained(gemma4_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def reference_processor(gemma4_dir):
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(gemma4_dir)


def reference_image_rows(model, processor, path: Path, max_soft_tokens: int, space: str = "language") -> torch.Tensor:
    """transformers' own per-item path: the processor on this one image, then get_image_features."""
    with Image.open(path) as img:
        image = ImageOps.exif_transpose(img).convert("RGB")
    inputs = processor([image], return_tensors="pt", max_soft_tokens=max_soft_tokens)
    with torch.no_grad():
        out = model.get_image_features(
            pixel_values=inputs["pixel_values"], image_position_ids=inputs["image_position_ids"]
        )
    if space == "tower":
        return out.last_hidden_state
    (rows,) = out.pooler_output
    return rows


def rel_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.float() - ref.float()).norm() / ref.float().norm())
