"""What a file of an output must be, and the one-line error when it is not (`DamagedFile`): a leaf module, read
by the layouts (`layout`, `tensors_file`) and the readers before they open anything."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from gemma_embed import FORMAT
from gemma_embed.errors import NotOurs
from gemma_embed.locations import Location, location

# The kind of a file that is no output of this tool at all (another tool's file, a text, random bytes): nothing of
# gemma-embed's to rebuild, so no advice to rebuild it.
NOT_AN_OUTPUT = "gemma-embed output"
FORMAT_NAME = FORMAT.split("/")[0] + "/"  # what every version's format field starts with


class DamagedFile(NotOurs, ValueError):
    """A file that should be one of an output's (or a part) and is not: `FILE: not a KIND (REASON); FIX`.

    A usage error of the kind `errors.NOT_OURS` (exit 2: the run cannot start on it) and a ValueError (what
    readers raised before). `ours`: whether the file is a gemma-embed file at all (damaged, or of another
    version), as opposed to someone else's (`NOT_AN_OUTPUT`)."""

    def __init__(self, file: str | os.PathLike | Location, reason: str, kind: str = f"{FORMAT} file", fix: str = ""):
        self.file, self.reason, self.kind, self.fix = location(file), " ".join(str(reason).split()), kind, fix
        super().__init__(f"{file}: not a {kind} ({self.reason})" + (f"; {fix}" if fix else ""))

    @property
    def ours(self) -> bool:
        return self.kind != NOT_AN_OUTPUT

    def told(self, kind: str | None = None, fix: str = "") -> DamagedFile:
        """The same finding, for a caller that knows what the file was meant to be and how to get past it."""
        return DamagedFile(self.file, self.reason, kind or self.kind, fix)


_NOT_REGULAR = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def require_regular_file(file: str | os.PathLike | Location, kind: str = f"{FORMAT} file", fix: str = "") -> None:
    """Before opening a file of an output: a folder would fail oddly ("No such device") and a FIFO would block
    the open. A missing file is a FileNotFoundError naming it."""
    info = location(file).info()
    if info["type"] != "file":
        mode = info.get("mode", stat.S_IFDIR if info["type"] == "directory" else 0)
        raise DamagedFile(file, f"is {_NOT_REGULAR.get(stat.S_IFMT(mode), 'not a regular file')}", kind, fix)


def read_json(file: str | os.PathLike | Location, kind: str, fix: str = "") -> Any:
    """A small JSON file of an output (index, manifest), or a `DamagedFile` naming it."""
    require_regular_file(file, kind, fix)
    try:
        return json.loads(location(file).read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedFile(file, f"not valid JSON: {exc}", kind, fix) from None


# How far into a file whose safetensors header cannot be read to look for gemma-embed's format field: the writer puts
# the run's metadata (a few hundred bytes to a few kB) before it, at the header's start.
HEAD_BYTES = 1 << 16


def looks_ours(file: Location) -> bool:
    """Whether a file whose safetensors header cannot be parsed still starts like a gemma-embed file: the 8-byte
    header length, then a header that opens as the writer opens it (`tensors_file.write_embedding_file`: the run's
    metadata first, its model first of all) or holds the format field (a damaged output), rather than anything else
    (a README, a pickle, random bytes)."""
    try:
        head = file.cat_file(0, 8 + HEAD_BYTES)[8:]
    except OSError:
        return False
    return head.startswith(b'{"__metadata__":{"model":') or f'"format":"{FORMAT_NAME}'.encode() in head
