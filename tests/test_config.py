"""One source of truth for options: the CLI is generated from RunConfig, with the same defaults and checks."""

from __future__ import annotations

import dataclasses
import pydoc

import pytest
from typer.testing import CliRunner

import gemma_embed
from gemma_embed import cli
from gemma_embed.config import RunConfig, option_of

COMMANDS = ("images", "video", "audio", "plan")


def _captured_config(monkeypatch, *args) -> RunConfig:
    """Parse a command line with the real app; return the RunConfig it would run (nothing is run)."""
    captured = {}

    def fake_run(config, reporter=None, stdin=None, own_process=False):
        captured["config"] = config
        raise SystemExit(0)

    import gemma_embed.pipeline as pipeline

    monkeypatch.setattr(pipeline, "run", fake_run)
    monkeypatch.setattr(pipeline, "plan", fake_run)
    result = CliRunner().invoke(cli.app, list(args))
    assert result.exit_code == 0, result.output
    return captured["config"]


@pytest.mark.parametrize("command", ["images", "video", "audio"])
def test_command_line_defaults_are_the_config_defaults(monkeypatch, command):
    config = _captured_config(monkeypatch, command, "some/folder")
    assert config == RunConfig(modality=command, inputs=("some/folder",))


def test_plan_takes_its_modality_as_an_option(monkeypatch):
    config = _captured_config(monkeypatch, "plan", "a.wav", "--modality", "audio", "--window-s", "10")
    assert config == RunConfig(modality="audio", inputs=("a.wav",), window_s=10.0)


def test_every_option_reaches_exactly_its_commands():
    for command in COMMANDS:
        names = {p.name for p in cli._parameters(command) if cli.ALIAS not in p.name} - {"paths"}
        wanted = {f.name for f in dataclasses.fields(RunConfig) if option_of(f) and command in option_of(f).commands}
        assert names == wanted, command
    # Per-modality options appear where they apply and nowhere else.
    assert "fps" in {p.name for p in cli._parameters("video")}
    assert "fps" not in {p.name for p in cli._parameters("images")}
    assert "window_s" not in {p.name for p in cli._parameters("video")}


def test_options_parse_into_typed_fields(monkeypatch):
    config = _captured_config(
        monkeypatch,
        "video",
        "v.mp4",
        "--fps",
        "2",
        "--max-frames",
        "8",
        "--pool",
        "frame",
        "--batch-size",
        "4",
        "-0",
        "--num-shards",
        "3",
        "--shard-index",
        "1",
    )
    assert (config.fps, config.max_frames, config.pool, config.batch_size) == (2.0, 8, "frame", 4)
    assert (config.null_separated, config.num_slices, config.slice_index) == (True, 3, 1)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--fps", "0"], "positive"),
        (["--max-frames", "0"], "at least 1"),
        (["--batch-size", "0"], "auto"),
        (["--memory-budget", "lots"], "memory budget"),
    ],
)
def test_the_command_line_applies_each_fields_check(args, message):
    result = CliRunner().invoke(cli.app, ["video", "v.mp4", *args])
    assert result.exit_code == 2 and message in result.output


def test_python_callers_get_the_same_checks_and_enums():
    config = RunConfig(modality="video", inputs=["a.mp4"], pool="frame", dtype="bfloat16")
    assert config.inputs == ("a.mp4",) and config.pool == "frame" and f"{config.dtype}" == "bfloat16"
    with pytest.raises(ValueError, match="pool='max'"):
        RunConfig(pool="max")
    with pytest.raises(ValueError, match="--max-soft-tokens"):
        RunConfig(max_soft_tokens=100).check()


def test_help_documents_the_library_face():
    text = pydoc.render_doc(gemma_embed, renderer=pydoc.plaintext)
    for name in (
        "run(config",
        "load(path",
        "iter_items(path",
        "read_metadata(path",
        "class RunConfig",
        "class Embedder",
    ):
        assert name in text, name
    assert gemma_embed.run.__doc__ and gemma_embed.load.__doc__ and gemma_embed.iter_items.__doc__


def test_run_from_python_returns_its_result_and_prints_nothing(tmp_path, capfd):
    from helpers import ROOT, SAMPLE_MODEL

    images = ROOT / "samples" / "media" / "images"
    out = tmp_path / "o.safetensors"
    result = gemma_embed.run(RunConfig(modality="images", inputs=[images], model=str(SAMPLE_MODEL), output=out))
    count = len(list(images.iterdir()))
    assert (result.ok, result.failed, result.items, result.output) == (count, 0, count, out)
    assert result.rows == sum(t.shape[0] for t in gemma_embed.load(out).values())
    assert result.summary()["type"] == "summary" and result.chunking
    printed = capfd.readouterr()
    assert printed.out == "" and printed.err == ""
