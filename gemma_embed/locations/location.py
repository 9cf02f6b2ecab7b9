"""`Location`: a place bytes are read from or written to, as a small picklable value (protocol, path).

`location(value)` parses a string once, as fsspec's `url_to_fs` splits a URL: `PROTOCOL://PATH` names a location
on that protocol's filesystem (`s3://bucket/a/b.tar`: protocol "s3", path "bucket/a/b.tar"); anything else (and
`file://PATH`) is a local path. Path arithmetic keeps the protocol (`parent`, `name`, `suffix`, `with_name`, `/`),
where pathlib would collapse `s3://` to `s3:/`.

Two kinds, one interface (the `Location` base): a local location is a `LocalLocation`, which *is* a
`pathlib.PosixPath` (normalised as pathlib normalises: `./a//b/` is `a/b`), so what the library hands back (outputs,
parts, index files) is the `Path` it handed back before, and every library that takes a file name accepts it; any
other protocol gives a `RemoteLocation` (protocol and path, its own arithmetic on the path, no `os.fspath`: a library
that opens by name must not be given it; a URL's path is kept as written, query string included, and its name is
the path's without the query). Every operation is the location's filesystem's (`Location.fs`, base.Files), bound
to its path, with fsspec's names: local files (local.py), or fsspec's filesystem of the protocol (remote.py). A
protocol the tool does not know, or whose client is not installed, is refused when first used, in one line from
one place (`filesystem_for`), naming the extra that installs it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import PosixPath, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO

from gemma_embed.errors import UsageError
from gemma_embed.locations.base import Files
from gemma_embed.locations.local import LocalFiles
from gemma_embed.locations.remote import files_for
from gemma_embed.redact import redact

LOCAL = "file"
LOCAL_PROTOCOLS = frozenset({"file", "local"})  # fsspec's names of its local filesystem
_PROTOCOL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")  # a URL scheme (one letter would be a Windows drive)
URL_PROTOCOLS = frozenset({"http", "https"})  # a location that is a URL: its path is kept as written
_LOCAL_FILES = LocalFiles()


class UnsupportedLocation(UsageError, ValueError):
    """A location on a protocol the tool cannot open (unknown, or its client not installed): `LOCATION: REASON`.
    Where a location is data (a path list on stdin, a table's path cell) the item fails with the reason; on the
    command line it is a usage error. A ValueError too (a value the tool cannot use), as readers that name a bad
    file in one line catch."""

    def __init__(self, where: Location, reason: str) -> None:
        self.where, self.reason = where, reason
        super().__init__(f"{redact(str(where))}: {reason}")


def split_protocol(text: str) -> tuple[str | None, str]:
    """(protocol, path) of a location string; protocol None for a local path."""
    match = _PROTOCOL.match(text)
    if match is None:
        return None, text
    return match.group(1).lower(), text[match.end() :]


def filesystem_for(where: Location) -> Files:
    """The filesystem of a location's protocol: local files, or fsspec's implementation of the protocol
    (remote.py); where the protocol is unknown or its client is not installed, the one error that says so,
    naming the location and the extra to install (`UnsupportedLocation`, a UsageError)."""
    if where.protocol == LOCAL:
        return _LOCAL_FILES
    found = files_for(where.protocol)
    if isinstance(found, str):
        raise UnsupportedLocation(where, found)
    return found


class Location:
    """What every location offers: its `protocol` ("file" for local paths), its `path` on that protocol's
    filesystem, and the filesystem's operations bound to it (fsspec's, then the tool's)."""

    __slots__ = ()

    @property
    def protocol(self) -> str:
        raise NotImplementedError

    @property
    def path(self) -> str:
        raise NotImplementedError

    def _at(self, path: str) -> Location:
        """Another location on the same filesystem."""
        raise NotImplementedError

    if TYPE_CHECKING:  # pathlib's arithmetic (LocalLocation) or RemoteLocation's own; not defined here, so a
        # LocalLocation keeps pathlib's

        @property
        def name(self) -> str: ...
        @property
        def suffix(self) -> str: ...
        @property
        def suffixes(self) -> list[str]: ...
        @property
        def stem(self) -> str: ...
        @property
        def parent(self) -> Location: ...
        def with_name(self, name: str) -> Location: ...
        def with_suffix(self, suffix: str) -> Location: ...
        def __truediv__(self, part: str) -> Location: ...
        def relative_to(self, other: Location) -> PurePosixPath: ...
        def is_relative_to(self, other: Location) -> bool: ...
        def is_absolute(self) -> bool: ...
        def expanduser(self) -> Location: ...

    @property
    def is_local(self) -> bool:
        return self.protocol == LOCAL

    @property
    def fs(self) -> Files:
        return filesystem_for(self)

    # ------------------------------------------------------------------------------------------ fsspec's
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
            yield self._at(root), dirs, files

    def glob(self, pattern: str) -> list[Location]:
        """The folder's entries whose name matches `pattern` (fnmatch, case-sensitive; one level), sorted."""
        if "/" in pattern:
            raise ValueError(f"{pattern!r}: a pattern for names in one folder")
        return [entry for entry in self.ls() if fnmatch.fnmatchcase(entry.name, pattern)]

    def matches(self) -> list[Location]:
        """The locations this one's path matches as a glob pattern (fsspec's: `*`, `?`, `[...]`, `**` across
        folders), sorted."""
        return [self._at(path) for path in self.fs.glob(self.path)]

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

    def write_bytes(self, data: bytes) -> int:
        """fsspec's write_bytes (pipe_file): a plain write in place; the tool's own files use `atomic_write`."""
        with self.open("wb") as fh:
            return fh.write(data)

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

    def input_by_name(self) -> contextlib.AbstractContextManager[tuple[BinaryIO, str]]:
        return self.fs.input_by_name(self.path)

    def facts(self) -> dict[str, Any]:
        return self.fs.facts(self.path)

    def size_and_time(self, fh: BinaryIO) -> tuple[int, int]:
        """(size, modification time in ns) of this location opened as `fh` (`open_input`, `input_by_name`)."""
        return self.fs.size_and_time(self.path, fh)

    def atomic_write(self, own_folder: bool = False) -> contextlib.AbstractContextManager[BinaryIO]:
        return self.fs.atomic_write(self.path, own_folder)

    def temp_path(self, own_folder: bool = False) -> contextlib.AbstractContextManager[str]:
        return self.fs.temp_path(self.path, own_folder)

    def own_folder(self, create: bool = True) -> None:
        self.fs.own_folder(self.path, create)

    def fetch(self, limit: int | None = None, timeout: float | None = None) -> bytes:
        """The whole file in one read, refused unread when over `limit` (`TooLarge`); `FetchFailed` otherwise."""
        return self.fs.fetch(self.path, limit, timeout)

    def open_lock(self) -> int:
        return self.fs.open_lock(self.path)

    def names(self, fd: int) -> bool:
        return self.fs.names(self.path, fd)

    def drop_lock(self) -> None:
        self.fs.drop_lock(self.path)

    @property
    def writable(self) -> bool:
        """Whether outputs can be written on this location's filesystem (not on http(s) or hf://)."""
        return self.fs.writable

    def holds_files(self) -> bool:
        """Whether new files can go in this folder (local: it exists; object storage: its bucket does)."""
        return self.fs.holds_files(self.path)

    def probe_folder(self, name: str) -> None:
        self.fs.probe_folder(self.path, name)

    def realpath(self) -> Location:
        return self._at(self.fs.realpath(self.path))

    def local_path(self) -> str:
        return self.fs.local_path(self.path)


class LocalLocation(Location, PosixPath):  # type: ignore[misc] # pathlib's arithmetic, the seam's operations
    """A local path: a `pathlib.PosixPath` (its arithmetic, equality and hashing, `os.fspath`) whose operations are
    the seam's, on the local filesystem."""

    __slots__ = ()

    @property
    def protocol(self) -> str:
        return LOCAL

    @property
    def path(self) -> str:
        return str(self)

    def _at(self, path: str) -> Location:
        return LocalLocation(path)

    def open(  # type: ignore[override]
        self,
        mode: str = "r",
        buffering: int = -1,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> Any:
        """pathlib's open (text by default), through the seam."""
        return self.fs.open(self.path, mode, buffering=buffering, encoding=encoding, errors=errors, newline=newline)


class RemoteLocation(Location):
    """A location on another protocol's filesystem: the protocol and the path on it, with pathlib's arithmetic
    applied to the path alone."""

    __slots__ = ("_protocol", "_path")
    _protocol: str
    _path: str

    def __init__(self, protocol: str, path: str) -> None:
        object.__setattr__(self, "_protocol", protocol)
        object.__setattr__(self, "_path", path if protocol in URL_PROTOCOLS else str(PurePosixPath(path)))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Location is immutable")

    def __reduce__(self) -> tuple:
        return (RemoteLocation, (self._protocol, self._path))

    @property
    def protocol(self) -> str:
        return self._protocol

    @property
    def path(self) -> str:
        return self._path

    def _at(self, path: str) -> Location:
        return RemoteLocation(self._protocol, path)

    def __str__(self) -> str:
        return f"{self._protocol}://{self._path}"

    def __repr__(self) -> str:
        return f"RemoteLocation({redact(str(self))!r})"

    def __fspath__(self) -> str:
        raise TypeError(f"{self}: not a local file (a library that opens by name cannot read it)")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RemoteLocation):
            return (self._protocol, self._path) == (other._protocol, other._path)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._protocol, self._path))

    # ------------------------------------------------------------------------------------------ arithmetic
    @property
    def _pure(self) -> PurePosixPath:
        """The path as a pure path: a URL's without its query string and fragment."""
        if self._protocol in URL_PROTOCOLS:
            return PurePosixPath(re.split(r"[?#]", self._path, maxsplit=1)[0])
        return PurePosixPath(self._path)

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
        return self._at(str(self._pure.parent))

    def with_name(self, name: str) -> Location:
        """The sibling named `name` (`s3://b/a/x.tar` -> `s3://b/a/NAME`)."""
        return self._at(str(self._pure.with_name(name)))

    def with_suffix(self, suffix: str) -> Location:
        return self._at(str(self._pure.with_suffix(suffix)))

    def __truediv__(self, part: str) -> Location:
        return self._at(str(self._pure / part))

    def relative_to(self, other: Location) -> PurePosixPath:
        """This location's path under `other`'s (ValueError when it is not under it), as pathlib gives it."""
        if other.protocol != self._protocol:
            raise ValueError(f"{self} is not under {other}")
        return self._pure.relative_to(other.path)

    def is_relative_to(self, other: Location) -> bool:
        return other.protocol == self._protocol and self._pure.is_relative_to(other.path)

    def is_absolute(self) -> bool:
        return True

    def expanduser(self) -> Location:
        return self  # a remote path has no home


def location(where: str | os.PathLike | Location) -> Location:
    """The location a string (or path, or Location) names. Nothing is checked here: an unsupported protocol is
    refused when the location is first used (`filesystem_for`)."""
    if isinstance(where, Location):
        return where
    text = os.fsdecode(os.fspath(where))
    protocol, path = split_protocol(text)
    if protocol is None:
        return LocalLocation(text)
    if protocol in LOCAL_PROTOCOLS:
        return LocalLocation(path)
    return RemoteLocation(protocol, path)
