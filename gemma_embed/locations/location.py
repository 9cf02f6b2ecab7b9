"""`Location`: a place bytes are read from or written to, as a small picklable value (protocol, path).

`location(value)` parses a string once, as fsspec's `url_to_fs` splits a URL: `PROTOCOL://PATH` names a location
on that protocol's filesystem (`s3://bucket/a/b.tar`: protocol "s3", path "bucket/a/b.tar"); anything else (and
`file://PATH`) is a local path. Path arithmetic works on the path with the protocol kept (`parent`, `name`,
`suffix`, `with_name`, `/`), where pathlib would collapse `s3://` to `s3:/`. A local path is normalised as pathlib
normalises it (`./a//b/` is `a/b`), so names the tool derives and writes are the ones it wrote before.

Every operation is the location's filesystem's (`Location.fs`, base.Files), bound to its path. Only local files are
implemented; any other protocol is refused when first used, in one line from one place (`filesystem_for`), so
object storage is a matter of adding its filesystem there. A local location is also an `os.PathLike` (libraries
that take a file name accept it) equal to the `pathlib.Path` of the same path, so what the library hands back
(outputs, parts, index files) compares and opens as the paths it handed back before.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any, BinaryIO

from gemma_embed.errors import UsageError
from gemma_embed.locations.base import Files
from gemma_embed.locations.local import LocalFiles

LOCAL = "file"
LOCAL_PROTOCOLS = frozenset({"file", "local"})  # fsspec's names of its local filesystem
_PROTOCOL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")  # a URL scheme (one letter would be a Windows drive)
# What each protocol would need, for the one line that refuses it (fsspec's implementations of them).
REMOTE_NEEDS = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "hf": "huggingface_hub's HfFileSystem",
    "http": "fsspec's HTTP filesystem (aiohttp)",
    "https": "fsspec's HTTP filesystem (aiohttp)",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
}
_LOCAL_FILES = LocalFiles()


class UnsupportedLocation(UsageError):
    """A location on a protocol the tool cannot open (yet): `LOCATION: REASON`. Where a location is data (a path
    list on stdin, a table's path cell) the item fails with the reason; on the command line it is a usage error."""

    def __init__(self, where: Location, reason: str) -> None:
        self.where, self.reason = where, reason
        super().__init__(f"{where}: {reason}")


def split_protocol(text: str) -> tuple[str | None, str]:
    """(protocol, path) of a location string; protocol None for a local path."""
    match = _PROTOCOL.match(text)
    if match is None:
        return None, text
    return match.group(1).lower(), text[match.end() :]


def _normal(path: str) -> str:
    return str(PurePosixPath(path))


def filesystem_for(where: Location) -> Files:
    """The filesystem of a location's protocol: local files; for any other protocol (not supported yet), the one
    error that says so, naming the location (`UnsupportedLocation`, a UsageError)."""
    if where.protocol == LOCAL:
        return _LOCAL_FILES
    needs = REMOTE_NEEDS.get(where.protocol)
    if needs is None:
        raise UnsupportedLocation(where, f"{where.protocol}:// locations are not supported (local paths only)")
    raise UnsupportedLocation(where, f"{where.protocol}:// locations need {needs} (not supported yet)")


class Location:
    """A location: `protocol` ("file" for local paths) and the `path` on that protocol's filesystem."""

    __slots__ = ("protocol", "path")
    protocol: str
    path: str

    def __init__(self, protocol: str, path: str) -> None:
        object.__setattr__(self, "protocol", protocol)
        object.__setattr__(self, "path", path)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Location is immutable")

    def __reduce__(self) -> tuple:
        return (Location, (self.protocol, self.path))

    # ------------------------------------------------------------------------------------------ as a value
    @property
    def is_local(self) -> bool:
        return self.protocol == LOCAL

    def __str__(self) -> str:
        return self.path if self.is_local else f"{self.protocol}://{self.path}"

    def __repr__(self) -> str:
        return f"Location({str(self)!r})"

    def __fspath__(self) -> str:
        """The local path; a remote location has none (a library that opens by name must not get it)."""
        if not self.is_local:
            raise TypeError(f"{self}: not a local file")
        return self.path

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Location):
            return (self.protocol, self.path) == (other.protocol, other.path)
        if isinstance(other, os.PathLike) and self.is_local:  # a pathlib.Path of the same path
            return PurePosixPath(self.path) == PurePosixPath(os.fspath(other))
        return NotImplemented

    def __hash__(self) -> int:
        # Equal to a Path of the same path, so hashed as one.
        return hash(PurePosixPath(self.path)) if self.is_local else hash((self.protocol, self.path))

    # ------------------------------------------------------------------------------------------ arithmetic
    def _with_path(self, path: str) -> Location:
        return Location(self.protocol, _normal(path))

    @property
    def _pure(self) -> PurePosixPath:
        return PurePosixPath(self.path)

    @property
    def name(self) -> str:
        return self._pure.name

    @property
    def suffix(self) -> str:
        return self._pure.suffix

    @property
    def suffixes(self) -> list[str]:
        return self._pure.suffixes

    @property
    def stem(self) -> str:
        return self._pure.stem

    @property
    def parent(self) -> Location:
        return self._with_path(str(self._pure.parent))

    def with_name(self, name: str) -> Location:
        """The sibling named `name` (`s3://b/a/x.tar` -> `s3://b/a/NAME`)."""
        return self._with_path(str(self._pure.with_name(name)))

    def with_suffix(self, suffix: str) -> Location:
        return self._with_path(str(self._pure.with_suffix(suffix)))

    def __truediv__(self, part: str) -> Location:
        return self._with_path(str(self._pure / part))

    def relative_to(self, other: Location) -> str:
        """This location's path under `other`'s, with forward slashes (ValueError when it is not under it)."""
        if other.protocol != self.protocol:
            raise ValueError(f"{self} is not under {other}")
        return self._pure.relative_to(other.path).as_posix()

    def is_relative_to(self, other: Location) -> bool:
        return other.protocol == self.protocol and self._pure.is_relative_to(other.path)

    def is_absolute(self) -> bool:
        return not self.is_local or self._pure.is_absolute()

    def expanduser(self) -> Location:
        """`~` and `~user` expanded in a local path (a remote path has no home)."""
        return self._with_path(os.path.expanduser(self.path)) if self.is_local else self

    # ------------------------------------------------------------------------------------------ fsspec's
    @property
    def fs(self) -> Files:
        return filesystem_for(self)

    def info(self) -> dict[str, Any]:
        return self.fs.info(self.path)

    def exists(self) -> bool:
        return self.fs.exists(self.path)

    def lexists(self) -> bool:
        return self.fs.lexists(self.path)

    def isdir(self) -> bool:
        return self.fs.isdir(self.path)

    def isfile(self) -> bool:
        return self.fs.isfile(self.path)

    def islink(self) -> bool:
        return self.fs.islink(self.path)

    def size(self) -> int:
        return self.fs.size(self.path)

    def ls(self) -> list[Location]:
        """The folder's entries, sorted by name."""
        return [self / os.path.basename(entry) for entry in self.fs.ls(self.path)]

    def walk(self) -> Iterator[tuple[Location, list[str], list[str]]]:
        """(folder, its folder names, its other names) from this folder down; sort or prune the folder names in
        place to steer the walk."""
        for root, dirs, files in self.fs.walk(self.path):
            yield self._with_path(root), dirs, files

    def glob(self, pattern: str) -> list[Location]:
        """The folder's entries whose name matches `pattern` (fnmatch, case-sensitive; one level), sorted."""
        if "/" in pattern:
            raise ValueError(f"{pattern!r}: a pattern for names in one folder")
        return [entry for entry in self.ls() if fnmatch.fnmatchcase(entry.name, pattern)]

    def open(self, mode: str = "rb", **kwargs: Any) -> Any:
        """fsspec's open: a file object (binary modes give a seekable file: ranged reads are seek and read)."""
        return self.fs.open(self.path, mode, **kwargs)

    def cat_file(self, start: int | None = None, end: int | None = None) -> bytes:
        return self.fs.cat_file(self.path, start, end)

    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.path)

    def read_text(self, encoding: str | None = None, errors: str | None = None) -> str:
        with self.open("r", encoding=encoding, errors=errors) as fh:
            return fh.read()

    def write_bytes(self, data: bytes) -> None:
        """fsspec's write_bytes (pipe_file): a plain write in place; the tool's own files use `atomic_write`."""
        with self.open("wb") as fh:
            fh.write(data)

    def rm_file(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def rm(self, recursive: bool = False) -> None:
        self.fs.rm(self.path, recursive)

    def makedirs(self, exist_ok: bool = False) -> None:
        self.fs.makedirs(self.path, exist_ok)

    def fsspec(self) -> tuple[Any, str]:
        """(fsspec filesystem, path) for a library that takes one (pyarrow, datasets): `fsspec.core.url_to_fs`."""
        import fsspec.core  # type: ignore[import-untyped]

        return fsspec.core.url_to_fs(os.path.abspath(self.path) if self.is_local else str(self))

    # ------------------------------------------------------------------------------------------ the tool's
    def regular_file(self, what: str = "a media file") -> os.stat_result:
        return self.fs.regular_file(self.path, what)

    def open_input(self) -> BinaryIO:
        return self.fs.open_input(self.path)

    def facts(self) -> dict[str, Any]:
        return self.fs.facts(self.path)

    def atomic_write(self) -> contextlib.AbstractContextManager[BinaryIO]:
        return self.fs.atomic_write(self.path)

    def temp_path(self) -> contextlib.AbstractContextManager[str]:
        return self.fs.temp_path(self.path)

    def open_lock(self) -> int:
        return self.fs.open_lock(self.path)

    def names(self, fd: int) -> bool:
        return self.fs.names(self.path, fd)

    def probe_folder(self, name: str) -> None:
        self.fs.probe_folder(self.path, name)

    def realpath(self) -> Location:
        return self._with_path(self.fs.realpath(self.path))

    def local_path(self) -> str:
        return self.fs.local_path(self.path)


def location(where: str | os.PathLike | Location) -> Location:
    """The location a string (or path, or Location) names. Nothing is checked here: an unsupported protocol is
    refused when the location is first used (`filesystem_for`)."""
    if isinstance(where, Location):
        return where
    text = os.fsdecode(os.fspath(where))
    protocol, path = split_protocol(text)
    if protocol is None or protocol in LOCAL_PROTOCOLS:
        return Location(LOCAL, _normal(path))
    return Location(protocol, _normal(path))
