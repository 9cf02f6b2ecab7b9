"""The same inputs write the same bytes whatever the CPU thread count and however the batches were cut:
`--cpu-threads 1`, `2` and `auto` beside a busy process (auto then follows the load), with the tuned batch plan
and with `--batch-size 1`, in float32 and bfloat16, for images (a Gemma 4 tower wide enough for the GEMMs' and the
elementwise kernels' thread splits to show: 7.2e-7 apart before gemma_embed/numerics.py) and for text
(EmbeddingGemma 2, whose ragged batches padded each text to its batch's longest before the padding ladder)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT, run_images
from safetensors import safe_open

LINES = [
    " ".join(["the red car", "a dog runs", "under the blue sky", "quickly over the river"][i % 4] for _ in range(n))
    for i, n in enumerate((1, 9, 3, 27, 14, 2, 40, 5, 11, 6, 33, 8))
]
# (--cpu-threads, --batch-size, a busy process beside the run)
RUNS = [(1, None, False), (2, 1, False), (None, None, True)]


@pytest.fixture(scope="module")
def wide_gemma4(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "samples"))
    from make_tiny_checkpoint import build_gemma4

    return build_gemma4(
        tmp_path_factory.mktemp("ckpt") / "g4", seed=2, audio=False, vision_hidden=96, vision_intermediate=200
    )


@pytest.fixture(scope="module")
def lines_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "lines.txt"
    path.write_text("\n".join(LINES) + "\n")
    return path


def _embeddings(path) -> bytes:
    with safe_open(str(path), "np") as fh:
        return fh.get_tensor("embeddings").tobytes()


def _runs(tmp_path, inputs, model, **options) -> list[bytes]:
    outputs = []
    for number, (threads, batch, busy) in enumerate(RUNS):
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            out = tmp_path / f"run{number}.safetensors"
            code, _, err = run_images(inputs, model, out, cpu_threads=threads, batch_size=batch, **options)
        finally:
            if spinner:
                spinner.kill()
                spinner.wait()
        assert code == 0, err
        outputs.append(_embeddings(out))
    return outputs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_images_write_the_same_bytes_at_any_thread_count_and_batch_size(tmp_path, wide_gemma4, dtype):
    images = ROOT / "samples" / "media" / "images"
    first, *others = _runs(tmp_path, [images], wide_gemma4, dtype=dtype)
    assert all(other == first for other in others)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_text_writes_the_same_bytes_at_any_thread_count_and_batch_size(tmp_path, lines_file, dtype):
    model = ROOT / "samples" / "tiny-embeddinggemma2"
    first, *others = _runs(tmp_path, [lines_file], model, modality="text", dtype=dtype)
    assert all(other == first for other in others)
