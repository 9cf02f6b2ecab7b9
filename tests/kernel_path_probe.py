"""Run in a fresh process under a forced kernel path (tests/integration/test_kernel_paths.py): embeds the same
images and texts at 1 thread with the tuned batches and at 8 threads one item a batch (more threads than a small
machine's cores: the thread splits of a large machine), in float32 and bfloat16, and prints one JSON line: each
case's outputs as digests, and the kernels the process computed with (`numerics.kernels()`).

    python tests/kernel_path_probe.py IMAGE_CKPT TEXT_CKPT IMAGES_DIR
    python tests/kernel_path_probe.py --samples SAMPLES_DIR    # every family and modality of the samples
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import gemma_embed  # before torch's first product: MKL's mode is asked for on import

TEXTS = [" ".join(["the sea and the red car"] * (1 + i % 13)) + f" line {i}" for i in range(24)]
# (threads, batch size): the thread count and the batch change together, as they do between two runs.
RUNS = ((1, None), (8, 1))


def samples_cases(samples: Path) -> dict[str, list[str]]:
    """Every family and modality of the shipped samples (the tiny checkpoints and media), both dtypes."""
    media = samples / "media"
    images = sorted(str(p) for p in (media / "images").iterdir())
    audio = sorted(str(p) for p in (media / "audio").iterdir())
    video = sorted(str(p) for p in (media / "video").iterdir())[:2]
    runs = [
        ("tiny-gemma4", "images", images),
        ("tiny-gemma4", "video", video),
        ("tiny-gemma4", "audio", audio),
        ("tiny-gemma3", "images", images),
        ("tiny-gemma3n", "images", images),
        ("tiny-gemma3n", "audio", audio),
        ("tiny-embeddinggemma", "text", TEXTS),
        ("tiny-embeddinggemma2", "images", images),
        ("tiny-embeddinggemma2", "audio", audio),
    ]
    return {
        f"{model}/{modality}/{dtype}": digests(str(samples / model), modality, inputs, dtype)
        for model, modality, inputs in runs
        for dtype in ("float32", "bfloat16")
    }


def digests(checkpoint: str, modality: str, inputs: list[str], dtype: str) -> list[str]:
    found = []
    for threads, batch in RUNS:
        embedder = gemma_embed.Embedder(checkpoint, device="cpu", dtype=dtype, cpu_threads=threads, batch_size=batch)
        if modality == "text":
            data = embedder.encode(inputs).tobytes()
        else:
            data = b"".join(rows.float().numpy().tobytes() for rows in embedder.embed(inputs, modality=modality))
        found.append(hashlib.sha256(data).hexdigest())
    return found


def main() -> None:
    cases = {}
    if sys.argv[1] == "--samples":
        cases = samples_cases(Path(sys.argv[2]))
    else:
        image_ckpt, text_ckpt, images = sys.argv[1:4]
        paths = sorted(str(p) for p in Path(images).iterdir())
        for dtype in ("float32", "bfloat16"):
            cases[f"images/{dtype}"] = digests(image_ckpt, "images", paths, dtype)
            cases[f"text/{dtype}"] = digests(text_ckpt, "text", TEXTS, dtype)
    from gemma_embed import numerics

    print(json.dumps({"cases": cases, "kernels": numerics.kernels()}))


if __name__ == "__main__":
    main()
