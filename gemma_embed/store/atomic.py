"""Whole-file writes of an output's small files, and the one-line error for a failed write. Every file of an output
appears atomically (the seam's `Location.atomic_write`: a temporary file in the same folder, flushed, fsynced,
renamed) or not at all, and, like any other tool's output, with the permissions the umask gives (0644 under umask
022). A leaf module: the file layouts (`layout`, `tensors_file`) and the exporters build on it."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from gemma_embed.errors import RunError
from gemma_embed.locations import Location, location

T = TypeVar("T")


def atomic_write_text(path: str | os.PathLike | Location, text: str) -> None:
    """Write a text file (UTF-8) whole or not at all."""
    with location(path).atomic_write() as fh:
        fh.write(text.encode("utf-8"))


def guarded_write(action: Callable[[], T], where: object) -> T:
    """Run a write; a full disk or unwritable folder ends the run with one clear line (parts stay intact)."""
    try:
        return action()
    except OSError as exc:
        raise RunError(
            f"{where}: cannot write: {exc.strerror or exc}; finished parts are kept, free space "
            f"and run again with --resume"
        ) from exc
