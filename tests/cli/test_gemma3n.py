"""The shipped Gemma 3n sample checkpoint through the audio command."""

from __future__ import annotations

import gemma_embed


def test_shipped_sample_checkpoint_runs_the_audio_command(tmp_path):
    from helpers import ROOT
    from typer.testing import CliRunner

    from gemma_embed.cli import app

    out = tmp_path / "samples.safetensors"
    result = CliRunner().invoke(
        app,
        [
            "audio",
            str(ROOT / "samples" / "media" / "audio"),
            "--model",
            str(ROOT / "samples" / "tiny-gemma3n"),
            "-o",
            str(out),
            "-q",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    meta = gemma_embed.read_metadata(out)
    assert meta["model_type"] == "gemma3n" and "Gemma3nAudioFeatureExtractor" in meta["preprocessing"]
    rows = gemma_embed.load(out)
    assert len(rows) == 5 and all(t.shape[0] > 0 and t.shape[1] == 32 for t in rows.values())
