"""Write the short audio clips in samples/media/audio/ (synthetic, deterministic, a few KB each).

    python samples/make_audio_samples.py

One clip per decoder path the tool takes: wav and flac and ogg through soundfile (at 16, 44.1 and 22.05 kHz,
mono and stereo), mp3 and m4a (AAC) through PyAV's fallback. Tests write their own files; these are for trying
the command by hand and for the CLI test.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def tone(seconds: float, rate: int, seed: int, channels: int = 1, noise: float = 0.02) -> np.ndarray:
    """A chirp with a slow tremolo and a little noise: frames differ from each other, like speech does."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    freq = 220.0 + 660.0 * t / max(seconds, 1e-9)
    wave = np.sin(2 * np.pi * np.cumsum(freq) / rate) * (0.6 + 0.3 * np.sin(2 * np.pi * 3.0 * t))
    out = [0.4 * wave + noise * rng.standard_normal(t.size)]
    for c in range(1, channels):  # other channels: the same chirp, delayed and quieter
        out.append(0.7 * np.roll(out[0], 40 * c))
    return np.stack(out, axis=1).astype(np.float32)


def write_with_pyav(path: Path, samples: np.ndarray, rate: int, codec: str, bitrate: int = 32_000) -> None:
    import av

    layout = "mono" if samples.shape[1] == 1 else "stereo"
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        stream.bit_rate = bitrate
        fmt = stream.codec_context.format.name  # the encoder's own sample format, e.g. fltp or s16p
        resampler = av.AudioResampler(format=fmt, layout=layout, rate=rate)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples.reshape(1, -1)), format="flt", layout=layout)
        frame.sample_rate = rate
        for converted in resampler.resample(frame):
            container.mux(stream.encode(converted))
        container.mux(stream.encode(None))


def main() -> None:
    import soundfile as sf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "media" / "audio")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # (flac keeps no noise: noise does not compress, and the file would be ten times larger)
    sf.write(args.out / "chirp-16k.wav", tone(1.0, 16_000, 0), 16_000, subtype="PCM_16")
    sf.write(args.out / "stereo-44k.flac", tone(1.0, 44_100, 1, channels=2, noise=0.0), 44_100, subtype="PCM_16")
    sf.write(args.out / "chirp-22k.ogg", tone(2.0, 22_050, 2), 22_050, format="OGG", subtype="VORBIS")
    write_with_pyav(args.out / "chirp-16k.mp3", tone(2.5, 16_000, 3), 16_000, "libmp3lame")
    write_with_pyav(args.out / "stereo-48k.m4a", tone(1.2, 48_000, 4, channels=2), 48_000, "aac")
    for path in sorted(args.out.iterdir()):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
