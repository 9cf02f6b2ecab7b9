"""The video command: every video's rows equal transformers' video processor + get_video_features on the frames
the tool reports it sampled, frames of different videos share device batches, pooling, options, bad input."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import (
    EXE,
    SAMPLE_MODEL,
    invoke,
    items_by_key,
    record_batches,
    reference_video_rows,
    rel_error,
    run_images,
    summary,
)
from make_video_samples import SAMPLES, make_samples, write_audio_only

import gemma_embed
from gemma_embed.errors import UsageError
from gemma_embed.models.gemma4 import Gemma4VisionTower


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory):
    """Five videos: h264/vp9/mjpeg/mpeg4 in mp4/webm/avi/mkv, 1 to 50 frames, one rotated, one variable-rate."""
    folder = tmp_path_factory.mktemp("videos")
    make_samples(folder)
    return folder


@pytest.fixture(scope="module")
def video_processor(gemma4_dir):
    from transformers import AutoVideoProcessor

    return AutoVideoProcessor.from_pretrained(gemma4_dir)


@pytest.fixture
def batch_log(monkeypatch):
    """The units of every device batch the vision tower runs (`unit.item` is the video's index)."""
    return record_batches(monkeypatch, Gemma4VisionTower)


@pytest.mark.parametrize("batch_size", [None, 5], ids=["auto", "chunk5"])
def test_every_video_matches_reference(
    tmp_path, gemma4_dir, video_dir, reference_model, video_processor, batch_log, batch_size
):
    out = tmp_path / "video.safetensors"
    code, records, err = run_images([video_dir], gemma4_dir, out, modality="video", batch_size=batch_size)
    assert code == 0, err
    rows, items = gemma_embed.load(out), items_by_key(out)
    assert sorted(rows) == sorted(SAMPLES)

    # Sampling: the processor's policy (32 evenly spaced), and every frame of a shorter clip.
    assert items["clip-h264.mp4"]["frame_indices"] == [k * 50 // 32 for k in range(32)]
    assert items["short-vp9.webm"]["frame_indices"] == list(range(20))
    assert items["one-frame.avi"]["frame_indices"] == [0]
    assert items["rotated-mpeg4.mp4"]["rotation"] == 90
    assert (items["rotated-mpeg4.mp4"]["width"], items["rotated-mpeg4.mp4"]["height"]) == (72, 128)

    for name, meta in items.items():
        ref = reference_video_rows(reference_model, video_processor, video_dir / name, meta)
        ours = rows[name]
        assert ours.shape == ref.shape, name
        assert ours.shape[0] == meta["frames"] * meta["rows_per_frame"] == meta["rows"], name
        assert len(meta["timestamps"]) == meta["frames"] and meta["fps"] > 0, name
        assert rel_error(ours, ref) < 1e-5, name

    frames = sum(meta["frames"] for meta in items.values())
    assert sum(len(call) for call in batch_log) == frames  # every frame encoded exactly once
    if batch_size:
        assert max(len(call) for call in batch_log) <= batch_size


def test_frames_of_different_videos_share_device_batches(tmp_path, gemma4_dir, video_dir, batch_log):
    # clip-h264 (160x120) and one-frame (64x48) are both 4:3: their frames have the same patch count.
    inputs = [video_dir / "clip-h264.mp4", video_dir / "one-frame.avi", video_dir / "short-vp9.webm"]
    # A fixed chunk bigger than any bucket: by default the chunk is tuned for speed, which on a CPU may split it.
    code, _, err = run_images(inputs, gemma4_dir, tmp_path / "o.safetensors", modality="video", batch_size=64)
    assert code == 0, err
    videos_per_batch = [{u.item for u in batch} for batch in batch_log]
    assert any(len(v) > 1 for v in videos_per_batch), f"no batch mixed videos: {videos_per_batch}"
    # One device batch per distinct frame size, not one per video or per frame.
    assert len(batch_log) == 2 and sorted(len(call) for call in batch_log) == [20, 33]


def test_pool_frame_mean_and_tower_space(tmp_path, gemma4_dir, video_dir, reference_model, video_processor):
    names = ["clip-h264.mp4", "rotated-mpeg4.mp4", "one-frame.avi"]
    inputs = [video_dir / n for n in names]
    # Pooling is over whatever frames were sampled: 6 of them show it as well as 32 (sampling has its own tests).
    sampled = {"modality": "video", "max_frames": 6}
    outs = {pool: tmp_path / f"{pool}.safetensors" for pool in ("frame", "mean")}
    for pool, out in outs.items():
        assert run_images(inputs, gemma4_dir, out, pool=pool, **sampled)[0] == 0
    tower_out = tmp_path / "tower.safetensors"
    assert run_images(inputs, gemma4_dir, tower_out, space="tower", **sampled)[0] == 0
    per_frame, mean, tower = (gemma_embed.load(p) for p in (outs["frame"], outs["mean"], tower_out))
    items = items_by_key(outs["frame"])
    assert gemma_embed.read_metadata(outs["frame"])["pooling"] == "frame"
    for path, name in zip(inputs, names, strict=True):
        meta = items[str(path)]
        ref = reference_video_rows(reference_model, video_processor, path, meta)
        assert meta["frames"] == (1 if name == "one-frame.avi" else 6)
        frames = ref.reshape(meta["frames"], meta["rows_per_frame"], -1)
        assert per_frame[str(path)].shape == (meta["frames"], ref.shape[1])
        assert rel_error(per_frame[str(path)], frames.mean(dim=1)) < 1e-5, name
        assert mean[str(path)].shape == (1, ref.shape[1])
        assert rel_error(mean[str(path)][0], ref.mean(dim=0)) < 1e-5, name
        ref_tower = reference_video_rows(reference_model, video_processor, path, meta, space="tower")
        assert rel_error(tower[str(path)], ref_tower) < 1e-5, name


def test_fps_and_max_frames_options_stdin_and_plan(tmp_path, gemma4_dir, video_dir):
    clip = video_dir / "clip-h264.mp4"  # 50 frames at 24 fps: 2.083 s
    out = tmp_path / "fps.safetensors"
    result = invoke("video", clip, "--model", gemma4_dir, "-o", out, "--fps", "2", "-q")
    assert result.exit_code == 0, result.output
    (meta,) = gemma_embed.read_metadata(out)["items"]
    # transformers' rate rule: int(50 / 24 * 2) = 4 frames, evenly spaced (a constant rate: in time and index).
    assert meta["frame_indices"] == [k * 50 // 4 for k in range(4)] == [0, 12, 25, 37]
    assert meta["timestamps"] == pytest.approx([i / 24 for i in meta["frame_indices"]])

    result = invoke(
        "video",
        clip,
        "--model",
        gemma4_dir,
        "-o",
        out,
        "--overwrite",
        "--fps",
        "10",
        "--max-frames",
        "3",
        "--pool",
        "frame",
        "-q",
    )
    assert result.exit_code == 0, result.output
    (meta,) = gemma_embed.read_metadata(out)["items"]
    assert meta["frame_indices"] == [0, 16, 33] and gemma_embed.load(out)[str(clip)].shape == (3, 32)

    listing = f"{video_dir / 'short-vp9.webm'}\n{clip}\n"
    result = runner_with_stdin(
        ["video", "-", "--model", gemma4_dir, "-o", out, "--overwrite", "--max-frames", "5", "--jsonl"], listing
    )
    assert result.exit_code == 0, result.output
    meta = gemma_embed.read_metadata(out)["items"]
    assert [m["frame_indices"] for m in meta] == [[0, 4, 8, 12, 16], [0, 10, 20, 30, 40]]

    planned = invoke("plan", video_dir, "--modality", "video", "--model", gemma4_dir, "--max-frames", "4", "-q")
    plan = json.loads(planned.stdout)
    assert plan["modality"] == "video" and plan["items"] == len(SAMPLES)
    assert plan["units"] == 4 + 4 + 1 + 4 + 4  # frames, each a unit
    assert all(b["chunk"] >= 1 for b in plan["buckets"])


def runner_with_stdin(args, text):
    from typer.testing import CliRunner

    return CliRunner().invoke(gemma_embed.cli.app, [str(a) for a in args], input=text, catch_exceptions=False)


def test_usage_errors(tmp_path, gemma4_dir, video_dir, image_dir):
    for args in (["--fps", "0"], ["--max-frames", "0"], ["--pool", "max"]):
        result = invoke("video", video_dir, "--model", gemma4_dir, "-o", tmp_path / "x.safetensors", *args)
        assert result.exit_code == 2, args
    with pytest.raises(UsageError, match="--pool frame does not apply to images"):
        run_images([image_dir], gemma4_dir, tmp_path / "i.safetensors", pool="frame")


def test_installed_command_names_bad_videos_and_writes_the_rest(tmp_path, video_dir):
    folder = tmp_path / "in"
    folder.mkdir()
    good = ["clip-h264.mp4", "one-frame.avi"]
    for name in good:
        (folder / name).write_bytes((video_dir / name).read_bytes())
    (folder / "empty.mp4").write_bytes(b"")
    (folder / "notes.mp4").write_text("not a video\n")
    write_audio_only(folder / "no-video.mp4")
    data = (video_dir / "vfr-h264.mkv").read_bytes()
    (folder / "truncated.mkv").write_bytes(data[: len(data) // 2])
    bad = {
        "empty.mp4": "empty file",
        "notes.mp4": "not a readable video",
        "no-video.mp4": "no video stream",
        "truncated.mkv": "truncated",
    }
    out = tmp_path / "o.safetensors"
    proc = subprocess.run(
        [EXE, "video", str(folder), "--model", str(SAMPLE_MODEL), "-o", str(out), "--jsonl"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == len(bad), proc.stderr
    for name, reason in bad.items():
        assert any(line.startswith(f"error: {name}: ") and reason in line for line in errors), (name, errors)
    assert summary(proc.stdout)["failed"] == len(bad)
    assert sorted(gemma_embed.load(out)) == sorted(good)
