"""What every implementation of the seam provides (`Files`), and the one error a location's kind can be.

`Files` names fsspec's methods (`info`, `exists`, `isdir`, `isfile`, `ls`, `walk`, `open`, `cat_file`, `rm_file`,
`rm`, `makedirs`), with fsspec's meaning: `info` is a dict with at least `name`, `size`, `type` ("file",
"directory" or "other") and `mtime` (None where the store keeps none); `glob` fsspec's (`*`, `?`, `[...]`, `**`
across folders), sorted; `open(path, "rb")` is a seekable file (ranged reads: seek, then read). Beyond
fsspec, what the tool needs of every location: the regular-file refusal, an input opened as a checked descriptor,
its facts for --resume (size, modification time, SHA-256), one whole-file read under a size limit and a timeout
(`fetch`: an item's bytes, `FetchFailed` with a reason that names no location), whole-file atomic writes, a
temporary file name for writers that open by name, a folder of the tool's own (`own_folder`; `own_folder=True`
writes into one), the output lock's file (`open_lock`, `names`, `drop_lock`), whether a folder can take new files
(`holds_files`) and the probe that it does. Paths are the
filesystem's own (`Location.path`), never a URL.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, BinaryIO, Protocol

HASH_BLOCK = 1 << 20


def content_facts(st: os.stat_result, fh: BinaryIO) -> dict[str, Any]:
    """Size, modification time and SHA-256 of an open file's content (read once, a block at a time): how
    `--resume` tells a changed file, whatever filesystem it is on."""
    import hashlib  # here: loading OpenSSL (16 ms on the busy 2-core machine) is for the runs that hash

    digest = hashlib.sha256()
    while block := fh.read(HASH_BLOCK):
        digest.update(block)
    return {"bytes": st.st_size, "mtime": st.st_mtime, "sha256": digest.hexdigest()}


class NotRegularFile(ValueError):
    """An input that is neither a regular file nor a folder: a FIFO, a device, a socket."""


class NotPlain(ValueError):
    """Where the tool makes a file or folder of its own (the output's lock, an unfinished run's parts folder), an
    entry it did not make: a symbolic link (never followed), a file with other names (hard links), something not a
    regular file or folder, or one another user owns. The message is the reason, without the path."""


class FetchFailed(OSError):
    """One read of a whole file (`Files.fetch`) failed: `reason` says why in words that name no location (a URL's
    query string may be a signature), `status` is the HTTP status where there was one, `transient` whether trying
    again may help (a timeout, a dropped connection, a 5xx or 429: the fetch stage retries those)."""

    def __init__(self, reason: str, status: int | None = None, transient: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.status, self.transient = reason, status, transient

    def __str__(self) -> str:
        return self.reason

    def __reduce__(self) -> tuple:
        return (type(self), (self.reason, self.status, self.transient))


class TooLarge(FetchFailed):
    """A file larger than the item limit: refused from its declared size, unread (`known`), or cut off once more
    than the limit had arrived (a body whose size was not declared)."""

    def __init__(self, size: int, limit: int, known: bool = True) -> None:
        self.size, self.limit, self.known = size, limit, known
        what = f"{size} bytes" if known else f"more than {limit} bytes (it declared no size)"
        super().__init__(f"it is {what}, over the {limit} bytes an item may have", None, False)

    def __reduce__(self) -> tuple:
        return (type(self), (self.size, self.limit, self.known))


class Files(Protocol):
    """A filesystem as the tool uses it: local files (local.py), and object storage and URLs through fsspec
    (remote.py)."""

    protocol: str
    writable: bool  # whether outputs can be written here (object storage: yes; http(s), hf: read-only)

    # fsspec's methods, with fsspec's meaning
    def info(self, path: str) -> dict[str, Any]: ...
    def exists(self, path: str) -> bool: ...
    def lexists(self, path: str) -> bool: ...
    def isdir(self, path: str) -> bool: ...
    def isfile(self, path: str) -> bool: ...
    def islink(self, path: str) -> bool: ...
    def size(self, path: str) -> int: ...
    def ls(self, path: str) -> list[str]: ...
    def walk(self, path: str) -> Iterator[tuple[str, list[str], list[str]]]: ...
    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any: ...
    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes: ...
    def rm_file(self, path: str) -> None: ...
    def rm(self, path: str, recursive: bool = False) -> None: ...
    def makedirs(self, path: str, exist_ok: bool = False) -> None: ...
    def glob(self, pattern: str) -> list[str]: ...

    # what the tool needs beyond fsspec
    def regular_file(self, path: str, what: str) -> os.stat_result: ...
    def open_input(self, path: str) -> BinaryIO: ...
    def input_by_name(self, path: str) -> contextlib.AbstractContextManager[tuple[BinaryIO, str]]: ...
    def facts(self, path: str) -> dict[str, Any]: ...
    def size_and_time(self, path: str, fh: BinaryIO) -> tuple[int, int]: ...
    def atomic_write(self, path: str, own_folder: bool = False) -> contextlib.AbstractContextManager[BinaryIO]: ...
    def temp_path(self, path: str, own_folder: bool = False) -> contextlib.AbstractContextManager[str]: ...
    def own_folder(self, path: str, create: bool = True) -> None: ...
    def fetch(self, path: str, limit: int | None, timeout: float | None) -> bytes: ...
    def open_lock(self, path: str) -> int: ...
    def names(self, path: str, fd: int) -> bool: ...
    def drop_lock(self, path: str) -> None: ...
    def holds_files(self, folder: str) -> bool: ...
    def probe_folder(self, folder: str, name: str) -> None: ...
    def realpath(self, path: str) -> str: ...
    def local_path(self, path: str) -> str: ...
