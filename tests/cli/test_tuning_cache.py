"""The tuner's state kept across runs (--tuning-cache, issue 34 goal 2): a run too short to decide keeps its
pairs, the next run on the same machine and model continues from them and says so in its summary, and the rows
written are the same whichever batch sizes ran."""

from __future__ import annotations

import json
import subprocess

from helpers import EXE, ROOT
from safetensors.numpy import load_file

MODEL = ROOT / "samples" / "tiny-embeddinggemma"


def _chunking(stdout: str) -> dict:
    summary = json.loads(stdout.splitlines()[-1])
    chunking = summary["chunking"]
    return next(c for c in (chunking, *chunking.values()) if isinstance(c, dict) and "chosen" in c)


def _run(folder, name: str, cache: str) -> dict:
    proc = subprocess.run(
        # One thread, fixed: a count that follows the machine's load would restart the comparison (its pairs were
        # measured under other conditions) whenever the other test worker's load changed it.
        [
            EXE,
            "text",
            "lines.txt",
            "--model",
            MODEL,
            "-o",
            f"{name}.safetensors",
            "--tuning-cache",
            cache,
            "--cpu-threads",
            "1",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return _chunking(proc.stdout)


def test_a_second_run_continues_from_the_pairs_the_first_kept_and_writes_the_same_rows(tmp_path):
    # 4000 lines of 12 words: about five batches of 8192 tokens, enough for one pair after the uncounted first.
    words = "the quick brown fox jumps over a lazy dog near the river".split()
    (tmp_path / "lines.txt").write_text("\n".join(" ".join(words[i % 3 :] + words[: i % 3]) for i in range(4000)))
    first = _run(tmp_path, "first", "cache.json")
    assert "stored" not in first, first
    states = json.loads((tmp_path / "cache.json").read_text())["states"]
    [(key, state)] = states.items()
    assert key.startswith("cpu: ") and "EmbeddingGemmaTextTower" in key and "float32" in key, key
    assert state["current"] == first["chosen"]
    assert state["comparison"] is not None and len(state["comparison"]["log_ratios"]) >= 1, state

    second = _run(tmp_path, "second", "cache.json")
    assert second["stored"].startswith(f"continued from {state['current']}"), second
    assert second["stored"].endswith("kept for this machine and tower in cache.json"), second
    kept = json.loads((tmp_path / "cache.json").read_text())["states"][key]
    pairs = len((kept["comparison"] or {}).get("log_ratios", [])) + len(kept["moves"])
    assert pairs > len(state["comparison"]["log_ratios"]) or kept["moves"], kept  # the second run added to it

    first_rows, second_rows = (load_file(tmp_path / f"{n}.safetensors") for n in ("first", "second"))
    assert first_rows.keys() == second_rows.keys()
    assert all((first_rows[k] == second_rows[k]).all() for k in first_rows)


def test_off_keeps_nothing(tmp_path):
    (tmp_path / "lines.txt").write_text("\n".join(f"line {i} of a short file" for i in range(50)))
    chunking = _run(tmp_path, "out", "off")
    assert "stored" not in chunking
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines.txt", "out.safetensors"]
