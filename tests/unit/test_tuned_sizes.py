"""The file that keeps the tuner's state across runs (gemma_embed/tuned_sizes.py): a cache, so a file that is not
one of ours is started afresh and a folder that cannot be written stops nothing."""

from __future__ import annotations

import json
import os

import pytest

from gemma_embed.tuned_sizes import FORMAT, MAX_BYTES, TunedSizes, default_location

STATE = {"current": 8192, "rejected": [16384], "comparison": None, "moves": ["kept 8192 over 16384: 1.01x"]}


def test_states_are_kept_by_key_and_written_whole(tmp_path):
    path = tmp_path / "cache" / "batch-sizes.json"
    sizes = TunedSizes.from_setting(str(path))
    assert sizes is not None and sizes.load("a") is None
    assert sizes.save("a", STATE) and sizes.save("b", {**STATE, "current": 4096})
    assert sizes.load("a") == STATE and sizes.load("b")["current"] == 4096
    assert json.loads(path.read_text())["format"] == FORMAT
    assert [p.name for p in path.parent.iterdir()] == ["batch-sizes.json"]  # no temporary file left


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", json.dumps({"format": "other", "states": {"a": STATE}}).encode(), b"\xff\xfe\x00"],
    ids=["damaged", "a list", "another format", "not text"],
)
def test_a_file_that_is_not_ours_is_started_afresh(tmp_path, content):
    path = tmp_path / "batch-sizes.json"
    path.write_bytes(content)
    sizes = TunedSizes.from_setting(str(path))
    assert sizes.load("a") is None
    assert sizes.save("a", STATE) and sizes.load("a") == STATE


def test_a_file_too_large_is_not_read(tmp_path):
    path = tmp_path / "batch-sizes.json"
    path.write_text(json.dumps({"format": FORMAT, "states": {"a": STATE}, "pad": "x" * MAX_BYTES}))
    assert TunedSizes.from_setting(str(path)).load("a") is None


def test_an_unwritable_folder_stops_nothing(tmp_path):
    if os.geteuid() == 0:
        path = "/proc/version/batch-sizes.json"  # no folder can be made under a file, not even by root
    else:
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o555)
        path = str(folder / "batch-sizes.json")
    sizes = TunedSizes.from_setting(path)
    assert sizes.save("a", STATE) is False and sizes.load("a") is None


def test_off_keeps_nothing_and_auto_is_the_users_cache_folder(monkeypatch, tmp_path):
    assert TunedSizes.from_setting("off") is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert str(TunedSizes.from_setting("auto").where) == str(tmp_path / "gemma-embed" / "batch-sizes.json")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert str(default_location()) == str(tmp_path / "home" / ".cache" / "gemma-embed" / "batch-sizes.json")
