"""Object storage and URLs, the seam's second kind of filesystem: fsspec's implementation of each protocol behind
the same `Files` protocol as local files, so every source, writer and reader works on them unchanged.

- `s3://` (s3fs), `gs://` (gcsfs), `hf://` (huggingface_hub's HfFileSystem), `http://` and `https://` (fsspec's
  HTTP filesystem, aiohttp). Each client is an optional extra (`pip install 'gemma-embed[s3]'`, `[gcs]`, `[hf]`,
  `[http]`); a missing one is one line naming the extra (`CLIENTS`, `files_for`).
- Credentials and endpoints come from where each ecosystem keeps them, never from the tool: botocore's chain for
  s3 (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`, `~/.aws`, instance roles) and its
  `AWS_ENDPOINT_URL` (MinIO, moto, any S3-compatible store), google-auth for gs, `HF_TOKEN` or the hub's login for
  hf, and fsspec's own configuration for all of them (`~/.config/fsspec/*.json`, `FSSPEC_S3_ENDPOINT_URL`, ...:
  `fsspec.filesystem(protocol)` applies it). Nothing here records them (redact.py keeps them out of what is
  written).

How the tool's own needs map onto object storage:
- reads are ranged: `open`/`open_input` give fsspec's seekable file with a read-ahead cache of READ_BLOCK bytes,
  so a tar shard is streamed member by member and a parquet file read by its footer and the row groups asked
  for, never downloaded whole first;
- `fetch` reads one item whole under the item size limit (from the object's declared size, before any byte) and,
  for URLs, a timeout; it fails with a `FetchFailed` whose reason names no URL (a query string may be a
  signature) and says whether trying again may help;
- writes are whole-object uploads: `atomic_write` and `temp_path` write a local temporary file and upload it when
  the block ends without error (one PUT, or a multipart upload that completes at once), so a reader never sees a
  half-written file, and a failed write leaves nothing behind;
- a folder is a prefix: it needs no creating, and new files can go under any prefix of a bucket that exists
  (`holds_files`); http(s) and hf:// are read-only here;
- libraries that open by name (safetensors, faiss, numpy's memmap) get `local_path`: a copy downloaded once per
  process into a private temporary folder (removed at exit), keyed by the object's size and version tag;
- the output lock (`open_lock`) is a local file named after the location (a flock cannot be held on object
  storage): two runs on one machine into one output are refused as for local outputs; runs on different machines
  are not (docs/object-storage.md).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import importlib
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

from gemma_embed.locations.base import FetchFailed, TooLarge, content_facts

READ_BLOCK = 4 << 20  # the read-ahead of a streamed remote file: a few members of a shard per request
HTTP_CHUNK = 1 << 16
# HTTP statuses worth another try: the server is busy or failed for now (RFC 9110's 408, 429, 5xx).
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
HTTP = frozenset({"http", "https"})


class Client:
    """What a protocol needs: the module fsspec's implementation imports, and the extra that installs it."""

    def __init__(self, module: str, extra: str, what: str, writable: bool) -> None:
        self.module, self.extra, self.what, self.writable = module, extra, what, writable

    @property
    def installed(self) -> bool:
        try:
            importlib.import_module(self.module)
        except ImportError:
            return False
        return True

    def missing(self, protocol: str) -> str:
        return f"{protocol}:// locations need {self.what}: pip install 'gemma-embed[{self.extra}]'"


CLIENTS = {
    "s3": Client("s3fs", "s3", "s3fs", True),
    "s3a": Client("s3fs", "s3", "s3fs", True),
    "gs": Client("gcsfs", "gcs", "gcsfs", True),
    "gcs": Client("gcsfs", "gcs", "gcsfs", True),
    "hf": Client("huggingface_hub", "hf", "huggingface_hub's HfFileSystem", False),
    "http": Client("aiohttp", "http", "fsspec's HTTP filesystem (aiohttp)", False),
    "https": Client("aiohttp", "http", "fsspec's HTTP filesystem (aiohttp)", False),
}

_made: dict[str, tuple[int, RemoteFiles]] = {}
_made_guard = threading.Lock()
# The environment the clients read their endpoint, credentials and settings from: a filesystem made under other
# values (a process that changed its AWS_ENDPOINT_URL or keys) is made again, as the client would see them now.
CLIENT_VARIABLES = ("AWS_", "FSSPEC_", "HF_", "HUGGING", "GOOGLE_", "GCSFS_", "CLOUDSDK_")


def _environment() -> int:
    return hash(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(CLIENT_VARIABLES))))


def files_for(protocol: str) -> RemoteFiles | str:
    """This process's filesystem of `protocol`, made on first use (again when the clients' environment changed);
    or, when it cannot be had, why (one line)."""
    client = CLIENTS.get(protocol)
    if client is None:
        return f"{protocol}:// locations are not supported (local paths, {', '.join(sorted(CLIENTS))})"
    if not client.installed:  # an import of a module already loaded: a dictionary look-up
        return client.missing(protocol)
    environment = _environment()
    with _made_guard:
        made = _made.get(protocol)
        if made is not None and made[0] == environment:
            return made[1]
        _made[protocol] = (environment, RemoteFiles(protocol, client.writable))
        return _made[protocol][1]


def _client_options(protocol: str) -> dict[str, Any]:
    """What a protocol's filesystem is made with beyond fsspec's configuration: for hf, the hub's endpoint as
    `HF_ENDPOINT` says now. huggingface_hub reads that variable once, when it is first imported (its
    `constants.ENDPOINT`), so a process that set it later (a Python caller, after transformers loaded the hub)
    would otherwise still reach the endpoint of the import; the filesystem made again under the new environment
    (`files_for`) must reach the new one."""
    if protocol == "hf" and os.environ.get("HF_ENDPOINT"):
        return {"endpoint": os.environ["HF_ENDPOINT"].rstrip("/")}
    return {}


def _mtime(info: dict) -> float | None:
    """The modification time in an fsspec info dict, as seconds, under whichever name the store gives it."""
    for name in ("mtime", "LastModified", "last_modified", "updated", "modified"):
        value = info.get(name)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, (int, float)):
            return float(value)
        with contextlib.suppress(ValueError):
            import datetime

            return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    return None


# The modules whose exceptions are a store's or a connection's trouble, not the tool's: said in one line (`_said`).
_CLIENT_MODULES = (
    "botocore",
    "aiobotocore",
    "s3fs",
    "aiohttp",
    "gcsfs",
    "google",
    "huggingface_hub",
    "httpx",
    "fsspec",
)


# huggingface_hub's answer for a repository it cannot give: the Hub says the same (401 or 404, RepoNotFound) for one
# that does not exist and for a private or gated one the token cannot read. HfFileSystem turns it into a
# FileNotFoundError ("no such file or directory", taken for a mistyped path); it is said as what it may be instead.
NO_REPOSITORY_ERRORS = frozenset({"RepositoryNotFoundError", "GatedRepoError"})
NO_REPOSITORY = (
    "the hub has no such repository, or it is private (or gated) and no token that may read it was given "
    "(HF_TOKEN, or hf auth login)"
)


def _said(exc: BaseException, url: str) -> OSError | None:
    """A client's exception as the OSError the tool reports in one line (`LOCATION: what happened`), or None for
    one it passes on as it is (a missing file, no access, a folder: already OSErrors that say so)."""
    if isinstance(exc, FileNotFoundError) and type(exc.__cause__).__name__ in NO_REPOSITORY_ERRORS:
        return PermissionError(13, NO_REPOSITORY, url)
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FetchFailed)):
        return None
    name = type(exc).__name__
    if not type(exc).__module__.startswith(_CLIENT_MODULES) and not isinstance(exc, (OSError, asyncio.TimeoutError)):
        return None
    detail = " ".join(str(exc).split())[:300] or name
    if "Credential" in name or "NoAuth" in name or "Unauthenticated" in name:
        return PermissionError(13, f"no credentials for the store ({detail})", url)
    unreachable = isinstance(exc, (ConnectionError, TimeoutError, asyncio.TimeoutError))
    if unreachable or any(word in name for word in ("Connect", "Timeout", "Offline")):
        return ConnectionError(111, f"cannot reach the store ({detail})", url)
    return OSError(5, f"the store failed: {name}: {detail}", url)


class RemoteFiles:
    """One protocol's fsspec filesystem, as the seam's `Files`. Paths are the location's (`bucket/key`); URLs
    (http, https) are given to fsspec whole."""

    def __init__(self, protocol: str, writable: bool) -> None:
        import fsspec  # type: ignore[import-untyped]

        self.protocol = protocol
        self.writable = writable
        self.fs = fsspec.filesystem(protocol, skip_instance_cache=True, **_client_options(protocol))

    def _p(self, path: str) -> str:
        return f"{self.protocol}://{path}" if self.protocol in HTTP else path

    def _url(self, path: str) -> str:
        return f"{self.protocol}://{path}"

    @contextlib.contextmanager
    def _speaking(self, path: str) -> Iterator[None]:
        """A client's exception inside the block becomes one that says, in one line, what happened where."""
        try:
            yield
        except Exception as exc:
            said = _said(exc, self._url(path))
            if said is None:
                raise
            raise said from exc

    def _read_only(self, path: str) -> PermissionError:
        return PermissionError(13, f"{self.protocol}:// locations are read-only here", self._url(path))

    # ------------------------------------------------------------------------------------------ fsspec's
    def info(self, path: str) -> dict[str, Any]:
        """fsspec's info, with `mtime` (seconds, or None) and `mtime_ns` under the names the seam uses (S3 keeps
        whole seconds: a rewrite of the same size within one second keeps its mtime_ns)."""
        with self._speaking(path):
            found = dict(self.fs.info(self._p(path)))
        kind = found.get("type")
        mtime = _mtime(found)
        found.update(
            name=path,
            size=int(found.get("size") or 0),
            type=kind if kind in ("file", "directory") else "other",
            mtime=mtime,
            mtime_ns=int(mtime * 1e9) if mtime is not None else 0,
            islink=False,
        )
        return found

    def exists(self, path: str) -> bool:
        """Whether there is an object (or a prefix) here: `info` answers, a missing one is False, and any other
        trouble (no network, no credentials) is said, not taken for absence as fsspec's `exists` takes it."""
        try:
            self.info(path)
        except FileNotFoundError:
            return False
        return True

    def lexists(self, path: str) -> bool:
        return self.exists(path)

    def isdir(self, path: str) -> bool:
        if self.protocol in HTTP:
            return False  # a URL names one file (fsspec would read an HTML page's links as a folder)
        with self._speaking(path):
            return bool(self.fs.isdir(self._p(path)))

    def isfile(self, path: str) -> bool:
        with self._speaking(path):
            return bool(self.fs.isfile(self._p(path)))

    def islink(self, path: str) -> bool:
        return False

    def size(self, path: str) -> int:
        return int(self.info(path)["size"])

    def ls(self, path: str) -> list[str]:
        with self._speaking(path):
            return sorted(entry.rstrip("/") for entry in self.fs.ls(self._p(path), detail=False))

    def walk(self, path: str) -> Iterator[tuple[str, list[str], list[str]]]:
        """fsspec's walk, top down (sorting or pruning the folder names in place steers it)."""
        if self.protocol in HTTP:
            return
        with self._speaking(path):
            yield from self.fs.walk(self._p(path), topdown=True)

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if any(c in mode for c in "wax+") and not self.writable:
            raise self._read_only(path)
        kwargs = {k: v for k, v in kwargs.items() if not (k == "buffering" and v == -1) and v is not None}
        kwargs.pop("buffering", None)
        with self._speaking(path):
            return self.fs.open(self._p(path), mode, **kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        with self._speaking(path):
            return bytes(self.fs.cat_file(self._p(path), start=start, end=end))

    def rm_file(self, path: str) -> None:
        if not self.writable:
            raise self._read_only(path)
        if not self.exists(path):
            raise FileNotFoundError(2, "no such file", self._url(path))
        with self._speaking(path):
            self.fs.rm_file(self._p(path))

    def rm(self, path: str, recursive: bool = False) -> None:
        if not self.writable:
            raise self._read_only(path)
        if self.isdir(path) and not recursive:
            raise IsADirectoryError(f"{self._url(path)}: a folder (remove it with recursive=True)")
        with self._speaking(path):
            self.fs.rm(self._p(path), recursive=recursive)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Nothing to make on object storage (a folder is a prefix of the names under it)."""
        if not self.writable:
            raise self._read_only(path)

    def glob(self, pattern: str) -> list[str]:
        with self._speaking(pattern):
            return sorted(self.fs.glob(self._p(pattern)))

    # ------------------------------------------------------------------------------------------ the tool's
    def regular_file(self, path: str, what: str = "a media file") -> os.stat_result:
        """A stat of the object (regular-file mode, its size and time): an object is always a regular file; a
        prefix is a folder (IsADirectoryError); a missing one FileNotFoundError."""
        found = self.info(path)
        if found["type"] == "directory":
            raise IsADirectoryError(f"is a directory, not {what}")
        when = found["mtime"] or 0.0
        return os.stat_result((stat.S_IFREG | 0o444, 0, 0, 1, 0, 0, found["size"], when, when, when))

    def open_input(self, path: str) -> BinaryIO:
        """A seekable file read ahead READ_BLOCK bytes at a time (ranged requests): streamed, not downloaded."""
        self.regular_file(path, "a file")
        with self._speaking(path):
            if self.protocol in HTTP or self.protocol == "hf":
                return self.fs.open(self._p(path), "rb")
            return self.fs.open(self._p(path), "rb", block_size=READ_BLOCK, cache_type="readahead")

    @contextlib.contextmanager
    def input_by_name(self, path: str) -> Iterator[tuple[BinaryIO, str]]:
        """An object for a library that opens by name (safetensors, faiss, numpy's memmap): its local copy
        (`local_path`), opened, and that copy's name: a private file of this process's, which nobody else puts
        anything in place of."""
        copy = self.local_path(path)
        with open(copy, "rb") as fh:
            yield fh, copy

    def size_and_time(self, path: str, fh: BinaryIO) -> tuple[int, int]:
        """Of the object (its info: fsspec's files have no descriptor to ask); `mtime_ns` as `info` gives it."""
        found = self.info(path)
        return found["size"], found["mtime_ns"]

    def facts(self, path: str) -> dict[str, Any]:
        """Size, modification time and SHA-256 of the content (read once, streamed), as for a local file."""
        found = self.regular_file(path)
        with self.open_input(path) as fh:
            return content_facts(found, fh)

    def fetch(self, path: str, limit: int | None, timeout: float | None) -> bytes:
        """One item's bytes, whole. Over `limit` by its declared size: `TooLarge`, unread. A URL is one GET with
        `timeout` seconds for the connection and for each read; object storage one ranged read after its info
        (its client retries on its own). Failures are `FetchFailed`, worded without the location."""
        if self.protocol in HTTP:
            from fsspec.asyn import sync  # type: ignore[import-untyped]

            return bytes(sync(self.fs.loop, self._http_fetch, self._p(path), limit, timeout))
        try:
            found = self.regular_file(path)
        except FileNotFoundError:
            raise FetchFailed("no such object", 404) from None
        except IsADirectoryError:
            raise FetchFailed("a folder (a prefix), not an object") from None
        except PermissionError:
            raise FetchFailed("access denied", 403) from None
        if limit is not None and found.st_size > limit:
            raise TooLarge(found.st_size, limit)
        try:
            return bytes(self.fs.cat_file(self._p(path)))
        except FileNotFoundError:
            raise FetchFailed("no such object (removed while the run read it)", 404) from None
        except PermissionError:
            raise FetchFailed("access denied", 403) from None
        except (OSError, asyncio.TimeoutError) as exc:
            raise FetchFailed(f"read failed ({type(exc).__name__})", transient=True) from None

    async def _http_fetch(self, url: str, limit: int | None, timeout: float | None) -> bytes:
        import aiohttp

        session = await self.fs.set_session()
        wait = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        got, declared = 0, None
        try:
            async with session.get(self.fs.encode_url(url), timeout=wait) as response:
                if response.status >= 400:
                    reason = f"HTTP {response.status}" + (f" {response.reason}" if response.reason else "")
                    raise FetchFailed(reason, response.status, response.status in TRANSIENT_STATUS)
                declared = response.content_length
                if limit is not None and declared is not None and declared > limit:
                    raise TooLarge(declared, limit)
                chunks = []
                async for chunk in response.content.iter_chunked(HTTP_CHUNK):
                    got += len(chunk)
                    if limit is not None and got > limit:
                        raise TooLarge(got, limit, known=False)
                    chunks.append(chunk)
                return b"".join(chunks)
        except FetchFailed:
            raise
        except asyncio.TimeoutError:
            raise FetchFailed(f"timed out (no answer within {timeout:g} s)", transient=True) from None
        except aiohttp.ClientPayloadError:
            of = f" of the {declared} declared" if declared is not None else ""
            raise FetchFailed(f"the body was cut short after {got} bytes{of}", transient=True) from None
        except aiohttp.ClientConnectionError as exc:
            raise FetchFailed(f"connection failed ({type(exc).__name__})", transient=True) from None
        except aiohttp.ClientError as exc:
            raise FetchFailed(f"HTTP request failed ({type(exc).__name__})") from None

    @contextlib.contextmanager
    def atomic_write(self, path: str, own_folder: bool = False) -> Iterator[BinaryIO]:
        """A file whose content is uploaded whole to `path` when the block ends without error (a local temporary
        file, then one upload): a reader sees the old object or the new one, never half of it. `own_folder` asks
        nothing more here: a prefix is no folder anyone can swap for a link."""
        if not self.writable:
            raise self._read_only(path)
        with self.temp_path(path) as name, open(name, "wb") as fh:
            yield fh
            fh.flush()

    @contextlib.contextmanager
    def temp_path(self, path: str, own_folder: bool = False) -> Iterator[str]:
        """The name of a new, empty local temporary file for a writer that opens by name; uploaded to `path` when
        the block ends without error, removed either way."""
        if not self.writable:
            raise self._read_only(path)
        fd, name = tempfile.mkstemp(prefix=".gemma-embed-", suffix=".upload", dir=_private_folder("uploads"))
        os.close(fd)
        try:
            yield name
            with self._speaking(path):
                self.fs.put_file(name, self._p(path))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)

    def own_folder(self, path: str, create: bool = True) -> None:
        """A prefix of the tool's own (an unfinished run's parts): nothing to create or check, object storage has
        no links and no folders to make (a prefix exists once an object is under it)."""
        if create and not self.writable:
            raise self._read_only(path)

    def open_lock(self, path: str) -> int:
        """The output lock's file: a local file named after the location (object storage holds no flock)."""
        return os.open(self._lock_name(path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    def names(self, path: str, fd: int) -> bool:
        try:
            on_disk, ours = os.stat(self._lock_name(path), follow_symlinks=False), os.fstat(fd)
        except FileNotFoundError:
            return False
        return (on_disk.st_dev, on_disk.st_ino) == (ours.st_dev, ours.st_ino)

    def drop_lock(self, path: str) -> None:
        os.unlink(self._lock_name(path))

    def _lock_name(self, path: str) -> str:
        digest = hashlib.sha256(self._url(path).encode("utf-8", "surrogateescape")).hexdigest()[:32]
        return os.path.join(_private_folder("locks", keep=True), f"{digest}.lock")

    def holds_files(self, folder: str) -> bool:
        """Whether new files can go under `folder`: its bucket exists (a prefix needs no creating)."""
        if not self.writable:
            return False
        bucket = folder.split("/", 1)[0]
        return bool(bucket) and self.exists(bucket)

    def probe_folder(self, folder: str, name: str) -> None:
        """PermissionError (an OSError) unless a new object can be written under `folder`: an empty one is written
        and removed."""
        if not self.writable:
            raise self._read_only(folder)
        probe = f"{folder}/.{name}.{os.urandom(4).hex()}.probe"
        try:
            with self._speaking(folder):
                self.fs.pipe_file(probe, b"")
                self.fs.rm_file(probe)
        except PermissionError as exc:
            raise PermissionError(13, exc.strerror or "access denied", self._url(folder)) from exc

    def realpath(self, path: str) -> str:
        return path  # object storage has no links

    def local_path(self, path: str) -> str:
        """A local copy of the object for a library that opens by name: downloaded once per process (again when
        the object's size or version tag changes), into a private temporary folder removed at exit."""
        found = self.info(path)
        if found["type"] == "directory":
            raise IsADirectoryError(21, "is a directory", self._url(path))
        tag = str(
            found.get("ETag") or found.get("etag") or found.get("md5Hash") or found.get("blob_id") or found.get("mtime")
        )
        key = hashlib.sha256(f"{self._url(path)}\0{found['size']}\0{tag}".encode("utf-8", "surrogateescape"))
        name = os.path.basename(path) or "file"
        copy = os.path.join(_private_folder("copies"), key.hexdigest()[:32], name)
        with _copy_guard:
            if not os.path.exists(copy):
                os.makedirs(os.path.dirname(copy), mode=0o700, exist_ok=True)
                partial = copy + ".partial"
                with self._speaking(path):
                    self.fs.get_file(self._p(path), partial)
                os.replace(partial, copy)
        return copy


_copy_guard = threading.Lock()
_folders: dict[str, str] = {}
_folders_guard = threading.Lock()


def _private_folder(kind: str, keep: bool = False) -> str:
    """A folder of this process's own under the system's temporary folder (mode 0700): uploads and local copies
    are removed at exit; the locks' folder (`keep`) is shared by this user's runs, so it stays."""
    with _folders_guard:
        if kind in _folders:
            return _folders[kind]
        if keep:
            folder = os.path.join(tempfile.gettempdir(), f"gemma-embed-{os.getuid()}-{kind}")
            os.makedirs(folder, mode=0o700, exist_ok=True)
            found = os.lstat(folder)
            if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
                raise PermissionError(13, "not a private folder of this user's (a link, or open to others)", folder)
        else:
            folder = tempfile.mkdtemp(prefix=f"gemma-embed-{kind}-")
            atexit.register(shutil.rmtree, folder, True)
        _folders[kind] = folder
        return folder
