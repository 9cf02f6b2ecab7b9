"""`gemma-embed serve` against hostile clients (issue 47): media URLs that name the server's own network, redirect
elsewhere, drip, lie about their size or never end; requests too large for one model worker; bodies that are no
JSON text; a web page posting to a server on its user's machine.

Every target is on 127.0.0.1 (an http.server site that drips, redirects and lies about Content-Length, and plain
TCP listeners that record connections, one answering like an FTP server). Addresses that must never be reached
(10.0.0.1, 169.254.169.254) are only ever named, and the test checks nothing connected anywhere: the server refuses
them before it connects. One server serves a captioned collection with small limits; the last test stops it with
SIGTERM while a fetch drips. Tests wait on the site's and the listeners' events, never on a sleep."""

from __future__ import annotations

import base64
import http.server
import io
import json
import os
import signal
import socket
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from serve_helpers import TINY_EG2, ServerProcess, call, call_json, finish, run_cli, write_captioned_images
from warm_cli import peak_rss

pytestmark = pytest.mark.serve
pytest.importorskip("fastapi")
from gemma_embed.serve.media_urls import FETCH_FAILED, Fetcher, public_address  # noqa: E402

MODEL = str(TINY_EG2)
MiB = 1 << 20
FETCH_LIMIT = 1 * MiB  # --max-fetch-bytes
ITEM_LIMIT = 4 * MiB  # --max-item-bytes
DRIP_EVERY_S = 0.5  # the drip site's pace: a byte each half second (a per-read timeout would never fire)
EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 4 4\nnewpath 0 0 moveto 4 4 lineto stroke\nshowpage\n%%EOF\n"


# ------------------------------------------------------------------------------------------ local servers


class Listener:
    """A TCP listener on 127.0.0.1 that records every connection (and, `ftp`, greets like an FTP server and keeps
    what the client sends)."""

    def __init__(self, ftp: bool = False):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.ftp = ftp
        self.connections = 0
        self.received = b""
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                if self.ftp:
                    conn.sendall(b"220 ready\r\n")
                conn.settimeout(2)
                try:
                    self.received += conn.recv(1024)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


class Site:
    """http.server on 127.0.0.1: /img/NAME (the collection's files), /redirect?to=URL, /chain/N (N redirects, then
    an image), /status/N, /drip?size=N (a byte every DRIP_EVERY_S), /declare?size=N (headers only: waits for the
    client to close), /stream?size=N (chunked, no length). It records what it sent and how each response ended."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.lock = threading.Condition()
        self.dripping = 0
        self.ended: list[tuple[str, int, bool]] = []  # (path, body bytes sent, cut by the client)
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                site.handle(self)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://localhost:{self.port}"  # the name --allowed-media-domains lets through
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, request: http.server.BaseHTTPRequestHandler) -> None:
        parts = urllib.parse.urlsplit(request.path)
        query = dict(urllib.parse.parse_qsl(parts.query))
        path = parts.path
        if path.startswith("/img/"):
            data = (self.folder / path.removeprefix("/img/")).read_bytes()
            return self._send(request, 200, data)
        if path == "/redirect":
            return self._redirect(request, query["to"])
        if path.startswith("/chain/"):
            left = int(path.removeprefix("/chain/"))
            return self._redirect(request, f"/chain/{left - 1}" if left > 1 else "/img/landscape.jpg")
        if path.startswith("/status/"):
            return self._send(request, int(path.removeprefix("/status/")), b"no")
        size = int(query.get("size", "0"))
        if path == "/drip":
            return self._drip(request, size)
        if path == "/declare":
            request.send_response(200)
            request.send_header("Content-Length", str(size))
            request.end_headers()
            request.wfile.flush()
            request.connection.settimeout(120)
            closed = request.rfile.read(1) == b""  # nothing is sent: the client must refuse without reading
            return self._ended(path, 0, closed)
        if path == "/stream":
            return self._stream(request, size)
        return self._send(request, 404, b"no")

    def _send(self, request, status: int, data: bytes) -> None:
        request.send_response(status)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def _redirect(self, request, to: str) -> None:
        request.send_response(302)
        request.send_header("Location", to)
        request.send_header("Content-Length", "0")
        request.end_headers()

    def _drip(self, request, size: int) -> None:
        request.send_response(200)
        request.send_header("Content-Length", str(size))
        request.end_headers()
        sent, cut = 0, False
        with self.lock:
            self.dripping += 1
            self.lock.notify_all()
        try:
            while sent < size:
                request.wfile.write(b"x")
                request.wfile.flush()
                sent += 1
                threading.Event().wait(DRIP_EVERY_S)  # the site's own pace, not a test's wait
        except OSError:
            cut = True
        finally:
            with self.lock:
                self.dripping -= 1
            self._ended("/drip", sent, cut)

    def _stream(self, request, size: int) -> None:
        request.send_response(200)
        request.send_header("Transfer-Encoding", "chunked")
        request.end_headers()
        piece = b"\0" * (256 << 10)
        sent, cut = 0, False
        try:
            while sent < size:
                request.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
            request.wfile.write(b"0\r\n\r\n")
        except OSError:
            cut = True
        self._ended("/stream", sent, cut)

    def _ended(self, path: str, sent: int, cut: bool) -> None:
        with self.lock:
            self.ended.append((path, sent, cut))
            self.lock.notify_all()

    def wait(self, test, timeout: float = 120) -> None:
        with self.lock:
            assert self.lock.wait_for(test, timeout), (self.dripping, self.ended)

    def ends(self, path: str) -> list[tuple[str, int, bool]]:
        with self.lock:
            return [e for e in self.ended if e[0] == path]

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    table = write_captioned_images(folder / "gallery")
    gallery = folder / "gallery.safetensors"
    finish(run_cli("images", str(table), "--column", "image", "--model", MODEL, "-o", str(gallery)))
    tools = folder / "bin"  # a `gs` that leaves a mark: Pillow's EPS plugin would run it
    tools.mkdir()
    marker = folder / "GS-RAN"
    (tools / "gs").write_text(f"#!/bin/sh\necho ran > {marker}\nexit 1\n")
    (tools / "gs").chmod(0o755)
    server = ServerProcess(
        "--model", MODEL, "--output", str(gallery), "--allowed-media-domains", "localhost",
        "--max-item-bytes", "4MiB", "--max-fetch-bytes", "1MiB", "--fetch-budget", "1536KiB", "--fetch-timeout", "15",
        "--max-client-batch-size", "8", "--max-request-tokens", "64", "--max-text-bytes", "4KiB", "--grace", "3",
        env={"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"},
    )  # fmt: skip
    site = Site(folder / "gallery")
    try:
        server.ready()
        yield {"server": server, "site": site, "marker": marker, "folder": folder / "gallery"}
    finally:
        site.close()
        server.kill()


@pytest.fixture
def listener():
    found = Listener()
    yield found
    found.close()


def _embed(server, inputs, modality="image", **more):
    return call_json(server, "POST", "/v1/embeddings", {"input": inputs, "modality": modality, **more})


def _refused_as_fetch_failed(server, url: str) -> None:
    status, answer = _embed(server, [url])
    assert status == 400, (url, answer)
    assert answer["error"] == {
        "message": f"input[0]: {FETCH_FAILED}",
        "type": "invalid_request_error",
        "param": "input[0]",
        "code": "fetch_failed",
    }, url


# ------------------------------------------------------------------------------------------ addresses


def test_hosts_outside_the_allow_list_are_refused_before_anything_connects(served, listener):
    server, port = served["server"], listener.port
    for url in [
        f"http://127.0.0.1:{port}/secret.png",
        f"http://2130706433:{port}/secret.png",  # 127.0.0.1 as one number
        f"http://0x7f.1:{port}/",
        f"http://[::1]:{port}/",
        f"http://[::ffff:127.0.0.1]:{port}/",
        f"http://0:{port}/",
        "http://10.0.0.1/",  # named only: refused before any connection
        "http://169.254.169.254/latest/meta-data/",
        f"http://user:pass@localhost:{port}/",
    ]:
        _refused_as_fetch_failed(server, url)
    assert listener.connections == 0


def test_without_an_allow_list_only_public_addresses_are_fetched(listener):
    """The server's Fetcher as `serve` makes it without --allowed-media-domains, with a resolver that answers as a
    rebinding DNS server would: a name of the loopback, of the cloud metadata address, of several addresses one of
    which is private. Each is refused and nothing connects (the listener behind 127.0.0.1 sees nobody)."""
    import asyncio

    from gemma_embed.serve.openai_shapes import ApiError

    answers = {
        "rebind.test": ["127.0.0.1"],
        "metadata.test": ["169.254.169.254"],
        "mixed.test": ["127.0.0.2", "10.0.0.1"],
        "v6.test": ["::1"],
        "mapped.test": ["::ffff:127.0.0.1"],
    }

    def resolve(host, port, type=0):
        if host not in answers:  # an address as it is, or localhost
            return socket.getaddrinfo(host, port, type=type)
        family = {True: socket.AF_INET6, False: socket.AF_INET}
        return [(family[":" in a], socket.SOCK_STREAM, 6, "", (a, port)) for a in answers[host]]

    fetcher = Fetcher(resolve=resolve)

    async def refused(url: str) -> ApiError:
        with pytest.raises(ApiError) as error:
            await fetcher.fetch(url, 1 << 20, fetcher.ledger(), "input")
        return error.value

    async def all_of_them():
        urls = [f"http://{name}:{listener.port}/x.png" for name in answers]
        urls += [f"http://127.0.0.1:{listener.port}/", f"http://localhost:{listener.port}/"]
        return [await refused(url) for url in urls]

    errors = asyncio.run(all_of_them())
    fetcher.close()
    assert {(e.status, e.message) for e in errors} == {(400, f"input: {FETCH_FAILED}")}
    assert fetcher.connections == 0 and listener.connections == 0


@pytest.mark.parametrize(
    "address, public",
    [
        # IANA's IPv4 and IPv6 special-purpose registries (RFC 6890 and its updates), and public addresses
        ("127.0.0.1", False), ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False),
        ("169.254.169.254", False), ("100.64.0.1", False), ("0.0.0.0", False), ("224.0.0.251", False),
        ("239.255.255.250", False), ("240.0.0.1", False), ("255.255.255.255", False), ("192.0.2.1", False),
        ("198.18.0.1", False), ("::1", False), ("::", False), ("fe80::1%eth0", False), ("fc00::1", False),
        ("ff02::1", False), ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False), ("2001:db8::1", False),
        ("8.8.8.8", True), ("93.184.216.34", True), ("2606:4700:4700::1111", True), ("::ffff:8.8.8.8", True),
    ],
)  # fmt: skip
def test_public_addresses_are_those_iana_lists_as_globally_reachable(address, public):
    assert public_address(address) is public


def test_redirects_are_checked_at_every_hop(served, listener):
    server, site = served["server"], served["site"]
    ftp = Listener(ftp=True)
    try:
        for to in [
            f"ftp://localhost:{ftp.port}/secret",  # followed before: the listener got an anonymous login
            f"http://127.0.0.1:{listener.port}/secret.png",  # another port of the loopback, by another name
            "file:///etc/passwd",
            "http://169.254.169.254/latest/meta-data/",
        ]:
            _refused_as_fetch_failed(server, f"{site.url}/redirect?" + urllib.parse.urlencode({"to": to}))
        _refused_as_fetch_failed(server, f"{site.url}/chain/4")  # a fourth redirect: over MAX_REDIRECTS
        status, answer = _embed(server, [f"{site.url}/chain/3"])  # three: followed
        assert status == 200 and len(answer["data"]) == 1
        assert ftp.connections == 0 and ftp.received == b"" and listener.connections == 0
    finally:
        ftp.close()


def test_every_failed_fetch_is_told_in_the_same_words(served):
    """A closed port, a 404, a 500, TLS spoken to a plain HTTP server: one text, as for a refused address, so an
    answer tells nothing about what listens where."""
    server, site = served["server"], served["site"]
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    for url in [
        f"http://localhost:{closed_port}/x.png",
        f"{site.url}/status/404",
        f"{site.url}/status/500",
        f"https://localhost:{site.port}/img/landscape.jpg",
        f"http://localhost:{site.port}/redirect",  # no Location at all: the site's KeyError is its 500
    ]:
        _refused_as_fetch_failed(server, url)


# ------------------------------------------------------------------------------------------ bytes and time


def test_a_declared_size_over_a_limit_is_refused_unread(served):
    server, site = served["server"], served["site"]
    status, answer = _embed(server, [f"{site.url}/declare?size={2 * MiB}"])
    assert status == 413 and answer["error"]["code"] == "fetch_too_large"
    assert "--max-fetch-bytes" in answer["error"]["message"]
    status, answer = _embed(server, [f"{site.url}/declare?size={100 * MiB}"])
    assert status == 413 and answer["error"]["code"] == "item_too_large"
    assert "--max-item-bytes" in answer["error"]["message"]
    site.wait(lambda: len(site.ends("/declare")) == 2)
    assert site.ends("/declare") == [("/declare", 0, True)] * 2  # the connection closed, no body asked for


def test_bodies_count_as_they_arrive_and_the_servers_memory_stays_flat(served):
    """8 URLs of 150 MiB with no declared length in one small request: refused once the request's bytes pass
    --max-fetch-bytes (1 MiB); the server's peak RSS grows by little, the site is cut off early."""
    server, site = served["server"], served["site"]
    Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # VmHWM starts again from the RSS now
    before = peak_rss(server.pid)
    status, answer = _embed(server, [f"{site.url}/stream?size={150 * MiB}&n={i}" for i in range(8)])
    assert status == 413 and answer["error"]["code"] == "fetch_too_large", answer
    grown = peak_rss(server.pid) - before
    assert grown < 64 * MiB, f"peak RSS grew by {grown / MiB:.0f} MiB"
    site.wait(lambda: len(site.ends("/stream")) == 8)
    streams = site.ends("/stream")
    assert all(cut for _, _, cut in streams) and sum(sent for _, sent, _ in streams) < 8 * 150 * MiB // 4


def test_the_servers_fetch_budget_is_shared_by_the_requests_in_flight(served):
    """Two requests whose URLs declare 1 MiB and 768 KiB against a --fetch-budget of 1.5 MiB: whichever is counted
    second gets 429 with Retry-After, unread, while the first is held (a drip, or headers with no body); a text is
    answered meanwhile; the held one ends at --fetch-timeout, told in the one text."""
    from concurrent.futures import FIRST_COMPLETED, wait

    server, site = served["server"], served["site"]

    def post(url: str):
        status, headers, body = call(server, "POST", "/v1/embeddings", {"input": [url], "modality": "image"})
        return status, headers, json.loads(body)

    site.wait(lambda: site.dripping == 0)
    with ThreadPoolExecutor(2) as pool:
        holding = pool.submit(post, f"{site.url}/drip?size={MiB}")
        site.wait(lambda: site.dripping == 1)
        second = pool.submit(post, f"{site.url}/declare?size={768 << 10}")
        first_done, _ = wait([holding, second], timeout=120, return_when=FIRST_COMPLETED)
        refused = first_done.pop().result()
        assert call_json(server, "POST", "/v1/embeddings", {"input": "still answering"})[0] == 200
        held = [f for f in (holding, second) if f.result(120) is not refused][0].result()
    status, headers, answer = refused
    assert status == 429 and answer["error"]["code"] == "fetch_budget_full", answer
    assert headers["retry-after"] == "1" and "--fetch-budget" in answer["error"]["message"]
    assert held[0] == 400 and held[2]["error"]["message"] == f"input[0]: {FETCH_FAILED}"


def test_six_dripping_fetches_block_no_other_route_and_end_at_the_deadline(served):
    """6 URLs that send a byte every half second (a timeout per read never fires): while all 6 are in flight, the
    collection list, a thumbnail, a search by vector, a data: image and a text are answered; then each fetch ends at
    --fetch-timeout (15 s for the whole fetch), told in the one text, its connection cut by the server."""
    server, site = served["server"], served["site"]
    site.wait(lambda: site.dripping == 0)  # an earlier test's drip has seen its connection cut
    done_before = len(site.ends("/drip"))
    image = "data:image/png;base64," + base64.b64encode((served["folder"] / "portrait.png").read_bytes()).decode()
    with ThreadPoolExecutor(6) as pool:
        drips = [pool.submit(_embed, server, [f"{site.url}/drip?size=1000&n={i}"]) for i in range(6)]
        site.wait(lambda: site.dripping == 6)
        status, outputs = call_json(server, "GET", "/v1/outputs")
        assert status == 200 and outputs["data"][0]["name"] == "gallery"
        status, _, picture = call(server, "GET", "/v1/outputs/gallery/items/0/thumbnail")
        assert status == 200 and picture[:3] == b"\xff\xd8\xff"
        status, found = call_json(server, "POST", "/v1/search", {"vector": [1.0] * 32, "k": 2})
        assert status in (200, 400), found  # answered (a vector of this width, or one line saying it is not)
        status, vectors = _embed(server, [image])
        assert status == 200 and len(vectors["data"]) == 1
        assert call_json(server, "POST", "/v1/embeddings", {"input": "a text meanwhile"})[0] == 200
        with site.lock:
            assert site.dripping == 6  # all of it happened while the six were in flight
        answers = [d.result(120) for d in drips]
    assert all(a == (400, answers[0][1]) for a in answers)
    assert answers[0][1]["error"]["message"] == f"input[0]: {FETCH_FAILED}"
    site.wait(lambda: len(site.ends("/drip")) == done_before + 6)
    assert all(cut and sent < 1000 for _, sent, cut in site.ends("/drip")[done_before:])


# ------------------------------------------------------------------------------------------ formats


def test_eps_and_formats_no_browser_shows_are_refused_and_nothing_runs(served):
    server, marker = served["server"], served["marker"]
    from PIL import Image

    tiff = io.BytesIO()
    Image.new("RGB", (8, 8)).save(tiff, "TIFF")
    for kind, data in [("image/x-eps", EPS), ("application/postscript", EPS), ("image/tiff", tiff.getvalue())]:
        url = f"data:{kind};base64," + base64.b64encode(data).decode()
        status, answer = _embed(server, [url])
        assert status == 400 and answer["error"]["code"] == "invalid_input", answer
        assert "PNG, JPEG, GIF, WEBP, BMP" in answer["error"]["message"]
    assert not marker.exists()  # the `gs` on the server's PATH never ran


def test_a_playlist_in_a_video_or_audio_item_reaches_nothing(served, listener):
    """FFmpeg's HLS and concat demuxers open the URLs a playlist names: as a data: item (bytes, not a URL) they are
    refused, and nothing connects to the address they name or reads the file."""
    server = served["server"]
    target = f"http://127.0.0.1:{listener.port}/segment.ts"
    playlists = [
        f"#EXTM3U\n#EXT-X-MEDIA-SEQUENCE:0\n#EXTINF:10.0,\n{target}\n#EXT-X-ENDLIST\n",
        "#EXTM3U\n#EXT-X-MEDIA-SEQUENCE:0\n#EXTINF:10.0,\nfile:///etc/passwd\n#EXT-X-ENDLIST\n",
        f"ffconcat version 1.0\nfile {target}\n",
    ]
    for modality, kind in (("video", "video/mp4"), ("audio", "audio/mpeg")):
        for playlist in playlists:
            url = f"data:{kind};base64," + base64.b64encode(playlist.encode()).decode()
            status, answer = _embed(server, [url], modality)
            assert status == 400 and answer["error"]["code"] == "invalid_input", answer
            assert "root:" not in json.dumps(answer)
    assert listener.connections == 0


def test_the_batch_tool_never_opens_eps_either(tmp_path, monkeypatch):
    """A folder of a user's own files holds downloads too: EPS/PS is not listed by the folder walk and not decoded
    from bytes, even with a Ghostscript on PATH (here one that leaves a mark)."""
    from gemma_embed.media.image import ImageDecodeError, decode_image, extensions

    marker = tmp_path / "GS-RAN"
    (tmp_path / "gs").write_text(f"#!/bin/sh\necho ran > {marker}\nexit 1\n")
    (tmp_path / "gs").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert not {".eps", ".ps", ".epsf"} & extensions()
    with pytest.raises(ImageDecodeError, match="not a recognised image format"):
        decode_image(EPS)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------ request limits


def _error(status_and_answer, status: int, code: str | None, words: str) -> None:
    got, answer = status_and_answer
    assert got == status, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert "\n" not in error["message"] and words in error["message"], error
    assert code is None or error["code"] == code, error
    assert "GiB" not in error["message"] and str(Path.cwd()) not in error["message"]


def test_per_request_limits_answer_413_naming_the_limit_and_its_option(served):
    server = served["server"]
    embed = lambda body: call_json(server, "POST", "/v1/embeddings", body)  # noqa: E731
    _error(embed({"input": ["x"] * 9}), 413, "too_many_inputs", "--max-client-batch-size")
    _error(embed({"input": list(range(1, 66))}), 413, "too_many_tokens", "--max-request-tokens")
    _error(embed({"input": [[1, 2] * 20, [3] * 30]}), 413, "too_many_tokens", "--max-request-tokens")
    _error(embed({"input": ["a" * 5000]}), 413, "text_too_long", "--max-text-bytes")
    _error(embed({"input": ["€" * 1400]}), 413, "text_too_long", "--max-text-bytes")  # 4200 bytes of 1400 chars
    search = call_json(server, "POST", "/v1/search", {"input": "a" * 5000})
    _error(search, 413, "text_too_long", "--max-text-bytes")
    assert embed({"input": ["x"] * 8})[0] == 200 and embed({"input": ["é" * 2000]})[0] == 200
    assert embed({"input": list(range(1, 65))})[0] == 200


def test_bodies_that_are_no_json_text_are_4xx_in_one_line(served):
    server = served["server"]
    post = lambda data, **headers: call(server, "POST", "/v1/embeddings", data, headers or None)  # noqa: E731

    def check(answer, status, words):
        got, _, body = answer
        _error((got, json.loads(body)), status, None, words)

    check(post(b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), 400, "nests too deeply")
    check(post(b'{"input": "caf\xe9"}'), 400, "not valid UTF-8")
    check(post(b'{"input": "\\ud800 alone"}'), 400, "lone surrogate")
    check(post(b'{"input": "x", "user": {"\\udfff": 1}}'), 400, "lone surrogate")
    assert post(b'{"input": "\\ud83d\\ude00 a pair"}')[0] == 200
    check(post(b'{"input": "x"}', **{"Content-Type": "text/plain"}), 415, "application/json")
    check(post(b"input=x", **{"Content-Type": "application/x-www-form-urlencoded"}), 415, "application/json")
    check(call(server, "POST", "/v1/search", b'{"vector": [1]}', {"Content-Type": "multipart/form-data"}), 415, "")
    assert post(b'{"input": "x"}', **{"Content-Type": "application/json; charset=utf-8"})[0] == 200


def test_a_loopback_server_answers_only_its_own_host_names(served):
    server = served["server"]
    port = server.address[1]
    for host in ("attacker.example", f"attacker.example:{port}", "localhost:1", f"10.0.0.1:{port}"):
        status, _, body = call(server, "GET", "/v1/models", headers={"Host": host})
        assert status == 421 and json.loads(body)["error"]["code"] == "misdirected_request", host
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"LOCALHOST:{port}"):
        assert call(server, "GET", "/v1/models", headers={"Host": host})[0] == 200, host


def test_a_client_that_leaves_ends_its_fetches(served):
    """A client that closes its connection while its URL drips: the request ends then (499 in the access log), and
    its fetch ends at the next byte because its ledger was given back (the server's note says so), not at
    --fetch-timeout."""
    import http.client

    server, site = served["server"], served["site"]
    site.wait(lambda: site.dripping == 0)
    connection = http.client.HTTPConnection(*server.address, timeout=60)
    body = json.dumps({"input": [f"{site.url}/drip?size=1000&n=leaves"], "modality": "image"})
    connection.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
    site.wait(lambda: site.dripping == 1)
    connection.close()  # gone without its answer
    site.wait(lambda: site.dripping == 0)
    server.wait_for_line("fetch refused or failed: its request has ended")
    assert any('"POST /v1/embeddings HTTP/1.1" 499' in line for line in server.stderr)


# ------------------------------------------------------------------------------------------ stopping


def test_sigterm_ends_a_server_whose_fetch_drips_within_the_grace(served):
    """Last: stops the module's server. A fetch that would drip for 500 s and a --fetch-timeout of 15 s: SIGTERM
    ends the fetch at once (its client gets the one text), and the process exits 0 within --grace (3 s); the wait
    below allows far less than the drip or the fetch deadline would take."""
    server, site = served["server"], served["site"]
    site.wait(lambda: site.dripping == 0)
    with ThreadPoolExecutor(1) as pool:
        dripping = pool.submit(_embed, server, [f"{site.url}/drip?size=1000&n=last"])
        site.wait(lambda: site.dripping == 1)
        assert server.stop(signal.SIGTERM, timeout=10) == 0  # the fetch alone would hold it 15 s
        status, answer = dripping.result(30)
    assert status in (400, 503) and "error" in answer
    site.wait(lambda: site.dripping == 0)
