"""Every command the README and docs/ show in a ```bash block runs on the samples, exit 0 (issue 24): the README's
quick start first (the docs use its outputs), then each page. Setup and test lines (pip, python) are skipped.
In-process (typer's CliRunner), each command once, in a folder with `docs/`, the sample checkpoints and a few of
the sample media linked in. The files
the commands write are the ones the README and pages name, and `.gitignore` covers every one of them."""

from __future__ import annotations

import fnmatch
import re
import shlex

import pytest
from helpers import ROOT
from typer.testing import CliRunner

from gemma_embed.cli import app

# The sample media the commands get here (the pages name tall.png).
SMALL_MEDIA = {"images": ["tall.png", "pixel.png"], "video": ["one-frame.avi"], "audio": ["chirp-16k.wav"]}
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def shown_commands(page) -> list[list[str]]:
    """The gemma-embed command lines of a page's ```bash blocks, as argument lists (comments dropped)."""
    found = []
    for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "gemma-embed":
                found.append(words[1:])
            else:
                assert not words or words[0] in ("pip", "python"), f"{page.name}: not a gemma-embed command: {line}"
    return found


def ignored(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, p.removeprefix("/")) for p in patterns)


def test_the_readme_front_page_is_short_and_points_to_the_docs():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 120
    for page in PAGES[1:]:
        assert f"](docs/{page.name})" in text or page.name == "layout.md" and "docs/layout.md" in text
    assert "python -m pytest -q tests/unit" in text and "random weights" in text


@pytest.mark.slow
def test_every_command_shown_runs_on_the_samples(tmp_path, monkeypatch):
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    samples = tmp_path / "samples"  # the checkpoints, and a few of the media: each command once, cheaply
    for checkpoint in ROOT.joinpath("samples").glob("tiny-*"):
        (samples / checkpoint.name).parent.mkdir(exist_ok=True)
        (samples / checkpoint.name).symlink_to(checkpoint)
    for kind, names in SMALL_MEDIA.items():
        (samples / "media" / kind).mkdir(parents=True)
        for name in names:
            (samples / "media" / kind / name).symlink_to(ROOT / "samples" / "media" / kind / name)
    monkeypatch.chdir(tmp_path)
    patterns = [p for p in (ROOT / ".gitignore").read_text().splitlines() if p and not p.startswith("#")]
    runner = CliRunner()
    ran = 0
    for page in PAGES:
        before = {p.name for p in tmp_path.iterdir()}
        for args in shown_commands(page):
            result = runner.invoke(app, args, catch_exceptions=False)
            assert result.exit_code == 0, f"{page.name}: gemma-embed {shlex.join(args)}\n{result.stderr}"
            ran += 1
        written = {p.name for p in tmp_path.iterdir()} - before
        text = page.read_text(encoding="utf-8")
        for name in written:
            assert ignored(name, patterns), f"{page.name} writes {name}, which .gitignore does not cover"
            stem = name.split("-0000")[0]  # output shards: the page names the pattern
            assert name in text or stem in text, f"{page.name} writes {name} without saying so"
    assert ran >= 15
