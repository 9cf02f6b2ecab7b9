"""The engine on a tiny checkpoint: out-of-memory back-off leaves the outputs unchanged, one failing unit spares
the rest, and a device error that persists ends the run keeping what was saved (--resume finishes it)."""

from __future__ import annotations

import pytest
import torch
from helpers import fail_chunks_above, record_batches, run_images

import gemma_embed
from gemma_embed.errors import DeviceError
from gemma_embed.models.gemma4 import Gemma4VisionTower


def test_oom_backoff_gives_same_outputs(tmp_path, gemma4_dir, image_dir, monkeypatch):
    reference_out = tmp_path / "ref.safetensors"
    assert run_images([image_dir], gemma4_dir, reference_out, max_soft_tokens=70, batch_size=1)[0] == 0

    batches = record_batches(monkeypatch, Gemma4VisionTower)
    fail_chunks_above(monkeypatch, Gemma4VisionTower, 1)
    out = tmp_path / "oom.safetensors"
    code, records, err = run_images([image_dir], gemma4_dir, out, max_soft_tokens=70)
    assert code == 0
    assert max(len(b) for b in batches) == 1  # every chunk that reached the tower fitted under the injected limit
    assert records[-1]["oom_backoffs"] >= 1
    assert "out of memory at chunk" in err and "retrying with chunk" in err
    ours, ref = gemma_embed.load(out), gemma_embed.load(reference_out)
    assert ours.keys() == ref.keys()
    for key in ref:
        assert torch.equal(ours[key], ref[key])


def test_encode_failure_of_one_unit_spares_the_rest(tmp_path, gemma4_dir, image_dir, monkeypatch):
    original = Gemma4VisionTower.encode

    def flaky(self, units, space):
        if any(u.rows == 60 for u in units):  # the 4000x300 image at 70 tokens
            raise RuntimeError("kernel exploded")
        return original(self, units, space)

    monkeypatch.setattr(Gemma4VisionTower, "encode", flaky)
    code, records, err = run_images([image_dir], gemma4_dir, tmp_path / "o.safetensors", max_soft_tokens=70)
    failed = [r for r in records if r.get("status") == "failed"]
    assert code == 1 and failed and all(r["stage"] == "encode" for r in failed)
    assert len(gemma_embed.load(tmp_path / "o.safetensors")) == len(records) - 1 - len(failed)


def test_persistent_device_error_ends_the_run_keeping_saved_items(tmp_path, gemma4_dir, image_dir, monkeypatch):
    original = Gemma4VisionTower.encode
    calls = []

    def broken_after_two(self, units, space):
        calls.append(len(units))
        if len(calls) >= 3:
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
        return original(self, units, space)

    monkeypatch.setattr(Gemma4VisionTower, "encode", broken_after_two)
    out = tmp_path / "o.safetensors"
    with pytest.raises(DeviceError, match="illegal memory access") as raised:
        run_images([image_dir], gemma4_dir, out, max_soft_tokens=70, batch_size=1, flush_every=1)
    assert "--resume" in str(raised.value)
    assert len(calls) == 3  # stopped at once: no unit after the failure was tried, none recorded as failed
    assert not (tmp_path / "o.safetensors.errors.jsonl").exists()
    saved = sorted((tmp_path / "o.safetensors.parts").glob("part-*.safetensors"))
    assert len(saved) == 2  # the two items encoded before the failure are kept

    monkeypatch.setattr(Gemma4VisionTower, "encode", original)
    code, records, err = run_images([image_dir], gemma4_dir, out, max_soft_tokens=70, resume=True)
    assert code == 0 and records[-1]["resumed"] == 2 and records[-1]["ok"] == len(gemma_embed.load(out))
