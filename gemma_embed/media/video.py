"""Video: PyAV decode of the sampled frames only, upright, with their real timestamps.

How a file is read:

1. `probe`: demux the video stream's packets (no decoding) into a frame table: every frame's presentation
   timestamp, which frames are keyframes, where the stream ends. This gives an exact frame count where headers
   have none (Matroska, WebM) or lie, real timestamps for variable-frame-rate files, and the keyframes to seek
   to. A table shorter than the header's frame count or duration means the file is truncated.
2. `sample_frame_indices`: the checkpoint video processor's policy (uniform `num_frames`, or `fps`), except
   that a clip shorter than the request gives all its frames instead of transformers' ValueError.
3. `_decode_wanted`: decode up to the last sampled frame only, seeking to a keyframe when that skips enough
   frames to pay for the seek (`_decode_by_table`); a frame table that disagrees with the decoder falls back to
   counting frames (`_decode_by_count`).
4. Rotation metadata (the display matrix) is applied, as players do.

Every failure raises VideoDecodeError with a one-line reason; a wall-clock limit bounds each file. A video's bytes
(a tar member, a parquet cell) are read like a file: FFmpeg tells the container by its content.
"""

from __future__ import annotations

import statistics
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from gemma_embed.locations import location
from gemma_embed.media import MAX_PIXELS, OPEN_TIMEOUT_S, as_file, ffmpeg_extensions, refuse_nothing_to_decode
from gemma_embed.memory import decode_peaks, decode_room

# Seconds one file may spend in probing + decoding before it is given up (pathological or huge files).
DECODE_TIME_LIMIT_S = 300.0
# Same guard as images: no frame larger than this many pixels is decoded.
MAX_FRAME_PIXELS = MAX_PIXELS
# The sampled frames of one video are held as uint8 RGB; refuse requests that would not fit.
MAX_DECODED_BYTES = 4 << 30
# Seek only when it skips at least this many frames: a seek flushes the decoder and restarts at a keyframe.
SEEK_MIN_SKIP = 24


# FFmpeg's video container formats (PyAV names): their extensions are walked for video, and for audio too
# (soundtracks). Left out: extensions those formats share with still images (avif, heic), audio-only files
# (m4a, wma, ...) and subtitles (mks).
VIDEO_CONTAINERS = (
    "mov,mp4,m4a,3gp,3g2,mj2",
    "mp4",
    "mov",
    "m4v",
    "matroska,webm",
    "webm",
    "avi",
    "flv",
    "asf",
    "mpeg",
    "vob",
    "mpegts",
    "ogv",
    "nut",
    "mxf",
    "dv",
    "gif",
)
NOT_VIDEO = frozenset({".avif", ".heic", ".heif", ".m4a", ".m4b", ".isma", ".mka", ".mks", ".wma"})


def extensions() -> set[str]:
    """Extensions walked for video: FFmpeg's for its video container formats."""
    return ffmpeg_extensions(VIDEO_CONTAINERS, NOT_VIDEO)


class VideoDecodeError(ValueError):
    pass


@dataclass(frozen=True)
class FramePolicy:
    """Which frames to sample. fps set: `fps` frames per second of video, at most `max_frames`.
    Otherwise `num_frames` evenly spaced frames (None: every frame). A shorter clip gives all its frames."""

    num_frames: int | None = 32
    fps: float | None = None
    max_frames: int | None = None

    @property
    def most_frames(self) -> int | None:
        """Upper bound on frames per video, if any (for window sizing)."""
        return self.max_frames if self.fps is not None else self.num_frames


def resolve_policy(
    processor_num_frames: int | None,
    processor_fps: float | None,
    fps: float | None = None,
    max_frames: int | None = None,
    processor_max_frames: int | None = None,
) -> FramePolicy:
    """The checkpoint processor's policy, overridden by --fps and --max-frames.

    A count policy (Gemma 4: 32 frames evenly spaced) and a rate policy (EmbeddingGemma 2: 1 frame per second, at
    most 32) are both followed. transformers gives `num_frames` priority over `fps` when the processor has both
    (default_sample_indices_fn); so does this. --fps switches to rate sampling capped by --max-frames (default: the
    processor's cap or frame count); --max-frames alone replaces a count policy's count, or a rate policy's cap.
    """
    if fps is not None:
        cap = max_frames or processor_max_frames or processor_num_frames
        return FramePolicy(num_frames=None, fps=float(fps), max_frames=cap)
    if processor_num_frames is not None or (max_frames is not None and processor_fps is None):
        return FramePolicy(num_frames=int(max_frames or processor_num_frames))
    if processor_fps is not None:
        return FramePolicy(num_frames=None, fps=float(processor_fps), max_frames=max_frames or processor_max_frames)
    return FramePolicy(num_frames=None)


def frames_to_sample(total_frames: int, duration_s: float | Fraction | None, policy: FramePolicy) -> int:
    """How many frames the policy takes from a clip of this many frames and seconds."""
    if total_frames < 1:
        raise VideoDecodeError("the video stream has no frames")
    if policy.fps is not None:
        if not duration_s or duration_s <= 0:
            raise VideoDecodeError("cannot sample by --fps: the video's duration is unknown")
        # transformers: max(1, int(total_num_frames / video_fps * fps)), i.e. whole frames of duration * fps.
        count = max(1, int(duration_s * Fraction(policy.fps)))
        if policy.max_frames:
            count = min(count, policy.max_frames)
    else:
        count = policy.num_frames or total_frames
    return min(count, total_frames)


def uniform_indices(total_frames: int, count: int) -> list[int]:
    """transformers' uniform sampling: arange(count) * total // count."""
    return [k * total_frames // count for k in range(count)]


def indices_at_times(pts: Sequence[int], end_pts: int, count: int) -> list[int]:
    """The frame on screen at each of `count` instants evenly spaced over [pts[0], end_pts).

    Exact integer arithmetic on timestamps, so a constant-rate clip gives exactly `uniform_indices`; a
    variable-rate clip gets frames evenly spaced in time, not in index. A frame held on screen across several
    instants is taken once.
    """
    start = pts[0]
    span = end_pts - start
    scaled = [(p - start) * count for p in pts]  # compare (p - start) * count with k * span: no division
    picked = [max(0, bisect_right(scaled, k * span) - 1) for k in range(count)]
    return sorted(set(picked))


def sample_frame_indices(
    total_frames: int,
    duration_s: float | Fraction | None,
    policy: FramePolicy,
    pts: Sequence[int] | None = None,
    end_pts: int | None = None,
) -> list[int]:
    """Indices (presentation order) of the frames to embed. With timestamps, rate sampling follows time."""
    count = frames_to_sample(total_frames, duration_s, policy)
    if policy.fps is not None and pts is not None and end_pts is not None and len(pts) == total_frames:
        return indices_at_times(pts, end_pts, count)
    return uniform_indices(total_frames, count)


# ------------------------------------------------------------------------------------------- probing


@dataclass
class FrameTable:
    """What demuxing (without decoding) tells about the video stream."""

    packets: int  # frames in the stream (one packet each)
    time_base: Fraction
    pts: list[int] | None  # presentation timestamps, ascending; None when the stream has none usable
    keyframes: list[int] = field(default_factory=list)  # indices into pts of frames that start a GOP
    end_pts: int | None = None  # where the last frame stops being shown

    @property
    def duration_s(self) -> Fraction | None:
        if self.pts is None or self.end_pts is None:
            return None
        return (self.end_pts - self.pts[0]) * self.time_base


class _Deadline:
    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.end = time.monotonic() + limit_s

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise VideoDecodeError(f"decoding took longer than the {self.limit_s:g} s limit; file skipped")


def _open(content: str | bytes):
    import av

    try:
        # Tags that are not UTF-8 (Latin-1 titles from old muxers) would abort the open; replace the bad bytes.
        return av.open(as_file(content), timeout=OPEN_TIMEOUT_S, metadata_errors="replace")
    except av.error.InvalidDataError:
        raise VideoDecodeError("not a readable video: invalid data (truncated, or not a media file)") from None
    except av.error.FFmpegError as exc:
        raise VideoDecodeError(f"cannot open as a video: {exc.strerror or exc}") from None


def _video_stream(container):
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams}) or ["none"]
        raise VideoDecodeError(f"no video stream (the file has: {', '.join(kinds)})")
    stream = container.streams.video[0]
    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height > MAX_FRAME_PIXELS:
        raise VideoDecodeError(f"{width}x{height} frames exceed the limit of {MAX_FRAME_PIXELS} pixels")
    return stream


def _declared_duration(stream) -> Fraction | None:
    """The stream's own duration from the header (MP4) or its DURATION tag (Matroska); not the container's,
    which also counts audio."""
    if stream.duration and stream.time_base:
        return stream.duration * stream.time_base
    tag = (stream.metadata or {}).get("DURATION")
    if tag:
        try:
            hours, minutes, seconds = tag.split(":")
            return Fraction(int(hours) * 3600 + int(minutes) * 60) + Fraction(seconds)
        except ValueError:
            return None
    return None


def probe(container, stream, deadline: _Deadline) -> FrameTable:
    """Demux every packet of the stream (cheap: nothing is decoded) into a frame table."""
    import av

    entries = []  # (pts, keyframe, duration)
    corrupt = False
    try:
        for packet in container.demux(stream):
            deadline.check()
            if packet.size == 0 or packet.is_discard:  # flush packets; edit-list discards never reach the screen
                continue
            corrupt = corrupt or packet.is_corrupt
            entries.append((packet.pts, packet.is_keyframe, packet.duration or 0))
    except av.error.FFmpegError as exc:
        raise VideoDecodeError(f"corrupt or truncated video stream: {exc.strerror or exc}") from None
    time_base = Fraction(stream.time_base) if stream.time_base else Fraction(1, 1)
    if not entries:
        raise VideoDecodeError("the video stream has no frames (empty or truncated)")
    declared = stream.frames or 0
    if corrupt or declared > len(entries):
        raise VideoDecodeError(
            f"truncated or corrupt: the header declares {declared or 'more'} frames, only {len(entries)} are complete"
        )
    if any(e[0] is None for e in entries) or len({e[0] for e in entries}) != len(entries):
        return FrameTable(packets=len(entries), time_base=time_base, pts=None)  # decode will count frames
    entries.sort(key=lambda e: e[0])
    pts = [e[0] for e in entries]
    steps = [b - a for a, b in zip(pts, pts[1:], strict=False)]
    typical_step = int(statistics.median(steps)) if steps else 1
    end_pts = pts[-1] + (entries[-1][2] or typical_step or 1)
    table = FrameTable(
        packets=len(entries),
        time_base=time_base,
        pts=pts,
        end_pts=end_pts,
        keyframes=[i for i, e in enumerate(entries) if e[1]],
    )
    _check_complete(table, _declared_duration(stream), typical_step)
    return table


def _check_complete(table: FrameTable, declared_s: Fraction | None, typical_step: int) -> None:
    if declared_s is None or table.duration_s is None or declared_s <= 0:
        return
    tolerance = max(3 * typical_step * table.time_base, declared_s / 50)
    if declared_s - table.duration_s > tolerance:
        raise VideoDecodeError(
            f"truncated: the header declares {float(declared_s):.3f} s of video, "
            f"the file holds {float(table.duration_s):.3f} s"
        )


# ------------------------------------------------------------------------------------------- decoding


@dataclass
class DecodedVideo:
    frames: np.ndarray  # (T, H, W, 3) uint8 RGB, upright
    frame_indices: list[int]  # presentation-order indices of the sampled frames
    timestamps: list[float]  # seconds from the first frame
    fps: float  # average frame rate: frames / duration
    duration_s: float
    total_frames: int
    rotation: int  # degrees counter-clockwise applied to the stored frames
    codec: str
    seeks: int = 0  # how many times decoding jumped ahead (for tests and benchmarks)
    frames_decoded: int = 0  # frames the decoder produced, sampled or not

    @property
    def height(self) -> int:
        return int(self.frames.shape[1])

    @property
    def width(self) -> int:
        return int(self.frames.shape[2])

    def facts(self) -> dict:
        """What the output's item metadata records about the video and the frames taken from it."""
        return {
            "width": self.width,
            "height": self.height,
            "frames": len(self.frame_indices),
            "frame_indices": list(self.frame_indices),
            "timestamps": list(self.timestamps),
            "fps": self.fps,
            "duration_s": self.duration_s,
            "total_frames": self.total_frames,
            "rotation": self.rotation,
            "codec": self.codec,
        }


class _TableMismatch(Exception):
    """The decoder's frames do not line up with the demuxed table; decode again by counting."""


def _rgb(frame) -> np.ndarray:
    return frame.to_ndarray(format="rgb24")


def _decode_by_table(
    container, stream, table: FrameTable, wanted: list[int], deadline: _Deadline
) -> tuple[dict[int, np.ndarray], int, int, int]:
    """Frames at the wanted indices, located by timestamp; seeks ahead where that pays."""
    index_of = {p: i for i, p in enumerate(table.pts)}
    frames: dict[int, np.ndarray] = {}
    rotation = 0
    seeks = decoded = 0
    position = -1  # index of the last frame decoded
    decoder = container.decode(stream)
    for target in wanted:
        keyframe = table.keyframes[max(0, bisect_right(table.keyframes, target) - 1)] if table.keyframes else 0
        if keyframe > position + SEEK_MIN_SKIP:
            # By the keyframe's pts: measured to land exactly on it in MP4, Matroska, WebM and AVI (its dts
            # lands one GOP early in MP4/Matroska with B-frames). Landing elsewhere is caught below.
            container.seek(table.pts[keyframe], stream=stream, backward=True, any_frame=False)
            decoder = container.decode(stream)
            seeks += 1
        while position < target:
            deadline.check()
            frame = next(decoder, None)
            if frame is None or frame.pts not in index_of:
                raise _TableMismatch
            decoded += 1
            position = index_of[frame.pts]
            if position == target:
                frames[target] = _rgb(frame)
                rotation = frame.rotation
        if target not in frames:  # stepped over it: the table's order is not the decoder's
            raise _TableMismatch
    return frames, rotation, seeks, decoded


def _decode_by_count(
    content: str | bytes, wanted: list[int], deadline: _Deadline
) -> tuple[dict[int, np.ndarray], int, dict[int, float | None], int]:
    """Frames at the wanted indices counted in output order from the start; their own timestamps."""
    import av

    wanted_set = set(wanted)
    frames: dict[int, np.ndarray] = {}
    times: dict[int, float | None] = {}
    rotation = 0
    first_time = None
    index = -1
    with _open(content) as container:
        stream = _video_stream(container)
        try:
            for index, frame in enumerate(container.decode(stream)):
                deadline.check()
                if index == 0:
                    first_time = frame.time
                if index in wanted_set:
                    frames[index] = _rgb(frame)
                    # A stream without timestamps (raw elementary streams) reports none rather than a guess.
                    known = frame.time is not None and first_time is not None
                    times[index] = frame.time - first_time if known else None
                    rotation = frame.rotation
                if index >= wanted[-1]:
                    break
        except av.error.FFmpegError as exc:
            raise VideoDecodeError(f"corrupt video stream: {exc.strerror or exc}") from None
    missing = [i for i in wanted if i not in frames]
    if missing:
        raise VideoDecodeError(
            f"truncated: frame {missing[0]} cannot be decoded ({len(frames)} of {len(wanted)} sampled frames decoded)"
        )
    return frames, rotation, times, index + 1


def upright(frames: np.ndarray, rotation: int) -> np.ndarray:
    """Apply a display-matrix rotation (degrees counter-clockwise, as PyAV reports it) to (T, H, W, 3)."""
    quarter_turns = round(rotation / 90) % 4
    if quarter_turns == 0:
        return frames
    return np.ascontiguousarray(np.rot90(frames, k=quarter_turns, axes=(1, 2)))


def _decode_wanted(content: str | bytes, table: FrameTable, wanted: list[int], deadline: _Deadline):
    """(frames by index, rotation, times by index, seeks, frames decoded): by the frame table where it holds,
    else by counting frames from the start."""
    import av

    if table.pts is not None:
        try:
            with _open(content) as container:
                frames, rotation, seeks, decoded = _decode_by_table(
                    container, _video_stream(container), table, wanted, deadline
                )
            times = {i: float((table.pts[i] - table.pts[0]) * table.time_base) for i in wanted}
            return frames, rotation, times, seeks, decoded
        except _TableMismatch:
            pass
        except av.error.FFmpegError as exc:
            raise VideoDecodeError(f"corrupt video stream: {exc.strerror or exc}") from None
    frames, rotation, times, decoded = _decode_by_count(content, wanted, deadline)
    return frames, rotation, times, 0, decoded


def decode_frame(content: str | bytes, index: int, time_limit_s: float = DECODE_TIME_LIMIT_S) -> np.ndarray:
    """One frame, upright, by its presentation-order index (as DecodedVideo.frame_indices lists them): what a
    search result page shows for a video hit."""
    if isinstance(content, str) and not location(content).isfile():  # a folder, or nothing there
        raise VideoDecodeError("not a file")
    deadline = _Deadline(time_limit_s)
    with _open(content) as container:
        table = probe(container, _video_stream(container), deadline)
    if not 0 <= index < table.packets:
        raise VideoDecodeError(f"no frame {index} (the stream has {table.packets})")
    frames, rotation, _, _, _ = _decode_wanted(content, table, [int(index)], deadline)
    return upright(frames[int(index)][None], rotation)[0]


def decode_video(
    content: str | bytes, policy: FramePolicy = FramePolicy(), time_limit_s: float = DECODE_TIME_LIMIT_S
) -> DecodedVideo:
    """Sample and decode the frames of a video file (a path) or of a video's bytes per `policy`; raise
    VideoDecodeError with a one-line reason."""
    refuse_nothing_to_decode(content, "a video file", VideoDecodeError)
    deadline = _Deadline(time_limit_s)
    with _open(content) as container:
        stream = _video_stream(container)
        table = probe(container, stream, deadline)
        codec = stream.codec_context.name
        average_rate = float(stream.average_rate or stream.guessed_rate or 0)
        width, height = stream.codec_context.width, stream.codec_context.height
    total = table.packets
    duration = (
        table.duration_s if table.duration_s else (Fraction(total) / Fraction(average_rate) if average_rate else None)
    )
    wanted = sample_frame_indices(total, duration, policy, table.pts, table.end_pts)
    if len(wanted) * width * height * 3 > MAX_DECODED_BYTES:
        raise VideoDecodeError(
            f"{len(wanted)} frames of {width}x{height} exceed {MAX_DECODED_BYTES >> 30} GiB; "
            f"sample fewer (--max-frames)"
        )
    decode_room.admit(decode_peaks.video_decode_peak(len(wanted), width, height))  # in a run: waits for room to decode
    frames, rotation, times, seeks, decoded = _decode_wanted(content, table, wanted, deadline)
    try:
        stacked = np.stack([frames[i] for i in wanted])
    except ValueError:
        raise VideoDecodeError("frames change size within the stream") from None
    return DecodedVideo(
        frames=upright(stacked, rotation),
        frame_indices=wanted,
        timestamps=[times[i] for i in wanted],
        fps=float(total / duration) if duration else average_rate,
        duration_s=float(duration or 0.0),
        total_frames=total,
        rotation=int(rotation),
        codec=codec,
        seeks=seeks,
        frames_decoded=decoded,
    )
