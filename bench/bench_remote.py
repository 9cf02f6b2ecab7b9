"""Object storage against local disk: the same small images embedded from a folder and from a local S3 server
(moto's, in a process of its own, reached by s3fs through AWS_ENDPOINT_URL), side by side in one run, the two
alternated (disk, S3, disk, S3, ...) so the machine's other load falls on both alike. Prints each run's items/s
and the median ratio S3 / disk; the fetch stage (sources/fetch.py) is what keeps the ratio near 1: objects are
fetched by its threads ahead of the decoders while the encoder works.

    python -m bench.bench_remote [--images 2000] [--size 64] [--repeats 3] [--max-soft-tokens 70] [--busy]

The server runs on the benchmark's own machine: its CPU time per object (printed) is taken from the encoder's
cores, which a real store would not take.
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import ROOT
from bench.common import cpu_name

MODEL = ROOT / "samples" / "tiny-gemma4"
BUCKET = "bench"
SERVER = """
import logging, sys, threading
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
print("ready", flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
server.stop()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_images(folder: Path, count: int, size: int) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    blobs = []
    for i in range(count):
        base = rng.integers(0, 255, (max(1, size // 8), max(1, size // 8), 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(base).resize((size, size), Image.BILINEAR).save(buffer, "JPEG", quality=90)
        blobs.append(buffer.getvalue())
        (folder / f"{i:06d}.jpg").write_bytes(blobs[-1])
    return blobs


def embed(inputs: str, output: Path, tokens: int | None) -> tuple[float, int]:
    """One run, as the command line makes it: (seconds, items)."""
    import gemma_embed
    from gemma_embed import RunConfig

    config = RunConfig(inputs=(inputs,), output=output, model=str(MODEL), max_soft_tokens=tokens, overwrite=True)
    start = time.perf_counter()
    result = gemma_embed.run(config)
    seconds = time.perf_counter() - start
    assert result.failed == 0, result.failures[:3]
    return seconds, result.ok


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (the kernel's /proc/PID/stat, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-soft-tokens", type=int, default=None, help="default: the checkpoint's (280)")
    parser.add_argument("--busy", action="store_true", help="one busy process beside the runs")
    args = parser.parse_args()

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert server.stdout.readline().strip() == "ready"
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        import s3fs

        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            blobs = make_images(root / "images", args.images, args.size)
            fs = s3fs.S3FileSystem(skip_instance_cache=True)
            fs.mkdir(BUCKET)
            fs.pipe({f"{BUCKET}/images/{i:06d}.jpg": blob for i, blob in enumerate(blobs)})
            sides = {"disk": str(root / "images"), "s3": f"s3://{BUCKET}/images"}
            tokens = args.max_soft_tokens
            embed(sides["disk"], root / "warm.safetensors", tokens)  # imports, the first model load: for neither
            rates: dict[str, list[float]] = {side: [] for side in sides}
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
            for repeat in range(args.repeats):
                order = list(sides.items())  # disk, s3, then s3, disk: a drift of the load falls on both alike
                for side, inputs in order if repeat % 2 == 0 else order[::-1]:
                    before = cpu_seconds(server.pid)
                    seconds, items = embed(inputs, root / f"{side}.safetensors", tokens)
                    served = (cpu_seconds(server.pid) - before) / items * 1000
                    rates[side].append(items / seconds)
                    print(
                        f"repeat {repeat + 1} {side:>4}: {items} items in {seconds:.2f} s, {items / seconds:.1f}/s "
                        f"(the S3 server's CPU: {served:.2f} ms an item)",
                        flush=True,
                    )
            if busy is not None:
                busy.kill()
            ratios = [s3 / disk for s3, disk in zip(rates["s3"], rates["disk"], strict=True)]
            print(
                f"CPU: {cpu_name()} ({os.cpu_count()} cores); {args.images} JPEGs of {args.size}x{args.size}, "
                f"--max-soft-tokens {tokens or 'default'}{'; one busy process beside the runs' if busy else ''}"
            )
            print(
                f"median items/s: disk {statistics.median(rates['disk']):.1f}, s3 {statistics.median(rates['s3']):.1f};"
                f" s3/disk per repeat {', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f}"
            )
    finally:
        server.stdin.close()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
