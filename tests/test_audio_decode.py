"""Audio decoding: every format the issue names, made here with soundfile and PyAV, and real broken files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT
from test_cli import EXE

import gemma_embed
from gemma_embed.media.audio import AudioDecodeError, decode_audio

TARGET = 16_000
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


# name, writer, source rate, channels, lossless, expected decoder
FORMATS = {
    "u8-8k.wav": (lambda p: write_soundfile(p, 8_000, "PCM_U8"), 8_000, 1, True, "soundfile"),
    "s16-16k.wav": (lambda p: write_soundfile(p, 16_000, "PCM_16"), 16_000, 1, True, "soundfile"),
    "s24-22k.wav": (lambda p: write_soundfile(p, 22_050, "PCM_24"), 22_050, 1, True, "soundfile"),
    "float-48k.wav": (lambda p: write_soundfile(p, 48_000, "FLOAT"), 48_000, 1, True, "soundfile"),
    "stereo-44k.wav": (lambda p: write_soundfile(p, 44_100, "PCM_16", channels=2), 44_100, 2, True, "soundfile"),
    "s24-32k.flac": (lambda p: write_soundfile(p, 32_000, "PCM_24"), 32_000, 1, True, "soundfile"),
    "vorbis-44k.ogg": (lambda p: write_soundfile(p, 44_100, "VORBIS"), 44_100, 1, False, "soundfile"),
    "opus-48k.opus": (lambda p: write_pyav(p, 48_000, "libopus"), 48_000, 1, False, "pyav"),
    "mp3-24k.mp3": (lambda p: write_pyav(p, 24_000, "libmp3lame", channels=2), 24_000, 2, False, "pyav"),
    "aac-48k.m4a": (lambda p: write_pyav(p, 48_000, "aac"), 48_000, 1, False, "pyav"),
    "video-track.mp4": (lambda p: write_pyav(p, 44_100, "aac", video=True), 44_100, 1, False, "pyav"),
}


def dominant_frequency(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spectrum) * rate / x.size)


@pytest.mark.parametrize("name", list(FORMATS))
def test_decodes_to_mono_float32_at_the_model_rate(tmp_path, name):
    writer, rate, channels, lossless, decoder = FORMATS[name]
    decoded = decode_audio(str(writer(tmp_path / name)), TARGET)
    x = decoded.samples
    assert x.dtype == np.float32 and x.ndim == 1
    assert decoded.sample_rate == TARGET and decoded.source_rate == rate and decoded.channels == channels
    if decoder:
        assert decoded.decoder == decoder
    expected_rms = AMPLITUDE / np.sqrt(2) / channels  # the silent channels halve the mean
    if lossless:
        assert abs(x.size - TARGET) <= 1
        ideal = sine(1.0, TARGET)[:, 0] / channels
        core = slice(200, x.size - 200)  # away from the resampler's edges
        tolerance = 0.02 if rate == 8_000 else 2e-3  # 8-bit PCM quantises at 1/128
        assert np.abs(x[core] - ideal[core]).max() < tolerance
    else:
        assert abs(x.size - TARGET) < 0.12 * TARGET  # encoder priming and padding
    assert abs(dominant_frequency(x, TARGET) - FREQ) < 5
    rms = float(np.sqrt(np.mean(x[x.size // 4 : 3 * x.size // 4] ** 2)))
    assert rms == pytest.approx(expected_rms, rel=0.1)


def test_model_rate_files_pass_through_bit_exact(tmp_path):
    import soundfile as sf

    samples = np.random.default_rng(0).uniform(-1, 1, 12_345).astype(np.float32)
    sf.write(tmp_path / "exact.wav", samples, TARGET, subtype="FLOAT")
    assert np.array_equal(decode_audio(str(tmp_path / "exact.wav"), TARGET).samples, samples)


def test_long_file_resamples_without_seams(tmp_path):
    """Several soundfile blocks through one resampler: no click where blocks meet."""
    path = write_soundfile(tmp_path / "long.wav", 44_100, "PCM_16", seconds=4.0)
    x = decode_audio(str(path), TARGET).samples
    assert abs(x.size - 4 * TARGET) <= 1
    ideal = sine(4.0, TARGET)[:, 0]
    assert np.abs(x[200:-200] - ideal[200:-200]).max() < 2e-3


# ------------------------------------------------------------------------------------------- bad input


def broken_files(folder: Path) -> dict[str, str]:
    """name -> the words its error must contain."""
    import soundfile as sf

    (folder / "empty.wav").write_bytes(b"")
    sf.write(folder / "zero-samples.wav", np.zeros((0, 1), np.float32), TARGET, subtype="PCM_16")
    data = write_soundfile(folder / "whole.flac", TARGET, "PCM_16", seconds=2.0).read_bytes()
    (folder / "truncated.flac").write_bytes(data[: len(data) // 2])
    (folder / "whole.flac").unlink()
    (folder / "not-audio.mp3").write_text("this is a text file, not an mp3\n" * 20)
    write_pyav(folder / "silent-film.mp4", TARGET, "aac", video=True, audio=False)
    return {
        "empty.wav": "empty file",
        "zero-samples.wav": "no audio samples",
        "truncated.flac": "truncated or corrupt",
        "not-audio.mp3": "not a recognised audio format",
        "silent-film.mp4": "no audio stream",
    }


def test_decode_errors_are_named_and_one_line(tmp_path):
    for name, words in broken_files(tmp_path).items():
        with pytest.raises(AudioDecodeError) as caught:
            decode_audio(str(tmp_path / name), TARGET)
        message = str(caught.value)
        assert words in message and "\n" not in message, (name, message)


def test_command_reports_bad_files_and_writes_the_others(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    expected = broken_files(folder)
    write_soundfile(folder / "good.wav", 44_100, "PCM_16")
    write_pyav(folder / "good.m4a", 48_000, "aac")
    out = tmp_path / "out.safetensors"
    # The folder walk takes video containers too (for their soundtracks): the silent film is walked and named.
    model = ROOT / "samples" / "tiny-gemma4"
    proc = subprocess.run(
        [EXE, "audio", str(folder), "--model", str(model), "-o", str(out), "--jsonl"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Note:" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == len(expected), proc.stderr
    for name, words in expected.items():
        (line,) = [e for e in errors if f"{name}:" in e]
        assert words in line, line
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    failed = {r["key"] for r in records if r["type"] == "item" and r["status"] == "failed"}
    assert failed == set(expected)
    assert sorted(gemma_embed.load(out)) == ["good.m4a", "good.wav"]
