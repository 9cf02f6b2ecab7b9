"""One source of truth for options: each RunConfig field reaches exactly its commands, Python callers get the
same checks and enums as the command line, and the library face is documented."""

from __future__ import annotations

import dataclasses
import pydoc

import pytest

import gemma_embed
from gemma_embed import cli
from gemma_embed.config import RunConfig, option_of

COMMANDS = ("images", "video", "audio", "plan")


def test_every_option_reaches_exactly_its_commands():
    for command in COMMANDS:
        names = {p.name for p in cli._parameters(command) if cli.ALIAS not in p.name} - {"paths"}
        wanted = {f.name for f in dataclasses.fields(RunConfig) if option_of(f) and command in option_of(f).commands}
        assert names == wanted, command
    # Per-modality options appear where they apply and nowhere else.
    assert "fps" in {p.name for p in cli._parameters("video")}
    assert "fps" not in {p.name for p in cli._parameters("images")}
    assert "window_s" not in {p.name for p in cli._parameters("video")}


def test_python_callers_get_the_same_checks_and_enums():
    config = RunConfig(modality="video", inputs=["a.mp4"], pool="frame", dtype="bfloat16")
    assert config.inputs == ("a.mp4",) and config.pool == "frame" and f"{config.dtype}" == "bfloat16"
    with pytest.raises(ValueError, match="pool='max'"):
        RunConfig(pool="max")
    with pytest.raises(ValueError, match="^max_soft_tokens: "):  # named as a Python caller writes it
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
