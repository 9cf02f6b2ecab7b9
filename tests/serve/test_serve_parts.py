"""The server's parts without a server: the batching queue (merging, admission, cancelling, who gets which rows), the
wait that watches for a client leaving, the API key check, OpenAI's shapes, data: URLs, and the missing extra.

The queue's tests give it an engine double whose `embed_stream` holds until the test lets it go (an event), so what
waits and what is merged is decided by the test, not by timing; each item's rows are made from its own text, so a
row that reached another item's slot is seen. The real engine behind the same queue is tested through a running
server (test_serve.py, test_serve_overload.py)."""

from __future__ import annotations

import asyncio
import base64
import hmac
import struct
import threading

import numpy as np
import pytest

from gemma_embed.errors import UsageError

pytestmark = pytest.mark.serve

torch = pytest.importorskip("torch")


def _rows_of(text: str) -> torch.Tensor:
    """A row that says which text it was made from: its bytes, padded."""
    data = list(text.encode())[:8] + [0] * (8 - min(8, len(text.encode())))
    return torch.tensor([data], dtype=torch.float32)


class HeldEngine:
    """`Embedder.embed_stream`'s contract (every source to the sink, by key), held until `go` is set; it records
    each call's sources."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.go = threading.Event()
        self.entered = threading.Event()

    def embed_stream(self, sources, modality, sink, **options):
        self.calls.append([s.data.decode() for s in sources])
        self.entered.set()
        assert self.go.wait(60)
        from gemma_embed.decoding import Prepared
        from gemma_embed.models.base import PreparedItem

        for source in reversed(sources):  # completion order is not input order
            item = PreparedItem(units=[], meta={"tokens": len(source.data)})
            sink.done(Prepared(source, item=item), _rows_of(source.data.decode()))


def _sources(*texts: str):
    from gemma_embed.sources.base import Source

    return [Source(f"input[{i}]", f"input[{i}]", data=t.encode()) for i, t in enumerate(texts)]


@pytest.fixture
def queue():
    from gemma_embed.serve.batcher import Batcher

    engine = HeldEngine()
    windows = []

    class Seen:
        def window(self, items, jobs, seconds):
            windows.append((items, jobs))

        def queued(self, items):
            pass

    batcher = Batcher(lambda: engine, capacity=6, observer=Seen())
    batcher.start()
    assert batcher.ready.wait(10)
    yield batcher, engine, windows
    engine.go.set()
    batcher.close(10)


def test_jobs_that_wait_together_are_one_window_and_each_gets_its_own_rows(queue):
    from gemma_embed.serve.batcher import RouteKey

    batcher, engine, windows = queue
    text = RouteKey.of("text")
    first = batcher.submit(text, _sources("first"))
    assert engine.entered.wait(10)  # the worker is inside the first window, held
    second = batcher.submit(text, _sources("b-one", "b-two"))
    third = batcher.submit(text, _sources("c-one"))
    other = batcher.submit(RouteKey.of("text", prompt_name="query"), _sources("query"))
    engine.go.set()
    results = [job.future.result(10) for job in (first, second, third, other)]
    assert engine.calls == [["first"], ["b-one", "b-two", "c-one"], ["query"]]  # one route at a time, merged
    assert windows == [(1, 1), (3, 2), (1, 1)]
    for answer, texts in zip(results, (["first"], ["b-one", "b-two"], ["c-one"], ["query"]), strict=True):
        assert [r.vector.tolist() for r in answer] == [_rows_of(t).reshape(-1).tolist() for t in texts]
        assert [r.tokens for r in answer] == [len(t) for t in texts]
    assert batcher.admitted == 0


def test_the_queue_refuses_past_its_capacity_and_a_cancelled_job_frees_its_place(queue):
    from gemma_embed.serve.batcher import QueueFull, RouteKey, TooLarge

    batcher, engine, windows = queue
    text = RouteKey.of("text")
    busy = batcher.submit(text, _sources("busy"))
    assert engine.entered.wait(10)
    waiting = batcher.submit(text, _sources("w1", "w2", "w3", "w4", "w5"))  # 6 admitted: full
    with pytest.raises(QueueFull) as refused:
        batcher.submit(text, _sources("one more"))
    assert refused.value.retry_after >= 1
    with pytest.raises(TooLarge):
        batcher.submit(text, _sources(*[f"t{i}" for i in range(7)]))  # could never fit
    batcher.cancel(waiting)  # its client went away while it waited
    assert waiting.future.cancelled()
    assert batcher.admitted == 1
    late = batcher.submit(text, _sources("late"))  # the freed place is taken
    engine.go.set()
    assert [r.vector.tolist() for r in late.future.result(10)] == [_rows_of("late").reshape(-1).tolist()]
    assert busy.future.result(10)[0].tokens == 4
    assert all("w1" not in call for call in engine.calls)  # the cancelled job was never encoded


def test_a_job_cancelled_while_it_encodes_is_dropped_and_frees_its_place_after(queue):
    from gemma_embed.serve.batcher import RouteKey

    batcher, engine, windows = queue
    job = batcher.submit(RouteKey.of("text"), _sources("running"))
    assert engine.entered.wait(10)
    batcher.cancel(job)
    assert batcher.admitted == 1  # still encoding: its items are in the window
    engine.go.set()
    after = batcher.submit(RouteKey.of("text"), _sources("after"))
    after.future.result(10)
    assert job.future.cancelled()  # its rows reached nobody
    assert batcher.admitted == 0


def test_waiting_for_a_client_that_leaves_cancels_its_jobs():
    from gemma_embed.serve.batcher import Batcher, RouteKey
    from gemma_embed.serve.service import ClientGone, wait_for_jobs

    engine = HeldEngine()
    batcher = Batcher(lambda: engine, capacity=8)
    batcher.start()
    try:
        busy = batcher.submit(RouteKey.of("text"), _sources("busy"))
        assert engine.entered.wait(10)
        waiting = batcher.submit(RouteKey.of("text"), _sources("x", "y"))

        async def leaves():
            gone = asyncio.Event()
            asyncio.get_running_loop().call_soon(gone.set)  # the client closes its connection
            with pytest.raises(ClientGone):
                await wait_for_jobs(batcher, [waiting], gone.wait)

        asyncio.run(leaves())
        assert waiting.future.cancelled() and batcher.admitted == 1
        engine.go.set()

        async def stays():
            return await wait_for_jobs(batcher, [busy], asyncio.Event().wait)

        assert asyncio.run(stays())[0][0].tokens == 4
    finally:
        engine.go.set()
        batcher.close(10)


def test_closing_refuses_waiting_jobs_and_new_ones():
    from gemma_embed.serve.batcher import Batcher, Closed, RouteKey

    engine = HeldEngine()
    batcher = Batcher(lambda: engine, capacity=8)
    batcher.start()
    running = batcher.submit(RouteKey.of("text"), _sources("running"))
    assert engine.entered.wait(10)
    waiting = batcher.submit(RouteKey.of("text"), _sources("waiting"))
    closer = threading.Thread(target=batcher.close, args=(30,))
    closer.start()
    with pytest.raises(Closed):
        waiting.future.result(10)
    with pytest.raises(Closed):
        batcher.submit(RouteKey.of("text"), _sources("new"))
    engine.go.set()  # the window in flight still finishes
    closer.join(30)
    assert running.future.result(10)[0].tokens == 7


# ------------------------------------------------------------------------------------------ the key


def test_the_key_is_compared_with_hmac_compare_digest(monkeypatch):
    from gemma_embed.serve import auth

    compared = []
    constant_time = hmac.compare_digest

    def recording(a, b):
        compared.append((a, b))
        return constant_time(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", recording)
    basic = base64.b64encode(b"anyone:s3cret").decode()
    assert auth.key_matches("Bearer s3cret", "s3cret")
    assert auth.key_matches(f"Basic {basic}", "s3cret")
    assert not auth.key_matches("Bearer s3cres", "s3cret")
    assert not auth.key_matches("Bearer ", "s3cret")
    assert not auth.key_matches(None, "s3cret")
    assert not auth.key_matches("Token s3cret", "s3cret")
    assert not auth.key_matches("Basic !!!", "s3cret")
    assert len(compared) == 4 and all(b == b"s3cret" for _, b in compared)


# ------------------------------------------------------------------------------------------ shapes


def test_openais_input_forms():
    from gemma_embed.serve.openai_shapes import ApiError, read_embeddings_request

    assert [w.text for w in read_embeddings_request({"input": "one"}).inputs] == ["one"]
    assert [w.text for w in read_embeddings_request({"input": ["a", "b"]}).inputs] == ["a", "b"]
    assert [w.ids for w in read_embeddings_request({"input": [1, 2, 3]}).inputs] == [(1, 2, 3)]
    assert [w.ids for w in read_embeddings_request({"input": [[1, 2], [3]]}).inputs] == [(1, 2), (3,)]
    media = read_embeddings_request({"input": ["data:image/png;base64,AA=="], "modality": "image"}).inputs
    assert media[0].modality == "images" and media[0].url.startswith("data:")
    mixed = read_embeddings_request(
        {
            "input": [
                {"type": "text", "text": "words"},
                {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}},
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF").decode(), "format": "wav"}},
            ]
        }
    ).inputs
    assert [w.modality for w in mixed] == ["text", "images", "audio"]
    assert mixed[2].data == b"RIFF"
    for body, param in [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["ok", 3]}, "input[1]"),
        ({"input": "x", "encoding_format": "xml"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "modality": "smell"}, "modality"),
        ({}, "input"),
        ([1, 2], None),
    ]:
        with pytest.raises(ApiError) as error:
            read_embeddings_request(body)
        assert error.value.status == 400 and error.value.param == param
        assert set(error.value.body()["error"]) == {"message", "type", "param", "code"}


def test_base64_vectors_are_little_endian_float32():
    from gemma_embed.serve.openai_shapes import encode_vector

    vector = np.array([1.5, -0.25, 3.0e-8], dtype=np.float32)
    raw = base64.b64decode(encode_vector(vector, "base64"))
    assert struct.unpack("<3f", raw) == tuple(float(v) for v in vector)
    assert encode_vector(vector, "float") == [float(v) for v in vector]


def test_data_urls_are_decoded_within_the_item_limit_and_other_schemes_refused():
    from gemma_embed.serve.media_urls import check_scheme, data_url_bytes
    from gemma_embed.serve.openai_shapes import ApiError

    payload = bytes(range(256)) * 4
    encoded = "data:application/octet-stream;base64," + base64.b64encode(payload).decode()
    assert data_url_bytes(encoded, 4096, "input") == payload
    assert data_url_bytes("data:,a%20b", 100, "input") == b"a b"
    for url, status, code in [
        (encoded, 413, "item_too_large"),  # 1024 bytes over a 1000-byte limit
        ("data:image/png;base64,@@@", 400, None),
    ]:
        with pytest.raises(ApiError) as error:
            data_url_bytes(url, 1000, "input[0]")
        assert (error.value.status, error.value.code or code) == (status, code)
    assert [check_scheme(u, "input") for u in ("data:,x", "HTTP://a/", "https://a/")] == ["data", "http", "https"]
    for url in ("file:///etc/passwd", "/etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1/"):
        with pytest.raises(ApiError) as error:
            check_scheme(url, "input[0]")
        assert (error.value.status, error.value.code) == (400, "unsupported_url")


def test_a_large_request_shares_every_window_with_the_requests_after_it():
    """A request cut into jobs (service.CHUNK_ITEMS) gets one of them a window: one that arrives after it is in the
    next window, not behind all of it."""
    from gemma_embed.serve.batcher import Batcher, RouteKey

    engine = HeldEngine()
    batcher = Batcher(lambda: engine, capacity=100)
    batcher.start()
    try:
        text = RouteKey.of("text")
        busy = batcher.submit(text, _sources("busy"))
        assert engine.entered.wait(10)  # held inside the first window
        large = batcher.submit_many([(text, _sources(f"a{i}", f"a{i}+")) for i in range(3)])
        small = batcher.submit(text, _sources("b"))
        engine.go.set()
        for job in [busy, *large, small]:
            job.future.result(10)
        assert engine.calls == [["busy"], ["a0", "a0+", "b"], ["a1", "a1+"], ["a2", "a2+"]]
    finally:
        engine.go.set()
        batcher.close(10)


def test_a_missing_extra_is_one_line_naming_it(monkeypatch):
    from typer.testing import CliRunner

    from gemma_embed import cli, serve

    monkeypatch.setattr(serve, "NEEDED", ("fastapi", "gemma_embed_no_such_module"))
    with pytest.raises(UsageError, match=r"pip install 'gemma-embed\[serve\]'"):
        serve.require_extra()
    result = CliRunner().invoke(cli.app, ["serve", "--model", "samples/tiny-embeddinggemma2"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        "error: serve needs gemma_embed_no_such_module, which is not installed: pip install 'gemma-embed[serve]'"
    ]


def test_what_keeps_a_server_from_starting_is_one_line_before_it_listens(tmp_path):
    import subprocess

    from helpers import EXE

    missing = tmp_path / "nothing.safetensors"
    for args, words in [
        (["--output", str(missing)], f"--output {missing}: "),
        ([], "give --model ID|DIR, or --output OUT.safetensors"),
        (["--model", "samples/tiny-embeddinggemma2", "--port", "70000"], "--port"),
        (["--model", "samples/tiny-embeddinggemma2", "--queue-size", "0"], "--queue-size"),
    ]:
        result = subprocess.run([EXE, "serve", *args], capture_output=True, text=True, timeout=300)
        lines = result.stderr.splitlines()
        assert result.returncode == 2 and result.stdout == "", result.stderr
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines


def test_a_model_failure_tells_the_client_no_sizes_and_the_log_everything():
    """The engine's too-large failure names the host's free memory (issue 47 saw "needs about 158.4 GiB ... more than
    the 20.5 GiB free"): the client gets 413 naming the options, the log the engine's words; another model failure
    500 without its reason; a decode failure keeps its reason (it is about the client's own bytes)."""
    from gemma_embed.errors import ItemError
    from gemma_embed.serve.service import item_error

    logged: list[str] = []
    words = "needs about 158.4 GiB of cpu memory to encode alone (100000 tokens), more than the 20.5 GiB free"
    too_large = item_error("input[0]", ItemError("0/0", "encode", words, "too-large"), logged.append)
    assert (too_large.status, too_large.code) == (413, "input_too_large")
    assert "GiB" not in too_large.message and "--max-request-tokens" in too_large.message
    reason = "RuntimeError: at /home/me/x.py:3"
    failed = item_error("input[1]", ItemError("0/1", "encode", reason), logged.append)
    assert (failed.status, failed.message) == (500, "input[1]: the model failed on this input")
    assert logged == [f"input[0]: {words}", f"input[1]: the model failed on this input: {reason}"]
    bad = item_error("input[2]", ItemError("0/2", "decode", "not a recognised image format"), logged.append)
    assert (bad.status, bad.message) == (400, "input[2]: not a recognised image format")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_listening_socket_s_connections_send_without_waiting_for_acks(host):
    """asyncio (which uvicorn serves through, `loop.create_server(sock=...)`) turns Nagle's algorithm off only on
    the connections of a socket that says it is TCP. With it on, a response's second write waited for the client's
    delayed ACK: every answer 40 ms late (issue 47's overload bench)."""
    import socket

    from gemma_embed.serve.listen import bind

    try:
        sock = bind(host, 0)
    except UsageError:
        pytest.skip(f"{host}: no such address on this machine")
    sock.listen()

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        connected: asyncio.Future = loop.create_future()
        server = await loop.create_server(lambda: _Accepted(connected), sock=sock)
        _, writer = await asyncio.open_connection(host, sock.getsockname()[1])
        transport = await connected
        nodelay = transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        writer.close()
        transport.close()
        server.close()
        await server.wait_closed()
        return nodelay

    assert asyncio.run(accepted_nodelay()) != 0


class _Accepted(asyncio.Protocol):
    def __init__(self, connected: asyncio.Future):
        self.connected = connected

    def connection_made(self, transport) -> None:
        self.connected.set_result(transport)
