"""What the server tests share: a `gemma-embed serve` process started as a user starts it (the tests' EXE, forked
from the warm server: tests/warm_cli.py; port 0 on 127.0.0.1, its announced URL read from stdout), waited on by its
events, stopped by a signal; plain HTTP calls to it; the sample checkpoints and a captioned image collection made by
the real command line."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from helpers import EXE, ROOT
from warm_cli import REPORT_VARIABLE, reported_pid

TINY_EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
SAMPLE_IMAGES = ROOT / "samples" / "media" / "images"
# A caption the gallery must show as text (and never run).
HOSTILE_CAPTION = '<script>alert("caption")</script><img src=x onerror=alert(1)>'
START_TIMEOUT_S = 300  # a busy 2-core machine takes a minute to import torch and transformers
TEXTS = [
    "a cat",
    "a tall building at night",
    "the quick brown fox jumps over the lazy dog",
    "embeddings " * 12,
    "une phrase en français, avec des accents",
    "short",
    "a much longer sentence that talks about rivers, mountains and the weather in the spring of that year",
    "numbers 1 2 3 4 5 6 7 8 9 10",
]


class ServerProcess:
    """A running `gemma-embed serve`: its URL, its stdout events, its stderr lines, its RSS; stopped by a signal."""

    def __init__(self, *args: str, env: dict | None = None):
        # Its RSS is read from /proc: of the process its report names (tests/warm_cli.py), forked or started anew.
        self._report = Path(tempfile.mkdtemp(prefix="gemma-embed-serve-")) / "report.json"
        self.proc = subprocess.Popen(
            [EXE, "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {}), REPORT_VARIABLE: str(self._report)},
            cwd=ROOT,
        )
        self.events: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        self._new_line = threading.Condition()  # told of each stderr line (and of its end) by the reader thread
        self._stderr_ended = False
        self._readers = [
            threading.Thread(target=self._read_events, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.url = self.wait_for("listening")["url"]

    def _read_events(self) -> None:
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put({"type": "eof"})

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            with self._new_line:
                self.stderr.append(line.rstrip("\n"))
                self._new_line.notify_all()
        with self._new_line:
            self._stderr_ended = True
            self._new_line.notify_all()

    def wait_for_line(self, needle: str, timeout: float = 60) -> list[str]:
        """The stderr lines holding `needle`, once one has come (woken by the reader at each line, never polled)."""

        def found() -> list[str]:
            return [line for line in self.stderr if needle in line]

        with self._new_line:
            if not self._new_line.wait_for(lambda: found() or self._stderr_ended, timeout=timeout) or not found():
                raise AssertionError(f"no stderr line with {needle!r}")
            return found()

    def wait_for(self, kind: str, timeout: float = START_TIMEOUT_S) -> dict:
        """The next stdout event of this type (the server's own announcement, not a guess at how long it takes)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {kind!r} event in {timeout} s; stderr:\n" + "\n".join(self.stderr)) from None
            if event["type"] == kind:
                return event
            if event["type"] == "eof":
                raise AssertionError(f"the server ended before {kind!r}; stderr:\n" + "\n".join(self.stderr))

    def ready(self) -> ServerProcess:
        self.wait_for("ready")
        return self

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        return parts.hostname, parts.port

    @property
    def pid(self) -> int:
        """The command's process (not the launcher's, when forked): its report is written before it runs."""
        return reported_pid(self._report)

    def rss(self) -> int:
        """The process's resident set (bytes), from /proc."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        code = self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(timeout)
        shutil.rmtree(self._report.parent, ignore_errors=True)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self._report.parent, ignore_errors=True)


def call(
    server: ServerProcess,
    method: str,
    path: str,
    body: dict | bytes | None = None,
    headers: dict | None = None,
    timeout: float = 120,
) -> tuple[int, dict, bytes]:
    """One HTTP request on a new connection: (status, headers lowercased, body)."""
    connection = http.client.HTTPConnection(*server.address, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    sent = {"Content-Type": "application/json", **(headers or {})} if data is not None else dict(headers or {})
    try:
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def call_json(server: ServerProcess, method: str, path: str, body=None, headers=None) -> tuple[int, dict]:
    status, _, data = call(server, method, path, body, headers)
    return status, json.loads(data) if data else {}


def metrics(text: str) -> dict[str, float]:
    """Prometheus' text format as {sample with its labels: value}, e.g. 'gemma_embed_queue_items': 0.0."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            sample, _, value = line.rpartition(" ")
            samples[sample] = float(value)
    return samples


def run_cli(*args: str, timeout: float = START_TIMEOUT_S) -> subprocess.Popen:
    """A `gemma-embed` command started now (wait on it with `finish`)."""
    return subprocess.Popen([EXE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def finish(proc: subprocess.Popen, timeout: float = START_TIMEOUT_S) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


def write_captioned_images(folder: Path) -> Path:
    """Three sample images and a parquet table naming them, with captions (one hostile): the gallery's collection."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    names = ["landscape.jpg", "portrait.png", "square.webp"]
    for name in names:
        shutil.copy(SAMPLE_IMAGES / name, folder / name)
    captions = [HOSTILE_CAPTION, 'a portrait & some "quotes"', "a square picture"]
    table = folder / "captions.parquet"
    pq.write_table(pa.table({"image": names, "caption": captions}), table)
    return table


@contextlib.contextmanager
def chromium_browser():
    """The system Chromium driven by Playwright through `executable_path` (its own browser download cannot be
    reached), and Playwright's `expect`; the test skips, saying why, where either is missing."""
    import pytest

    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip)")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("no Chromium on this machine (apt-get install -y chromium): the gallery is not tried in a browser")
    with playwright_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable)
        try:
            yield browser, playwright_api.expect
        finally:
            browser.close()
