"""Write small real video files with PyAV: different codecs, sizes, lengths, a rotated and a variable-rate one.

    python samples/make_video_samples.py            # writes samples/media/video/

Tests import `write_video` / `write_audio_only` / `make_samples` to make the same kinds of files. PyAV wheels
bundle FFmpeg with libx264, libvpx-vp9, mpeg4 and mjpeg encoders, so this needs nothing else.
"""

from __future__ import annotations

import argparse
from fractions import Fraction
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

# name -> (codec, width, height, frames, extra): a long-ish clip, one shorter than the default 32 frames,
# a one-frame clip, a rotated phone-style clip and a variable-frame-rate one.
SAMPLES = {
    "clip-h264.mp4": ("libx264", 160, 120, 50, {}),
    "short-vp9.webm": ("libvpx-vp9", 96, 64, 20, {}),
    "one-frame.avi": ("mjpeg", 64, 48, 1, {}),
    "rotated-mpeg4.mp4": ("mpeg4", 128, 72, 40, {"rotation": 90}),
    "vfr-h264.mkv": ("libx264", 80, 80, 30, {"frame_ms": (40, 100, 20)}),
}


def frame_pixels(index: int, width: int, height: int, seed: int = 0) -> np.ndarray:
    """A moving pattern: every frame differs, and it compresses to a few KB."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = index * 0.35 + seed
    rgb = np.stack([np.sin(x / 9.0 + phase), np.cos(y / 7.0 - phase), np.sin((x + y) / 13.0 + 2 * phase)], -1)
    return ((rgb * 0.45 + 0.5) * 255).astype(np.uint8)


def write_video(
    path: Path,
    codec: str,
    width: int,
    height: int,
    frames: int,
    rate: int = 24,
    rotation: int | None = None,
    frame_ms: tuple[int, ...] | None = None,
    gop: int | None = None,
    seed: int = 0,
) -> Path:
    """Encode `frames` frames. rotation: display-matrix degrees counter-clockwise. frame_ms: per-frame display
    times in milliseconds, cycled (a variable frame rate); gop: keyframe interval."""
    import av

    path = Path(path)
    with av.open(str(path), "w") as container:
        # libx264's default quality makes these patterns ~45 KB; crf 32 keeps a sample at a few KB.
        stream = container.add_stream(codec, rate=rate, options={"crf": "32"} if codec == "libx264" else None)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        if gop:
            stream.codec_context.gop_size = gop
        if frame_ms:
            stream.codec_context.time_base = Fraction(1, 1000)
        if rotation is not None:
            stream.set_display_rotation(rotation)
        clock_ms = 0
        for index in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_pixels(index, width, height, seed), format="rgb24")
            if frame_ms:
                frame.pts, frame.time_base = clock_ms, Fraction(1, 1000)
                clock_ms += frame_ms[index % len(frame_ms)]
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_audio_only(path: Path, seconds: float = 1.0, rate: int = 16000) -> Path:
    """A media file with an audio stream and no video stream."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=rate)
        stream.layout = "mono"
        t = np.arange(int(seconds * rate), dtype=np.float32) / rate
        wave = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        for start in range(0, len(wave), 1024):
            frame = av.AudioFrame.from_ndarray(wave[None, start : start + 1024].copy(), format="fltp", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def make_samples(folder: Path) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return [
        write_video(folder / name, codec, w, h, n, seed=i, **extra)
        for i, (name, (codec, w, h, n, extra)) in enumerate(SAMPLES.items())
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "media" / "video")
    args = parser.parse_args()
    for path in make_samples(args.out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
