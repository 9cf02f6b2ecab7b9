"""EmbeddingGemma 2: gemma-embed against `SentenceTransformer.encode`, on the same mixed-size images and audio clips.

    python -m bench.bench_embeddinggemma2 [--images 24] [--clips 16] [--rounds 2]

Builds a random EmbeddingGemma 2 checkpoint bigger than the test one (vision tower hidden 256 with 4 layers, text
model hidden 256 with 6 layers, the tiny audio tower; written by transformers and sentence-transformers, as
samples/make_tiny_checkpoint.py writes the sample), images of twelve aspect ratios and clips of 1-20 s. Each
side runs in its own fresh process per round (so its peak RSS is its own), alternating over rounds:
- sentence-transformers: `SentenceTransformer(ckpt).encode(inputs)` with its default batch size (32), inputs read
  as its users do (transformers' `load_image`; soundfile for the 16 kHz wav clips) inside the timing;
- gemma-embed: `pipeline.run` over the same folders (decode threads, buckets, ragged batches, two stages).
Prints items/s, load seconds and peak RSS of each, the median of the per-round ratios, and the largest relative
difference between the two sides' vectors. gemma-embed's load seconds include transformers' lazy imports of its
config classes, which sentence-transformers pays when it is imported, before its timer starts.
The vectors differ by ~1e-4 here (under 1e-5 on the tests' tiny checkpoint): stage 1 drops the processor's padding
patches, as for soft tokens (rows ~3e-6 from the padded per-item route at this tower size), and this random,
untrained text model amplifies that ~30x; fed the same stage-1 rows, stage 2 is bit-identical to
sentence-transformers (measured). About 2 minutes on 2 cores with the defaults.
Search latency over a large index is `python -m bench.bench_search`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import Timer, emit, peak_rss, run_child

SIZES = {"text_hidden": 256, "text_layers": 6, "vision_hidden": 256, "vision_layers": 4}


def child_st(ckpt: str, folder: str, modality: str, out: str) -> dict:
    import numpy as np
    import soundfile as sf
    from sentence_transformers import SentenceTransformer
    from transformers.image_utils import load_image

    with Timer() as load:
        model = SentenceTransformer(ckpt, device="cpu")
    files = sorted(Path(folder).iterdir())
    with Timer() as embed:
        if modality == "images":
            inputs = [load_image(str(f)) for f in files]
        else:
            inputs = [{"array": sf.read(f, dtype="float32")[0], "sampling_rate": 16_000} for f in files]
        vectors = model.encode(inputs)
    np.save(out, vectors)
    return {"load_s": load.seconds, "embed_s": embed.seconds, "items": len(files), "peak_rss": peak_rss()}


def child_ours(ckpt: str, folder: str, modality: str, out: str) -> dict:
    from gemma_embed.config import RunConfig
    from gemma_embed.pipeline import run

    config = RunConfig(modality=modality, inputs=(folder,), output=Path(out), model=ckpt, device="cpu", overwrite=True)
    with Timer() as total:
        result = run(config)
    assert result.failed == 0, result.failures
    return {
        "load_s": total.seconds - result.seconds,
        "embed_s": result.seconds,
        "items": result.ok,
        "peak_rss": peak_rss(),
        "chunking": result.chunking,
        "cpu_threads": result.cpu_threads,
    }


def worst_difference(ours_path: Path, st_path: Path) -> float:
    import numpy as np
    import torch

    import gemma_embed

    ours = torch.cat(list(gemma_embed.load(ours_path).values())).numpy()
    theirs = np.load(st_path)
    return float((np.linalg.norm(ours - theirs, axis=1) / np.linalg.norm(theirs, axis=1)).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--clips", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", nargs=5, metavar=("SIDE", "CKPT", "FOLDER", "MODALITY", "OUT"))
    args = parser.parse_args()
    if args.child:
        side, ckpt, folder, modality, out = args.child
        emit((child_st if side == "st" else child_ours)(ckpt, folder, modality, out))
        return

    import torch
    from make_tiny_checkpoint import build_embeddinggemma2

    from bench.bench_audio import write_clips
    from bench.bench_images import make_images

    with tempfile.TemporaryDirectory(prefix="bench-eg2-") as tmp:
        tmp = Path(tmp)
        ckpt = build_embeddinggemma2(tmp / "ckpt", seed=0, **SIZES)
        make_images(tmp / "images", args.images)
        (tmp / "audio").mkdir()
        write_clips(tmp / "audio", args.clips, 1.0, 20.0, seed=0)
        print(
            f"# EmbeddingGemma 2, random: text model hidden {SIZES['text_hidden']} x {SIZES['text_layers']} layers, "
            f"vision tower hidden {SIZES['vision_hidden']} x {SIZES['vision_layers']}; torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, cpu float32; {args.images} images, {args.clips} clips of 1-20 s",
            flush=True,
        )
        print(f"{'inputs':>7} {'side':>22} {'load s':>7} {'embed s':>8} {'items/s':>8} {'peak RSS MiB':>13}")
        for modality, folder in (("images", tmp / "images"), ("audio", tmp / "audio")):
            runs: dict[str, list[dict]] = {"st": [], "ours": []}
            for _ in range(args.rounds):
                for side in ("st", "ours"):
                    out = tmp / f"{side}-{modality}.{'npy' if side == 'st' else 'safetensors'}"
                    runs[side].append(
                        run_child("bench_embeddinggemma2", "--child", side, str(ckpt), str(folder), modality, str(out))
                    )
            ratios = [st["embed_s"] / own["embed_s"] for st, own in zip(runs["st"], runs["ours"], strict=True)]
            for side, label in (("st", "SentenceTransformer"), ("ours", "gemma-embed")):
                best = min(runs[side], key=lambda r: r["embed_s"])
                print(
                    f"{modality:>7} {label:>22} {best['load_s']:>7.2f} {best['embed_s']:>8.2f} "
                    f"{best['items'] / best['embed_s']:>8.2f} {best['peak_rss'] / 2**20:>13.0f}"
                )
            difference = worst_difference(tmp / f"ours-{modality}.safetensors", tmp / f"st-{modality}.npy")
            print(
                f"{modality:>7} {'ratio':>22} gemma-embed {statistics.median(ratios):.2f}x the items/s of "
                f"SentenceTransformer.encode (median of rounds: {', '.join(f'{r:.2f}' for r in ratios)}); "
                f"largest relative difference {difference:.1e}",
                flush=True,
            )
            last = runs["ours"][-1]
            print(
                json.dumps({"modality": modality, "chunking": last["chunking"], "cpu_threads": last["cpu_threads"]}),
                file=sys.stderr,
            )


if __name__ == "__main__":
    main()
