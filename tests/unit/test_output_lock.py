"""The output lock (store/lock.py) in one process: other holders are stand-in file descriptions with a flock,
which conflict with ours exactly as another process's would."""

from __future__ import annotations

import fcntl
import os
import threading
import time
import types
from pathlib import Path

import pytest

from gemma_embed.errors import UsageError
from gemma_embed.store import lock
from gemma_embed.store.lock import MERGE, output_lock

REAL_FLOCK = fcntl.flock


def hold(path: Path, content: str) -> int:
    """Another holder: its own open file description of `path`, flocked, with `content` in the file."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    REAL_FLOCK(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.pwrite(fd, content.encode(), 0)
    return fd


def never_waits(monkeypatch) -> None:
    """The lock module's clock, with a sleep that fails the test: whatever it does, it does without waiting."""

    def sleep(seconds: float) -> None:
        raise AssertionError(f"the lock waited ({seconds} s)")

    monkeypatch.setattr(lock, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep))


def test_a_held_output_is_refused_at_once_naming_the_holder(tmp_path, monkeypatch):
    out = tmp_path / "out.safetensors"
    other = hold(tmp_path / "out.lock", "4242 run\n")
    never_waits(monkeypatch)  # at once: one try of the flock, the holder's PID read, no wait in between
    try:
        with pytest.raises(UsageError) as caught, output_lock(out):
            pass
        assert str(caught.value) == (
            f"{out}: another gemma-embed run (PID 4242) is writing this output; "
            f"wait for it to finish or choose another --output"
        )
    finally:
        os.close(other)


def test_the_holder_writes_its_pid_and_removes_the_file_when_done(tmp_path):
    out = tmp_path / "out.safetensors"
    with output_lock(out):
        assert (tmp_path / "out.lock").read_text() == f"{os.getpid()} run\n"
        with output_lock(out):  # re-entrant in the same thread (the CLI, then pipeline.run)
            pass
        assert (tmp_path / "out.lock").exists()  # the inner exit does not release
        other = os.open(tmp_path / "out.lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(other)
    assert not (tmp_path / "out.lock").exists()


def test_a_lock_file_nobody_holds_is_taken(tmp_path):
    """What SIGKILL leaves: the file, with a dead PID, and no flock (the kernel dropped it with the process)."""
    out = tmp_path / "out.safetensors"
    (tmp_path / "out.lock").write_text("999999 run\n")
    with output_lock(out):
        assert (tmp_path / "out.lock").read_text() == f"{os.getpid()} run\n"
    assert not (tmp_path / "out.lock").exists()


def test_another_thread_is_refused_like_another_process(tmp_path):
    out = tmp_path / "out.safetensors"
    errors = []

    def second() -> None:
        try:
            with output_lock(out):
                pass
        except UsageError as exc:
            errors.append(str(exc))

    with output_lock(out):
        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
    assert errors and f"(PID {os.getpid()})" in errors[0]


def test_a_lock_file_removed_between_open_and_flock_is_opened_again(tmp_path, monkeypatch):
    """The race removal brings: we open the old file, its holder removes it, a newcomer creates and locks a new
    one, then our flock succeeds on the removed file. Taking that as ours would give two writers."""
    out = tmp_path / "out.safetensors"
    path = tmp_path / "out.lock"
    path.write_text("")
    newcomer = []

    def flock_after_a_swap(fd, operation):
        if not newcomer:
            path.unlink()
            newcomer.append(hold(path, "777 run\n"))
        return REAL_FLOCK(fd, operation)

    monkeypatch.setattr(lock.fcntl, "flock", flock_after_a_swap)
    try:
        with pytest.raises(UsageError, match=r"\(PID 777\)"), output_lock(out):
            pass
    finally:
        os.close(newcomer[0])


def test_a_merge_waits_for_another_merge_but_not_for_a_run(tmp_path, monkeypatch):
    out = tmp_path / "out.safetensors"
    merging = hold(tmp_path / "out.lock", "555 merge\n")
    refused = []

    def flock_until_the_other_merge_ends(fd, operation):
        try:
            return REAL_FLOCK(fd, operation)
        except BlockingIOError:
            refused.append(fd)
            if len(refused) == 1:
                os.close(merging)  # the other merge finishes while this one waits for it
            raise

    monkeypatch.setattr(lock.fcntl, "flock", flock_until_the_other_merge_ends)
    with output_lock(out, MERGE):
        assert (tmp_path / "out.lock").read_text() == f"{os.getpid()} merge\n"
    assert len(refused) == 1  # it found the other merge holding the lock and took it once that one ended
    monkeypatch.setattr(lock.fcntl, "flock", REAL_FLOCK)

    running = hold(tmp_path / "out.lock", "556 run\n")
    never_waits(monkeypatch)  # and a run's lock is refused at once
    try:
        with (
            pytest.raises(UsageError, match=r"\(PID 556\) is writing this output; this slice"),
            output_lock(out, MERGE, "this slice's work is saved"),
        ):
            pass
    finally:
        os.close(running)


def test_a_run_is_told_when_the_holder_is_joining_slices(tmp_path):
    merging = hold(tmp_path / "out.lock", "557 merge\n")
    try:
        with pytest.raises(UsageError, match=r"\(PID 557, joining slices\)"), output_lock(tmp_path / "out.safetensors"):
            pass
    finally:
        os.close(merging)


def test_a_missing_folder_is_the_usual_line(tmp_path):
    missing = tmp_path / "no" / "o.safetensors"
    with pytest.raises(UsageError, match="output folder does not exist"), output_lock(missing):
        pass


def test_slices_do_not_join_over_a_run_writing_the_final_output(tmp_path):
    from gemma_embed import distributed

    out = tmp_path / "out.safetensors"
    running = hold(tmp_path / "out.lock", "558 run\n")
    try:
        with pytest.raises(UsageError, match=r"\(PID 558\) is writing this output; wait for it"):
            distributed.begin_slice(out, distributed.Slice(0, 2))
        with pytest.raises(UsageError, match=r"\(PID 558\).*this slice's work is saved.*--resume to join them"):
            distributed.finish_slice(out, distributed.Slice(1, 2), {"k": 1}, note=lambda message: None)
    finally:
        os.close(running)
    assert (tmp_path / "out-rank00001-of-00002.positions.json").exists()  # the slice's own work is kept
