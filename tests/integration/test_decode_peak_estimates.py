"""The decode room admits items by memory's estimate of their decode peak: the estimate must never be below the
peak Pillow and transformers' processor really reach (VmHWM in a fresh process), nor far above it."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import SAMPLE_MODEL
from memory_helpers import ROOT, decode_peaks
from PIL import Image


@pytest.mark.slow
def test_image_decode_peak_estimates_hold_for_each_kind_of_file(tmp_path):
    side = 2000
    y, x = np.mgrid[0:side, 0:side]
    rgb = Image.fromarray(np.stack([(x // 7) % 256, (y // 5) % 256, ((x + y) // 9) % 256], -1).astype(np.uint8))
    files = {
        "rgb.png": lambda p: rgb.save(p, compress_level=1),
        "rgb.jpg": lambda p: rgb.save(p, quality=90),
        "rgb.webp": lambda p: rgb.save(p, quality=80),
        "rgba.png": lambda p: rgb.convert("RGBA").save(p, compress_level=1),  # composited onto white
    }
    paths = []
    for name, write in files.items():
        write(tmp_path / name)
        paths.append(tmp_path / name)
    measured = decode_peaks(SAMPLE_MODEL, "images", ROOT / "samples/media/images/pixel.png", paths)
    assert len(measured) == len(paths)
    for m in measured:
        ratio = m["estimate"] / m["peak"]
        print(f"{m['path']}: {m['peak'] / m['pixels']:.2f} B/px measured, estimate / measured {ratio:.2f}")
        assert 1.0 <= ratio <= 1.3, m  # never admitted below its real peak, never held far above it
