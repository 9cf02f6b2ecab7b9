"""The engine on a tiny checkpoint: out-of-memory back-off leaves the outputs unchanged, one failing unit spares
the rest, and a device error that persists ends the run keeping what was saved (--resume finishes it)."""

from __future__ import annotations

import pytest
import torch
from helpers import fail_chunks_above, record_batches, run_images, write_image

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


def test_the_first_batch_is_encoded_before_a_whole_window_is_decoded(tmp_path, gemma4_dir, monkeypatch):
    """Issue 34, goal 1: the first window is one batch, so the first records do not wait for WINDOW_BATCHES
    batches' worth of decoding; later windows are full. Before, 12 images at --batch-size 2 decoded 6 (a window
    of 4 batches in the making) before the first encode. Here every decode but the first batch's waits until the
    first encode has begun: a run that needed more than one batch decoded before encoding would wait out the
    guard instead (an order of events, not of timings: a busy machine cannot change it)."""
    import threading

    from gemma_embed import decoding

    folder = tmp_path / "same-size"
    folder.mkdir()
    for seed in range(12):
        write_image(folder / f"{seed:02d}.png", 96, 64, seed)
    options = {"max_soft_tokens": 70, "batch_size": 2, "workers": 2}
    first_batch = {f"{seed:02d}.png" for seed in range(options["batch_size"])}
    encoding = threading.Event()
    waited_out: list[str] = []
    decoded_before_encoding: list[str] = []
    decode = decoding.decode_and_prepare

    def held_decode(modality, source, *args, **kwargs):
        name = source.key.rsplit("/", 1)[-1]
        if name not in first_batch and not encoding.wait(timeout=120):  # only against a hang
            waited_out.append(name)
        prepared = decode(modality, source, *args, **kwargs)
        if not encoding.is_set():
            decoded_before_encoding.append(name)
        return prepared

    encode = Gemma4VisionTower.encode

    def counted_encode(self, units, space):
        encoding.set()
        return encode(self, units, space)

    monkeypatch.setattr(decoding, "decode_and_prepare", held_decode)
    monkeypatch.setattr(Gemma4VisionTower, "encode", counted_encode)
    code, records, _ = run_images([folder], gemma4_dir, tmp_path / "o.safetensors", **options)
    assert code == 0 and records[-1]["ok"] == 12
    # The first encode began with the first batch's two items decoded and nothing else: no decode waited it out.
    assert not waited_out, waited_out
    assert sorted(decoded_before_encoding) == sorted(first_batch), decoded_before_encoding  # not a window's 8
    reference = tmp_path / "reference.safetensors"
    assert run_images([folder], gemma4_dir, reference, max_soft_tokens=70, batch_size=1)[0] == 0
    ours, theirs = gemma_embed.load(tmp_path / "o.safetensors"), gemma_embed.load(reference)
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
