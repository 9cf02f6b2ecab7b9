"""`gemma_embed.run(RunConfig(...))` from Python: its result, and nothing printed."""

from __future__ import annotations

import gemma_embed
from gemma_embed.config import RunConfig


def test_run_from_python_returns_its_result_and_prints_nothing(tmp_path, capfd):
    from helpers import ROOT, SAMPLE_MODEL

    images = ROOT / "samples" / "media" / "images"
    out = tmp_path / "o.safetensors"
    result = gemma_embed.run(RunConfig(modality="images", inputs=[images], model=str(SAMPLE_MODEL), output=out))
    count = len(list(images.iterdir()))
    assert (result.ok, result.failed, result.items, result.output) == (count, 0, count, out)
    assert result.rows == sum(t.shape[0] for t in gemma_embed.load(out).values())
    assert result.summary()["type"] == "summary" and result.chunking
    # The stage says in words why its batch size (tests/unit/test_tuning.py has each case).
    reasons = ("still exploring", "capped by memory", "fastest measured", "no batch held half of", "the size in use")
    assert result.chunking["reason"].startswith(reasons)
    printed = capfd.readouterr()
    assert printed.out == "" and printed.err == ""
