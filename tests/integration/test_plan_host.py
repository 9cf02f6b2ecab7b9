"""`plan` shows the host side: on a CPU the one budget is shared out between the model, decoding and the encode."""

from __future__ import annotations

import json
import math

from helpers import ROOT, SAMPLE_MODEL
from safetensors import safe_open
from typer.testing import CliRunner

from gemma_embed.cli import app

SIZES = {"F32": 4, "BF16": 2, "F16": 2}
SAMPLE_IMAGES = ROOT / "samples" / "media" / "images"


def test_plan_shows_the_host_budget_shared_out_with_the_model_counted():
    result = CliRunner().invoke(
        app, ["plan", str(SAMPLE_IMAGES), "--model", str(SAMPLE_MODEL), "--device", "cpu", "--memory-budget", "64MiB"]
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout.strip().splitlines()[-1])
    host = plan["host"]
    assert host["budget"] == 64 * 2**20
    assert host["model"] + host["decode"] + host["encode"] == host["budget"]
    # The model is the image tower's weights as the checkpoint stores them (a few bytes of buffers besides).
    with safe_open(str(SAMPLE_MODEL / "model.safetensors"), "pt") as f:
        stored = sum(
            math.prod(f.get_slice(k).get_shape()) * SIZES[f.get_slice(k).get_dtype()]
            for k in f.keys()
            if k.startswith(("model.vision_tower.", "model.embed_vision."))
        )
    assert stored <= host["model"] <= stored + 4096
    # Every bucket's chunk fits the encode's share, not the whole budget.
    assert all(b["chunk"] * b["cost_per_unit"] <= host["encode"] or b["chunk"] == 1 for b in plan["buckets"])
