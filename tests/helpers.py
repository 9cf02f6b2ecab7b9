"""Small helpers for running the library the way the CLI does."""

from __future__ import annotations

import io
import json
from pathlib import Path

from gemma_embed.config import RunConfig
from gemma_embed.pipeline import run
from gemma_embed.progress import Reporter


def run_images(inputs, model: Path, output: Path, stdin=None, **options) -> tuple[int, list[dict], str]:
    """Run the pipeline; return (exit code, stdout JSON records, stderr text)."""
    options.setdefault("overwrite", True)
    config = RunConfig(
        modality=options.pop("modality", "images"),
        inputs=tuple(str(i) for i in inputs),
        output=output,
        model=str(model),
        device="cpu",
        **options,
    )
    out, err = io.StringIO(), io.StringIO()
    code = run(config, Reporter(jsonl=True, stdout=out, stderr=err, live=False), stdin=stdin)
    records = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    return code, records, err.getvalue()


def record_batches(monkeypatch, tower_cls) -> list[list]:
    """Spy on a tower: the list of units of every device batch it runs (the batch still runs)."""
    batches: list[list] = []
    original = tower_cls.encode

    def spy(self, units, space):
        batches.append(list(units))
        return original(self, units, space)

    monkeypatch.setattr(tower_cls, "encode", spy)
    return batches
