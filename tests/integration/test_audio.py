"""Gemma 4 audio: every clip's rows equal transformers' per-clip reference, whatever ragged batch it shared;
long clips are windowed, never truncated (DESIGN §6)."""

from __future__ import annotations

import pytest
import torch
from audio_helpers import CLIP_SECONDS, RATE, make_clip, reference_audio_rows, write_clips
from helpers import record_batches, rel_error, run_images

import gemma_embed
from gemma_embed import engine
from gemma_embed.batching import longest_first, padded_length
from gemma_embed.media.audio import DecodedAudio
from gemma_embed.models.audio import AudioPreparer
from gemma_embed.models.gemma4_audio import Gemma4AudioTower, gemma4_audio_rows
from gemma_embed.models.loading import resolve_checkpoint


def run_audio(inputs, model, output, **options):
    return run_images(inputs, model, output, modality="audio", **options)


@pytest.fixture(scope="module")
def extractor(gemma4_dir):
    from transformers import AutoFeatureExtractor

    return AutoFeatureExtractor.from_pretrained(gemma4_dir)


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    return folder, write_clips(folder)


@pytest.fixture
def encode_log(monkeypatch):
    """The units of every device batch the audio tower runs."""
    return record_batches(monkeypatch, Gemma4AudioTower)


def test_token_count_alone_equals_batched_and_the_tower_mask(gemma4_dir, extractor, reference_model):
    clips = [make_clip(s, i) for i, s in enumerate([0.03, 0.5, 1.0, 2.37, 3.5, 7.9])]
    batched = extractor(clips, return_tensors="pt")
    for i, clip in enumerate(clips):
        alone = extractor([clip], return_tensors="pt")
        valid = int(alone["input_features_mask"].sum())
        assert valid == int(batched["input_features_mask"][i].sum())
        with torch.no_grad():
            out = reference_model.model.get_audio_features(alone["input_features"], alone["input_features_mask"])
        assert gemma4_audio_rows(valid) == int(out.attention_mask.sum()), clip.size


# ------------------------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("space", ["language", "tower"])
def test_ragged_batch_rows_match_each_clip_alone(
    tmp_path, monkeypatch, gemma4_dir, extractor, reference_model, clip_dir, encode_log, space
):
    folder, clips = clip_dir
    # Every clip in one ragged group, padded to the longest's rung (by default only equal rungs share a batch).
    monkeypatch.setattr(engine, "padded_buckets", longest_first)  # every clip in one ragged batch
    out = tmp_path / "audio.safetensors"
    code, records, err = run_audio([folder], gemma4_dir, out, space=space, batch_size=len(CLIP_SECONDS))
    assert code == 0, err

    frames = sorted(u.length for u in encode_log[0])
    assert len(encode_log) == 1 and len(frames) == len(CLIP_SECONDS), [len(b) for b in encode_log]
    assert len(set(frames)) == len(frames), "the clips must differ in frame count"

    result = gemma_embed.load(out)
    items = {item["path"].rsplit("/", 1)[-1]: item for item in gemma_embed.read_metadata(out)["items"]}
    for name, samples in clips.items():
        ref = reference_audio_rows(reference_model, extractor, samples, "gemma4", space)
        assert result[name].shape == ref.shape, name
        assert rel_error(result[name], ref) < 1e-5, name
        assert items[name]["duration_s"] == pytest.approx(CLIP_SECONDS[name], abs=1e-4)
        assert items[name]["sample_rate"] == RATE and "windows" not in items[name]


def test_default_grouping_batches_clips_of_one_rung_only(tmp_path, gemma4_dir, clip_dir, encode_log):
    folder, _ = clip_dir
    code, _, err = run_audio([folder], gemma4_dir, tmp_path / "a.safetensors")
    assert code == 0, err
    for batch in encode_log:
        assert len({padded_length(u.length) for u in batch}) == 1  # a clip's padding never depends on its batch
    assert sum(len(b) for b in encode_log) == len(CLIP_SECONDS)


def test_seventy_seconds_yield_three_windows_in_order(tmp_path, gemma4_dir, extractor, reference_model):
    import soundfile as sf

    samples = make_clip(70.0, 7)
    path = tmp_path / "long.wav"
    sf.write(path, samples, RATE, subtype="FLOAT")
    out = tmp_path / "long.safetensors"
    code, _, err = run_audio([path], gemma4_dir, out)
    assert code == 0, err

    (item,) = gemma_embed.read_metadata(out)["items"]
    assert item["duration_s"] == pytest.approx(70.0)
    assert [(w["start_s"], w["end_s"]) for w in item["windows"]] == [(0.0, 30.0), (30.0, 60.0), (60.0, 70.0)]
    expected = [
        reference_audio_rows(reference_model, extractor, samples[a * RATE : b * RATE], "gemma4")
        for a, b in [(0, 30), (30, 60), (60, 70)]
    ]
    assert [w["rows"] for w in item["windows"]] == [e.shape[0] for e in expected] == [750, 750, 250]
    rows = gemma_embed.load(out)[str(path)]
    assert rows.shape[0] == item["rows"] == 1750
    assert rel_error(rows, torch.cat(expected)) < 1e-5
    # In order: each window's rows sit where its boundaries say.
    assert rel_error(rows[1500:], expected[2]) < 1e-5


def test_tail_shorter_than_a_frame_is_recorded_not_dropped_silently(gemma4_dir, extractor):
    preparer = AudioPreparer(extractor, gemma4_audio_rows, window_s=1.0)
    samples = make_clip(2.005, 3)  # 80 samples past the second window: less than one 20 ms frame
    item = preparer.prepare(DecodedAudio(samples, RATE, RATE, 1, "test"))
    assert [w["rows"] for w in item.meta["windows"]] == [25, 25, 0]
    assert len(item.units) == 2
    with pytest.raises(ValueError, match=r"^too short: 100 samples, one frame needs 161$"):
        preparer.prepare(DecodedAudio(samples[:100], RATE, RATE, 1, "test"))
    # 161 is the extractor's own threshold: 160 samples give it no valid frame, 161 give one.
    valid = [int(extractor([samples[:n]], return_tensors="pt")["input_features_mask"].sum()) for n in (160, 161)]
    assert valid == [0, 1]


# ------------------------------------------------------------------------------------------- loading


def test_tower_loads_strictly_with_buffers_as_from_pretrained(gemma4_dir, reference_model):
    tower = Gemma4AudioTower(resolve_checkpoint(str(gemma4_dir)), "cpu", torch.float32)
    ours = dict(tower.tower.named_buffers()) | dict(tower.tower.named_parameters())
    theirs = dict(reference_model.model.audio_tower.named_buffers()) | dict(
        reference_model.model.audio_tower.named_parameters()
    )
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name
    assert torch.equal(
        tower.embed.embedding_projection.weight, reference_model.model.embed_audio.embedding_projection.weight
    )
