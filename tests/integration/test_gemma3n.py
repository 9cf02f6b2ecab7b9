"""Gemma 3n audio: the inverted mask, the padding leak at a clip's last token, and the batching that is exact.

The per-clip reference is `Gemma3nForConditionalGeneration.from_pretrained` with its timm vision tower stubbed
out (timm is not installed; the checkpoint holds no vision-tower tensors): `get_audio_features(features, ~mask)`.
"""

from __future__ import annotations

import pytest
import torch
from audio_helpers import CLIP_SECONDS, RATE, make_clip, reference_audio_rows, write_clips
from helpers import record_batches, rel_error, run_images
from make_tiny_checkpoint import build_gemma3n, gemma3n_without_vision_tower

import gemma_embed
from gemma_embed import engine
from gemma_embed.batching import longest_first
from gemma_embed.media.audio import DecodedAudio
from gemma_embed.models.audio import AudioPreparer
from gemma_embed.models.gemma3n import Gemma3nAudioTower, gemma3n_audio_rows
from gemma_embed.models.loading import resolve_checkpoint


@pytest.fixture(scope="module")
def gemma3n_dir(tmp_path_factory):
    return build_gemma3n(tmp_path_factory.mktemp("ckpt") / "g3n", seed=1, vision=False)  # audio tests


@pytest.fixture(scope="module")
def reference(gemma3n_dir):
    from transformers import AutoFeatureExtractor, Gemma3nForConditionalGeneration

    with gemma3n_without_vision_tower():
        model = Gemma3nForConditionalGeneration.from_pretrained(gemma3n_dir, dtype=torch.float32).eval()
    return model, AutoFeatureExtractor.from_pretrained(gemma3n_dir)


@pytest.fixture(scope="module")
def tower(gemma3n_dir):
    return Gemma3nAudioTower(resolve_checkpoint(str(gemma3n_dir)), "cpu", torch.float32)


def units_for(tower, extractor, clips):
    preparer = AudioPreparer(extractor, tower.rows_for_frames, keep_tail=True)
    return [preparer.prepare(DecodedAudio(c, RATE, RATE, 1, "test")).units[0] for c in clips]


def test_loader_matches_full_model_and_from_pretrained_trap(gemma3n_dir, reference, tower):
    from transformers import Gemma3nAudioEncoder

    model, _ = reference
    # Non-persistent buffers (rel-pos timescales, q_scale, softcap, clipping) come from the constructors.
    ours = dict(tower.tower.named_buffers()) | dict(tower.tower.named_parameters())
    theirs = dict(model.model.audio_tower.named_buffers()) | dict(model.model.audio_tower.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name
    for name, value in model.model.embed_audio.state_dict().items():
        assert torch.equal(tower.embed.state_dict()[name], value), name
    # The trap the loader avoids: the sub-model's from_pretrained on the composite folder keeps random weights.
    trap = Gemma3nAudioEncoder.from_pretrained(gemma3n_dir)
    assert not torch.equal(
        trap.conformer[0].attention.attn.q_proj.weight,
        model.model.audio_tower.conformer[0].attention.attn.q_proj.weight,
    )


def test_row_count_matches_the_tower_mask(reference, tower):
    model, extractor = reference
    for i, seconds in enumerate([0.04, 0.05, 0.11, 0.5, 1.0, 1.37, 2.37, 3.5]):
        clip = make_clip(seconds, i)
        features = extractor([clip], return_tensors="pt")
        mask = features["input_features_mask"]
        with torch.no_grad():
            out = model.model.get_audio_features(features["input_features"], ~mask)
        expected = int((~out.audio_mel_mask).sum())
        assert gemma3n_audio_rows(tower.config, int(mask.sum()), mask.shape[1]) == expected, seconds


def test_token_count_alone_differs_from_the_batched_extractor(reference, tower):
    """Why features are made one clip at a time: in a batch, this extractor adds frames that start inside the clip
    and run into the next clip's padding, and marks them valid, so a clip can gain a token it does not have alone.
    The reference (and this tool) is the clip alone."""
    _, extractor = reference
    other = make_clip(5.0, 11)
    gained = 0
    for n in range(1_000, 30_000, 701):
        clip = make_clip(n / RATE, n)
        alone = extractor([clip])["input_features_mask"][0]
        batched = extractor([clip, other])["input_features_mask"][0]
        rows_alone = gemma3n_audio_rows(tower.config, int(alone.sum()), len(alone))
        rows_batched = gemma3n_audio_rows(tower.config, int(batched.sum()), len(batched))
        assert rows_batched in (rows_alone, rows_alone + 1)
        gained += rows_batched != rows_alone
    assert gained > 0


def test_zero_padding_alone_leaks_into_the_last_token_and_the_cut_fixes_it(reference, tower):
    """The measurement behind the design: pad + mask is not enough for this tower; pad + mask + zeroing the first
    convolution's output past each unit's length is exact."""
    model, extractor = reference
    clips = [make_clip(s, i) for i, s in enumerate(CLIP_SECONDS.values())]
    units = units_for(tower, extractor, clips)
    refs = [reference_audio_rows(model, extractor, c, "gemma3n") for c in clips]
    rows = [u.rows for u in units]
    try:
        tower.zero_conv_padding = False
        with torch.no_grad():
            leaky = torch.split(tower.encode(units, "language"), rows)
    finally:
        tower.zero_conv_padding = True
    with torch.no_grad():
        exact = torch.split(tower.encode(units, "language"), rows)
    # The 1.0 s clip (shortest, most padded) moves at its last valid token only.
    assert rel_error(leaky[0][:-1], refs[0][:-1]) < 1e-5
    assert float((leaky[0][-1] - refs[0][-1]).abs().max()) > 1e-2
    for ours, ref in zip(exact, refs, strict=True):
        assert ours.shape == ref.shape
        assert rel_error(ours, ref) < 1e-5


def test_ragged_batch_rows_match_each_clip_alone(tmp_path, monkeypatch, gemma3n_dir, reference):
    model, extractor = reference
    clips = write_clips(tmp_path / "clips")
    batches = record_batches(monkeypatch, Gemma3nAudioTower)
    monkeypatch.setattr(engine, "padded_buckets", longest_first)  # every clip in one ragged batch
    out = tmp_path / "g3n.safetensors"
    code, _, err = run_images([tmp_path / "clips"], gemma3n_dir, out, modality="audio", batch_size=len(CLIP_SECONDS))
    assert code == 0, err
    assert len(batches) == 1 and len({u.length for u in batches[0]}) == len(CLIP_SECONDS), [
        [u.length for u in b] for b in batches
    ]
    result = gemma_embed.load(out)
    for name, samples in clips.items():
        ref = reference_audio_rows(model, extractor, samples, "gemma3n")
        assert result[name].shape == ref.shape, name
        assert rel_error(result[name], ref) < 1e-5, name
