"""`gemma-embed serve`: the batch tool's engine behind an HTTP server (the optional [serve] extra: FastAPI, uvicorn,
prometheus-client). Nothing outside this package imports fastapi.

- `settings.py`: the server's options (pure);
- `batcher.py`: the bounded queue whose worker thread merges concurrent requests into the engine's windows;
- `service.py`: what each route does, without HTTP (embed, search, waiting while watching the client);
- `openai_shapes.py`: OpenAI's request, response and error shapes; `media_urls.py`: data: and http(s) URLs;
- `collections.py`: the outputs named with --output, searched and shown; `gallery.py` + `static/`: the page;
- `metrics.py`: Prometheus; `auth.py`: the API key; `app.py`: the FastAPI routes; `server.py`: uvicorn, signals;
  `listen.py`: the listening socket (no fastapi: a port in use is one line at once).
"""

from __future__ import annotations

from collections.abc import Callable

from gemma_embed.errors import UsageError

EXTRA = "pip install 'gemma-embed[serve]'"
NEEDED = ("fastapi", "uvicorn", "prometheus_client")


def require_extra() -> None:
    """UsageError in one line, naming the extra, when a package the server needs is missing."""
    import importlib.util

    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"serve needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed: {EXTRA}"
        )


def serve(
    settings, run_options: dict, announce: Callable[[dict], None], log: Callable[[str], None] | None = None
) -> int:
    """Serve a model with `settings` (a ServeConfig) until SIGTERM or Ctrl-C: 0 after a clean stop. `run_options`
    are RunConfig fields (`model`, `device`, `dim`, ...); without `model`, the first output's. `announce` gets the
    machine-readable events, `log` the human lines (None: quiet)."""
    require_extra()
    from gemma_embed.serve.listen import bind

    bind(settings.host, settings.port).close()  # a port in use: one line now, before seconds of imports
    from gemma_embed.serve.server import run

    return run(settings, run_options, announce, log)
