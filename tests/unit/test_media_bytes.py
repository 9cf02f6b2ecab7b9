"""The decoders read an item's bytes (a tar member, a parquet cell) exactly as they read the same file by path:
the same pixels, samples and metadata, and the same one-line errors for the same broken files."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ROOT, TEST_MEDIA

from gemma_embed import capture
from gemma_embed.media import MediaBytes
from gemma_embed.media.audio import AudioDecodeError, decode_audio
from gemma_embed.media.image import ImageDecodeError, decode_image
from gemma_embed.media.video import FramePolicy, VideoDecodeError, decode_video

SAMPLES = ROOT / "samples" / "media"
REAL = TEST_MEDIA
IMAGES = sorted((SAMPLES / "images").iterdir()) + sorted((REAL / "images").iterdir())
AUDIO = sorted((SAMPLES / "audio").iterdir()) + sorted((REAL / "audio").iterdir())
VIDEO = sorted((SAMPLES / "video").iterdir()) + sorted((REAL / "video").iterdir())


def _named(path) -> MediaBytes:
    return MediaBytes(path.read_bytes(), path.name)


def _outcome(decode, content) -> str:
    """The error a decoder raises, run as decoding.py runs it (C libraries' lines captured for the item), or
    what it decoded."""
    with capture.Capture(), capture.item("x"), capture.native():
        try:
            decoded = decode(content)
        except ValueError as exc:
            return f"error: {exc}"
    return f"decoded: {getattr(decoded, 'samples', getattr(decoded, 'image', None))!r}"


@pytest.mark.parametrize("path", IMAGES, ids=lambda p: p.name)
def test_image_bytes_decode_like_the_file(path):
    by_path = decode_image(str(path))
    for content in (_named(path), path.read_bytes()):  # with the member's name, and a bare bytes cell
        decoded = decode_image(content)
        assert decoded.meta == by_path.meta
        assert np.array_equal(np.asarray(decoded.image), np.asarray(by_path.image))


@pytest.mark.parametrize("path", AUDIO, ids=lambda p: p.name)
def test_audio_bytes_decode_like_the_file(path):
    by_path = decode_audio(str(path), 16_000)
    for content in (_named(path), path.read_bytes()):
        decoded = decode_audio(content, 16_000)
        # The same decoder (soundfile or PyAV) chosen, by the name's extension or, for bare bytes, the header.
        assert (decoded.decoder, decoded.source_rate, decoded.channels) == (
            by_path.decoder,
            by_path.source_rate,
            by_path.channels,
        )
        assert np.array_equal(decoded.samples, by_path.samples)


@pytest.mark.parametrize("path", VIDEO, ids=lambda p: p.name)
def test_video_bytes_decode_like_the_file(path):
    policy = FramePolicy(num_frames=4)
    by_path = decode_video(str(path), policy)
    decoded = decode_video(_named(path), policy)
    assert decoded.frame_indices == by_path.frame_indices and decoded.timestamps == by_path.timestamps
    assert (decoded.fps, decoded.rotation, decoded.codec) == (by_path.fps, by_path.rotation, by_path.codec)
    assert np.array_equal(decoded.frames, by_path.frames)


@pytest.mark.parametrize("path", sorted((REAL / "bad").iterdir()), ids=lambda p: p.name)
def test_broken_bytes_fail_with_the_files_reason(path):
    """The bad-input files: the same reason (libtiff's cause included), or for five-samples.wav, which only the
    preparer refuses, the same samples."""
    decode = {".wav": decode_audio, ".raw": decode_audio, ".tif": decode_image}[path.suffix]
    expected = _outcome(decode, str(path))
    assert expected.startswith("error: ") or path.name == "five-samples.wav", expected
    assert _outcome(decode, _named(path)) == expected


def test_empty_and_truncated_bytes_are_one_line_errors():
    with pytest.raises(ImageDecodeError, match="not a recognised image format"):
        decode_image(b"")
    with pytest.raises(AudioDecodeError, match=r"^empty \(0 bytes\)$"):
        decode_audio(MediaBytes(b"", "a.wav"))
    with pytest.raises(VideoDecodeError, match=r"^empty \(0 bytes\)$"):
        decode_video(MediaBytes(b"", "a.mp4"))
    clip = (SAMPLES / "video" / "clip-h264.mp4").read_bytes()
    with pytest.raises(VideoDecodeError) as failed:
        decode_video(MediaBytes(clip[: len(clip) // 2], "clip.mp4"))
    assert "\n" not in str(failed.value)


def test_media_bytes_are_bytes():
    data = MediaBytes(b"abc", "x.jpg")
    assert data == b"abc" and isinstance(data, bytes) and data.name == "x.jpg"
