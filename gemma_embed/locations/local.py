"""Local files, the seam's first filesystem: fsspec's method names and meaning, on paths exactly as given.

An own small class rather than a subclass of fsspec's `LocalFileSystem`, because that class rewrites every path
before the OS sees it: relative paths become absolute and a leading `~` is expanded (a relative name such as
`~draft/a.jpg` would open another user's home folder), so its errors and listings no longer name the path the user
gave, which the tool's messages and metadata must. Its `exists` also swallows every exception with a bare
`except` (a stop signal included), its walk lists a link to a folder as a file, and importing fsspec costs about
90 ms (asyncio) on every command before the output lock is taken. Overriding all of that would leave a subclass in
name only. Libraries that take an fsspec filesystem get one from `Location.fsspec()`.

Safety lives here, in one place, for the hostile-input work that follows:
- inputs: `regular_file` refuses what is not a regular file by `stat` alone (opening a FIFO blocks until a writer
  comes; /dev/zero never ends); `open_input` opens without blocking or taking a terminal and refuses a
  descriptor that is not a regular file after all (swapped in after the stat);
- created files: every file the tool creates is created with O_EXCL | O_NOFOLLOW inside its folder opened once
  (`dir_fd`), and renamed into place from that folder (`atomic_write`, `temp_path`; a writer that opens by name
  gets the created file's own descriptor path); the output lock's file is opened with O_NOFOLLOW and checked by
  its descriptor (a link, a hard link or another user's file there is refused, never written through); a folder
  of the tool's own (parts) is a plain folder of this user's, opened without following a link (`own_folder`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from typing import Any, BinaryIO

from gemma_embed.locations.base import NotPlain, NotRegularFile, TooLarge, content_facts

# What a file that is not a regular one is, by its stat mode, for messages.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def scratch_file(prefix: str = "gemma-embed-") -> BinaryIO:
    """An anonymous temporary file of the process's own, read and written (a computation's spill, no user's
    location): in the system's temporary folder ($TMPDIR), its name unlinked at once where the system allows,
    gone when it is closed."""
    return tempfile.TemporaryFile(prefix=prefix)


def kind_of(mode: int) -> str:
    """What a stat mode that is no regular file or folder is, in words ("a FIFO", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a file")


class LocalFiles:
    """The local filesystem (POSIX), on paths as given: relative paths stay relative to the working folder."""

    protocol = "file"
    writable = True

    # ------------------------------------------------------------------------------------------ fsspec's
    def info(self, path: str) -> dict[str, Any]:
        """fsspec's info: the entry through a symbolic link (`islink` says whether it is one), with the
        nanosecond modification time beside fsspec's float (`mtime_ns`: what an index fingerprint compares)."""
        st = os.lstat(path)
        link = stat.S_ISLNK(st.st_mode)
        if link:
            st = os.stat(path)
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
        return {
            "name": path,
            "size": st.st_size,
            "type": kind,
            "mtime": st.st_mtime,
            "mtime_ns": st.st_mtime_ns,
            "mode": st.st_mode,
            "islink": link,
        }

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def lexists(self, path: str) -> bool:
        """Whether there is an entry, a dangling symbolic link included."""
        return os.path.lexists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def islink(self, path: str) -> bool:
        return os.path.islink(path)

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def ls(self, path: str) -> list[str]:
        """The folder's entries as paths under it, sorted by name."""
        return [os.path.join(path, name) for name in sorted(os.listdir(path))]

    def walk(self, path: str) -> Iterator[tuple[str, list[str], list[str]]]:
        """os.walk's (folder, folder names, other names), top down: sorting or pruning the folder names in place
        steers the walk. Links to folders are listed with the folders and not descended into; unreadable
        folders are passed over (fsspec's on_error="omit")."""
        yield from os.walk(path, followlinks=False)

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        return open(path, mode, **kwargs)  # noqa: SIM115 - the caller closes it

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes [start, end) of the file (fsspec's ranged read; None: from the start, to the end)."""
        with open(path, "rb") as fh:
            if start:
                fh.seek(start)
            return fh.read() if end is None else fh.read(max(0, end - (start or 0)))

    def rm_file(self, path: str) -> None:
        os.unlink(path)

    def rm(self, path: str, recursive: bool = False) -> None:
        """Remove a file or a link; a folder (never one reached through a link) only with `recursive`."""
        if os.path.isdir(path) and not os.path.islink(path):
            if not recursive:
                raise IsADirectoryError(f"{path}: a folder (remove it with recursive=True)")
            shutil.rmtree(path)
        else:
            os.unlink(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def glob(self, pattern: str) -> list[str]:
        """The paths `pattern` matches (`**` across folders), sorted, spelled as the pattern is (relative stays
        relative)."""
        import glob

        return sorted(glob.glob(pattern, recursive=True))

    # ------------------------------------------------------------------------------------------ the tool's
    def regular_file(self, path: str, what: str = "a media file") -> os.stat_result:
        """The file's stat (through symbolic links), after refusing what must not be opened for reading: a folder
        (IsADirectoryError, "is a directory, not `what`") and anything that is not a regular file (NotRegularFile,
        naming its kind and, through a link, where the link leads). Only stat is called, never open."""
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(f"is a directory, not {what}")
        if not stat.S_ISREG(st.st_mode):
            kind = kind_of(st.st_mode)
            if os.path.islink(path):
                kind = f"a symbolic link to {os.path.realpath(path)}, {kind}"
            raise NotRegularFile(f"not a regular file ({kind}); not opened")
        return st

    def open_input(self, path: str) -> BinaryIO:
        """A user's file opened for reading, buffered. Opened without blocking (a FIFO put there after a stat
        would otherwise wait for a writer) and without becoming a controlling terminal; a descriptor that is not a
        regular file is closed again, unread (NotRegularFile). A folder is IsADirectoryError, as open() says."""

        def nonblocking(name: str, flags: int) -> int:
            return os.open(name, flags | os.O_NONBLOCK | os.O_NOCTTY)

        fh = open(path, "rb", opener=nonblocking)  # noqa: SIM115 - returned to the caller
        try:
            fd = fh.fileno()
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise NotRegularFile(f"not a regular file ({kind_of(mode)}); not read")
            os.set_blocking(fd, True)
        except BaseException:
            fh.close()
            raise
        return fh

    @contextlib.contextmanager
    def input_by_name(self, path: str) -> Iterator[tuple[BinaryIO, str]]:
        """A user's file for a library that opens by name (safetensors, faiss, numpy's memmap): the file opened as
        an input first (`open_input`: a FIFO or a device is refused unopened, without waiting), and a name for it,
        its descriptor's own (`/proc/self/fd/N`, where the system has it), so that the library reads the very file
        that was checked, whatever is put at `path` meanwhile. A mapping the library makes outlives the block."""
        with self.open_input(path) as fh:
            by_descriptor = f"/proc/self/fd/{fh.fileno()}"
            yield fh, by_descriptor if os.path.exists(by_descriptor) else path

    def size_and_time(self, path: str, fh: BinaryIO) -> tuple[int, int]:
        """Of the opened file itself (fstat): whatever is put at `path` meanwhile."""
        st = os.fstat(fh.fileno())
        return st.st_size, st.st_mtime_ns

    def facts(self, path: str) -> dict[str, Any]:
        """Size, modification time and SHA-256 of the content: how `--resume` tells a changed file."""
        st = self.regular_file(path)
        with self.open_input(path) as fh:
            return content_facts(st, fh)

    @contextlib.contextmanager
    def atomic_write(self, path: str, own_folder: bool = False) -> Iterator[BinaryIO]:
        """A binary file whose content appears at `path` whole when the block ends, or not at all: written to a
        new temporary file beside it (mode 0666 less the umask, as open() would create `path` itself; a
        `mkstemp` file is always 0600), flushed, fsynced and renamed over `path` (a link there is replaced, never
        written through). `own_folder`: the folder is one of the tool's own (`own_folder`), opened only as that."""
        with _folder(path, own_folder) as (folder_fd, name):
            tmp = _temp_name(name)
            fd = os.open(tmp, _CREATE, 0o666, dir_fd=folder_fd)
            try:
                with os.fdopen(fd, "wb") as fh:
                    yield fh
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=folder_fd)
                raise

    @contextlib.contextmanager
    def temp_path(self, path: str, own_folder: bool = False) -> Iterator[str]:
        """A name for a new, empty temporary file beside `path`, for a writer that opens by name (numpy's memmap,
        pyarrow, faiss); it becomes `path` (fsynced, renamed) when the block ends without error, or is removed.

        The file is created here (O_EXCL | O_NOFOLLOW) and held open; the name given is the descriptor's own
        (`/proc/self/fd/N`, where the system has it), which reopens that very file: a link put in place of the
        temporary name meanwhile redirects nothing. Before the rename the name must still be that file."""
        with _folder(path, own_folder) as (folder_fd, name):
            tmp = _temp_name(name)
            fd = os.open(tmp, _CREATE, 0o666, dir_fd=folder_fd)
            try:
                by_descriptor = f"/proc/self/fd/{fd}"
                yield by_descriptor if os.path.exists(by_descriptor) else os.path.join(os.path.dirname(path), tmp)
                ours, there = os.fstat(fd), os.stat(tmp, dir_fd=folder_fd, follow_symlinks=False)
                if (ours.st_dev, ours.st_ino) != (there.st_dev, there.st_ino):
                    raise NotPlain(
                        f"its temporary file {tmp} was replaced while it was written; not renamed into place"
                    )
                os.fsync(fd)
                os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    _unlink_if(tmp, folder_fd, fd)
                raise
            finally:
                os.close(fd)

    def own_folder(self, path: str, create: bool = True) -> None:
        """A folder the tool keeps beside an output for itself (an unfinished run's parts): created when missing
        (with `create`), and refused (NotPlain) unless it is a plain folder, no symbolic link, owned by this
        user. Files go in it with `own_folder=True`, which opens it without following a link again."""
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o777)
        _plain(os.stat(path, follow_symlinks=False), path, folder=True)

    def fetch(self, path: str, limit: int | None, timeout: float | None = None) -> bytes:
        """The file's bytes, read whole; `TooLarge` from its size alone (unread) when over `limit`."""
        st = self.regular_file(path)
        if limit is not None and st.st_size > limit:
            raise TooLarge(st.st_size, limit)
        with self.open_input(path) as fh:
            return fh.read()

    def open_lock(self, path: str) -> int:
        """The output lock's file, opened (created when missing: mode 0666 less the umask) for reading and
        writing, never through a symbolic link (NotPlain), and refused when the opened file is not a plain one of
        this user's (a hard link to another file: its PID line would overwrite that file); a descriptor for
        fcntl.flock (store/lock.py)."""
        try:
            fd = os.open(
                path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, 0o666
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotPlain(_link_reason(path)) from None
            raise
        try:
            _plain(os.fstat(fd), path, folder=False)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def names(self, path: str, fd: int) -> bool:
        """Whether `path` still names the file open as `fd` (not a link to it: the entry itself)."""
        try:
            on_disk, ours = os.stat(path, follow_symlinks=False), os.fstat(fd)
        except FileNotFoundError:
            return False
        return (on_disk.st_dev, on_disk.st_ino) == (ours.st_dev, ours.st_ino)

    def drop_lock(self, path: str) -> None:
        """Remove the lock's file (its holder, on release: see store/lock.py on why that is safe)."""
        os.unlink(path)

    def holds_files(self, folder: str) -> bool:
        """Whether new files can go in `folder`: it is a folder that exists."""
        return os.path.isdir(folder or ".")

    def probe_folder(self, folder: str, name: str) -> None:
        """OSError unless `folder` takes a new file: an empty one named after `name` is created and removed."""
        probe = os.path.join(folder, f".{name}.{_token()}.probe")
        os.close(os.open(probe, _CREATE, 0o600))
        os.unlink(probe)

    def realpath(self, path: str) -> str:
        """The path with every symbolic link resolved (as far as it exists, then by its text)."""
        return os.path.realpath(path)

    def local_path(self, path: str) -> str:
        """The name a library that opens files by name (safetensors, numpy, pyarrow, PyAV) is given."""
        return path


def _token() -> str:
    """Eight random hex digits (what secrets.token_hex(4) gives, without importing it before it is needed)."""
    return os.urandom(4).hex()


def _temp_name(name: str) -> str:
    return f".{name}.{_token()}.tmp"


def _link_reason(path: str) -> str:
    return f"a symbolic link to {os.path.realpath(path)}; not followed"


def _plain(st: os.stat_result, path: str, folder: bool) -> None:
    """NotPlain unless `st` (an lstat, or the fstat of what was opened without following links) is a plain folder
    or a regular file of one name, owned by this user."""
    if stat.S_ISLNK(st.st_mode):
        raise NotPlain(_link_reason(path))
    if folder and not stat.S_ISDIR(st.st_mode):
        raise NotPlain(f"is {'a file' if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)}")
    if not folder and not stat.S_ISREG(st.st_mode):
        raise NotPlain(f"is {'a folder' if stat.S_ISDIR(st.st_mode) else kind_of(st.st_mode)}")
    if not folder and st.st_nlink != 1:
        raise NotPlain(f"a file with {st.st_nlink} names (hard links); not written")
    if st.st_uid != os.geteuid():
        raise NotPlain(f"owned by user {st.st_uid}, not by this one ({os.geteuid()})")


def _unlink_if(name: str, folder_fd: int, fd: int) -> None:
    """Remove `name` from the folder if it is still the file open as `fd` (never whatever replaced it)."""
    ours, there = os.fstat(fd), os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    if (ours.st_dev, ours.st_ino) == (there.st_dev, there.st_ino):
        os.unlink(name, dir_fd=folder_fd)


@contextlib.contextmanager
def _folder(path: str, own: bool = False) -> Iterator[tuple[int, str]]:
    """(descriptor of the folder `path` goes in, opened once, and the file's name in it): files created there and
    renamed there stay in that folder however its path changes meanwhile. The output's folder is the one the
    user named (a link to a folder included); a folder of the tool's own (`own`) is opened without following a
    link and must be a plain one of this user's (NotPlain)."""
    folder, name = os.path.split(path)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        fd = os.open(folder or ".", flags | (os.O_NOFOLLOW if own else 0))
    except OSError as exc:
        if own and exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(folder):
            raise NotPlain(_link_reason(folder)) from None
        raise
    try:
        if own:
            _plain(os.fstat(fd), folder, folder=True)
        yield fd, name
    finally:
        os.close(fd)
