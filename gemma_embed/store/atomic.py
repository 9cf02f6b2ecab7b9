"""Whole-file writes: every file of an output appears atomically (a temporary file in the same folder, flushed,
fsynced, renamed) or not at all, and, like any other tool's output, with the permissions the umask gives (0644
under umask 022). A leaf module: the file layouts (`layout`, `tensors_file`) and the exporters build on it."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from gemma_embed.errors import RunError

T = TypeVar("T")


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file handle whose content appears at `path` whole when the block ends, or not at all.

    The temporary file is created with mode 0666 less the umask, as `open()` would create `path` itself (a
    `mkstemp` file is always 0600, and would stay so after the rename).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` for a writer that wants a file name (numpy's memmap, pyarrow); it becomes
    `path` when the block ends without error, or is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file whole or not at all."""
    with atomic_file(path) as fh:
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
