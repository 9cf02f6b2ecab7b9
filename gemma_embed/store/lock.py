"""One writer per output: an advisory lock on `OUT.lock`, taken before anything of the output is read or written
and held until the run ends.

Two runs into one output would number their parts alike and overwrite each other's, and the first to finish
would delete the other's parts folder: the output silently held another image's rows under a key (issue 20).
So a run takes `fcntl.flock(LOCK_EX | LOCK_NB)` on `OUT.lock` beside the output and writes its PID there; a
second run fails at once, naming that PID.

- A lock is the flock, never the file: the kernel releases a flock when its holder dies, even by SIGKILL, so a
  lock file left behind by a killed run is simply taken by the next one.
- The holder removes the file when it is done, so a finished run leaves nothing behind. Removing a lock file is
  racy by itself (a second process may have opened the old file, and lock it after the removal while a third
  creates and locks a new one), so whoever gets the flock checks that the path still names the file it locked,
  and starts again when it does not; with that check, removal is safe. (Never delete the file by hand while a
  run holds it: a new run would then create and lock a file of its own.)
- Re-entrant within a thread: flock refuses a second open of the same file even in the same process, and the
  command line takes the lock before it imports torch (seconds on a busy machine; the second run should fail at
  once) while `pipeline.run` takes it again for library callers. Another thread is refused like a process.
- Slices (`--num-slices`, torchrun ranks) lock their own outputs; joining them takes the final output's lock as
  a `merge`. A merge waits for another merge (every torchrun rank writes the same index at the end; a merge takes
  moments) but never for a run.
- flock is advisory (programs that do not take it are not stopped) and, on some network filesystems, local to
  one machine.
- The lock file is opened by the seam (`Location.open_lock`: created when missing, never through a symbolic
  link, and refused when it is a hard link to another file or another user's); what is in the way is one line
  naming it (a `DamagedFile`, exit 2), and nothing is written to it. This module keeps the protocol on its
  descriptor (flock, the holder's PID, the removal check). An output on object storage has its lock's file on
  this machine (locations/remote.py): runs on one machine are kept apart as for a local output, runs on two
  machines into one bucket are not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator

from gemma_embed.errors import OutputBusy
from gemma_embed.locations import Location, NotPlain, location
from gemma_embed.store.damage import DamagedFile
from gemma_embed.store.layout import Where, cannot_write_here, lock_path, output_folder

RUN, MERGE = "run", "merge"
POLL_S = 0.05  # how often a merge looks again while another merge holds the lock
HOLDER_WRITE_WAIT_S = 0.5  # a new holder writes its PID right after its flock; wait that long to read it
# What is in the way where the lock's file goes (a link, a hard link, another user's file): named, never written.
LOCK_KIND = "gemma-embed lock file"
LOCK_FIX = "remove it and run again"

_holders: dict[Location, int] = {}  # lock path -> the thread holding it, for the locks this process holds
_holders_guard = threading.Lock()


@contextlib.contextmanager
def output_lock(
    output: Where, role: str = RUN, busy_hint: str = "wait for it to finish or choose another --output"
) -> Iterator[None]:
    """Hold `output`'s lock for the block; an `OutputBusy` (a UsageError) at once, naming the holder's PID, when
    another run (or thread) holds it. `role` MERGE waits for another merge instead of failing."""
    output = location(output)
    path = lock_path(output)
    key = output_folder(output).realpath() / path.name  # the usual line when the folder is missing
    me = threading.get_ident()
    with _holders_guard:
        holder = _holders.get(key)
    if holder == me:  # held further out in this thread: the outer block releases it
        yield
        return
    if holder is not None:
        raise _busy(output, os.getpid(), RUN, busy_hint)
    fd = _acquire(path, output, role, busy_hint)
    with _holders_guard:
        _holders[key] = me
    try:
        yield
    finally:
        with _holders_guard:
            del _holders[key]
        _release(path, fd)


def _acquire(path: Location, output: Location, role: str, busy_hint: str) -> int:
    while True:
        try:
            fd = path.open_lock()
        except NotPlain as exc:
            raise DamagedFile(path, str(exc), LOCK_KIND, LOCK_FIX) from None
        except OSError as exc:
            raise cannot_write_here(path.parent, exc) from exc
        try:
            _lock(fd, output, role, busy_hint)
            if path.names(fd):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {role}\n".encode("ascii"), 0)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder removed the file between our open and our flock: open the new one


def _lock(fd: int, output: Location, role: str, busy_hint: str) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pid, holder_role = _holder(fd)
            if role != MERGE or holder_role != MERGE:
                raise _busy(output, pid, holder_role, busy_hint) from None
        time.sleep(POLL_S)


def _holder(fd: int) -> tuple[int | None, str]:
    """(PID, role) the holder wrote into the lock file; (None, RUN) when it cannot be read."""
    deadline = time.monotonic() + HOLDER_WRITE_WAIT_S
    while True:
        fields = os.pread(fd, 64, 0).decode("ascii", "replace").split()
        if len(fields) == 2 and fields[0].isdigit():
            return int(fields[0]), fields[1]
        if time.monotonic() > deadline:
            return None, RUN
        time.sleep(0.01)


def _busy(output: Location, pid: int | None, role: str, hint: str) -> OutputBusy:
    details = [f"PID {pid}"] if pid else []
    if role == MERGE:
        details.append("joining slices")
    who = "another gemma-embed run" + (f" ({', '.join(details)})" if details else "")
    return OutputBusy(f"{output}: {who} is writing this output; {hint}")


def _release(path: Location, fd: int) -> None:
    try:
        if path.names(fd):  # whether `path` still names the file open as `fd` (see the module note on removal)
            path.drop_lock()
    except OSError:
        pass  # a lock file left behind is harmless: the next run takes it
    finally:
        os.close(fd)
