"""The server's own options (`gemma-embed serve`), declared once as config.py declares the runs' options: type,
default, help and check. The model options (`--model`, `--device`, `--dim`, ...) are the runs' own RunConfig fields.

Pure: no fastapi, no torch. The command line builds its parameters from these fields and the library reads them."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from gemma_embed.config import at_least, option, parse_item_bytes
from gemma_embed.locations import Location, location

API_KEY_VARIABLE = "GEMMA_EMBED_API_KEY"  # the key when --api-key is not given (kept out of `ps` and shell history)
SERVE = ("serve",)
SERVER = "Server"  # the help panel
MIB = 1 << 20


def parse_outputs(value: Iterable[str | os.PathLike | Location] | None) -> tuple[Location, ...]:
    """--output, repeated: the outputs to search and show, in the order given (locations of the seam)."""
    return tuple(location(v) for v in (value or ()))


def port_number(value: int) -> None:
    if not 0 <= int(value) <= 65535:
        raise ValueError(f"must be 0 (any free port) to 65535, got {value}")


def request_size(value: str | int | None) -> int:
    parsed = parse_item_bytes(value)
    if parsed is None:
        raise ValueError("give a size like 64MiB")
    return parsed


@dataclass(frozen=True)
class ServeConfig:
    """How the server listens, whom it answers and how much it holds; the model is a RunConfig's."""

    outputs: tuple[Location, ...] = option(
        (),
        "An output to search and show in the gallery (repeat).",
        commands=SERVE,
        panel=SERVER,
        long="--output",
        flags=("-o",),
        cli_type=list[str] | None,
        parse=parse_outputs,
        metavar="FILE",
    )
    host: str = option(
        "127.0.0.1", "Address to listen on (0.0.0.0: every interface).", commands=SERVE, panel=SERVER, metavar="ADDR"
    )
    port: int = option(
        8000, "Port (0: any free port, announced).", commands=SERVE, panel=SERVER, check=port_number, metavar="PORT"
    )
    api_key: str | None = option(
        None,
        f"Require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_VARIABLE}).",
        commands=SERVE,
        panel=SERVER,
        metavar="KEY",
    )
    queue_size: int = option(
        1024,
        "Items waiting or encoding at most; a request beyond gets 429.",
        commands=SERVE,
        panel=SERVER,
        check=at_least(1),
        metavar="N",
    )
    max_request_bytes: int = option(
        64 * MIB,
        "Largest request body (data: URLs included).",
        commands=SERVE,
        panel=SERVER,
        cli_type=str,
        cli_default="64MiB",
        parse=request_size,
        metavar="SIZE",
    )
    grace: float = option(
        30.0,
        "Seconds in-flight requests get to finish after SIGTERM or Ctrl-C.",
        commands=SERVE,
        panel=SERVER,
        check=at_least(0),
        metavar="S",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", parse_outputs(self.outputs))
        object.__setattr__(self, "max_request_bytes", request_size(self.max_request_bytes))
        for name, check in (("port", port_number), ("queue_size", at_least(1)), ("grace", at_least(0))):
            try:
                check(getattr(self, name))
            except ValueError as exc:
                raise ValueError(f"--{name.replace('_', '-')}: {exc}") from None

    def key(self) -> str | None:
        """The API key: --api-key, else the environment's; None (or empty): no key asked for."""
        return self.api_key or os.environ.get(API_KEY_VARIABLE) or None
