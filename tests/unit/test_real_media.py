"""A real RGBA image (tests/media/SOURCES.md) decoded as transformers converts it: alpha onto white."""

from __future__ import annotations

import numpy as np
from helpers import TEST_MEDIA
from PIL import Image


def test_alpha_is_composited_onto_white_not_dropped():
    """What the conversion does, checked on pixels: a fully transparent pixel becomes white."""
    from gemma_embed.media.image import decode_image

    decoded = decode_image(str(TEST_MEDIA / "images" / "rgba.png"))
    with Image.open(TEST_MEDIA / "images" / "rgba.png") as img:
        alpha = np.asarray(img.getchannel("A"))
    pixels = np.asarray(decoded.image)
    assert decoded.mode == "RGBA" and decoded.image.mode == "RGB"
    assert (pixels[alpha == 0] == 255).all() and (alpha == 0).any()
