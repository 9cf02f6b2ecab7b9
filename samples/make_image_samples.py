"""Write the small sample media under samples/media/ (deterministic: gradients and shapes, fixed seed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent


def _picture(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / max(1, width - 1), y / max(1, height - 1), (x + y) / max(1, width + height - 2)], -1)
    img = Image.fromarray((base * 255 * rng.uniform(0.5, 1.0, 3)).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = rng.integers(0, max(1, width)), rng.integers(0, max(1, height))
        r = int(rng.integers(2, max(3, min(width, height) // 3 + 3)))
        draw.ellipse([x0 - r, y0 - r, x0 + r, y0 + r], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    return img


def make_images(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    specs = [
        ("landscape.jpg", 640, 480),
        ("portrait.png", 300, 500),
        ("square.webp", 256, 256),
        ("panorama.jpg", 4000, 300),
        ("tall.png", 120, 900),
        ("pixel.png", 1, 1),
    ]
    for i, (name, w, h) in enumerate(specs):
        path = folder / name
        _picture(w, h, seed=i).save(path, quality=85) if name.endswith(".jpg") else _picture(w, h, seed=i).save(path)
        written.append(path)
    # A JPEG stored sideways with EXIF orientation 6: viewers (and gemma-embed) show it upright, 240 x 320.
    rotated = folder / "exif-rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    _picture(320, 240, seed=42).save(rotated, exif=exif.tobytes(), quality=85)
    written.append(rotated)
    return written


if __name__ == "__main__":
    for p in make_images(HERE / "media" / "images"):
        print(p.relative_to(HERE), p.stat().st_size)
