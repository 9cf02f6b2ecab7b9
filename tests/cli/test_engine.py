"""A device error that persists ends the command with one line naming the device."""

from __future__ import annotations

from gemma_embed.models.gemma4 import Gemma4VisionTower


def test_persistent_device_error_on_the_command_line(tmp_path, gemma4_dir, image_dir, monkeypatch):
    from typer.testing import CliRunner

    from gemma_embed.cli import app

    def broken(self, units, space):
        raise RuntimeError("CUDA error: device-side assert triggered")  # torch before 2.8 spells it like this

    monkeypatch.setattr(Gemma4VisionTower, "encode", broken)
    out = tmp_path / "o.safetensors"
    args = ["images", str(image_dir), "--model", str(gemma4_dir), "-o", str(out), "--device", "cpu", "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "error: cpu: CUDA error: device-side assert triggered" in result.output
