"""Help as a new user reads it, and a wrong choice as one plain line (issue: first contact)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from gemma_embed import cli


def help_text(*args: str) -> str:
    result = CliRunner().invoke(cli.app, [*args, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def option_line(text: str, name: str) -> str:
    (line,) = [line for line in text.splitlines() if re.search(rf"\s{re.escape(name)}\s", line)]
    return " ".join(line.strip("│ ").split())


def test_top_level_flags_show_no_type():
    text = help_text()
    assert option_line(text, "--version") == "--version Print the version."
    assert option_line(text, "--help") == "--help Show this message and exit."


def test_only_video_offers_pool_frame():
    assert "frame" in option_line(help_text("video"), "--pool")
    for command in ("images", "audio"):
        assert (
            option_line(help_text(command), "--pool")
            == "--pool POOL none (every row) or mean (one row). [default: none]"
        )


def test_max_soft_tokens_says_its_default():
    assert option_line(help_text("images"), "--max-soft-tokens").endswith("per image (default: the checkpoint's).")
    assert option_line(help_text("video"), "--max-soft-tokens").endswith("per frame (default: the checkpoint's).")
    # The released checkpoints' numbers are their family's words, which `gemma-embed models` prints.
    models = CliRunner().invoke(cli.app, ["models"], env={"COLUMNS": "200"})
    assert "Gemma 4: soft tokens" in models.output
    assert "(the released checkpoints': 280 an image, 70 a frame," in " ".join(models.output.split())


def test_plan_lists_its_modalities_and_search_k_shows_no_range():
    assert "images, video, audio or text" in option_line(help_text("plan"), "--modality")
    assert option_line(help_text("search"), "--top") == "--top -k K Hits to show (at least 1). [default: 10]"


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["export", "x.safetensors", "--to", "csv"],
            "error: Invalid value for '--to': 'csv': choose parquet, npy or jsonl",
        ),
        (["images", "x", "--pool", "bogus"], "error: Invalid value for '--pool': 'bogus': choose none, mean or frame"),
        (
            ["images", "x", "--dtype", "f8"],
            "error: Invalid value for '--dtype': 'f8': choose auto, float32, bfloat16 or float16",
        ),
        (["search", "x", "q", "-k", "0"], "error: Invalid value for '--top' / '-k': must be at least 1, got 0"),
    ],
    ids=["export-to", "pool", "dtype", "top"],
)
def test_a_wrong_value_is_one_plain_line(capsys, monkeypatch, args, line):
    monkeypatch.setattr("sys.argv", ["gemma-embed", *args])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    (printed,) = capsys.readouterr().err.splitlines()
    assert printed.startswith(line + " (see '"), printed


def test_each_commands_help_names_every_family_that_runs_it_or_none():
    """A command's help never names one family where several run it (`text --help` said EmbeddingGemma 2 only,
    though EmbeddingGemma runs it too): each family name it mentions comes with all the others of that command."""
    from gemma_embed.config import Modality
    from gemma_embed.models import registry

    names = [family.name for family in registry.families()]
    for modality in Modality:
        text = " ".join(help_text(str(modality)).split())
        running = [family.name for family in registry.families() if modality in family.commands]
        # the longest name first: "EmbeddingGemma 2" mentions EmbeddingGemma 2, not EmbeddingGemma
        pattern = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        mentioned = set(re.findall(rf"\b(?:{pattern})\b", text))
        assert not mentioned or set(running) <= mentioned, (modality, sorted(mentioned))
