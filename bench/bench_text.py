"""Text: gemma-embed's `Embedder.encode` against `SentenceTransformer.encode` on a random EmbeddingGemma (2) model.

    python -m bench.bench_text [--family embeddinggemma2|embeddinggemma] [--lines 600] [--rounds 3]
                               [--corpora short,medium,mixed] [--busy off,on]

The checkpoint is random, at a realistic width: text model hidden 512 x 8 layers (sliding layers with a 512-token
window, and full ones), built by samples/make_tiny_checkpoint.py's builder of the family and written by
transformers and sentence-transformers themselves (EmbeddingGemma: a bidirectional Gemma 3 text model with
max_seq_length 2048 and its Dense 512 -> 2048 -> 512 head). Three corpora of `--lines` lines, words drawn from the
tokenizer's own training sentences (a word is one or two tokens, as with a real tokenizer):
- short: tweets, 1-50 words, log-normal with median 12;
- medium: passages, 30-200 words, median 80;
- mixed: 1-300 words, log-normal with median 20 (issue 22's corpus).
Each side runs in its own fresh process (its peak RSS, VmHWM, is its own), model loaded before the timer, the sides
rotated in every round:
- sentence-transformers: `SentenceTransformer(ckpt).encode(lines)` at its default batch size (32), and at its best
  batch size on that corpus (one run each of `--st-batch-sizes`, 8, 16, 64 and 128, first; the fastest kept);
- gemma-embed: `Embedder(ckpt).encode(lines)` (windows, token-budget batches, the tuner), its summary's chunking
  printed; and the same after `gemma_embed.configure_for_long_runs()`, glibc's allocator as the command line sets it
  (memory/allocator.py: CPU forwards reuse the heap instead of faulting in fresh pages).
`--busy on` repeats the rounds with one busy process (`python -c "while True: pass"`) sharing the cores, started
before each round and killed by its PID after. Printed per corpus: items/s, tokens/s, padding share (tokens
computed that were padding: sentence-transformers' measured on the attention masks its Transformer module gets),
peak RSS, and the largest relative difference of each side's vectors to each text encoded alone (the references:
sentence-transformers at batch size 1, over the first `--alone-lines` lines, in float32 and with the model in
float64); then the median over rounds of
gemma-embed's items/s over each sentence-transformers side's. The machine's load moves absolute numbers a lot
(other work shares its cores): the ratios, from rounds that alternate the sides, are what compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.common import Timer, cpu_name, emit, peak_rss, run_child

SIZES = {"text_hidden": 512, "text_layers": 8, "sliding_window": 512}
CORPORA = {  # (median words, log-normal sigma, fewest, most)
    "short": (12, 0.6, 1, 50),
    "medium": (80, 0.3, 30, 200),
    "mixed": (20, 1.0, 1, 300),
}
ST_DEFAULT = 32
ST_CANDIDATES = (8, 16, 64, 128)


def write_corpus(path: Path, kind: str, lines: int, seed: int = 0) -> None:
    from make_tiny_checkpoint import EG2_CORPUS

    words = sorted({w for sentence in EG2_CORPUS for w in sentence.split() if w.isascii() and w.strip(".,")})
    median, sigma, fewest, most = CORPORA[kind]
    rng = np.random.default_rng(seed)
    counts = np.clip(np.rint(rng.lognormal(np.log(median), sigma, lines)), fewest, most).astype(int)
    path.write_text("".join(" ".join(rng.choice(words, n)) + "\n" for n in counts))


def read_lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def child_st(ckpt: str, corpus: str, out: str, batch_size: str) -> dict:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(ckpt, device="cpu")
    if batch_size == "1-float64":  # the reference: each text alone, every weight and sum in float64
        import torch

        model.to(torch.float64)
        batch_size = "1"
    lines = read_lines(corpus)
    computed = {"real": 0, "padded": 0}

    def count_padding(module, args):  # the attention mask of every batch the Transformer module runs
        mask = args[0]["attention_mask"]
        computed["real"] += int(mask.sum())
        computed["padded"] += int(mask.numel())

    model[0].register_forward_pre_hook(count_padding)
    with Timer() as embed:
        vectors = model.encode(lines, batch_size=int(batch_size))
    np.save(out, vectors)
    return {
        "embed_s": embed.seconds,
        "items": len(lines),
        "peak_rss": peak_rss(),
        "padding": 1 - computed["real"] / max(1, computed["padded"]),
    }


def child_ours(ckpt: str, corpus: str, out: str, batch_size: str) -> dict:
    import gemma_embed
    from gemma_embed import Embedder

    if batch_size.endswith("-cli"):  # the command line's allocator settings, as a Python caller can ask for them
        gemma_embed.configure_for_long_runs()
        batch_size = batch_size.removesuffix("-cli")
    options = {} if batch_size == "auto" else {"batch_size": int(batch_size)}
    embedder = Embedder(ckpt, device="cpu", **options)
    command = embedder.load("text")
    lines = read_lines(corpus)
    with Timer() as embed:
        vectors = embedder.encode(lines, modality="text")
    np.save(out, vectors)
    engine = command.engines[0]
    return {
        "embed_s": embed.seconds,
        "items": len(lines),
        "peak_rss": peak_rss(),
        "padding": engine.padding_share(),
        "chunking": command.chunking(),
        "cpu_threads": command.cpu_threads.report(),
    }


def token_counts(ckpt: str, corpus: Path) -> list[int]:
    """Tokens of each line as both sides feed the model (the checkpoint's chat template and prompt)."""
    from gemma_embed.models.embeddinggemma import EmbeddingGemmaPreparer, is_embeddinggemma
    from gemma_embed.models.embeddinggemma2 import EmbeddingGemma2Preparer
    from gemma_embed.models.loading import resolve_checkpoint

    checkpoint = resolve_checkpoint(ckpt)
    if is_embeddinggemma(checkpoint):
        preparer = EmbeddingGemmaPreparer(checkpoint)
    else:
        preparer = EmbeddingGemma2Preparer(checkpoint, "text")
    return [preparer.prepare(line).units[0].length for line in read_lines(str(corpus))]


def build_checkpoint(family: str, folder: Path) -> str:
    from make_tiny_checkpoint import build_embeddinggemma, build_embeddinggemma2

    if family == "embeddinggemma":
        sizes = {"text_hidden": SIZES["text_hidden"], "text_layers": SIZES["text_layers"]}
        built = build_embeddinggemma(
            folder, seed=0, max_seq_length=2048, sliding_window=SIZES["sliding_window"], dense_dims=(2048, 512), **sizes
        )
    else:
        built = build_embeddinggemma2(folder, seed=0, vision=False, audio=False, **SIZES)
    return str(built)


def worst_difference(vectors: np.ndarray, reference: np.ndarray) -> float:
    return float((np.linalg.norm(vectors - reference, axis=1) / np.linalg.norm(reference, axis=1)).max())


def busy_process() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["embeddinggemma2", "embeddinggemma"], default="embeddinggemma2")
    parser.add_argument("--lines", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpora", default="short,medium,mixed")
    parser.add_argument("--busy", default="off,on")
    parser.add_argument("--alone-lines", type=int, default=100, help="lines encoded alone for the reference")
    parser.add_argument("--st-batch-sizes", default=",".join(map(str, ST_CANDIDATES)), help="tried for ST's best")
    parser.add_argument("--st-best", type=int, help="ST's best batch size, known from an earlier run: no search")
    parser.add_argument("--busy-rounds", type=int, help="rounds with the busy process (default: --rounds)")
    parser.add_argument("--child", nargs=5, metavar=("SIDE", "CKPT", "CORPUS", "OUT", "BATCH"))
    args = parser.parse_args()
    if args.child:
        side, ckpt, corpus, out, batch = args.child
        emit((child_st if side == "st" else child_ours)(ckpt, corpus, out, batch))
        return

    import torch

    from gemma_embed.device import cpu_bf16_units

    cpu = cpu_name()
    flags = cpu_bf16_units()
    with tempfile.TemporaryDirectory(prefix="bench-text-") as tmp:
        tmp = Path(tmp)
        ckpt = build_checkpoint(args.family, tmp / "ckpt")
        family = "EmbeddingGemma" if args.family == "embeddinggemma" else "EmbeddingGemma 2"
        print(
            f"# {cpu}, {torch.get_num_threads()} threads, bf16 units {', '.join(flags) or 'none'}; "
            f"torch {torch.__version__}; random {family} text model hidden {SIZES['text_hidden']} x "
            f"{SIZES['text_layers']} layers, float32; {args.lines} lines a corpus, {args.rounds} rounds",
            flush=True,
        )

        def run(side: str, corpus: Path, batch: str, tag: str) -> tuple[dict, np.ndarray]:
            out = tmp / f"{tag}.npy"
            record = run_child("bench_text", "--child", side, ckpt, str(corpus), str(out), batch)
            return record, np.load(out)

        for kind in args.corpora.split(","):
            corpus = tmp / f"{kind}.txt"
            write_corpus(corpus, kind, args.lines)
            tokens = sum(token_counts(ckpt, corpus))
            # The reference: the first lines, each alone (no padding), as sentence-transformers encodes them.
            first = tmp / f"{kind}-first.txt"
            first.write_text("".join(f"{line}\n" for line in read_lines(str(corpus))[: args.alone_lines]))
            alone = run("st", first, "1", f"{kind}-alone")[1]
            alone64 = run("st", first, "1-float64", f"{kind}-alone64")[1]
            candidates = [int(b) for b in args.st_batch_sizes.split(",")] if args.st_best is None else []
            tried = {b: run("st", corpus, str(b), f"{kind}-st{b}")[0]["embed_s"] for b in candidates}
            best = min(tried, key=tried.get) if tried else args.st_best
            print(
                f"\n## {kind}: {args.lines} lines, {tokens} tokens ({tokens / args.lines:.0f} a line); "
                f"sentence-transformers' best batch size here: {best} "
                f"({', '.join(f'{b}: {s:.1f} s' for b, s in tried.items()) or 'given'}; "
                f"default {ST_DEFAULT} in the rounds)",
                flush=True,
            )
            print(
                f"{'load':>5} {'side':>24} {'items/s':>8} {'tokens/s':>9} {'padding':>8} {'peak RSS MiB':>13} "
                f"{'vs alone':>9} {'vs f64':>8}"
            )
            sides = {
                "st": ("st", str(ST_DEFAULT)),
                "st-best": ("st", str(best)),
                "ours": ("ours", "auto"),
                "ours-cli": ("ours", "auto-cli"),
            }
            for busy in args.busy.split(","):
                runs: dict[str, list[tuple[dict, np.ndarray]]] = {name: [] for name in sides}
                rounds = args.busy_rounds if busy == "on" and args.busy_rounds else args.rounds
                for r in range(rounds):
                    names = list(sides)[r % len(sides) :] + list(sides)[: r % len(sides)]  # no side always first
                    hog = busy_process() if busy == "on" else None
                    try:
                        for name in names:
                            side, batch = sides[name]
                            runs[name].append(run(side, corpus, batch, f"{kind}-{name}"))
                    finally:
                        if hog is not None:
                            hog.kill()
                            hog.wait()
                labels = {
                    "st": f"ST batch {ST_DEFAULT}",
                    "st-best": f"ST batch {best}",
                    "ours": "gemma-embed",
                    "ours-cli": "gemma-embed, CLI allocator",
                }
                for name in sides:
                    rates = [rec["items"] / rec["embed_s"] for rec, _ in runs[name]]
                    rec = runs[name][0][0]
                    worst = max(worst_difference(vectors[: len(alone)], alone) for _, vectors in runs[name])
                    worst64 = max(
                        worst_difference(vectors[: len(alone)].astype(np.float64), alone64) for _, vectors in runs[name]
                    )
                    print(
                        f"{'busy' if busy == 'on' else 'quiet':>5} {labels[name]:>24} {statistics.median(rates):>8.1f} "
                        f"{statistics.median(rates) * tokens / args.lines:>9.0f} {100 * rec['padding']:>7.1f}% "
                        f"{max(r['peak_rss'] for r, _ in runs[name]) / 2**20:>13.0f} {worst:>9.1e} {worst64:>8.1e}"
                    )
                for mine in ("ours", "ours-cli"):
                    for name in ("st", "st-best"):
                        ratios = [
                            ours["embed_s"] and theirs["embed_s"] / ours["embed_s"]
                            for (ours, _), (theirs, _) in zip(runs[mine], runs[name], strict=True)
                        ]
                        print(
                            f"{'busy' if busy == 'on' else 'quiet':>5} {'ratio':>24} {labels[mine]} "
                            f"{statistics.median(ratios):.2f}x the items/s of {labels[name]} "
                            f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})"
                        )
                last = runs["ours"][-1][0]
                print(
                    json.dumps(
                        {"corpus": kind, "busy": busy, "chunking": last["chunking"], "cpu_threads": last["cpu_threads"]}
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
