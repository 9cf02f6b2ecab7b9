"""Peak memory of the text command on hostile text inputs (issue 31): a JSON-lines file with one 500 MB value, and
a `.jsonl.gz` that inflates to 4 GB, each between ordinary rows and beside an ordinary file.

    python -m bench.bench_text_bounds [--value-mb 500] [--inflate-gb 4] [--rows 200]

Each case is one fresh `gemma-embed text` process (tests/memory_helpers.cli_peak: the kernel's VmHWM, and the RSS
once the model is loaded), killed if it passes 3 GB. It prints, per case: exit code, peak RSS, peak above the
loaded model, items written (and which rows are missing), wall time. The bound is the reader's
(sources/bounded.py): a line is read CHUNK bytes at a time and only --max-text-bytes of it kept; a gzip stream
is inflated as it streams and stopped past INFLATE_RATIO times its compressed size.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import zlib
from pathlib import Path

from memory_helpers import ROOT, cli_peak

from bench.common import cpu_name
from gemma_embed.sizes import human_bytes

MODEL = ROOT / "samples" / "tiny-embeddinggemma"
CAP = 3 << 30
BLOCK = 16 << 20


def rows(prefix: str, count: int) -> bytes:
    return b"".join(
        json.dumps({"text": f"{prefix} row {n}: a short ordinary text"}).encode() + b"\n" for n in range(count)
    )


def write_long_value(path: Path, value_bytes: int, count: int) -> None:
    """`count` ordinary rows, one row whose text is `value_bytes` of words (written a block at a time), `count` more."""
    piece = b"a pasted log line with words " * (BLOCK // 29)
    with open(path, "wb") as out:
        out.write(rows("before", count))
        out.write(b'{"text": "')
        written = 0
        while written < value_bytes:
            chunk = piece[: min(len(piece), value_bytes - written)]
            out.write(chunk)
            written += len(chunk)
        out.write(b'"}\n')
        out.write(rows("after", count))


def write_gzip_bomb(path: Path, inflated_bytes: int, count: int) -> int:
    """`count` ordinary rows, then one record whose text inflates to `inflated_bytes`, compressed a block at a time
    (the whole never in memory); the compressed size."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip stream
    block = b"A" * BLOCK
    with open(path, "wb") as out:
        out.write(packer.compress(rows("before", count) + b'{"text": "'))
        written = 0
        while written < inflated_bytes:
            out.write(packer.compress(block))
            written += len(block)
        out.write(packer.compress(b'"}\n' + rows("after", count)))
        out.write(packer.flush())
    return path.stat().st_size


def run_case(name: str, inputs: list[Path], out: Path, expected: int, *extra: str) -> dict:
    args = ["text", *map(str, inputs), "--column", "text", "--model", str(MODEL), "-o", str(out), "-q", *extra]
    started = time.perf_counter()
    run = cli_peak(args, cap=CAP, timeout=1800)
    wall = time.perf_counter() - started
    written = 0
    if out.exists():
        from gemma_embed.store import read_metadata

        written = len(read_metadata(out)["keys"])
    errors = [line for line in run["stderr"].splitlines() if line.startswith("error:")]
    print(
        f"{name}: exit {run['code']}, peak {human_bytes(run['peak'])} "
        f"({human_bytes(run['peak'] - run.get('loaded', 0))} above the loaded model), "
        f"{written} of {expected} ordinary rows written, {wall:.1f} s"
        + (" KILLED at the cap" if run.get("killed") else "")
    )
    for line in errors:
        print(f"    {line[:300]}")
    return {**run, "written": written, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--value-mb", type=int, default=500)
    parser.add_argument("--inflate-gb", type=float, default=4.0)
    parser.add_argument("--rows", type=int, default=200)
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        other = root / "other.jsonl"
        other.write_bytes(rows("other", args.rows))
        long_value = root / "long.jsonl"
        write_long_value(long_value, args.value_mb << 20, args.rows)
        print(f"long.jsonl: {human_bytes(long_value.stat().st_size)} (one value of {args.value_mb} MiB)")
        for mode in ("cut", "skip"):
            value_row = 1 if mode == "cut" else 0  # cut: the long row is embedded from its beginning
            run_case(
                f"500 MB value, --long-text {mode}",
                [long_value, other],
                root / f"long-{mode}.safetensors",
                3 * args.rows + value_row,
                "--long-text",
                mode,
            )
        long_value.unlink()
        bomb = root / "bomb.jsonl.gz"
        packed = write_gzip_bomb(bomb, int(args.inflate_gb * (1 << 30)), args.rows)
        print(f"bomb.jsonl.gz: {human_bytes(packed)} inflating to {args.inflate_gb:g} GiB")
        # The rows after the bomb's record are the rest of a file refused as a bomb: not read.
        run_case("4 GB gzip bomb", [bomb, other], root / "bomb.safetensors", 2 * args.rows)


if __name__ == "__main__":
    main()
