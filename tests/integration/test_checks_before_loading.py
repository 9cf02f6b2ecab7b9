"""Every option and every input path is checked before any weight is read, and `plan` reads none: a spy on
safetensors' tensor reads sees nothing."""

from __future__ import annotations

import pytest
from helpers import ROOT, spy_tensor_reads

from gemma_embed import pipeline
from gemma_embed.config import RunConfig
from gemma_embed.errors import UsageError

GEMMA4 = ROOT / "samples" / "tiny-gemma4"
EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
IMAGES = ROOT / "samples" / "media" / "images"
AUDIO = ROOT / "samples" / "media" / "audio"


def config(tmp_path, **options) -> RunConfig:
    options.setdefault("modality", "images")
    options.setdefault("inputs", (str(IMAGES),))
    model = str(options.pop("model", GEMMA4))
    return RunConfig(output=tmp_path / "out.safetensors", device="cpu", model=model, **options)


@pytest.mark.parametrize(
    "options, message",
    [
        # (worded for a Python caller: options named as RunConfig fields)
        ({"pool": "frame"}, "pool frame does not apply to images (choose none, mean)"),
        ({"dim": 64}, "dim, prompt and prompt_name apply to retrieval vectors only (EmbeddingGemma 2 checkpoints)"),
        ({"dim": 100_000, "model": EG2}, "dim 100000: the model's vectors have"),
        ({"inputs": (str(IMAGES) + "-typo",)}, "images-typo: no such file or directory"),
        (
            {"modality": "audio", "model": ROOT / "samples" / "tiny-gemma3n", "pool": "frame", "inputs": (str(AUDIO),)},
            "pool frame does not apply to audio",
        ),
    ],
    ids=["pool-frame-images", "dim-soft-tokens", "dim-too-wide", "missing-input", "pool-frame-audio"],
)
def test_a_bad_option_or_path_fails_before_any_tensor_is_read(tmp_path, monkeypatch, options, message):
    reads = spy_tensor_reads(monkeypatch)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pipeline.run(config(tmp_path, **options))
    assert reads == []
    assert list(tmp_path.iterdir()) == []  # no output, no errors file


@pytest.mark.parametrize("model, modality", [(GEMMA4, "images"), (EG2, "images"), (EG2, "text")])
def test_plan_reads_no_tensor(tmp_path, monkeypatch, model, modality):
    reads = spy_tensor_reads(monkeypatch)
    inputs = (str(IMAGES),)
    if modality == "text":
        lines = tmp_path / "lines.txt"
        lines.write_text("one line\nand another, longer line\n")
        inputs = (str(lines),)
    plan = pipeline.plan(config(tmp_path, model=model, modality=modality, inputs=inputs))
    assert plan["buckets"] and all(b["cost_per_unit"] > 0 for b in plan["buckets"])
    assert reads == []
