"""A plain `run()` or `Embedder` call leaves the process as it found it: no signal handlers, no redirected fd 2,
no replaced `warnings.showwarning`. The command line (own_process=True) takes them over, which the same spy sees."""

from __future__ import annotations

import os
import signal
import warnings

import pytest
from helpers import ROOT, SAMPLE_MODEL

import gemma_embed
from gemma_embed.models.gemma4 import Gemma4VisionTower

IMAGES = ROOT / "samples" / "media" / "images"


def process_state() -> tuple:
    fd2 = os.fstat(2)
    return (
        signal.getsignal(signal.SIGINT),
        signal.getsignal(signal.SIGTERM),
        warnings.showwarning,
        (fd2.st_dev, fd2.st_ino),
    )


@pytest.fixture
def seen_while_encoding(monkeypatch) -> list:
    seen: list = []
    original = Gemma4VisionTower.encode

    def spy(self, units, space):
        seen.append(process_state())
        return original(self, units, space)

    monkeypatch.setattr(Gemma4VisionTower, "encode", spy)
    return seen


@pytest.mark.parametrize("own_process", [False, True])
def test_run_changes_the_process_only_when_asked(tmp_path, seen_while_encoding, own_process):
    before = process_state()
    config = gemma_embed.RunConfig(
        modality="images", inputs=[IMAGES], model=str(SAMPLE_MODEL), output=tmp_path / "o.safetensors", device="cpu"
    )
    gemma_embed.run(config, own_process=own_process)
    assert seen_while_encoding
    changed = [state != before for state in seen_while_encoding]
    assert all(changed) if own_process else not any(changed)
    assert process_state() == before  # and put back afterwards either way


def test_embedder_leaves_the_process_alone(seen_while_encoding):
    before = process_state()
    gemma_embed.Embedder(SAMPLE_MODEL, device="cpu").embed([str(IMAGES / "tall.png")])
    assert seen_while_encoding and all(state == before for state in seen_while_encoding)
