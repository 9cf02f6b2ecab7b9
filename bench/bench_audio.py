"""Audio throughput and memory: gemma-embed's pipeline against transformers' per-clip reference loop, one run.

    python -m bench.bench_audio                      # Gemma 4, 24 clips of 1-20 s, hidden 256
    python -m bench.bench_audio --family gemma3n --clips 16
    python -m bench.bench_audio --device cuda         # both sides on the GPU, in the tool's dtype (bf16 there)

Builds a random checkpoint with a more realistic audio tower than the tests' (hidden 256, 4 layers, the real
subsampling channels), writes clips of mixed lengths as 16 kHz wav files, then times
- the reference: for each clip, read it, the feature extractor on it alone, `get_audio_features`, strip padding;
- this tool: `gemma_embed.pipeline.run` over the same files (decode threads, ragged batches, memory planning,
  writing the output file), model loading included.
It checks the two agree (float32 relative error per clip), prints clips/s of each and their ratio, the peak RSS
of each phase, and the profiler's peak transient of one tower forward against the cost model the planner uses
(that last check runs on the CPU in float32 whatever --device says: the profiler's memory view is the CPU's).
Both sides compute in the same dtype on the same device; the reference's rows are copied to the host inside
its timing, which waits for a GPU to finish.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import PeakRss

RATE = 16_000


# ------------------------------------------------------------------------------------------- setup


def build_checkpoint(folder: Path, family: str, hidden: int, layers: int, seed: int) -> Path:
    from make_tiny_checkpoint import (
        gemma3n_without_vision_tower,
        randomize,
        tiny_gemma3n_config,
        tiny_gemma4_config,
        write_processor_files,
    )

    torch.manual_seed(seed)
    if family == "gemma4":
        from transformers import Gemma4AudioConfig, Gemma4ForConditionalGeneration

        config = tiny_gemma4_config(vision=False)
        config.audio_config = Gemma4AudioConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            subsampling_conv_channels=[128, 32],
            output_proj_dims=hidden,
        )
        model = Gemma4ForConditionalGeneration(config).eval()
    else:
        from transformers import Gemma3nAudioFeatureExtractor, Gemma3nForConditionalGeneration

        with gemma3n_without_vision_tower():
            model = Gemma3nForConditionalGeneration(
                tiny_gemma3n_config(audio_hidden=hidden, audio_layers=layers, sscp_channels=(128, 32))
            ).eval()
    randomize(model, seed)
    model.save_pretrained(folder)
    if family == "gemma4":
        write_processor_files(folder)
    else:
        Gemma3nAudioFeatureExtractor().save_pretrained(folder)
    return folder


def write_clips(folder: Path, count: int, shortest: float, longest: float, seed: int) -> list[Path]:
    import soundfile as sf

    rng = np.random.default_rng(seed)
    paths = []
    for i, seconds in enumerate(rng.uniform(shortest, longest, count)):
        t = np.arange(int(seconds * RATE)) / RATE
        wave = 0.3 * np.sin(2 * np.pi * (200 + 50 * i) * t) + 0.05 * rng.standard_normal(t.size)
        path = folder / f"clip-{i:03d}.wav"
        sf.write(path, wave.astype(np.float32), RATE, subtype="FLOAT")
        paths.append(path)
    return paths


def reference_model(folder: Path, family: str, device: str = "cpu", dtype=torch.float32):
    from transformers import AutoFeatureExtractor

    if family == "gemma4":
        from transformers import Gemma4ForConditionalGeneration

        model = Gemma4ForConditionalGeneration.from_pretrained(folder, dtype=dtype)
    else:
        from make_tiny_checkpoint import gemma3n_without_vision_tower
        from transformers import Gemma3nForConditionalGeneration

        with gemma3n_without_vision_tower():
            model = Gemma3nForConditionalGeneration.from_pretrained(folder, dtype=dtype)
    return model.to(device).eval(), AutoFeatureExtractor.from_pretrained(folder)


# ------------------------------------------------------------------------------------------- the two sides


def reference_rows(model, extractor, path: Path, family: str) -> torch.Tensor:
    import soundfile as sf

    samples, _ = sf.read(path, dtype="float32")
    features = extractor([samples], return_tensors="pt").to(model.device)  # float32, as the tool's
    mask = features["input_features_mask"]
    with torch.inference_mode():
        if family == "gemma4":
            out = model.model.get_audio_features(features["input_features"], mask)
            rows = out.pooler_output[0][out.attention_mask[0]]
        else:
            out = model.model.get_audio_features(features["input_features"], ~mask)
            rows = out.pooler_output[0][~out.audio_mel_mask[0]]
    return rows.float().cpu()


def run_tool(
    paths: list[Path], model: Path, output: Path, batch_size: int | None, workers: int, device="cpu", dtype="auto"
):
    from gemma_embed.config import RunConfig
    from gemma_embed.pipeline import run
    from gemma_embed.progress import Reporter

    config = RunConfig(
        modality="audio",
        inputs=tuple(str(p) for p in paths),
        output=output,
        model=str(model),
        device=device,
        dtype=dtype,
        overwrite=True,
        batch_size=batch_size,
        workers=workers,
    )
    return run(config, Reporter(quiet=True, stdout=io.StringIO(), stderr=io.StringIO(), live=False))


def profiled_peak(fn) -> int:
    """Peak bytes allocated during fn, from the profiler's allocation/free events (the CPU analogue of
    cuda.max_memory_allocated minus the baseline)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak


def cost_model_check(folder: Path, family: str, seconds: float, batch: int) -> tuple[int, int]:
    """(profiled peak, modelled cost) of one tower forward over `batch` clips of `seconds`."""
    from gemma_embed.embedder import Embedder
    from gemma_embed.media.audio import DecodedAudio

    stages = Embedder(folder, device="cpu", dtype="float32").load("audio").stages
    tower = stages.chain[0].tower
    samples = (0.1 * np.random.default_rng(0).standard_normal(int(seconds * RATE))).astype(np.float32)
    unit = stages.preparer.prepare(DecodedAudio(samples, RATE, RATE, 1, "bench")).units[0]
    units = [unit] * batch
    with torch.inference_mode():
        tower.encode(units, "language")  # warm-up: first-call allocations are not the steady state
        peak = profiled_peak(lambda: tower.encode(units, "language"))
    return peak, batch * tower.unit_cost(unit.length)


# ------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["gemma4", "gemma3n"], default="gemma4")
    parser.add_argument("--clips", type=int, default=24)
    parser.add_argument("--shortest", type=float, default=1.0)
    parser.add_argument("--longest", type=float, default=20.0)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=None, help="cap for the tool (default: planned)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="both sides' compute dtype; auto: the tool's choice")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    from gemma_embed.device import dtype_name, resolve_device, resolve_dtype

    dtype = resolve_dtype(args.dtype, resolve_device(args.device))

    with tempfile.TemporaryDirectory(prefix="bench-audio-") as tmp:
        tmp = Path(tmp)
        folder = build_checkpoint(tmp / "ckpt", args.family, args.hidden, args.layers, args.seed)
        paths = write_clips(tmp, args.clips, args.shortest, args.longest, args.seed)
        total_s = sum(p.stat().st_size for p in paths) / 4 / RATE
        model, extractor = reference_model(folder, args.family, args.device, dtype)
        print(
            f"{args.family} audio tower hidden {args.hidden}, {args.layers} layers; {len(paths)} clips of "
            f"{args.shortest:g}-{args.longest:g} s ({total_s:.0f} s of audio); torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, {args.device} {dtype_name(dtype)}"
        )
        reference_rows(model, extractor, paths[0], args.family)  # warm-up
        tool_options = (args.batch_size, args.workers, args.device, dtype_name(dtype))
        run_tool(paths[:2], folder, tmp / "warm.safetensors", *tool_options)

        with PeakRss() as ref_mem:
            start = time.perf_counter()
            refs = [reference_rows(model, extractor, p, args.family) for p in paths]
            ref_s = time.perf_counter() - start
        out = tmp / "out.safetensors"
        with PeakRss() as tool_mem:
            start = time.perf_counter()
            result = run_tool(paths, folder, out, *tool_options)
            tool_s = time.perf_counter() - start
        assert result.failed == 0, "the tool reported failures"

        import gemma_embed

        ours = gemma_embed.load(out)
        worst = max(float((ours[str(p)] - r).norm() / r.norm()) for p, r in zip(paths, refs, strict=True))
        assert all(ours[str(p)].shape == r.shape for p, r in zip(paths, refs, strict=True))
        mib = 2**20
        print(f"{'':24}{'clips/s':>10}{'audio s/s':>11}{'peak RSS':>12}{'RSS rise':>11}")
        for name, seconds, mem in [("reference (per clip)", ref_s, ref_mem), ("gemma-embed", tool_s, tool_mem)]:
            print(
                f"{name:24}{len(paths) / seconds:10.2f}{total_s / seconds:11.1f}"
                f"{mem.peak / mib:9.0f} MiB{(mem.peak - mem.start) / mib:7.0f} MiB"
            )
        print(f"ratio gemma-embed / reference: {ref_s / tool_s:.2f}x clips/s; max relative error {worst:.2e}")
        for seconds, batch in [(30.0, 1), (30.0, 2)]:
            peak, modelled = cost_model_check(folder, args.family, seconds, batch)
            print(
                f"tower forward, {batch} x {seconds:g} s: profiled peak {peak / mib:.1f} MiB, "
                f"cost model {modelled / mib:.1f} MiB ({modelled / max(peak, 1):.2f}x)"
            )


if __name__ == "__main__":
    main()
