"""The audio command: a checkpoint without an audio tower is a usage error, --window-s windows a clip, and plan
costs audio."""

from __future__ import annotations

import json

import pytest
import torch
from audio_helpers import RATE, make_clip
from helpers import ROOT
from typer.testing import CliRunner

import gemma_embed
from gemma_embed.cli import app
from gemma_embed.errors import CheckpointError
from gemma_embed.models.gemma4_audio import Gemma4AudioTower
from gemma_embed.models.loading import resolve_checkpoint

runner = CliRunner()


def test_checkpoint_without_audio_tower_is_a_clear_error(tmp_path):
    from make_tiny_checkpoint import build_gemma4

    folder = build_gemma4(tmp_path / "vision-only", seed=3, audio=False)
    with pytest.raises(CheckpointError, match="no audio tower"):
        Gemma4AudioTower(resolve_checkpoint(str(folder)), "cpu", torch.float32)
    result = runner.invoke(
        app,
        [
            "audio",
            str(ROOT / "samples" / "media" / "audio"),
            "--model",
            str(folder),
            "-o",
            str(tmp_path / "x.safetensors"),
        ],
    )
    assert result.exit_code == 2 and "no audio tower" in result.output


# ------------------------------------------------------------------------------------------- command


def test_cli_audio_window_option_and_plan(tmp_path, gemma4_dir):
    import soundfile as sf

    sf.write(tmp_path / "twenty-five.wav", make_clip(25.0, 1), RATE, subtype="PCM_16")
    out = tmp_path / "w.safetensors"
    result = runner.invoke(
        app,
        [
            "audio",
            str(tmp_path / "twenty-five.wav"),
            "--model",
            str(gemma4_dir),
            "-o",
            str(out),
            "--window-s",
            "10",
            "-q",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    (item,) = gemma_embed.read_metadata(out)["items"]
    assert [(w["start_s"], w["end_s"]) for w in item["windows"]] == [(0, 10), (10, 20), (20, 25)]

    too_long = runner.invoke(app, ["audio", str(tmp_path), "--model", str(gemma4_dir), "--window-s", "45"])
    assert too_long.exit_code == 2

    planned = runner.invoke(
        app,
        ["plan", str(ROOT / "samples" / "media" / "audio"), "--modality", "audio", "--model", str(gemma4_dir), "-q"],
        catch_exceptions=False,
    )
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.stdout.strip().splitlines()[-1])
    assert plan["modality"] == "audio" and plan["items"] == 5 and plan["units"] == 5
    assert all(b["cost_per_unit"] > 0 and b["chunk"] >= 1 for b in plan["buckets"])
