"""Each tampered-file case is one `error:` line and exit 2 from the command line: `images --resume` (before the
model loads), `inspect`, `export` and `search` (issue 20)."""

from __future__ import annotations

import subprocess

import pytest
from helpers import EXE, ROOT, SAMPLE_MODEL
from store_helpers import CASES, write_output, write_part
from typer.testing import CliRunner

from gemma_embed.cli import app

IMAGES = ROOT / "samples" / "media" / "images"
# What search meets before it embeds the query (keys and items are decoded later, when the hits are formed).
SEARCH_SEES = ("a directory", "a FIFO", "a pickle")


def one_error_line(result, *names: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(name in lines[0] for name in names), lines[0]
    return lines[0]


@pytest.mark.parametrize("case", list(CASES))
def test_resume_over_a_damaged_part(tmp_path, case):
    out = tmp_path / "out.safetensors"
    good = write_part(out)
    damaged = good.with_name("part-000050.safetensors")
    damaged.write_bytes(good.read_bytes())
    CASES[case][0](damaged)
    args = ["images", str(IMAGES), "--model", str(SAMPLE_MODEL), "-o", str(out), "--resume"]
    line = one_error_line(CliRunner().invoke(app, args), str(damaged), "not a part file", "--overwrite")
    assert CASES[case][1] in line


@pytest.mark.parametrize("case", list(CASES))
def test_readers_of_a_damaged_output(tmp_path, case):
    out = write_output(tmp_path / "out.safetensors")
    CASES[case][0](out)
    runner = CliRunner()
    if case != "a directory":  # a folder as the output: "output path is a folder" (test_store)
        resumed = runner.invoke(app, ["images", str(IMAGES), "--model", str(SAMPLE_MODEL), "-o", str(out), "--resume"])
        assert CASES[case][1] in one_error_line(resumed, str(out), "--overwrite")
    for args in (["inspect", str(out)], ["inspect", str(out), "--json"], ["export", str(out), "--to", "parquet"]):
        assert CASES[case][1] in one_error_line(runner.invoke(app, args), str(out))
    assert not (tmp_path / "out.parquet").exists()
    if case in SEARCH_SEES:
        assert CASES[case][1] in one_error_line(runner.invoke(app, ["search", str(out), "a query"]), str(out))


def test_the_real_process_prints_one_line_and_no_traceback(tmp_path):
    out = tmp_path / "out.safetensors"
    part = write_part(out)
    part.with_name("part-000050.safetensors").mkdir()
    proc = subprocess.run(
        [EXE, "images", str(IMAGES), "--model", str(SAMPLE_MODEL), "-o", str(out), "--resume"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: {part.parent}/part-000050.safetensors: not a part file (is a directory); "
        f"remove it or run with --overwrite\n"
    )
