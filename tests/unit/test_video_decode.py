"""Video decode: frame sampling against transformers' policy, pixels against transformers' PyAV reader,
rotation, variable frame rate, seeking, and broken files (one-line errors, bounded time)."""

from __future__ import annotations

import numpy as np
import pytest
from make_video_samples import SAMPLES, frame_pixels, make_samples, write_audio_only, write_video
from transformers.video_utils import VideoMetadata, default_sample_indices_fn, read_video_pyav

from gemma_embed.media.video import (
    FramePolicy,
    VideoDecodeError,
    decode_video,
    frames_to_sample,
    indices_at_times,
    resolve_policy,
    sample_frame_indices,
    uniform_indices,
)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("videos")
    return {path.name: path for path in make_samples(folder)}


def transformers_indices(total: int, num_frames=None, fps=None, video_fps=24.0) -> list[int]:
    meta = VideoMetadata(total_num_frames=total, fps=video_fps, duration=total / video_fps)
    return default_sample_indices_fn(meta, num_frames=num_frames, fps=fps).tolist()


# ------------------------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("total", [32, 33, 50, 97, 100, 1000, 12345])
@pytest.mark.parametrize("num_frames", [1, 8, 32])
def test_uniform_sampling_equals_transformers(total, num_frames):
    policy = FramePolicy(num_frames=num_frames)
    assert sample_frame_indices(total, total / 24, policy) == transformers_indices(total, num_frames=num_frames)


@pytest.mark.parametrize("total", [1, 2, 20, 31])
def test_clip_shorter_than_num_frames_gives_all_frames(total):
    with pytest.raises(ValueError, match="exceeds"):  # what transformers does with the default 32
        transformers_indices(total, num_frames=32)
    assert sample_frame_indices(total, total / 24, FramePolicy(num_frames=32)) == list(range(total))


@pytest.mark.parametrize("total, video_fps", [(240, 24.0), (50, 24.0), (900, 30.0), (7, 25.0), (1000, 29.97)])
@pytest.mark.parametrize("fps", [0.5, 1.0, 2.0, 4.0])
def test_rate_sampling_count_equals_transformers(total, video_fps, fps):
    expected = transformers_indices(total, fps=fps, video_fps=video_fps)
    policy = FramePolicy(num_frames=None, fps=fps)
    assert frames_to_sample(total, total / video_fps, policy) == len(expected)
    assert sample_frame_indices(total, total / video_fps, policy) == expected  # no timestamps: uniform


def test_rate_sampling_is_capped_by_max_frames():
    policy = FramePolicy(num_frames=None, fps=10.0, max_frames=32)
    assert frames_to_sample(10_000, 400.0, policy) == 32
    assert frames_to_sample(10_000, 1.0, policy) == 10
    assert frames_to_sample(3, 1.0, policy) == 3


def test_resolve_policy_defaults_and_overrides():
    assert resolve_policy(32, None) == FramePolicy(num_frames=32)
    assert resolve_policy(32, None, max_frames=8) == FramePolicy(num_frames=8)
    assert resolve_policy(32, None, fps=2.0) == FramePolicy(num_frames=None, fps=2.0, max_frames=32)
    assert resolve_policy(32, None, fps=2.0, max_frames=100) == FramePolicy(num_frames=None, fps=2.0, max_frames=100)
    assert resolve_policy(None, 1.0) == FramePolicy(num_frames=None, fps=1.0)  # an fps-only processor
    assert resolve_policy(32, 1.0) == FramePolicy(num_frames=32)  # transformers: num_frames wins
    with pytest.raises(VideoDecodeError, match="no frames"):
        frames_to_sample(0, 0.0, FramePolicy())


def test_time_sampling_on_a_constant_rate_equals_uniform():
    for total, step, count in [(50, 512, 8), (900, 1001, 32), (7, 40, 3), (100, 3, 100)]:
        pts = [1000 + i * step for i in range(total)]
        assert indices_at_times(pts, pts[-1] + step, count) == uniform_indices(total, count)


def test_time_sampling_follows_timestamps_not_indices():
    # Ten quick frames (10 ms) then ten slow ones (190 ms): half the frames cover 5% of the time.
    pts, t = [], 0
    for i in range(20):
        pts.append(t)
        t += 10 if i < 10 else 190
    picked = indices_at_times(pts, t, 4)  # instants 0, 0.5, 1.0, 1.5 s
    assert picked == [0, 12, 14, 17]  # frames start at 0, 0.48, 0.86 and 1.43 s
    assert uniform_indices(20, 4) == [0, 5, 10, 15]  # what assuming a constant rate would pick


# ------------------------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("name", list(SAMPLES))
def test_frames_equal_transformers_pyav_reader(videos, name):
    video = decode_video(str(videos[name]))
    expected_count = min(32, SAMPLES[name][3])
    assert len(video.frame_indices) == video.frames.shape[0] == expected_count
    reference, _ = read_video_pyav(str(videos[name]), sample_indices_fn=lambda **_: np.array(video.frame_indices))
    reference = np.rot90(reference, k=video.rotation // 90, axes=(1, 2))
    assert video.frames.dtype == np.uint8 and np.array_equal(video.frames, reference)


def test_seeking_on_a_long_clip_decodes_the_same_frames(tmp_path):
    path = write_video(tmp_path / "long.mp4", "libx264", 96, 64, 600, rate=30, gop=12)
    video = decode_video(str(path), FramePolicy(num_frames=8))  # 75 frames apart, keyframes every 12
    assert video.seeks > 0, "sparse samples of a clip with short GOPs should be decoded by seeking"
    # Each seek lands on the keyframe before its target: at most a GOP decoded per sampled frame.
    assert video.frames_decoded <= 8 * 12 + 24
    assert video.frame_indices == transformers_indices(600, num_frames=8)
    reference, _ = read_video_pyav(str(path), sample_indices_fn=lambda **_: np.array(video.frame_indices))
    assert np.array_equal(video.frames, reference)
    assert video.timestamps == pytest.approx([i / 30 for i in video.frame_indices], abs=1e-9)


def test_stream_without_timestamps_is_decoded_by_counting_frames(tmp_path):
    import av

    path = tmp_path / "raw.h264"  # an elementary stream: no container, no timestamps, no frame count
    with av.open(str(path), "w", format="h264") as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(40):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame_pixels(i, 64, 48), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    video = decode_video(str(path))
    assert video.total_frames == 40 and video.frame_indices == transformers_indices(40, num_frames=32)
    assert video.timestamps == [None] * 32  # unknown, not guessed
    with av.open(str(path)) as container:  # transformers' reader cannot seek(0) in a raw stream
        every_frame = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert np.array_equal(video.frames, np.stack([every_frame[i] for i in video.frame_indices]))


def test_decoding_stops_at_the_last_sampled_frame(tmp_path):
    path = write_video(tmp_path / "ten.mp4", "libx264", 64, 48, 100, rate=25, gop=250)  # a single GOP
    video = decode_video(str(path), FramePolicy(num_frames=None, fps=1.0, max_frames=2))  # frames 0 and 50
    assert video.frame_indices == [0, 50] and video.seeks == 0
    assert video.frames_decoded == 51


def test_rotation_metadata_is_applied(videos):
    video = decode_video(str(videos["rotated-mpeg4.mp4"]))
    assert video.rotation == 90
    assert (video.width, video.height) == (72, 128)  # encoded 128x72, shown rotated


def test_variable_frame_rate_uses_timestamps(videos):
    video = decode_video(str(videos["vfr-h264.mkv"]), FramePolicy(num_frames=None))
    steps = [40, 100, 20]  # the display times the sample was written with, in ms
    expected = np.cumsum([0] + [steps[i % 3] for i in range(29)]) / 1000
    assert video.timestamps == pytest.approx(expected.tolist(), abs=1e-9)
    assert video.fps == pytest.approx(30 / video.duration_s)
    by_rate = decode_video(str(videos["vfr-h264.mkv"]), FramePolicy(num_frames=None, fps=5.0, max_frames=100))
    # int(1.62 s * 5) = 8 instants 0.2 s apart; each picked frame is the one on screen at its instant.
    times = np.array(video.timestamps)
    for k, index in enumerate(by_rate.frame_indices):
        instant = k * video.duration_s / 8
        assert times[index] <= instant + 1e-9 and (index == 29 or times[index + 1] > instant)
    assert by_rate.frame_indices != uniform_indices(30, 8)


# ------------------------------------------------------------------------------------------- bad input


def _truncate(source, target, fraction):
    data = source.read_bytes()
    target.write_bytes(data[: int(len(data) * fraction)])
    return target


@pytest.fixture(scope="module")
def broken(tmp_path_factory, videos):
    folder = tmp_path_factory.mktemp("broken")
    (folder / "empty.mp4").write_bytes(b"")
    (folder / "notes.mp4").write_text("this is a text file, not a video\n")
    write_audio_only(folder / "audio-only.mp4")
    _truncate(videos["clip-h264.mp4"], folder / "cut.mp4", 0.5)
    _truncate(videos["vfr-h264.mkv"], folder / "cut.mkv", 0.4)
    import av

    # An MP4 with its index first (as streamed files are), cut off: the header promises frames that are gone.
    with (
        av.open(str(videos["clip-h264.mp4"])) as src,
        av.open(str(folder / "fs.mp4"), "w", options={"movflags": "faststart"}) as dst,
    ):
        out = dst.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.size:
                packet.stream = out
                dst.mux(packet)
    _truncate(folder / "fs.mp4", folder / "cut-faststart.mp4", 0.6)
    return folder


@pytest.mark.parametrize(
    "name, message",
    [
        ("empty.mp4", "empty file"),
        ("notes.mp4", "not a readable video"),
        ("audio-only.mp4", "no video stream (the file has: audio)"),
        ("cut.mp4", "not a readable video"),
        ("cut.mkv", "truncated"),
        ("cut-faststart.mp4", "truncated"),
    ],
)
def test_broken_files_raise_one_line_errors(broken, name, message):
    with pytest.raises(VideoDecodeError) as info:
        decode_video(str(broken / name))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_decoding_is_bounded_in_time(videos):
    with pytest.raises(VideoDecodeError, match="longer than the 0 s limit"):
        decode_video(str(videos["clip-h264.mp4"]), time_limit_s=0.0)
