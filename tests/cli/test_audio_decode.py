"""The audio command on a folder of broken and good files: each bad one named in one line, the others written."""

from __future__ import annotations

import json
import subprocess

from audio_helpers import broken_files, write_pyav, write_soundfile
from helpers import EXE, ROOT

import gemma_embed


def test_command_reports_bad_files_and_writes_the_others(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    expected = broken_files(folder)
    write_soundfile(folder / "good.wav", 44_100, "PCM_16")
    write_pyav(folder / "good.m4a", 48_000, "aac")
    out = tmp_path / "out.safetensors"
    # The folder walk takes video containers too (for their soundtracks): the silent film is walked and named.
    model = ROOT / "samples" / "tiny-gemma4"
    proc = subprocess.run(
        [EXE, "audio", str(folder), "--model", str(model), "-o", str(out), "--jsonl"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Note:" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == len(expected), proc.stderr
    for name, words in expected.items():
        (line,) = [e for e in errors if f"{name}:" in e]
        assert words in line, line
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    failed = {r["key"] for r in records if r["type"] == "item" and r["status"] == "failed"}
    assert failed == set(expected)
    assert sorted(gemma_embed.load(out)) == ["good.m4a", "good.wav"]
