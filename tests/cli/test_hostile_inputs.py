"""The command line against hostile inputs: a shard with a sparse 3 GiB member, a FIFO named .tar and /dev/zero
linked as .parquet, a stop signal while the path list on stdin waits for more. Nothing hangs, memory stays low,
what is done is saved."""

from __future__ import annotations

import io
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import EXE, PEAK_RSS_WRAPPER, REAL_EXE, SAMPLE_MODEL, run_images, write_image
from tar_helpers import gnu_sparse_member, gnu_tar, regular, sparse_file, write_tar
from warm_cli import REPORT_VARIABLE, reported_pid

import gemma_embed

MODEL = SAMPLE_MODEL
GiB = 1 << 30


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_a_sparse_3_gib_member_is_a_failure_and_peak_rss_stays_under_1_5_gb(tmp_path):
    """The shard is 20 KB; read whole (as tarfile's extractfile().read() did), the member was 3 GiB of zeros in
    memory, twice. Measured here: the run's peak RSS, and the member refused from its header."""
    image = write_image(tmp_path / "a.png", 64, 48, 0).read_bytes()
    crafted = write_tar(
        tmp_path / "crafted.tar", [gnu_sparse_member("big.png", 3 * GiB, [(GiB, b"x" * 4096)]), regular("a.png", image)]
    )
    shards = [crafted]
    if gnu_tar():  # the same, written by GNU tar itself (pax sparse 1.0) from a sparse file
        folder = tmp_path / "files"
        folder.mkdir()
        sparse_file(folder / "big.png", 3 * GiB, [(GiB, b"x" * 4096)])
        (folder / "a.png").write_bytes(image)
        shards.append(tmp_path / "gnu.tar")
        command = [gnu_tar(), "--sparse", "--format=posix", "-cf", str(shards[-1]), "big.png", "a.png"]
        subprocess.run(command, cwd=folder, check=True)
    assert all(shard.stat().st_size < 64_000 for shard in shards)
    out = tmp_path / "out.safetensors"
    # --memory-budget 2GiB makes the default item limit a quarter of it, 512 MiB, on a host with 2 GiB free; the
    # budget never exceeds what is free, so on a host short of memory it is less, down to the 256 MiB floor.
    # fmt: off
    args = [
        REAL_EXE, "images", *map(str, shards), "--model", str(MODEL), "-o", str(out), "--max-soft-tokens", "70",
        "--memory-budget", "2GiB", "--jsonl",
    ]
    # fmt: on
    listing = tmp_path / "empty.txt"
    listing.write_text("")
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS_WRAPPER, str(listing), *args], capture_output=True, text=True)
    result = json.loads(proc.stdout)
    peak = result["peak"]
    print(f"peak RSS with a sparse 3 GiB member in each of {len(shards)} shards: {peak / 2**20:.0f} MiB")
    assert result["code"] == 1, result["stderr"]
    errors = _errors(result["stderr"])
    limits = [float(m) for m in re.findall(r"over the (\d+\.\d) MiB an item may have", result["stderr"])]
    assert len(limits) == len(shards) and all(256 <= limit <= 512 for limit in limits), errors
    assert errors == [
        f"error: {shard}:big.png: the sparse member (4096 bytes stored) is 3.0 GiB (3221225472 bytes), over the "
        f"{limit:.1f} MiB an item may have; not read (--max-item-bytes raises the limit)"
        for shard, limit in zip(shards, limits, strict=True)
    ]
    assert list(gemma_embed.load(out)) == [f"{shard}:a.png" for shard in shards]
    assert peak < 1.5e9


def test_a_fifo_named_tar_and_dev_zero_linked_as_parquet_are_one_line_each(tmp_path):
    os.mkfifo(tmp_path / "pipe.tar")
    os.symlink("/dev/zero", tmp_path / "zero.parquet")
    good = write_image(tmp_path / "good.png", 64, 48, 0)
    out = tmp_path / "out.safetensors"
    started = time.monotonic()
    # fmt: off
    proc = subprocess.run(
        [
            EXE, "images", str(tmp_path / "pipe.tar"), str(tmp_path / "zero.parquet"), str(good), "--column", "image",
            "--model", str(MODEL), "-o", str(out), "--max-soft-tokens", "70", "--max-item-bytes", "64MiB",
            "--allow-outside-paths",
        ],
        capture_output=True, text=True, timeout=120,
    )
    # fmt: on
    print(f"the run took {time.monotonic() - started:.1f} s")  # before: killed after 760 s, never ending
    assert proc.returncode == 1, proc.stderr
    assert _errors(proc.stderr) == [
        f"error: {tmp_path / 'pipe.tar'}: not a regular file (a FIFO); not opened",
        f"error: {tmp_path / 'zero.parquet'}: not a regular file (a symbolic link to /dev/zero, a character device); "
        f"not opened",
    ]
    assert list(gemma_embed.load(out)) == [str(good)]

    bad = subprocess.run([EXE, "images", str(good), "--max-item-bytes", "30%"], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "--max-item-bytes" in bad.stderr and "not a share" in bad.stderr


# read(2)'s number in /proc/PID/task/TID/syscall (the call a thread is blocked in, then its arguments).
READ_SYSCALL = {"x86_64": 0, "aarch64": 63}.get(platform.machine())


def _reading_stdin(pid: int) -> bool:
    """Whether a thread of `pid` is blocked reading its stdin; True where that cannot be seen (another CPU
    architecture, /proc hidden), since the test's outcome is the same either way: it only waits for that state so
    that the signal meets a run blocked in the read, rather than one about to begin it."""
    if READ_SYSCALL is None:
        return True
    try:
        calls = [
            Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[:2] for tid in os.listdir(f"/proc/{pid}/task")
        ]
    except PermissionError:
        return True
    except OSError:
        return False  # a thread ended while we looked: look again
    return [str(READ_SYSCALL), "0x0"] in calls


def test_sigterm_while_the_path_list_on_stdin_waits_saves_what_is_done(tmp_path):
    """`producer | gemma-embed images -` where the producer stops writing but keeps the pipe open: the first
    items are embedded and saved, then the run waits on stdin; SIGTERM ends it at once (the handler's flag
    alone was never read by the blocked main thread), exit 143, and --resume finishes it."""
    images = [write_image(tmp_path / f"img{i}.png", 64 + 8 * i, 48, i) for i in range(4)]
    listing = "".join(f"{path}\n" for path in images)
    reference = tmp_path / "reference.safetensors"
    assert run_images(["-"], MODEL, reference, stdin=io.StringIO(listing), max_soft_tokens=70)[0] == 0

    out = tmp_path / "out.safetensors"
    parts = out.with_name(out.name + ".parts")
    options = ["--model", str(MODEL), "-o", str(out), "--max-soft-tokens", "70", "--device", "cpu"]
    report = tmp_path / "report.json"  # the command's PID, forked or not (tests/warm_cli.py): its /proc is read
    proc = subprocess.Popen(
        [EXE, "images", "-", *options, "--flush-every", "1", "--workers", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, REPORT_VARIABLE: str(report)},
    )
    said: list[str] = []  # the lines of stderr
    reader = threading.Thread(target=lambda: said.extend(line.decode() for line in proc.stderr))
    reader.start()
    try:
        proc.stdin.write("".join(f"{path}\n" for path in images[:2]).encode())
        proc.stdin.flush()  # and no more: the pipe stays open
        deadline = time.monotonic() + 120  # only against a hang
        # One part per item at --flush-every 1; then the run waits for the third path, blocked reading stdin. (Its
        # PID is reported before the command runs: before it saves a part.)
        while len(list(parts.glob("part-*.safetensors"))) < 2 or not _reading_stdin(reported_pid(report)):
            assert proc.poll() is None, said
            assert time.monotonic() < deadline, "the first two items were never saved"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        # It ends while stdin stays open (the handler's flag alone left it waiting for ever). The timeout is only
        # against that hang: the interpreter's own exit takes seconds on a busy machine.
        code = proc.wait(timeout=60)
        assert not proc.stdin.closed
    finally:
        proc.kill()  # a run that swallowed the signal (as before) must not outlive the test
        proc.stdin.close()
        reader.join()
    assert code == 143, said
    (note,) = [line for line in said if "interrupted" in line]
    assert note == (
        f"note: interrupted by SIGTERM: 2 items are saved in {parts}; run the same command with --resume to finish\n"
    )
    assert not any("Traceback" in line or "Fatal" in line for line in said), said

    resumed = subprocess.run(
        [EXE, "images", "-", *options, "--resume", "--jsonl"], input=listing, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    statuses = [json.loads(line).get("status") for line in resumed.stdout.splitlines()]
    assert statuses.count("resumed") == 2 and statuses.count("ok") == 2
    ours, theirs = gemma_embed.load(out), gemma_embed.load(reference)
    assert list(ours) == list(theirs) == [str(path) for path in images]
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)
