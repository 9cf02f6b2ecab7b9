"""`gemma-embed search` embeds its query in memory: it writes no file anywhere (an empty TMPDIR and working
folder stay empty)."""

from __future__ import annotations

import json
import os
import subprocess

from helpers import EXE, ROOT, run_images

EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
IMAGES = ROOT / "samples" / "media" / "images"


def test_search_writes_no_file(tmp_path):
    index = tmp_path / "made" / "index.safetensors"
    index.parent.mkdir()
    code, _, _ = run_images([str(IMAGES)], EG2, index)
    assert code == 0
    temp, work = tmp_path / "tmp", tmp_path / "work"
    temp.mkdir()
    work.mkdir()
    before = sorted(p.name for p in index.parent.iterdir())
    proc = subprocess.run(
        [EXE, "search", str(index), "a tall building at night", "--jsonl", "--device", "cpu"],
        cwd=work,
        env={**os.environ, "TMPDIR": str(temp), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    hits = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(hits) == len(list(IMAGES.iterdir())) and hits[0]["rank"] == 1
    assert list(temp.iterdir()) == [] and list(work.iterdir()) == []
    assert sorted(p.name for p in index.parent.iterdir()) == before
