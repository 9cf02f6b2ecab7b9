"""The server's listening socket, and its one error line (a port in use, an address not this machine's). No
fastapi, uvicorn or torch: `serve` binds once before importing them, so a port in use is a usage error at once."""

from __future__ import annotations

import socket

from gemma_embed.errors import UsageError


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` (SO_REUSEADDR, as uvicorn binds), not yet listening; UsageError naming both
    options when it cannot be.

    The protocol is named (IPPROTO_TCP, not 0): asyncio turns Nagle's algorithm off (TCP_NODELAY) only on the
    connections of a socket whose `proto` says TCP, as getaddrinfo's sockets do. Without it a response's second
    write waited for the client's delayed ACK: every answer 40 ms late (measured on the 2-core AMD EPYC: one
    client's text requests to samples/tiny-embeddinggemma, 64 ms p50 with 19 ms spent in the server's own handler;
    issue 47's overload bench)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"--host {host} --port {port}: cannot listen there: {exc.strerror or exc}") from None
    return sock
