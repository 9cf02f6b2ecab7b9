"""The server's listening socket, and its one error line (a port in use, an address not this machine's). No
fastapi, uvicorn or torch: `serve` binds once before importing them, so a port in use is a usage error at once."""

from __future__ import annotations

import socket

from gemma_embed.errors import UsageError


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` (SO_REUSEADDR, as uvicorn binds), not yet listening; UsageError naming both
    options when it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"--host {host} --port {port}: cannot listen there: {exc.strerror or exc}") from None
    return sock
