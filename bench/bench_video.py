"""Benchmark: `gemma-embed video` (library call) against transformers' per-video loop, in one run.

    python -m bench.bench_video [--videos 4] [--rounds 2] [--batch-size N] [--device cpu|cuda] [--dtype auto]

Builds a random Gemma 4 checkpoint with a mid-size vision tower (hidden 256, 4 layers), writes videos of several
sizes and lengths with PyAV, then times
  * this tool: pipeline.run over all videos (decode threads, frame buckets across videos, planned chunks);
  * the reference loop: per video, transformers' PyAV reader at the same frame indices, the checkpoint's video
    processor, and model.model.get_video_features.
Prints frames/s and videos/s of each, their ratio, decode and encode time separately, peak RSS, and the largest
relative error between the two (they must agree). The two alternate for --rounds rounds and the best round of
each is kept, because a shared CPU makes single timings noisy. The tool's wall time excludes loading the
checkpoint and processor (printed separately); the reference's model is loaded once, outside its timing.
Both sides compute in the same dtype (--dtype; auto is the tool's own choice for the device: bf16 on a GPU
that has it natively). On a GPU the encode timer waits for the device (synchronize) before it stops. The first
round tunes the chunk as a run does; later rounds reuse the size it settled on (--batch-size), so the tuner's
probes are timed once, not every round.
A last section times decoding one long clip by seeking against transformers' sequential reader.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from make_tiny_checkpoint import build_gemma4  # samples/ is on the path (bench/__init__.py)
from make_video_samples import write_video

from bench.common import peak_rss

# (width, height, frames): three aspect ratios, so frames fall in a few buckets shared across videos.
SHAPES = [(320, 240, 90), (640, 360, 60), (240, 320, 45), (160, 120, 24), (480, 270, 120), (320, 240, 16)]


class Timer:
    """Adds up the wall time spent in wrapped functions (summed over decode threads)."""

    def __init__(self, synchronize=lambda: None):
        self.seconds: dict[str, float] = {}
        self.synchronize = synchronize  # the device's: a GPU returns before its kernels finish

    def wrap(self, owner, name: str, label: str, waits: bool = False):
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                result = original(*args, **kwargs)
                if waits:
                    self.synchronize()
                return result
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)
        return original


def synchronizer(device: str):
    if torch.device(device).type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def run_tool(ckpt: Path, videos: list[Path], out: Path, device: str, dtype: str, batch_size: int | None = None):
    """Wall seconds of pipeline.run less its setup, the seconds spent in each stage, and the run's chunking."""
    import gemma_embed.media.video as video_module
    import gemma_embed.models.loading as loading
    from gemma_embed import pipeline
    from gemma_embed.config import RunConfig
    from gemma_embed.embedder import Embedder
    from gemma_embed.models.gemma4 import Gemma4VideoPreparer, Gemma4VisionTower
    from gemma_embed.progress import Reporter

    timer = Timer(synchronizer(device))
    wrapped = [
        (video_module, "decode_video", "decode", False),
        (Gemma4VideoPreparer, "prepare", "prepare", False),
        (Gemma4VisionTower, "encode", "encode", True),
        (Embedder, "load", "setup", False),
        (loading, "resolve_checkpoint", "setup", False),
    ]
    restore = [(owner, name, timer.wrap(owner, name, label, waits)) for owner, name, label, waits in wrapped]
    config = RunConfig(
        modality="video",
        inputs=tuple(map(str, videos)),
        output=out,
        model=str(ckpt),
        device=device,
        dtype=dtype,
        overwrite=True,
        batch_size=batch_size,
    )
    start = time.perf_counter()
    try:
        result = pipeline.run(config, Reporter(quiet=True, stdout=io.StringIO()))
    finally:
        for owner, name, original in restore:
            setattr(owner, name, original)
    wall = time.perf_counter() - start
    assert result.failed == 0, "the tool failed on a benchmark video"
    return wall - timer.seconds.get("setup", 0.0), timer.seconds, result.chunking


def settled_chunk(chunking: dict, out: Path) -> int | None:
    """The frames a batch the tuner's chosen work (patches a batch, one choice for the stage) gives at the frames'
    patch count (every sampled frame of one budget has the same)."""
    import gemma_embed

    work = chunking.get("chosen")
    patches = {item["patches"] for item in gemma_embed.read_metadata(out)["items"] if "patches" in item}
    return max(1, work // max(patches)) if work and patches else None


def run_reference(model, processor, videos: list[Path], indices: dict[str, list[int]]):
    from transformers.video_utils import read_video_pyav

    decode = encode = 0.0
    rows = {}
    for path in videos:
        start = time.perf_counter()
        wanted = np.array(indices[str(path)])
        frames, _ = read_video_pyav(str(path), sample_indices_fn=lambda **_: wanted)  # noqa: B023
        mid = time.perf_counter()
        inputs = processor(videos=[frames], do_sample_frames=False, return_tensors="pt")
        with torch.inference_mode():
            out = model.model.get_video_features(
                pixel_values_videos=inputs["pixel_values_videos"].to(model.device),  # float32, as the tool's
                video_position_ids=inputs["video_position_ids"].to(model.device),
                num_frames_per_video=inputs["num_frames_per_video"],
            )
        rows[str(path)] = out.pooler_output[0].float().cpu()  # the copy to the host waits for the device
        decode += mid - start
        encode += time.perf_counter() - mid
    return decode + encode, decode, encode, rows


def bench_long_clip(folder: Path, frames: int) -> None:
    """Decoding 32 frames of a long clip: seek-ahead (this tool) vs transformers' sequential PyAV reader."""
    from transformers.video_utils import read_video_pyav

    from gemma_embed.media.video import decode_video

    path = write_video(folder / "long.mp4", "libx264", 640, 360, frames, rate=30, gop=60)
    start = time.perf_counter()
    video = decode_video(str(path))
    ours = time.perf_counter() - start
    start = time.perf_counter()
    ref, _ = read_video_pyav(str(path), sample_indices_fn=lambda **_: np.array(video.frame_indices))
    theirs = time.perf_counter() - start
    assert np.array_equal(ref, video.frames)
    print(
        f"long clip ({frames} frames 640x360, GOP 60, 32 sampled): decode {ours:.2f} s with {video.seeks} seeks "
        f"vs {theirs:.2f} s sequential (x{theirs / ours:.1f}); frames identical"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="alternating tool/reference rounds; best kept")
    parser.add_argument("--batch-size", type=int, default=None, help="cap the tool's chunks (default: planned)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="both sides' compute dtype; auto: the tool's choice")
    parser.add_argument("--vision-hidden", type=int, default=256)
    parser.add_argument("--vision-layers", type=int, default=4)
    parser.add_argument("--long-frames", type=int, default=900, help="0 skips the long-clip decode test")
    args = parser.parse_args()

    from transformers import AutoVideoProcessor, Gemma4ForConditionalGeneration

    import gemma_embed
    from gemma_embed.device import dtype_name, resolve_device, resolve_dtype

    dtype = resolve_dtype(args.dtype, resolve_device(args.device))

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ckpt = build_gemma4(
            folder / "ckpt", seed=0, audio=False, vision_hidden=args.vision_hidden, vision_layers=args.vision_layers
        )
        videos = []
        for i in range(args.videos):
            width, height, frames = SHAPES[i % len(SHAPES)]
            videos.append(write_video(folder / f"v{i:03d}.mp4", "libx264", width, height, frames, seed=i))
        print(
            f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device} "
            f"{dtype_name(dtype)}; vision tower "
            f"hidden {args.vision_hidden}, {args.vision_layers} layers; {len(videos)} videos"
        )

        # Warm both paths on one video so neither pays first-call costs in the timing.
        run_tool(ckpt, videos[:1], folder / "warm.safetensors", args.device, dtype_name(dtype))
        model = Gemma4ForConditionalGeneration.from_pretrained(ckpt, dtype=dtype).to(args.device).eval()
        processor = AutoVideoProcessor.from_pretrained(ckpt)

        out = folder / "tool.safetensors"
        tool_runs, ref_runs = [], []
        batch_size = args.batch_size
        for round_ in range(args.rounds):
            tool_runs.append(run_tool(ckpt, videos, out, args.device, dtype_name(dtype), batch_size))
            if round_ == 0:
                batch_size = batch_size or settled_chunk(tool_runs[0][2], out)  # later rounds: no probes again
                tool_rss = peak_rss() / 2**20
                ours = gemma_embed.load(out)
                items = gemma_embed.read_metadata(out)["items"]
                indices = {item["path"]: item["frame_indices"] for item in items}
                run_reference(model, processor, videos[:1], indices)  # warm
            ref_runs.append(run_reference(model, processor, videos, indices))
            print(f"round {round_ + 1}: tool {tool_runs[-1][0]:.2f} s, reference {ref_runs[-1][0]:.2f} s", flush=True)
        tool_wall, parts, chunking = min(tool_runs, key=lambda r: r[0])
        ref_wall, ref_decode, ref_encode, ref_rows = min(ref_runs, key=lambda r: r[0])
        frames = sum(len(v) for v in indices.values())
        worst = max(float((ours[str(p)] - ref_rows[str(p)]).norm() / ref_rows[str(p)].norm()) for p in videos)

        print(
            f"{'':>10} {'wall s':>8} {'frames/s':>9} {'videos/s':>9} {'decode s':>9} {'prepare s':>10} {'encode s':>9}"
        )
        print(
            f"tool setup (checkpoint + processor load, excluded): {parts.get('setup', 0):.2f} s; "
            f"chunk: {args.batch_size or f'tuned in round 1 ({tool_runs[0][2]}), then fixed at {batch_size}'}"
        )
        print(
            f"{'tool':>10} {tool_wall:8.2f} {frames / tool_wall:9.1f} {len(videos) / tool_wall:9.2f} "
            f"{parts.get('decode', 0):9.2f} {parts.get('prepare', 0):10.2f} {parts.get('encode', 0):9.2f}"
        )
        print(
            f"{'reference':>10} {ref_wall:8.2f} {frames / ref_wall:9.1f} {len(videos) / ref_wall:9.2f} "
            f"{ref_decode:9.2f} {'(in encode)':>10} {ref_encode:9.2f}"
        )
        print(f"ratio tool/reference: x{ref_wall / tool_wall:.2f} frames/s ({frames} frames in {len(videos)} videos)")
        print(
            "tool decode/prepare/encode are summed over threads (decode and prepare run in 2 worker threads, "
            "overlapping each other); reference encode includes its processor"
        )
        print(
            f"peak RSS: {tool_rss:.0f} MiB after the tool, {peak_rss() / 2**20:.0f} MiB after the reference "
            f"(process-wide, includes the full reference model)"
        )
        print(
            f"max relative error tool vs reference: {worst:.2e} ({dtype_name(dtype)}; in bf16 transformers' own "
            f"result moves by ~3e-3 when the processor's padding patches, which the tool never sends, are left out)"
        )
        if args.long_frames:
            bench_long_clip(folder, args.long_frames)


if __name__ == "__main__":
    main()
