"""Audio decoding: every format the issue names, made here with soundfile and PyAV, and real broken files."""

from __future__ import annotations

import numpy as np
import pytest
from audio_helpers import AMPLITUDE, FREQ, broken_files, sine, write_pyav, write_soundfile

from gemma_embed.media.audio import AudioDecodeError, decode_audio

TARGET = 16_000
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


def test_decode_errors_are_named_and_one_line(tmp_path):
    for name, words in broken_files(tmp_path).items():
        with pytest.raises(AudioDecodeError) as caught:
            decode_audio(str(tmp_path / name), TARGET)
        message = str(caught.value)
        assert words in message and "\n" not in message, (name, message)
