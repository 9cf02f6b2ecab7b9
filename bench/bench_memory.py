"""Memory: the planner's cost models and the host side's estimates against measurements, on the CPU.

    python -m bench.bench_memory                 # vision tower: cost model vs measured peak transient
    python -m bench.bench_memory --decode        # host: decode + prepare peak per pixel / sample, vs the estimates
    python -m bench.bench_memory --host [--root DIR] [--workers 1,4,8] [--budget 1GiB]
                                                 # eight 9400x9400 PNGs: peak RSS vs budget + model + 300 MiB

Peak transient = the highest running sum of the profiler's allocation/free events during one forward (the CPU
analogue of `cuda.max_memory_allocated() - baseline`), inputs and weights excluded. Two encoder layers suffice:
activations are freed layer by layer, so the peak does not grow with depth.
Host peaks are VmHWM of fresh processes (tests/memory_helpers.py). `--host` runs the `images` command with the
package of `--root` (another checkout, to compare before and after a change); "model" is the peak RSS of the same
command on one 64x48 image (the process baseline plus the model). Results go in bench/MEMORY.md.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import torch
from memory_helpers import ROOT, cli_peak, decode_peaks, write_flat_png
from torch.profiler import ProfilerActivity, profile

from bench.common import Timer
from gemma_embed.memory.planner import parse_budget
from gemma_embed.models.gemma4 import vision_item_cost

MODEL = ROOT / "samples" / "tiny-gemma4"
MiB = 2**20

GRIDS = {630: (7, 10), 2520: (14, 20), 10080: (28, 40)}  # patches -> token grid (rows, cols)


def vision_inputs(batch: int, patches: int, dtype):
    rows, cols = GRIDS[patches]
    gy, gx = 3 * rows, 3 * cols
    xs, ys = torch.arange(gx).repeat(gy), torch.arange(gy).repeat_interleave(gx)
    positions = torch.stack([xs, ys], -1)[None].repeat(batch, 1, 1)
    return torch.rand(batch, patches, 768, dtype=dtype), positions


def peak_transient(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    running = peak = 0
    for event in events:
        running += event.nbytes()
        peak = max(peak, running)
    return peak


def measure(hidden, intermediate, heads, patches, batch, dtype, attn="sdpa") -> tuple[int, int]:
    from transformers import Gemma4VisionConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionModel

    config = Gemma4VisionConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        position_embedding_size=1024,
    )
    config._attn_implementation = attn
    model = Gemma4VisionModel(config).eval().to(dtype)
    pixels, positions = vision_inputs(batch, patches, dtype)
    with torch.inference_mode():
        model(pixel_values=pixels, pixel_position_ids=positions)  # warm-up
        measured = peak_transient(lambda: model(pixel_values=pixels, pixel_position_ids=positions))
    modelled = batch * vision_item_cost(
        patches,
        hidden,
        intermediate,
        heads,
        torch.empty((), dtype=dtype).element_size(),
        materialises_scores=attn == "eager",
    )
    return measured, modelled


def towers() -> None:
    cases = [
        (256, 1024, 4, 630, 1, torch.float32, "sdpa"),
        (256, 1024, 4, 630, 4, torch.float32, "sdpa"),
        (256, 1024, 4, 2520, 1, torch.float32, "sdpa"),
        (256, 1024, 4, 2520, 2, torch.float32, "sdpa"),
        (256, 1024, 4, 10080, 1, torch.float32, "sdpa"),
        (64, 128, 4, 10080, 1, torch.float32, "sdpa"),
        (768, 3072, 12, 630, 1, torch.float32, "sdpa"),
        (768, 3072, 12, 2520, 1, torch.float32, "sdpa"),
        (768, 3072, 12, 2520, 2, torch.float32, "sdpa"),
        (768, 3072, 12, 2520, 1, torch.bfloat16, "sdpa"),
        (768, 3072, 12, 10080, 1, torch.float32, "sdpa"),
        (256, 1024, 4, 2520, 1, torch.float32, "eager"),
    ]
    print("| D | I | H | patches | batch | dtype | attn | measured MiB | model MiB | model / measured |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for hidden, inter, heads, patches, batch, dtype, attn in cases:
        measured, modelled = measure(hidden, inter, heads, patches, batch, dtype, attn)
        print(
            f"| {hidden} | {inter} | {heads} | {patches} | {batch} | {str(dtype)[6:]} | {attn} | "
            f"{measured / 2**20:.1f} | {modelled / 2**20:.1f} | {modelled / measured:.2f} |",
            flush=True,
        )


# ------------------------------------------------------------------------------------------ host side


def _image_files(folder: Path) -> list[Path]:
    """One file of each kind the estimates distinguish, 3000x3000, and RGB PNG and JPEG at 9400x9400."""
    import numpy as np
    from PIL import Image

    side = 3000
    y, x = np.mgrid[0:side, 0:side]
    rgb = Image.fromarray(np.stack([(x // 7) % 256, (y // 5) % 256, ((x + y) // 9) % 256], -1).astype(np.uint8))
    writers = {
        "rgb.png": lambda p: rgb.save(p, compress_level=1),
        "rgb.jpg": lambda p: rgb.save(p, quality=90),
        "rgb.tif": lambda p: rgb.save(p),
        "rgb.webp": lambda p: rgb.save(p, quality=80),
        "rgb-trns.png": lambda p: rgb.save(p, compress_level=1, transparency=(0, 0, 0)),
        "rgba.png": lambda p: rgb.convert("RGBA").save(p, compress_level=1),
        "rgba.webp": lambda p: rgb.convert("RGBA").save(p, quality=80),
        "la.png": lambda p: rgb.convert("LA").save(p, compress_level=1),
        "p.png": lambda p: rgb.convert("P").save(p),
        "p-trns.png": lambda p: rgb.convert("P").save(p, transparency=0),
        "l.png": lambda p: rgb.convert("L").save(p, compress_level=1),
        "one.png": lambda p: rgb.convert("1").save(p),
        "i16.png": lambda p: Image.fromarray((x * 7 % 65536).astype(np.uint16)).save(p),
        "cmyk.jpg": lambda p: rgb.convert("CMYK").save(p, quality=90),
    }
    paths = []
    for name, write in writers.items():
        write(folder / name)
        paths.append(folder / name)
    big = write_flat_png(folder / "big-9400.png", 9400, 9400)
    with Image.open(big) as img:
        img.save(folder / "big-9400.jpg", quality=90)
    return [*paths, big, folder / "big-9400.jpg"]


def _video_files(folder: Path) -> list[Path]:
    from make_video_samples import write_video

    return [
        write_video(folder / "1080p-h264.mp4", "libx264", 1920, 1080, 40),
        write_video(folder / "720p-rotated-mpeg4.mp4", "mpeg4", 1280, 720, 40, rotation=90),
    ]


def _audio_files(folder: Path) -> list[Path]:
    import av
    import numpy as np
    import soundfile as sf

    rate = 44_100
    t = np.arange(rate * 600) / rate
    stereo = (np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 330 * t)], -1) * 0.3).astype(np.float32)
    sf.write(folder / "600s-44k-stereo.wav", stereo, rate, subtype="PCM_16")
    sf.write(folder / "600s-44k-stereo.flac", stereo, rate)
    with av.open(str(folder / "600s-44k-stereo.mp3"), "w") as container:
        stream = container.add_stream("libmp3lame", rate=rate, layout="stereo")
        for start in range(0, len(stereo), 115_200):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(stereo[start : start + 115_200].T), "fltp", "stereo"
            )
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return sorted(folder.glob("600s-*"))


def decode() -> None:
    media = ROOT / "samples" / "media"
    kinds = [
        ("images", media / "images" / "pixel.png", _image_files, "pixel"),
        ("video", media / "video" / "clip-h264.mp4", _video_files, "pixel"),
        ("audio", media / "audio" / "chirp-16k.wav", _audio_files, "sample"),
    ]
    print("| kind | file | size | measured peak MiB | per | measured | estimate | estimate / measured |")
    print("|---|---|---|---|---|---|---|---|")
    for modality, warm, files, per in kinds:
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
            # One fresh process a file: a second file would reuse heap memory the first one freed.
            for m in (decode_peaks(MODEL, modality, warm, [path])[0] for path in files(Path(tmp))):
                count = m["pixels"] if per == "pixel" else m["samples"]
                print(
                    f"| {modality} | {Path(m['path']).name} | {count / 1e6:.1f} M {per}s | {m['peak'] / MiB:.0f} | "
                    f"{per} | {m['peak'] / count:.2f} B | {m['estimate'] / count:.2f} B | "
                    f"{m['estimate'] / m['peak']:.2f} |",
                    flush=True,
                )


def host(root: Path, workers: list[int], budget_text: str, cap: int) -> None:
    budget = parse_budget(budget_text).bytes
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line), "?")
    print(f"# {root}: images command, samples/tiny-gemma4, --memory-budget {budget_text}, CPU {model_name}")
    with tempfile.TemporaryDirectory(prefix="bench-memory-host-") as tmp:
        tmp = Path(tmp)
        tiny, big = tmp / "tiny", tmp / "big"
        tiny.mkdir()
        big.mkdir()
        write_flat_png(tiny / "a.png", 64, 48)
        first = write_flat_png(big / "00.png", 9400, 9400)
        for i in range(1, 8):  # the same file eight times: decoding is what is measured, not the content
            (big / f"{i:02d}.png").write_bytes(first.read_bytes())

        def images(inputs: Path, n: int) -> dict:
            out = tmp / "out.safetensors"
            args = ["images", inputs, "--model", MODEL, "-o", out, "--overwrite", "--device", "cpu"]
            return cli_peak([*args, "--memory-budget", budget_text, "--workers", str(n)], root=root, cap=cap)

        baseline = images(tiny, 8)
        assert baseline["code"] == 0, baseline["stderr"][-2000:]
        model = baseline["peak"]
        bound = budget + model + 300 * MiB
        print(
            f"model (peak RSS on one 64x48 image): {model / MiB:.0f} MiB; bound = budget + model + 300 MiB = "
            f"{bound / MiB:.0f} MiB"
        )
        print("| workers | peak RSS MiB | RSS when decoding starts MiB | seconds | within the bound |")
        print("|---|---|---|---|---|")
        for n in workers:
            with Timer() as timer:
                run = images(big, n)
            if run.get("killed"):
                print(f"| {n} | over {cap / MiB:.0f} (stopped there) | - | - | no |", flush=True)
                continue
            assert run["code"] == 0, run["stderr"][-2000:]
            verdict = "yes" if run["peak"] <= bound else "no"
            loaded = f"{run['loaded'] / MiB:.0f}" if "loaded" in run else "-"
            print(f"| {n} | {run['peak'] / MiB:.0f} | {loaded} | {timer.seconds:.0f} | {verdict} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decode", action="store_true", help="host peaks of decode + prepare vs the estimates")
    parser.add_argument("--host", action="store_true", help="eight 9400x9400 PNGs: peak RSS vs the budget")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose package --host runs")
    parser.add_argument("--workers", default="1,4,8", help="--host: the --workers values to run")
    parser.add_argument("--budget", default="1GiB", help="--host: the --memory-budget")
    parser.add_argument("--cap-gib", type=float, default=10, help="--host: stop a run whose RSS passes this")
    args = parser.parse_args()
    if args.decode:
        decode()
    elif args.host:
        host(args.root.resolve(), [int(w) for w in args.workers.split(",")], args.budget, int(args.cap_gib * 2**30))
    else:
        towers()


if __name__ == "__main__":
    main()
