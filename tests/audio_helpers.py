"""Clips, files and transformers' per-clip reference for the audio tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

RATE = 16_000
# Clearly different lengths, no two with the same mel frame count (checked in the tests).
CLIP_SECONDS = {"a-1.00s.wav": 1.0, "b-2.37s.wav": 2.37, "c-3.50s.wav": 3.5, "d-7.00s.wav": 7.0, "e-12.00s.wav": 12.0}


def make_clip(seconds: float, seed: int, rate: int = RATE) -> np.ndarray:
    """A chirp under a tremolo plus noise: every frame differs, so a misplaced row cannot go unnoticed."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * rate))) / rate
    freq = 200.0 + 300.0 * np.sin(2 * np.pi * 0.3 * t + seed)
    wave = np.sin(2 * np.pi * np.cumsum(freq) / rate) * (0.5 + 0.4 * np.sin(2 * np.pi * 2.0 * t))
    return (0.4 * wave + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def write_clips(folder: Path, seconds: dict[str, float] = CLIP_SECONDS) -> dict[str, np.ndarray]:
    """16 kHz float wav files (decoded bit-exactly), and the samples written to each."""
    import soundfile as sf

    folder.mkdir(parents=True, exist_ok=True)
    clips = {}
    for seed, (name, secs) in enumerate(seconds.items()):
        clips[name] = make_clip(secs, seed)
        sf.write(folder / name, clips[name], RATE, subtype="FLOAT")
    return clips


def reference_audio_rows(model, extractor, samples: np.ndarray, family: str, space: str = "language") -> torch.Tensor:
    """transformers' own per-clip path: the extractor on this clip alone, then get_audio_features, padding
    rows dropped with the mask it returns."""
    features = extractor([samples], return_tensors="pt")
    with torch.no_grad():
        if family == "gemma3n":
            # Gemma3nModel.forward passes the inverted mask (True = padding); so does the reference.
            out = model.model.get_audio_features(features["input_features"], ~features["input_features_mask"])
            valid = ~out.audio_mel_mask[0]
            # The tower zeroes the rows it calls padding; check that is what the mask says.
            assert bool((out.last_hidden_state[0][~valid] == 0).all())
        else:
            out = model.model.get_audio_features(features["input_features"], features["input_features_mask"])
            valid = out.attention_mask[0].bool()
    rows = out.pooler_output[0] if space == "language" else out.last_hidden_state[0]
    return rows[valid]
