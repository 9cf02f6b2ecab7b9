"""Start, run and stop the server: bind, load the model in the queue's worker thread, answer until SIGTERM or
Ctrl-C, then finish what is in flight within the grace period and return 0.

uvicorn runs the application; its own signal handling is replaced (`_Server.capture_signals`): uvicorn re-raises a
caught SIGTERM once it has shut down, which would end the process with 143 after a clean stop. Here the first
SIGINT, SIGTERM or SIGHUP stops accepting connections and lets the requests in flight finish for up to `--grace`
seconds (uvicorn's `timeout_graceful_shutdown`; what is still running then is cancelled); a second one ends the
wait at once. The socket is bound here, before uvicorn starts, so `--port 0` gets a free port that is known (and
announced) before the first request.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable

import uvicorn

from gemma_embed.config import RunConfig
from gemma_embed.errors import UsageError
from gemma_embed.serve.app import loopback_hosts, make_app
from gemma_embed.serve.collections import open_collections
from gemma_embed.serve.metrics import Metrics
from gemma_embed.serve.service import Service
from gemma_embed.serve.settings import ServeConfig

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _bind(host: str, port: int) -> socket.socket:
    from gemma_embed.serve.listen import bind

    sock = bind(host, port)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run(
    settings: ServeConfig,
    run_options: dict,
    announce: Callable[[dict], None],
    log: Callable[[str], None] | None = None,
) -> int:
    """Serve the model `run_options` name (RunConfig fields; without `model`, the first output's) and
    `settings.outputs` until stopped; 0 after a clean stop. `announce` gets the
    machine-readable events (listening, ready, stopped), `log` the human lines (access log, notes); None: quiet.
    UsageError: the server could not start (a missing extra, an unreadable output, a port in use, a model that
    cannot load)."""
    collections = open_collections(settings.outputs)
    config = _run_config(run_options, collections)
    metrics = Metrics()
    started = time.monotonic()
    server: _Server | None = None

    def on_ready(failure: BaseException | None) -> None:
        if failure is not None:
            if server is not None:
                server.should_exit = True
            return
        announce({"type": "ready", "model": str(config.model), "seconds": round(time.monotonic() - started, 3)})
        if log is not None:
            log(f"note: {config.model} loaded in {time.monotonic() - started:.1f} s: ready")

    service = Service(config, settings, collections, metrics, on_ready, log)
    sock = _bind(settings.host, settings.port)
    app = make_app(service, metrics, log, loopback_hosts(settings.host, sock.getsockname()[1]))
    uvicorn_config = uvicorn.Config(
        app,
        lifespan="off",
        access_log=False,
        log_config=None,
        log_level="warning",
        timeout_graceful_shutdown=max(0.0, settings.grace),
        timeout_keep_alive=5,
        server_header=False,
    )
    server = _Server(uvicorn_config, on_stop=service.stop_fetching)
    _route_uvicorn_logs(log)
    url = _url(sock)
    service.start()
    announce({"type": "listening", "url": url, "model": str(config.model), "outputs": list(collections)})
    if log is not None:
        log(f"note: serving {config.model} on {url} (loading the model)")
        if settings.host not in LOOPBACK and settings.key() is None:
            log(f"warning: listening on {settings.host} with no --api-key: anyone who reaches it can use it")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        stopping = time.monotonic()
        since = server.stop_asked or stopping  # the grace counts from the signal
        service.close(timeout=max(0.0, settings.grace - (stopping - since)))
    failure = service.batcher.failure
    if failure is not None:
        if isinstance(failure, UsageError):
            raise failure
        raise UsageError(f"{config.model}: the model could not be loaded: {failure}") from failure
    announce({"type": "stopped", "seconds": round(time.monotonic() - stopping, 3)})
    return 0


def _run_config(run_options: dict, collections: dict) -> RunConfig:
    """The run options with their model: --model, else the one the first --output was made with (as `gemma-embed
    search` takes it); every output's model must be it."""
    from gemma_embed.search import check_query_settings

    options = dict(run_options)
    if options.get("model") is None:
        if not collections:
            raise UsageError("give --model ID|DIR, or --output OUT.safetensors to serve the model it was made with")
        first = next(iter(collections.values()))
        options.update(model=first.model, revision=options.get("revision") or first.header.get("revision") or None)
    try:
        config = RunConfig(modality="text", **options)  # each route sets its own command
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for collection in collections.values():
        made = {"model": config.model, "revision": config.revision or ""}
        check_query_settings(
            {name: collection.header.get(name, "") for name in made}, made, f"--output {collection.path}"
        )
    return config


def _route_uvicorn_logs(log: Callable[[str], None] | None) -> None:
    """uvicorn's warnings and errors as the tool's own lines (`warning: ...`), nothing under --quiet."""

    class _Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if log is not None:
                log(f"{record.levelname.lower()}: {' '.join(record.getMessage().split())}")

    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers = [_Lines()]
        logger.propagate = False


class _Server(uvicorn.Server):
    """uvicorn's Server with the tool's signal handling (see the module's docstring). `on_stop` runs (in a thread of
    its own) at the first signal: the media fetches in flight end then, not when the grace runs out."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None] | None = None):
        super().__init__(config)
        self.on_stop = on_stop
        self.stop_asked: float | None = None

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def stop(signum, frame) -> None:
            if self.should_exit:
                self.force_exit = True  # a second signal: stop waiting for what is in flight
            self.should_exit = True
            if self.stop_asked is None:
                self.stop_asked = time.monotonic()
                if self.on_stop is not None:
                    threading.Thread(target=self.on_stop, name="gemma-embed-stop", daemon=True).start()

        previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
