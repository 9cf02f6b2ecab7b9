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


# ------------------------------------------------------------------- files in every format, and broken ones

FREQ = 1_000.0
AMPLITUDE = 0.5


def sine(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    """(frames, channels): a 1 kHz sine on the first channel, silence on the others (the downmix halves it)."""
    t = np.arange(int(round(seconds * rate))) / rate
    out = np.zeros((t.size, channels), dtype=np.float32)
    out[:, 0] = AMPLITUDE * np.sin(2 * np.pi * FREQ * t)
    return out


def write_soundfile(path: Path, rate: int, subtype: str, channels: int = 1, seconds: float = 1.0, **kw) -> Path:
    import soundfile as sf

    sf.write(path, sine(seconds, rate, channels), rate, subtype=subtype, **kw)
    return path


def write_pyav(
    path: Path, rate: int, codec: str, channels: int = 1, seconds: float = 1.0, video: bool = False, audio: bool = True
) -> Path:
    """Encode with FFmpeg through PyAV; `video` adds a small video stream, as a phone recording has."""
    import av

    layout = "mono" if channels == 1 else "stereo"
    with av.open(str(path), "w") as container:
        vstream = None
        if video:
            vstream = container.add_stream("mpeg4", rate=10)
            vstream.width, vstream.height, vstream.pix_fmt = 64, 48, "yuv420p"
        if audio:
            astream = container.add_stream(codec, rate=rate, layout=layout)
            resampler = av.AudioResampler(format=astream.codec_context.format.name, layout=layout, rate=rate)
            samples = np.ascontiguousarray(sine(seconds, rate, channels).reshape(1, -1))
            frame = av.AudioFrame.from_ndarray(samples, format="flt", layout=layout)
            frame.sample_rate = rate
            for converted in resampler.resample(frame):
                container.mux(astream.encode(converted))
            container.mux(astream.encode(None))
        if vstream is not None:
            for i in range(int(seconds * 10)):
                picture = np.full((48, 64, 3), (i * 20) % 255, dtype=np.uint8)
                container.mux(vstream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
            container.mux(vstream.encode(None))
    return path


def broken_files(folder: Path) -> dict[str, str]:
    """name -> the words its error must contain."""
    import soundfile as sf

    (folder / "empty.wav").write_bytes(b"")
    sf.write(folder / "zero-samples.wav", np.zeros((0, 1), np.float32), RATE, subtype="PCM_16")
    data = write_soundfile(folder / "whole.flac", RATE, "PCM_16", seconds=2.0).read_bytes()
    (folder / "truncated.flac").write_bytes(data[: len(data) // 2])
    (folder / "whole.flac").unlink()
    (folder / "not-audio.mp3").write_text("this is a text file, not an mp3\n" * 20)
    write_pyav(folder / "silent-film.mp4", RATE, "aac", video=True, audio=False)
    return {
        "empty.wav": "empty file",
        "zero-samples.wav": "no audio samples",
        "truncated.flac": "truncated or corrupt",
        "not-audio.mp3": "not a recognised audio format",
        "silent-film.mp4": "no audio stream",
    }
