"""One writer per output: a second run into a busy output fails at once naming the holder, and the holder's
output is a single run's; a holder killed with SIGKILL leaves a lock file the next run takes (issue 20)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers import EXE, SAMPLE_MODEL, SLOW_CLI, reporting_cli, run_images, write_image
from warm_cli import REPORT_VARIABLE, reported_pid

import gemma_embed

pytestmark = pytest.mark.slow  # real processes, two at a time

OPTIONS = ["--model", str(SAMPLE_MODEL), "--max-soft-tokens", "70", "--device", "cpu"]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    for i, (w, h) in enumerate([(64, 48), (48, 64), (100, 100)]):
        write_image(folder / f"img{i}.png", w, h, i)
    return folder


@pytest.fixture(scope="module")
def reference(images, tmp_path_factory) -> Path:
    """A single uninterrupted run's output (in-process: one process start less)."""
    out = tmp_path_factory.mktemp("reference") / "reference.safetensors"
    assert run_images([images], SAMPLE_MODEL, out, max_soft_tokens=70)[0] == 0
    return out


def _start_holder(tmp_path: Path, images: Path, out: Path, *flags: str, release: Path | None = None):
    """A run that holds the output's lock and waits while "loading the model" (until `release` appears), and the
    PID of its command's process (forked from the warm server, or started anew: its report, tests/warm_cli.py)."""
    marker, report = tmp_path / "loading", tmp_path / "holder.json"
    args = [SLOW_CLI, "--load", "120", "--loading-marker", str(marker)]
    if release is not None:
        args += ["--release", str(release)]
    holder = subprocess.Popen(
        [*args, "images", str(images), "-o", str(out), *OPTIONS, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, REPORT_VARIABLE: str(report)},
    )
    deadline = time.monotonic() + 120  # only against a hang
    while not marker.exists():  # the lock is taken before loading starts
        assert holder.poll() is None, holder.stderr.read().decode()
        assert time.monotonic() < deadline, "the first run never started loading"
        time.sleep(0.02)
    return holder, reported_pid(report)  # reported before the command ran


def _same_rows(out: Path, reference: Path) -> None:
    ours, theirs = gemma_embed.load(out), gemma_embed.load(reference)
    assert list(ours) == list(theirs)
    for key, rows in ours.items():
        assert torch.equal(rows, theirs[key]), key
    assert gemma_embed.read_metadata(out) == gemma_embed.read_metadata(reference)


@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
def test_a_second_run_into_a_busy_output_fails_at_once_naming_the_holder(tmp_path, images, reference, flag):
    out = tmp_path / "out.safetensors"
    release = tmp_path / "release"
    holder, pid = _start_holder(tmp_path, images, out, flag, release=release)
    try:
        assert (tmp_path / "out.lock").read_text() == f"{pid} run\n"
        started = time.monotonic()
        second, report = reporting_cli("images", images, "-o", out, *OPTIONS, flag, timeout=60)
        elapsed = time.monotonic() - started
        assert second.returncode == 2, second.stderr
        assert second.stderr.splitlines() == [
            f"error: {out}: another gemma-embed run (PID {pid}) is writing this output; "
            f"wait for it to finish or choose another --output"
        ]
        # At once, as docs/reliability.md promises: refused before torch is imported (the event that
        # makes it quick), and, the user's view of it, within a bound far above a bare process start on a loaded
        # 2-core machine and far below the wait for the holder (which holds until `release`, after this).
        assert report["imported"] == []
        assert elapsed < 15, f"the second run took {elapsed:.2f} s to fail"
        assert second.stdout == ""
    finally:
        release.touch()
        stdout, stderr = holder.communicate(timeout=180)
    assert holder.returncode == 0, stderr.decode()
    _same_rows(out, reference)
    assert not (tmp_path / "out.lock").exists()  # a finished run leaves no lock file
    assert not (tmp_path / "out.safetensors.parts").exists()


def test_a_holder_killed_with_sigkill_leaves_a_lock_the_next_run_takes(tmp_path, images, reference):
    out = tmp_path / "out.safetensors"
    holder, pid = _start_holder(tmp_path, images, out, "--overwrite")
    os.kill(pid, signal.SIGKILL)  # the command's own process
    holder.communicate(timeout=60)
    assert holder.returncode == -signal.SIGKILL
    lock = tmp_path / "out.lock"
    assert lock.read_text() == f"{pid} run\n"  # the file stays; the kernel released the flock
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    resumed = subprocess.run(
        [EXE, "images", str(images), "-o", str(out), *OPTIONS, "--resume"], capture_output=True, text=True, timeout=180
    )
    assert resumed.returncode == 0, resumed.stderr
    _same_rows(out, reference)
    assert not lock.exists()
