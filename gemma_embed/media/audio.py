"""Audio: any file with sound in it -> mono float32 samples at the feature extractor's rate.

soundfile (libsndfile) reads wav, flac, ogg and aiff exactly and fast; everything else (mp3, m4a/aac, opus, wma,
the audio track of a video file, ...) and any file soundfile does not recognise goes through PyAV (FFmpeg). mp3
goes to PyAV although libsndfile can read it: its mpg123 decoder prints notes straight to the process's stderr
on a damaged file, which would break the one-line error contract. An item's bytes (a tar member, a parquet cell)
route by the extension of the name they carry, as a file does; bytes with no name route by what libsndfile makes
of their header (its formats, but MPEG, go to soundfile). Both are read in
blocks: each block is downmixed to mono (the mean of the channels) and fed to one FFmpeg resampler
(libswresample, via PyAV), so memory holds the output at the model's rate, never the whole source.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gemma_embed.media import (
    OPEN_TIMEOUT_S,
    as_file,
    content_extension,
    ffmpeg_extensions,
    refuse_nothing_to_decode,
)
from gemma_embed.memory import decode_peaks, decode_room

BLOCK_FRAMES = 1 << 16  # source frames per block read from soundfile
# FFmpeg's audio formats (PyAV names) whose extensions are walked for audio, beside the video containers (for
# their soundtracks) and libsndfile's formats.
AUDIO_FORMATS = (
    "wav", "w64", "rf64", "mp3", "aac", "adts", "flac", "ogg", "oga", "opus", "spx", "aiff", "au", "caf", "ape",
    "wv", "tak", "tta", "amr", "ac3", "eac3", "dts", "truehd", "mlp", "mpc", "shn", "voc", "ircam", "nistsphere",
    "gsm", "oma", "ipod", "rm", "wsaud", "qoa", "asf", "matroska",
)  # fmt: skip
# libsndfile's formats: soundfile takes a file's format from its extension, upper-cased (WAV, FLAC, AIFF, ...).
# RAW is headerless (it needs the sample format given); MP3 goes to PyAV (see the module docstring).
NOT_SOUNDFILE = frozenset({".raw", ".mp3"})
SOUNDFILE_ALIASES = {".wave", ".oga", ".aif", ".aifc"}
# Extensions of those formats that never hold sound: Matroska subtitles, and GIF among the video containers.
NOT_AUDIO = frozenset({".mks", ".gif"})


def soundfile_extensions() -> set[str]:
    """Extensions soundfile reads (its available formats, lower-cased), and the aliases libsndfile accepts."""
    import soundfile as sf

    return ({f".{name.lower()}" for name in sf.available_formats()} | SOUNDFILE_ALIASES) - NOT_SOUNDFILE


def extensions() -> set[str]:
    """Extensions walked for audio: FFmpeg's audio formats, libsndfile's, and FFmpeg's video containers (their
    soundtracks are embedded)."""
    from gemma_embed.media.video import extensions as video_extensions

    found = ffmpeg_extensions(AUDIO_FORMATS) | soundfile_extensions() | {".mp3"} | video_extensions()
    return found - NOT_AUDIO


class AudioDecodeError(ValueError):
    pass


@dataclass
class DecodedAudio:
    samples: np.ndarray  # 1-D float32, mono, at `sample_rate`
    sample_rate: int  # the rate of `samples` (the feature extractor's)
    source_rate: int  # the file's own rate
    channels: int  # the file's channel count, before the downmix
    decoder: str  # "soundfile" or "pyav"
    source_samples: int = -1  # samples per channel in the file, at `source_rate` (-1: not counted)

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate

    def facts(self) -> dict:
        """What the output's item metadata records about the clip."""
        return {
            "duration_s": round(self.duration_s, 6),
            "sample_rate": self.source_rate,
            "channels": self.channels,
            "decoder": self.decoder,
        }


class MonoResampler:
    """Downmix blocks of (channels, frames) float32 to mono, then resample them with libswresample.

    One resampler object sees the whole stream, so block edges leave no seams. Where the rates already match
    the samples pass through untouched (bit-exact).
    """

    def __init__(self, source_rate: int, target_rate: int):
        import av

        self.source_rate = int(source_rate)
        self.target_rate = int(target_rate)
        self.parts: list[np.ndarray] = []
        self.source_samples = 0  # frames fed in, at the source rate
        self._resampler = None
        if self.source_rate != self.target_rate:
            self._resampler = av.AudioResampler(format="flt", layout="mono", rate=self.target_rate)

    def add(self, block: np.ndarray) -> None:
        """block: (channels, frames) float32 at the source rate."""
        if block.shape[-1] == 0:
            return
        self.source_samples += int(block.shape[-1])
        mono = np.ascontiguousarray(block.mean(axis=0, dtype=np.float32)[None, :], dtype=np.float32)
        if self._resampler is None:
            self.parts.append(mono[0])
            return
        import av

        frame = av.AudioFrame.from_ndarray(mono, format="flt", layout="mono")
        frame.sample_rate = self.source_rate
        self._collect(self._resampler.resample(frame))

    def _collect(self, frames) -> None:
        for out in frames:
            self.parts.append(out.to_ndarray().reshape(-1).astype(np.float32, copy=False))

    def finish(self) -> np.ndarray:
        if self._resampler is not None:
            self._collect(self._resampler.resample(None))  # flush the filter's delay line
        if not self.parts:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(self.parts).astype(np.float32, copy=False)


# ------------------------------------------------------------------------------------------ soundfile


def _soundfile_source(content: str | bytes):
    """What soundfile opens: a local file's name as bytes (names that are not UTF-8 open too), or a file object."""
    source = as_file(content)
    return os.fsencode(source) if isinstance(source, str) else source


def _soundfile_info(content: str | bytes):
    """The content's soundfile info, or None when libsndfile does not recognise the format."""
    import soundfile as sf

    try:
        return sf.info(_soundfile_source(content))
    except (sf.LibsndfileError, RuntimeError, TypeError):
        return None


def _soundfile_blocks(content: str | bytes) -> Iterator[np.ndarray]:
    import soundfile as sf

    with sf.SoundFile(_soundfile_source(content)) as fh:
        while True:
            block = fh.read(BLOCK_FRAMES, dtype="float32", always_2d=True)
            if block.shape[0] == 0:
                return
            yield block.T


def _decode_with_soundfile(content: str | bytes, info, target_rate: int) -> DecodedAudio:
    import soundfile as sf

    seconds = info.frames / info.samplerate if info.frames > 0 and info.samplerate > 0 else None
    decode_room.admit(decode_peaks.audio_decode_peak(seconds, target_rate))  # in a run: waits for room to decode
    resampler = MonoResampler(info.samplerate, target_rate)
    try:
        for block in _soundfile_blocks(content):
            resampler.add(block)
    except (sf.LibsndfileError, RuntimeError) as exc:
        # libsndfile knew the format from the header, so a failure past it means the data itself is bad.
        raise AudioDecodeError(f"truncated or corrupt {info.format} audio: {_one_line(exc)}") from None
    samples = resampler.finish()
    return DecodedAudio(
        samples, target_rate, int(info.samplerate), int(info.channels), "soundfile", resampler.source_samples
    )


# ------------------------------------------------------------------------------------------ PyAV


def _decode_with_pyav(content: str | bytes, target_rate: int) -> DecodedAudio:
    import av

    try:
        # Tags that are not UTF-8 (Latin-1 titles from old muxers) would abort the open; replace the bad bytes.
        container = av.open(as_file(content), timeout=OPEN_TIMEOUT_S, metadata_errors="replace")
    except av.FFmpegError:
        raise AudioDecodeError("not a recognised audio format") from None
    with container:
        if not container.streams.audio:
            raise AudioDecodeError(_no_audio_reason(container))
        stream = container.streams.audio[0]
        decode_room.admit(decode_peaks.audio_decode_peak(_declared_seconds(container, stream), target_rate))
        resampler = None
        channels = 0
        try:
            for frame in container.decode(stream):
                if resampler is None:
                    resampler = MonoResampler(frame.sample_rate, target_rate)
                    channels = len(frame.layout.channels)
                resampler.add(_planar_float(frame))
        except av.FFmpegError as exc:
            raise AudioDecodeError(
                f"truncated or corrupt {stream.codec_context.name} audio: {_one_line(exc)}"
            ) from None
        if resampler is None:
            return DecodedAudio(
                np.zeros(0, np.float32), target_rate, int(stream.rate or 0), int(stream.channels or 0), "pyav", 0
            )
        samples = resampler.finish()
        return DecodedAudio(
            samples, target_rate, int(resampler.source_rate), channels, "pyav", resampler.source_samples
        )


def _declared_seconds(container, stream) -> float | None:
    """The stream's duration from the header, else the container's (FFmpeg's estimate); None if neither says."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None


def _no_audio_reason(container) -> str:
    """A video file without sound says so; anything else FFmpeg merely guessed at (a headerless .raw file
    probes as a raw image) is not an audio file, and the reason names what FFmpeg made of it."""
    from gemma_embed.media.video import VIDEO_CONTAINERS

    kinds = sorted({s.type for s in container.streams})
    if container.format.name in VIDEO_CONTAINERS and kinds:
        return f"no audio stream in this file ({', '.join(kinds)})"
    codecs = sorted({s.codec_context.name for s in container.streams if s.codec_context is not None})
    return f"not an audio file (FFmpeg sees {', '.join(codecs) or container.format.name})"


def _planar_float(frame) -> np.ndarray:
    """(channels, samples) float32 in [-1, 1] from any PyAV audio frame (packed or planar, integer or float)."""
    channels = len(frame.layout.channels)
    data = frame.to_ndarray()
    data = data.reshape(channels, -1) if frame.format.is_planar else data.reshape(-1, channels).T
    if data.dtype == np.uint8:  # 8-bit PCM is unsigned, centred on 128
        return (data.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(data.dtype, np.integer):
        return data.astype(np.float32) / float(-np.iinfo(data.dtype).min)
    return data.astype(np.float32, copy=False)


# ------------------------------------------------------------------------------------------ entry point


def decode_audio(content: str | bytes, sample_rate: int = 16_000) -> DecodedAudio:
    """Mono float32 samples at `sample_rate` from an audio file (a path) or its bytes; AudioDecodeError with a
    one-line reason otherwise."""
    refuse_nothing_to_decode(content, "an audio file", AudioDecodeError)
    info = _soundfile_info(content) if _for_soundfile(content) else None
    if info is not None and not isinstance(content, str) and not content_extension(content):
        info = None if info.format in ("MP3", "MPEG") else info  # nameless mp3 goes to PyAV, as an .mp3 file does
    decoded = _decode_with_soundfile(content, info, sample_rate) if info else _decode_with_pyav(content, sample_rate)
    if decoded.samples.size == 0 and decoded.source_samples <= 0:
        raise AudioDecodeError("no audio samples (zero-length audio)")
    # A few samples may resample to none; the preparer says how many one feature frame needs.
    if not np.isfinite(decoded.samples).all():
        raise AudioDecodeError("audio contains NaN or infinite samples")
    return decoded


def decode_audio_value(value, sample_rate: int = 16_000) -> DecodedAudio:
    """`decode_audio`, also for samples a Python caller holds: `(samples, rate)` or `{"array": samples,
    "sampling_rate": rate}` (datasets' Audio form), 1-D or (channels, frames), downmixed and resampled by the same
    libswresample path as a file's samples."""
    if isinstance(value, dict):
        value = (value["array"], value["sampling_rate"])
    if not isinstance(value, tuple):
        return decode_audio(value, sample_rate)
    samples, rate = value
    block = np.asarray(samples.numpy() if hasattr(samples, "numpy") else samples, dtype=np.float32)
    if block.ndim == 1:
        block = block[None, :]
    if block.ndim != 2 or block.shape[-1] == 0:
        raise AudioDecodeError(f"audio samples must be 1-D or (channels, frames), got shape {tuple(block.shape)}")
    if not np.isfinite(block).all():
        raise AudioDecodeError("audio contains NaN or infinite samples")
    resampler = MonoResampler(int(rate), sample_rate)
    for start in range(0, block.shape[-1], BLOCK_FRAMES):  # in a file's blocks: the resampler sees the same stream
        resampler.add(np.ascontiguousarray(block[:, start : start + BLOCK_FRAMES]))
    return DecodedAudio(resampler.finish(), sample_rate, int(rate), int(block.shape[0]), "array", block.shape[-1])


def _for_soundfile(content: str | bytes) -> bool:
    """Whether soundfile is tried first: by the extension of the path or of the bytes' name; bytes without a name
    always (their header decides)."""
    ext = content_extension(content)
    return ext in _soundfile_extensions() or (not ext and not isinstance(content, str))


@functools.cache
def _soundfile_extensions() -> frozenset[str]:
    return frozenset(soundfile_extensions())


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
