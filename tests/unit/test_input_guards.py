"""The guards every input passes (no model): the item-size limit and its default, the regular-file check, a path
list read as it arrives, and a stop signal that ends a wait for an input however long its read blocks."""

from __future__ import annotations

import io
import os
import signal
import socket
import threading

import pytest

from gemma_embed.config import RunConfig
from gemma_embed.interrupts import Interrupted, responsive, stop_on_signals
from gemma_embed.media import NotRegularFile, regular_file
from gemma_embed.memory.planner import BudgetSpec
from gemma_embed.sources import read_path_list
from gemma_embed.sources.base import ITEM_BYTES_FLOOR, Collection, default_item_bytes, parse_item_bytes
from gemma_embed.sources.files import iter_path_list

GiB, MiB = 1 << 30, 1 << 20


def test_the_default_item_limit_is_a_quarter_of_the_host_budget_with_a_floor():
    # The default budget rule on host memory: min(free / 2, total / 10), a quarter of it.
    assert default_item_bytes(free=20 * GiB, total=64 * GiB) == int(6.4 * GiB) // 4
    assert default_item_bytes(free=2 * GiB, total=64 * GiB) == GiB // 4  # free / 2 is the smaller
    assert default_item_bytes(free=20 * GiB, total=4 * GiB) == ITEM_BYTES_FLOOR == 256 * MiB
    # --memory-budget: its bytes, never more than is free, or a share of the total.
    assert default_item_bytes(20 * GiB, 64 * GiB, BudgetSpec(bytes=8 * GiB)) == 2 * GiB
    assert default_item_bytes(4 * GiB, 64 * GiB, BudgetSpec(bytes=8 * GiB)) == GiB
    assert default_item_bytes(20 * GiB, 64 * GiB, BudgetSpec(bytes=GiB)) == ITEM_BYTES_FLOOR
    assert default_item_bytes(64 * GiB, 64 * GiB, BudgetSpec(fraction_of_total=0.5)) == 8 * GiB
    # Measured once per run, when no limit is given.
    assert Collection().with_item_limit().max_item_bytes >= ITEM_BYTES_FLOOR
    assert Collection(max_item_bytes=1000).with_item_limit().max_item_bytes == 1000


def test_max_item_bytes_reads_sizes_as_the_memory_budget_does():
    assert parse_item_bytes("2GiB") == 2 * GiB
    assert parse_item_bytes("512MiB") == 512 * MiB
    assert parse_item_bytes("1.5GB") == 1_500_000_000
    assert parse_item_bytes(4096) == 4096 and parse_item_bytes(None) is None and parse_item_bytes("auto") is None
    for bad, reason in {"30%": "not a share", "2": "use a size like", "lots": "use a size like"}.items():
        with pytest.raises(ValueError, match=reason):
            parse_item_bytes(bad)
    with pytest.raises(ValueError, match="^max_item_bytes: cannot read '2x'"):  # a Python caller's name for it
        RunConfig(max_item_bytes="2x").check()
    collection = RunConfig(max_item_bytes="2GiB", memory_budget="1GiB", allow_outside_paths=True).collection
    assert collection.max_item_bytes == 2 * GiB and collection.allow_outside_paths
    assert collection.memory_budget == BudgetSpec(bytes=GiB)
    assert RunConfig().collection == Collection()  # nothing given: the defaults


def test_the_regular_file_check_names_what_it_refuses_without_opening_it(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    os.symlink("/dev/zero", tmp_path / "zero.parquet")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock"))
    file = tmp_path / "file.png"
    file.write_bytes(b"x")
    refused: dict[str, str] = {}

    def check() -> None:
        for name in ("pipe", "zero.parquet", "sock"):
            try:
                regular_file(tmp_path / name)
            except NotRegularFile as exc:
                refused[name] = str(exc)

    # In a thread: opening the FIFO would block it until a writer came, and none comes. The join's timeout is only
    # against that hang (the checks themselves take microseconds); a writer then lets the thread end.
    checker = threading.Thread(target=check, daemon=True)
    checker.start()
    checker.join(60)
    if checker.is_alive():
        os.close(os.open(tmp_path / "pipe", os.O_WRONLY | os.O_NONBLOCK))
    assert not checker.is_alive(), "regular_file opened the FIFO"
    assert refused == {
        "pipe": "not a regular file (a FIFO); not opened",
        "zero.parquet": "not a regular file (a symbolic link to /dev/zero, a character device); not opened",
        "sock": "not a regular file (a socket); not opened",
    }
    with pytest.raises(IsADirectoryError, match="is a directory, not a tar shard"):
        regular_file(tmp_path, "a tar shard")
    assert regular_file(file).st_size == 1
    listener.close()


class Trickle(io.RawIOBase):
    """A pipe's read end as a reader sees it: a few bytes at a time."""

    def __init__(self, data: bytes, step: int):
        self.data, self.step = data, step

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk, self.data = self.data[: self.step], self.data[self.step :]
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_a_path_list_is_the_same_however_it_arrives():
    newline = b"a.jpg\r\n\n  \nb/c d.png\ncaf\xe9.jpg\nlast.png"
    nul = b"a.jpg\0\0b\nc.png\0caf\xe9.jpg\0"
    for data, null_separated, expected in [
        (newline, False, ["a.jpg", "b/c d.png", "caf\udce9.jpg", "last.png"]),
        (nul, True, ["a.jpg", "b\nc.png", "caf\udce9.jpg"]),
    ]:
        assert read_path_list(io.BytesIO(data), null_separated) == expected
        for step in (1, 3, 7):
            trickled = io.BufferedReader(Trickle(data, step), buffer_size=step)
            assert list(iter_path_list(trickled, null_separated)) == expected, step
    assert read_path_list(io.StringIO("x.png\ny.png\n"), False) == ["x.png", "y.png"]


def test_each_path_is_given_as_soon_as_it_arrives():
    """`find | gemma-embed images -`: the first path is there while the writer is still writing."""
    read_end, write_end = os.pipe()
    got: list[str] = []
    with os.fdopen(read_end, "rb") as stream:
        paths = iter_path_list(stream, null_separated=False)
        os.write(write_end, b"first.png\nsecond")
        reader = threading.Thread(target=lambda: got.append(next(paths)), daemon=True)
        reader.start()
        reader.join(60)  # only against a hang: a reader that waits for the rest of the stream never ends
        assert got == ["first.png"]
        os.write(write_end, b".png\n")
        os.close(write_end)
        assert list(paths) == ["second.png"]


def _blocked(read_end: int, reading: threading.Event):
    """A source whose next item waits for a byte on a pipe: as a list on stdin from a writer that went quiet.
    `reading` is set when the wait begins (the item has been asked for)."""
    yield "ready"
    reading.set()
    yield os.read(read_end, 1)


def test_a_stop_signal_ends_a_wait_for_an_input_that_blocks():
    read_end, write_end = os.pipe()
    reading, stopped = threading.Event(), threading.Event()
    items = responsive(_blocked(read_end, reading))

    def signal_the_waiting_run() -> None:
        if reading.wait(60):  # the next item has been asked for: the main thread waits for it
            os.kill(os.getpid(), signal.SIGTERM)
        if not stopped.wait(60):  # only against a hang: the wait did not end, so a byte ends the read
            os.write(write_end, b"!")

    with stop_on_signals() as flag:
        assert next(items) == "ready"
        threading.Thread(target=signal_the_waiting_run, daemon=True).start()
        with pytest.raises(Interrupted) as raised:
            next(items)
        stopped.set()
        assert raised.value.signum == signal.SIGTERM == flag.signum
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are put back
    os.write(write_end, b"x")  # the read that was waiting ends: its item is the next one, nothing is lost
    assert next(items) == b"x"
    os.close(write_end)
    os.close(read_end)


def test_without_a_run_the_items_are_read_in_the_callers_thread_and_errors_pass_through():
    threads = []

    def source():
        for item in (1, 2):
            threads.append(threading.current_thread())
            yield item
        raise OSError("disk gone")

    items = responsive(source())
    assert next(items) == 1 and threads == [threading.main_thread()]  # no handlers installed: a plain iterator
    with stop_on_signals():
        assert next(items) == 2 and threads[1] is not threading.main_thread()  # a run's: the helper reads it
        with pytest.raises(OSError, match="disk gone"):
            next(items)
        with pytest.raises(StopIteration):
            next(items)
