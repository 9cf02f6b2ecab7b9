"""Serving: `gemma-embed serve` against what users write by hand, a FastAPI server calling
`SentenceTransformer.encode` per request, at 1, 8 and 32 concurrent clients.

    python -m bench.bench_serve [--family embeddinggemma|embeddinggemma2] [--clients 1,8,32] [--requests 96]
                                [--rounds 2] [--corpus short] [--against DIR] [--drip 6] [--drip-seconds 40]

infinity-emb, the peer the issue names first, does not install on this stack: its last release (0.0.78) pins
sentence-transformers < 4, transformers <= 5.0 and numpy < 2, while EmbeddingGemma 2 needs transformers 5.24 and the
project runs sentence-transformers 6.2 (`pip download --no-deps infinity-emb`, its METADATA). So the peer is the
hand-written server: FastAPI + uvicorn, one `SentenceTransformer(ckpt)`, a plain `def` route calling `model.encode`
on each request's texts (FastAPI runs it in its thread pool, so concurrent requests encode concurrently, each
alone), answering OpenAI's shape.

Both servers run at once on the same random checkpoint, laid out like the hub's (bench_text.build_checkpoint: text
model hidden 512 x 8 layers, written by transformers and sentence-transformers), and get the same texts (one a
request, from bench_text's corpus). For each client count the sides alternate, rotated every round; each client is
a thread with its own keep-alive connection sending its share of `--requests` one after another, after one untimed
run of 64 requests at that client count (the engine's tuner and thread count settle there). Printed per side
and client count: requests/s, p50 and p99 latency (median over rounds), then gemma-embed's ratio to the peer, and
the largest difference between the two sides' vectors for the same texts. Timings on a shared machine move with
the other work on it: the ratios, from alternated rounds, are what compare.

`--against DIR` adds a third side: `gemma-embed serve` run from DIR (a checkout before a change, on PYTHONPATH; this
checkout's side runs with this checkout first on it, whatever is installed). `--drip N` then measures, for each
gemma-embed side on samples/tiny-embeddinggemma2, the latency of text and data-URL image requests (one client, one
after another) quiet and again while N media fetches from a local site that sends a byte every 2 s are in flight
(issue 47: they held every thread of asyncio's default pool, so data: images and thumbnails waited for them).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench import ROOT
from bench.bench_text import SIZES, build_checkpoint, read_lines, write_corpus
from bench.common import cpu_name

START_TIMEOUT_S = 600
EXE = str(Path(sys.executable).parent / "gemma-embed")


# ------------------------------------------------------------------------------------------ the peer


def peer_server(ckpt: str) -> None:
    """The hand-written server: FastAPI, uvicorn, `SentenceTransformer.encode` per request. Prints its URL."""
    import socket

    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(ckpt, device="cpu")
    app = FastAPI()

    class Request(BaseModel):
        input: str | list[str]
        model: str | None = None

    def embeddings(request):
        texts = [request.input] if isinstance(request.input, str) else request.input
        vectors = model.encode(texts)
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)],
            "model": ckpt,
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        }

    embeddings.__annotations__ = {"request": Request}  # the body's model (this module's annotations are strings)
    app.post("/v1/embeddings")(embeddings)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    print(json.dumps({"type": "ready", "url": f"http://127.0.0.1:{sock.getsockname()[1]}"}), flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


# ------------------------------------------------------------------------------------------ the servers


class Server:
    """A server process and its URL (from its JSON lines on stdout: `ready` carries it, or `listening` before)."""

    def __init__(self, command: list[str], code: str | Path = ROOT):
        env = {**os.environ, "PYTHONPATH": str(code)}  # which checkout's gemma_embed the process imports
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        url = None
        deadline = time.monotonic() + START_TIMEOUT_S
        for line in self.proc.stdout:
            event = json.loads(line)
            url = event.get("url", url)
            if event["type"] == "ready":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command}: not ready in {START_TIMEOUT_S} s")
        if url is None:
            raise RuntimeError(f"{command}: ended before it was ready")
        self.host, self.port = url.removeprefix("http://").rsplit(":", 1)
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)


def embed(connection: http.client.HTTPConnection, text: str, modality: str = "text") -> list[float]:
    body = {"input": text} if modality == "text" else {"input": [text], "modality": modality}
    connection.request("POST", "/v1/embeddings", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {body[:300]!r}")
    return json.loads(body)["data"][0]["embedding"]


def load(server: Server, texts: list[str], clients: int) -> dict:
    """`clients` threads, each with its own connection, sending its share of the texts one request at a time."""
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    failures: list[BaseException] = []

    def client(number: int) -> None:
        connection = http.client.HTTPConnection(server.host, int(server.port), timeout=600)
        mine = texts[number::clients]
        embed(connection, mine[0])  # the connection open and warm before the clock
        start.wait()
        try:
            for text in mine:
                began = time.perf_counter()
                embed(connection, text)
                with lock:
                    latencies.append(time.perf_counter() - began)
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - began
    if failures:
        raise failures[0]
    ordered = sorted(latencies)
    return {
        "requests_per_s": len(ordered) / seconds,
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["embeddinggemma", "embeddinggemma2"], default="embeddinggemma")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--requests", type=int, default=96, help="requests a measurement (32 clients: 3 each)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--corpus", default="short", help="bench_text's corpus kind the texts come from")
    parser.add_argument("--against", metavar="DIR", help="also run gemma-embed serve from this checkout")
    parser.add_argument("--drip", type=int, default=0, metavar="N", help="slow fetches in flight for the drip part")
    parser.add_argument("--drip-seconds", type=int, default=40, help="how long each slow fetch drips")
    parser.add_argument("--skip-load", action="store_true", help="only the drip part")
    parser.add_argument("--peer", metavar="CKPT", help=argparse.SUPPRESS)  # run as the peer's server process
    args = parser.parse_args()
    if args.peer:
        peer_server(args.peer)
        return
    if not args.skip_load:
        load_part(args)
    if args.drip:
        drip_part(args)


def load_part(args) -> None:

    exe = EXE
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        tmp = Path(tmp)
        ckpt = build_checkpoint(args.family, tmp / "ckpt")
        corpus = tmp / "texts.txt"
        write_corpus(corpus, args.corpus, args.requests + 64)
        texts = read_lines(str(corpus))
        print(
            f"# {cpu_name()}, {os.cpu_count()} CPUs; random {args.family} text model hidden {SIZES['text_hidden']} x "
            f"{SIZES['text_layers']} layers, float32, laid out like the hub's; {args.requests} requests of one "
            f"'{args.corpus}' text each per measurement, {args.rounds} rounds, sides alternated",
            flush=True,
        )
        sides = {
            "gemma-embed serve": Server([exe, "serve", "--model", ckpt, "--port", "0", "-q"]),
            "FastAPI + ST.encode": Server([sys.executable, "-m", "bench.bench_serve", "--peer", ckpt]),
        }
        if args.against:
            sides["serve before"] = Server([exe, "serve", "--model", ckpt, "--port", "0", "-q"], args.against)
        try:
            names = list(sides)
            vectors = {}
            for name, server in sides.items():  # the same texts give the same vectors on both sides
                connection = http.client.HTTPConnection(server.host, int(server.port), timeout=600)
                vectors[name] = np.array([embed(connection, t) for t in texts[:16]])
                connection.close()
            worst = float(np.abs(vectors[names[0]] - vectors[names[1]]).max())
            print(f"largest difference between the sides' vectors (16 texts): {worst:.1e}")
            print(f"{'clients':>7} {'side':>22} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
            for clients in [int(c) for c in args.clients.split(",")]:
                runs: dict[str, list[dict]] = {name: [] for name in names}
                for name in names:  # untimed: each side meets this load's batch sizes once before the clock
                    load(sides[name], texts[:64], clients)
                for r in range(args.rounds):
                    for name in names[r % len(names) :] + names[: r % len(names)]:
                        runs[name].append(load(sides[name], texts[64 : 64 + args.requests], clients))
                for name in names:
                    median = {k: statistics.median(run[k] for run in runs[name]) for k in runs[name][0]}
                    print(
                        f"{clients:>7} {name:>22} {median['requests_per_s']:>8.1f} {median['p50_ms']:>8.1f} "
                        f"{median['p99_ms']:>8.1f}"
                    )
                for other in names[1:]:
                    ours, theirs = runs[names[0]], runs[other]
                    rate = [a["requests_per_s"] / b["requests_per_s"] for a, b in zip(ours, theirs, strict=True)]
                    p50 = [a["p50_ms"] / b["p50_ms"] for a, b in zip(ours, theirs, strict=True)]
                    p99 = [a["p99_ms"] / b["p99_ms"] for a, b in zip(ours, theirs, strict=True)]
                    print(
                        f"{clients:>7} {'ratio to ' + other:>22} {statistics.median(rate):.2f}x the requests/s, p50 "
                        f"{statistics.median(p50):.2f}x, p99 {statistics.median(p99):.2f}x "
                        f"(rounds: {', '.join(f'{x:.2f}' for x in rate)})",
                        flush=True,
                    )
                print(json.dumps({"clients": clients, "runs": runs}), flush=True)
        finally:
            for server in sides.values():
                server.stop()


# ------------------------------------------------------------------------------------------ slow fetches


def drip_site(seconds: int):
    """An http.server on 127.0.0.1 whose every GET sends a byte each 2 s for `seconds` (and counts those in flight)."""
    import http.server

    state = {"dripping": 0, "lock": threading.Condition()}

    class Drip(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(seconds // 2))
            self.end_headers()
            with state["lock"]:
                state["dripping"] += 1
                state["lock"].notify_all()
            try:
                for _ in range(seconds // 2):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    threading.Event().wait(2)
            except OSError:
                pass
            finally:
                with state["lock"]:
                    state["dripping"] -= 1

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    site.daemon_threads = True
    threading.Thread(target=site.serve_forever, daemon=True).start()
    return site, state


def latencies(server: Server, inputs: list[tuple[str, str]]) -> dict[str, dict]:
    """Each (modality, input) sent in turn on one connection: p50 and worst latency (ms) by modality."""
    connection = http.client.HTTPConnection(server.host, int(server.port), timeout=600)
    seen: dict[str, list[float]] = {}
    for modality, value in inputs:
        began = time.perf_counter()
        embed(connection, value, modality)
        seen.setdefault(modality, []).append(1000 * (time.perf_counter() - began))
    connection.close()
    return {m: {"p50_ms": statistics.median(v), "max_ms": max(v)} for m, v in seen.items()}


def drip_part(args) -> None:
    import base64

    picture = (ROOT / "samples" / "media" / "images" / "portrait.png").read_bytes()
    image = "data:image/png;base64," + base64.b64encode(picture).decode()
    inputs = [("text", f"a short text number {i}") if i % 2 else ("image", image) for i in range(40)]
    print(
        f"# drip part: {cpu_name()}; samples/tiny-embeddinggemma2; 20 texts and 20 data-URL images, one client, "
        f"quiet and with {args.drip} fetches dripping a byte every 2 s for {args.drip_seconds} s",
        flush=True,
    )
    sides = {"this": (ROOT, ["--allowed-media-domains", "localhost", "--fetch-timeout", "600"])}
    if args.against:
        sides["before"] = (Path(args.against), [])
    for name, (code, extra) in sides.items():
        drip_side(name, code, extra, args, inputs)


def post_drip(server: Server, url: str) -> None:
    connection = http.client.HTTPConnection(server.host, int(server.port), timeout=600)
    body = json.dumps({"input": [url], "modality": "image"})
    try:
        connection.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
        connection.getresponse().read()
    except OSError:  # the server was stopped with the fetch in flight (the part's end)
        pass
    finally:
        connection.close()


def drip_side(name: str, code: Path, extra: list[str], args, inputs: list[tuple[str, str]]) -> None:
    model = str(ROOT / "samples" / "tiny-embeddinggemma2")
    site, state = drip_site(args.drip_seconds)
    server = Server([EXE, "serve", "--model", model, "--port", "0", "-q", *extra], code)
    try:
        latencies(server, inputs[:4])  # untimed: the first window of each modality
        quiet = latencies(server, inputs)
        url = f"http://localhost:{site.server_address[1]}/drip.png"
        for number in range(args.drip):
            threading.Thread(target=post_drip, args=(server, f"{url}?n={number}"), daemon=True).start()
        with state["lock"]:
            state["lock"].wait_for(lambda: state["dripping"] == args.drip, 120)
        began = time.perf_counter()
        busy = latencies(server, inputs)
        still = state["dripping"]
        for modality in quiet:
            q, b = quiet[modality], busy[modality]
            print(
                f"{name:>7} {modality:>6}: quiet p50 {q['p50_ms']:.1f} ms, max {q['max_ms']:.1f} ms; with "
                f"{args.drip} dripping p50 {b['p50_ms']:.1f} ms, max {b['max_ms']:.1f} ms; p50 ratio "
                f"{b['p50_ms'] / q['p50_ms']:.2f}x, max ratio {b['max_ms'] / q['max_ms']:.2f}x",
                flush=True,
            )
        seconds = time.perf_counter() - began
        print(f"{name:>7} measured in {seconds:.1f} s; fetches still dripping at its end: {still}", flush=True)
    finally:
        server.proc.kill()
        server.proc.wait(60)
        site.shutdown()


if __name__ == "__main__":
    main()
