"""Shared fixtures: tiny random checkpoints saved with save_pretrained, real image files, the reference model.

Helpers live in `helpers.py`; torch is imported inside the fixtures that need it, so a test file of pure
functions runs without importing it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import IMAGE_SIZES, write_image


@pytest.fixture(scope="session")
def gemma4_dir(tmp_path_factory) -> Path:
    """A single-file Gemma 4 checkpoint (vision + audio) with processor_config.json, seed 1."""
    from make_tiny_checkpoint import build_gemma4

    return build_gemma4(tmp_path_factory.mktemp("ckpt") / "g4", seed=1)


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    for seed, (name, (w, h)) in enumerate(IMAGE_SIZES.items()):
        write_image(folder / name, w, h, seed)
    return folder


@pytest.fixture(scope="session")
def reference_model(gemma4_dir):
    import torch
    from transformers import Gemma4ForConditionalGeneration

    return Gemma4ForConditionalGeneration.from_pretrained(gemma4_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def reference_processor(gemma4_dir):
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(gemma4_dir)
