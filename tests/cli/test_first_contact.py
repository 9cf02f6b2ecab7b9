"""What a new user meets in the first hour (issue 24), each with the exact line: a typo in an input path, a missing
output folder for every command that writes a file and the note saying where it wrote, the wrong command for the
files found, `plan` at 80 columns, `inspect` on retrieval vectors, the search table's prompt and scoring line,
and `--list-extensions`. In-process (typer's CliRunner) wherever the behaviour allows."""

from __future__ import annotations

import io
import re

import pytest
from helpers import ROOT, SAMPLE_MODEL, reporting_cli
from typer.testing import CliRunner

import gemma_embed
from gemma_embed.cli import app

EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
MEDIA = ROOT / "samples" / "media"
IMAGES = MEDIA / "images"
NODIR = "error: nodir: output folder does not exist"


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def retrieval_index(tmp_path_factory):
    """Two images as EmbeddingGemma 2 retrieval vectors (no prompt: the embed commands' default)."""
    out = tmp_path_factory.mktemp("first-contact") / "index.safetensors"
    inputs = [IMAGES / name for name in ("tall.png", "pixel.png")]
    gemma_embed.run(gemma_embed.RunConfig(modality="images", inputs=inputs, model=str(EG2), output=out))
    return out


def test_a_missing_input_path_is_one_line_before_torch_is_imported_and_writes_nothing(tmp_path):
    typo = tmp_path / "imges"
    proc, report = reporting_cli("images", typo, "--model", SAMPLE_MODEL, "-o", tmp_path / "typo.safetensors")
    assert proc.returncode == 2
    assert proc.stderr == f"error: {typo}: no such file or directory\n"
    # At once: checked before torch is imported (seconds on a busy machine), let alone the model loaded.
    assert report["imported"] == []
    assert list(tmp_path.iterdir()) == []  # no output, no errors file: the corrected rerun needs no --overwrite


@pytest.mark.parametrize(
    "command",
    [
        ["images", IMAGES, "--model", SAMPLE_MODEL, "-o", "nodir/x.safetensors"],
        ["search", "INDEX", "a tall building", "--html", "nodir/hits.html"],
        ["export", "INDEX", "--to", "parquet", "-o", "nodir/x.parquet"],
        ["export", "INDEX", "--to", "npy", "-o", "nodir/x.npy"],
        ["index", "nodir/index.safetensors"],
    ],
    ids=["embed", "search-html", "export-parquet", "export-npy", "index"],
)
def test_every_command_that_writes_refuses_a_missing_folder_in_one_line(
    retrieval_index, tmp_path, monkeypatch, command
):
    monkeypatch.chdir(tmp_path)
    result = cli(*[retrieval_index if a == "INDEX" else a for a in command])
    assert result.exit_code == 2
    assert result.stderr == NODIR + "\n"  # the one line, no temporary name, no traceback
    assert result.stdout == ""  # before any work: no table, no summary
    assert list(tmp_path.iterdir()) == []


def test_each_command_that_writes_says_where_it_wrote(retrieval_index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("search", retrieval_index, "a tall building", "--html", "hits.html", "-k", "2")
    assert result.exit_code == 0 and (tmp_path / "hits.html").is_file()
    assert result.stderr == "note: wrote hits.html\n"
    result = cli("export", retrieval_index, "--to", "parquet", "-o", "x.parquet")
    assert result.exit_code == 0 and result.stderr == "note: wrote x.parquet\n"
    result = cli("export", retrieval_index, "--to", "npy", "-o", "x.npy")
    assert result.exit_code == 0 and result.stderr == "note: wrote x.npy, x.keys.txt\n"
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(retrieval_index.read_bytes())
    result = cli("index", "copy.safetensors")
    assert result.exit_code == 0
    assert re.fullmatch(r"note: index: wrote copy\.search-index in \d+\.\d s", result.stderr.splitlines()[-1])


@pytest.mark.parametrize(
    "args, end",
    [
        (
            ["images", MEDIA / "audio", "--model", SAMPLE_MODEL, "-o", "x.safetensors"],
            "; passed over 5 files (.mp3 x1, .wav x1, .ogg x1, .flac x1, .m4a x1); "
            "these are audio files: gemma-embed audio PATH...",
        ),
        (
            ["plan", MEDIA / "video", "--model", SAMPLE_MODEL],
            "; passed over 5 files (.mp4 x2, .avi x1, .webm x1, .mkv x1); "
            "these are video files: gemma-embed plan --modality video PATH...",
        ),
    ],
    ids=["images-on-audio", "plan-on-video"],
)
def test_the_wrong_command_for_the_files_names_the_right_one(tmp_path, monkeypatch, args, end):
    monkeypatch.chdir(tmp_path)
    result = cli(*args)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: no image files found in {args[1]}: looked for ")
    assert "extensions: gemma-embed images --list-extensions)" in line
    assert line.endswith(end), line
    assert list(tmp_path.iterdir()) == []


def test_plan_heading_and_caption_take_the_console_width_and_break_between_phrases():
    from rich.console import Console

    from gemma_embed import pipeline
    from gemma_embed.progress import plan_phrases, print_plan

    plan = pipeline.plan(gemma_embed.RunConfig(modality="images", inputs=[IMAGES], model=str(SAMPLE_MODEL)))
    out = io.StringIO()
    print_plan(plan, Console(file=out, width=80, color_system=None))
    lines = out.getvalue().splitlines()
    top = next(n for n, line in enumerate(lines) if line.startswith("┏"))
    bottom = next(n for n, line in enumerate(lines) if line.startswith("└"))
    heading, caption = plan_phrases(plan)
    for shown, phrases in ((lines[:top], heading), (lines[bottom + 1 :], caption)):
        assert shown and all(len(line) <= 80 for line in shown)
        assert [p for line in shown for p in line.split("; ")] == phrases  # each line whole phrases, in order
    # The heading's two phrases do not fit 80 columns together; each is one line, not folded into the table's width.
    assert lines[0] == f"images: {plan['items']} items, {plan['units']} units on cpu ({plan['dtype']})"
    assert lines[top - 1].startswith("free ") and ", budget " in lines[top - 1]
    assert "chunk = the memory cap" in lines[bottom + 1]


def test_inspect_shows_retrieval_pooling_and_no_empty_rows(retrieval_index):
    result = cli("inspect", retrieval_index)
    assert result.exit_code == 0
    header = result.stdout.split("┏")[0].splitlines()
    shown = " ".join(" ".join(line.split()) for line in header)  # a long value folds onto the next lines
    assert (
        "pooling none (the towers' rows unpooled; each item one vector, the checkpoint's mean over its tokens)" in shown
    )
    names = [line.split()[0] for line in header if line[:2].strip()]  # a row's first line starts with its name
    assert "revision" not in names and {"model", "space", "dtype", "items"} <= set(names)
    # The JSON form keeps the file's exact values.
    import json

    exact = json.loads(cli("inspect", retrieval_index, "--json").stdout)
    assert (exact["pooling"], exact["revision"]) == ("none", "")


def test_search_says_its_prompt_and_scoring_and_how_to_find_an_item_itself(retrieval_index):
    result = cli("search", retrieval_index, "--image", IMAGES / "tall.png", "-k", "1", "--device", "cpu")
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "queries embedded with the query prompt, items with no prompt; score: cosine similarity of the vectors; "
        '--prompt "" embeds a query as its items were, to find an item itself'
    )
    rank, score, key = lines[2].split()[:3]
    assert key.endswith("tall.png") and float(score) < 0.999  # the query prompt: its own item scores below 1
    lines = cli("search", retrieval_index, "--image", IMAGES / "tall.png", "-k", "1", "--prompt", "").stdout
    first, _, hit = lines.splitlines()
    assert first == "queries and items embedded with no prompt; score: cosine similarity of the vectors"
    rank, score, key = hit.split()[:3]
    assert (rank, score) == ("1", "1.0000") and key.endswith("tall.png")  # embedded as its item was


def test_scoring_lines_for_named_prompts_and_soft_tokens():
    from gemma_embed.search import scoring

    prompts = {"query": "task: search result | query: ", "document": "title: none | text: "}
    made = {"space": "retrieval", "preprocessing": '{"prompt": "title: none | text: "}'}
    assert scoring(made, "query", None, True, prompts) == (
        "queries embedded with the query prompt, items with the document prompt; score: cosine similarity of the "
        "vectors; --prompt-name document embeds a query as its items were, to find an item itself"
    )
    assert scoring(made, "query", None, False, prompts) == (
        "queries embedded with the query prompt, items with the document prompt; score: cosine similarity of the "
        "vectors"
    )
    assert scoring(made, "document", None, True, prompts) == (
        "queries and items embedded with the document prompt; score: cosine similarity of the vectors"
    )
    soft = {"space": "language", "pooling": "none"}
    assert scoring(soft, None, None, True) == (
        "each query is the mean of its rows; score: cosine similarity with each item's best row"
    )
    assert scoring({**soft, "pooling": "frame"}, None, None, True).endswith("each item's best frame row")


def test_list_extensions_prints_what_the_walk_takes():
    from gemma_embed.sources.files import extensions

    for command in ("images", "video", "audio", "text"):
        result = cli(command, "--list-extensions")
        assert result.exit_code == 0
        assert result.stdout.split() == sorted(e.lstrip(".") for e in extensions(command))
    assert {"png", "jpg", "webp"} <= set(cli("images", "--list-extensions").stdout.split())
    assert cli("text", "--list-extensions").stdout == "md text txt\n"
