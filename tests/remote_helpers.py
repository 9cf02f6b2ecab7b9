"""Object storage and URLs on this machine, for the tests that read and write them: moto's S3 server (a real S3 HTTP
API, `moto[server]`'s ThreadedMotoServer on 127.0.0.1) reached by s3fs through `AWS_ENDPOINT_URL`, a counting
proxy in front of it (the bytes a run fetched, as the server sent them), and an HTTP server of media files with the
failures a crawl meets (404, 500, a body that never comes, a body cut short) and a count of requests in flight."""

from __future__ import annotations

import contextlib
import http.client
import http.server
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

# What the S3 tests put in the environment: the keys botocore signs with (moto takes any), and the secret the
# leak tests look for in everything a run writes and prints.
SECRET_KEY = "s3cr3t-Key-0f-th3-T3st-9f8e7d6c5b4a"
ACCESS_KEY = "AKIATESTGEMMAEMBED01"
SIGNATURE = "Signature-4b1d2c3e4f5a6b7c8d9e0f1a2b3c"  # a signed URL's query value


@contextlib.contextmanager
def s3_server(monkeypatch) -> Iterator[str]:
    """moto's S3 server on a free port of 127.0.0.1, with this process's environment pointing botocore at it
    (`AWS_ENDPOINT_URL`, the test keys); yields the endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for name, value in s3_environment(endpoint).items():
        monkeypatch.setenv(name, value)
    try:
        yield endpoint
    finally:
        server.stop()


def s3_environment(endpoint: str) -> dict[str, str]:
    """What botocore (through s3fs) needs to reach an S3 server at `endpoint`: the endpoint, keys and region."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "2",
    }


def s3fs_client():
    """A fresh s3fs filesystem (the tests' own view of the bucket, not the tool's cached instance)."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


# ------------------------------------------------------------------------------------------ a counting proxy


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 and no log lines: the local servers' handlers build on it."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass


def local_server(handler: type[http.server.BaseHTTPRequestHandler]):
    """A threaded server of `handler` on 127.0.0.1 at a free port, and the thread that serves it (not started)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    return server, threading.Thread(target=server.serve_forever, daemon=True)


class CountingProxy:
    """An HTTP proxy in front of `upstream` that relays every request and counts the response bytes it sent back:
    what a client really fetched, measured outside it. `events` orders what happened: ("sent", method, path) when
    a request arrives, before it is relayed, and ("answered", method, path) once the store's answer is back (so
    "B was sent after A was answered" can be told apart from requests in flight together)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.sent = 0
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.events: list[tuple[str, str, str]] = []  # ("sent" | "answered", method, path without the query)
        self.by_path: dict[str, int] = {}  # response bytes by the path asked for (its query string left out)
        self.lock = threading.Lock()
        proxy = self

        class Handler(QuietHandler):
            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = self.path.split("?")[0]
                with proxy.lock:
                    proxy.events.append(("sent", self.command, path))
                connection = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "host")}
                headers["Host"] = proxy.upstream
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                with proxy.lock:
                    proxy.sent += len(data)
                    proxy.requests.append((self.command, self.path, self.headers.get("Range")))
                    proxy.events.append(("answered", self.command, path))
                    proxy.by_path[path] = proxy.by_path.get(path, 0) + len(data)
                self.send_response(response.status, response.reason)
                relayed = ("transfer-encoding", "connection") + (() if self.command == "HEAD" else ("content-length",))
                for key, value in response.getheaders():
                    if key.lower() not in relayed:
                        self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                connection.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

        self.server, self.thread = local_server(Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def reset(self) -> None:
        with self.lock:
            self.sent = 0
            self.requests.clear()
            self.events.clear()
            self.by_path.clear()

    def __enter__(self) -> CountingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------------------ a media server


class MediaServer:
    """Files of `folder` over HTTP on 127.0.0.1, plus the answers a crawl meets:

    - `/status/CODE/...`: that status with a short body (404, 500, 503, ...), counted per path in `asked`;
    - `/stall/...`: headers, then a body that never comes until the server closes (a read timeout);
    - `/cut/NAME`: the file's headers with its whole Content-Length, then half its bytes, then the connection
      closes (a truncated body);
    - `/flaky/N/NAME`: 503 for the first N requests of that path, then the file;
    - `/gate/NAME`: the file, once `gate_width` of these requests are in flight together, or all `gate_expected` of
      them have arrived (or after GATE_WAIT_S):
      how the per-host limit is seen from the server; `peak` is the most of them ever in flight at once.
    Every request's query string is ignored (signed URLs)."""

    GATE_WAIT_S = 10.0

    def __init__(self, folder: Path, gate_width: int = 2) -> None:
        self.folder = folder
        self.gate_width = gate_width
        # How many gated requests the test will make: once all have arrived, the last ones can have no partner, and
        # waiting GATE_WAIT_S for one would only add the wait (the last of eight URLs at two a time came alone).
        self.gate_expected: int | None = None
        self.asked: dict[str, int] = {}
        self.requests: list[str] = []  # every request's path as sent, query string included
        self.in_flight = 0
        self.peak = 0
        self.closing = threading.Event()
        self.changed = threading.Condition()
        media = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                gated = path.startswith("/gate/")
                with media.changed:
                    media.requests.append(self.path)
                    media.asked[path] = media.asked.get(path, 0) + 1
                    if gated:
                        media.in_flight += 1
                        media.peak = max(media.peak, media.in_flight)
                        media.changed.notify_all()
                try:
                    self._answer(path)
                finally:
                    if gated:
                        with media.changed:
                            media.in_flight -= 1
                            media.changed.notify_all()

            def _answer(self, path: str) -> None:
                parts = path.strip("/").split("/")
                if parts[0] == "status":
                    self._send(int(parts[1]), b"no")
                elif parts[0] == "stall":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.flush()
                    media.closing.wait()
                elif parts[0] == "cut":
                    data = media.read(parts[-1])
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                elif parts[0] == "flaky":
                    if media.asked[path] <= int(parts[1]):
                        self._send(503, b"busy")
                    else:
                        self._send(200, media.read(parts[-1]))
                elif parts[0] == "gate":
                    with media.changed:
                        media.changed.wait_for(media._gate_open, media.GATE_WAIT_S)
                    self._send(200, media.read(parts[-1]))
                else:
                    data = media.read(parts[-1]) if (media.folder / parts[-1]).is_file() else None
                    self._send(200, data) if data is not None else self._send(404, b"not found")

            def _send(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server, self.thread = local_server(Handler)

    def _gate_open(self) -> bool:
        """(Under `changed`.) Whether a gated request may be answered: `gate_width` of them in flight together, or
        every gated request the test makes has arrived."""
        arrived = sum(count for path, count in self.asked.items() if path.startswith("/gate/"))
        return self.in_flight >= self.gate_width or (self.gate_expected is not None and arrived >= self.gate_expected)

    def read(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{path}"

    def __enter__(self) -> MediaServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


def files_under(root: Path) -> Iterator[Path]:
    """Every regular file under `root`."""
    for folder, _, names in os.walk(root):
        for name in names:
            yield Path(folder) / name
