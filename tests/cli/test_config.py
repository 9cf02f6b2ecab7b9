"""The command line is generated from RunConfig: the same defaults, one typed field per option, each field's check."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gemma_embed import cli
from gemma_embed.config import RunConfig


@pytest.fixture(autouse=True)
def _inputs_exist(tmp_path, monkeypatch):
    """The inputs these command lines name exist (a missing path is refused before the run, as it should be)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "some" / "folder").mkdir(parents=True)
    for name in ("a.wav", "v.mp4"):
        (tmp_path / name).write_bytes(b"")


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
