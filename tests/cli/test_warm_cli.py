"""The tests' `EXE` (the command forked from a server that has imported it, tests/warm_cli.py) behaves as the
installed command started anew, which the rest of the suite relies on: the same exit code, records and output
bytes; the signals a test sends reach the command; a caller killed with SIGKILL takes its command with it; and a run
whose environment differs in what is read at import is a real start. `SLOW_CLI` (tests/slow_gemma_embed.py forked
the same way) behaves as `python tests/slow_gemma_embed.py`."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from helpers import EXE, PYTHON_CLI, REAL_EXE, ROOT, SAMPLE_MODEL, SLOW_CLI, SLOW_EXE
from warm_cli import REPORT_VARIABLE, SOCKET_VARIABLE

SAMPLE_IMAGES = ROOT / "samples" / "media" / "images"
TEXT_MODEL = ROOT / "samples" / "tiny-embeddinggemma"


@pytest.fixture
def server_log() -> Path:
    """The server's log (each run it forks, each real start and why), written before a caller hears back; skipped
    where no server was started (GEMMA_EMBED_TEST_NO_WARM_CLI)."""
    path = os.environ.get(SOCKET_VARIABLE)
    if not path:
        pytest.skip("no warm command server in this session (GEMMA_EMBED_TEST_NO_WARM_CLI is set)")
    return Path(path).parent / "server.log"


def _forked(log: Path) -> int:
    return log.read_text().count(": forked ")


def _items(stdout: str) -> list[dict]:
    return [r for r in map(json.loads, stdout.splitlines()) if r.get("type") == "item"]


def test_a_run_through_the_server_equals_a_real_start(tmp_path, server_log):
    runs = {}
    for name, exe in (("warm", EXE), ("real", REAL_EXE), ("warm again", EXE)):
        folder = tmp_path / name
        folder.mkdir()
        before = _forked(server_log)
        proc = subprocess.run(
            [exe, "images", SAMPLE_IMAGES, "--model", SAMPLE_MODEL, "-o", "out.safetensors", "--jsonl"],
            capture_output=True,
            text=True,
            cwd=folder,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        assert _forked(server_log) - before == (0 if exe == REAL_EXE else 1)
        runs[name] = (_items(proc.stdout), (folder / "out.safetensors").read_bytes())
    assert runs["warm"][0] and runs["warm"] == runs["real"] == runs["warm again"]

    usage = [subprocess.run([exe, "images", "--batch-size", "zero"], capture_output=True) for exe in (EXE, REAL_EXE)]
    assert usage[0].returncode == usage[1].returncode == 2
    assert usage[0].stderr == usage[1].stderr and usage[0].stderr.startswith(b"error: ")


def _start_serving(exe: str) -> tuple[subprocess.Popen, tuple[str, int]]:
    proc = subprocess.Popen(
        [exe, "serve", "--port", "0", "--model", TEXT_MODEL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    address = None
    for line in proc.stdout:  # the server's own announcements: listening, then ready once the model is loaded
        event = json.loads(line)
        if event["type"] == "listening":
            parts = urlsplit(event["url"])
            address = (parts.hostname, parts.port)
        if event["type"] == "ready" and address is not None:
            return proc, address
    raise AssertionError(f"no 'ready' event: {proc.stderr.read()}")


def _accepts(address: tuple[str, int]) -> bool:
    try:
        socket.create_connection(address, timeout=5).close()
        return True
    except OSError:
        return False


def test_the_slowed_script_runs_forked_as_python_runs_it(tmp_path, server_log):
    """SLOW_CLI runs tests/slow_gemma_embed.py as `__main__` in the forked child: its patches apply (each device
    batch waits for its gate file, so a run whose gate holds batch 0 open and is then sent SIGINT stops with 130 and
    no output, as `python SLOW_EXE` does), and a run through it writes the real start's bytes."""
    outputs = {}
    for name, start in (("warm", [SLOW_CLI]), ("real", [sys.executable, str(SLOW_EXE)])):
        folder = tmp_path / name
        (folder / "gate").mkdir(parents=True)
        before = _forked(server_log)
        args = ["--gate", "gate", "images", SAMPLE_IMAGES, "--model", SAMPLE_MODEL, "-o", "out.safetensors"]
        held = subprocess.Popen([*start, *map(str, args)], cwd=folder, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120  # only against a hang
        while not (folder / "out.lock").exists() and held.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # a poll of the lock file: the run goes no further than batch 0's gate
        held.send_signal(signal.SIGINT)
        _, stderr = held.communicate(timeout=120)
        assert held.returncode == 130 and "Traceback" not in stderr and not (folder / "out.safetensors").exists()
        assert _forked(server_log) - before == (1 if name == "warm" else 0)
        for batch in range(64):
            (folder / "gate" / str(batch)).touch()
        done = subprocess.run([*start, *map(str, args), "--overwrite"], cwd=folder, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outputs[name] = (folder / "out.safetensors").read_bytes()
    assert outputs["warm"] == outputs["real"]


def test_signals_reach_the_command_and_a_killed_caller_takes_it_along(server_log):
    before = _forked(server_log)
    proc, address = _start_serving(EXE)
    assert _forked(server_log) == before + 1 and _accepts(address)
    proc.send_signal(signal.SIGTERM)  # the server's documented stop: exit 0 (docs/serve.md)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    assert not _accepts(address)

    proc, address = _start_serving(EXE)
    command = int(server_log.read_text().rsplit(": forked ", 1)[1].split()[0])  # the forked child's PID
    ended = os.pidfd_open(command)  # readable once that process has exited (Linux 5.3)
    try:
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        # The command notices its caller's end at once and kills itself.
        assert select.select([ended], [], [], 60)[0], "the command outlived its killed caller"
    finally:
        os.close(ended)
    assert not _accepts(address)


def test_a_run_whose_environment_differs_at_import_is_a_real_start(server_log):
    before = server_log.read_text()
    proc = subprocess.run(
        [EXE, "--version"], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120
    )
    real = subprocess.run([REAL_EXE, "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == real.returncode == 0 and proc.stdout == real.stdout
    assert server_log.read_text()[len(before) :].strip() == "['--version']: a real start (environment: HF_HUB_OFFLINE)"


def test_a_run_without_roots_file_access_is_forked_and_refused_the_file_as_a_real_start(tmp_path, server_log):
    """`setpriv` drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH before the command: a forked run holds the caller's
    capabilities, so a file of mode 000 is as unreadable to it as to the real start (named in the same line)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("a capability a caller can drop needs root and setpriv (util-linux)")
    folder = tmp_path / "images"
    shutil.copytree(SAMPLE_IMAGES, folder)
    locked = sorted(folder.iterdir())[0]
    locked.chmod(0)
    runs = {}
    for name, exe in (("warm", EXE), ("real", REAL_EXE)):
        before = _forked(server_log)
        proc = subprocess.run(
            ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", exe, "images", str(folder)]
            + ["--model", str(SAMPLE_MODEL), "-o", str(tmp_path / f"{name}.safetensors"), "--jsonl"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert _forked(server_log) - before == (1 if exe == EXE else 0), server_log.read_text()[-300:]
        records = {r["key"]: r for r in map(json.loads, proc.stdout.splitlines()) if "key" in r}
        runs[name] = (proc.returncode, records, proc.stderr.splitlines()[:-1])  # the last: timing and output
    assert runs["warm"] == runs["real"]
    code, records, lines = runs["warm"]
    assert lines == [f"error: {locked.name}: permission denied: Permission denied"]
    assert code == 1 and records[locked.name]["error"] == "unreadable", records  # named, and the others embedded
    assert sorted(r["status"] for r in records.values()) == ["failed"] + ["ok"] * (len(records) - 1)


HOLDING = """
import json, os, sys
held = bytearray(int(sys.argv[1]) << 20)
held[::4096] = b"x" * len(held[::4096])  # every page touched: resident
print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "main": __name__}))
"""


def test_the_python_launcher_runs_a_script_as_python_does_and_its_report_holds_its_pid_and_peak(tmp_path, server_log):
    """PYTHON_CLI (Ray's `py_executable` in the tests) is `python SCRIPT ARGS` forked: the script runs as
    `__main__` with its arguments, in a process that reports its PID and, as it ends, its own peak RSS, which grows
    by what the script holds (what the peak-RSS tests read of a forked command)."""
    script = tmp_path / "hold.py"
    script.write_text(HOLDING)
    reports = {}
    for megabytes in (0, 256):
        report = tmp_path / f"report-{megabytes}.json"
        before = _forked(server_log)
        env = {**os.environ, REPORT_VARIABLE: str(report)}
        args = [str(script), str(megabytes), "x y"]
        warm = subprocess.run([PYTHON_CLI, *args], capture_output=True, text=True, env=env, timeout=120)
        real = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
        assert warm.returncode == real.returncode == 0, warm.stderr
        assert _forked(server_log) == before + 1
        said, said_real = json.loads(warm.stdout), json.loads(real.stdout)
        assert said["argv"] == said_real["argv"] == [str(megabytes), "x y"] and said["main"] == "__main__"
        reports[megabytes] = json.loads(report.read_text())
        assert reports[megabytes]["pid"] == said["pid"]
    grew = reports[256]["peak"] - reports[0]["peak"]
    assert 240 << 20 < grew < 300 << 20, reports  # 256 MiB, give or take what else differs between the runs


def test_a_path_naming_the_same_folders_again_is_the_same_environment(server_log):
    """PATH compared as the folders it names, each once (as it is searched): named again, as pyenv's shim does for
    each process it starts (Ray's workers have it so), the run forks; a folder more is a real start."""
    path = os.environ["PATH"]
    before = _forked(server_log)
    again = subprocess.run([EXE, "--version"], capture_output=True, env={**os.environ, "PATH": f"{path}:{path}"})
    assert again.returncode == 0 and _forked(server_log) == before + 1
    log = server_log.read_text()
    more = subprocess.run([EXE, "--version"], capture_output=True, env={**os.environ, "PATH": f"/nonexistent:{path}"})
    assert more.returncode == 0
    assert server_log.read_text()[len(log) :].strip() == "['--version']: a real start (environment: PATH)"


def test_a_command_ended_by_a_signal_ends_its_caller_by_the_same_signal(tmp_path, server_log):
    """The caller's status is the command's: ended by SIGKILL (which no process may catch or reset) or SIGTERM, as
    `python SCRIPT` ends."""
    script = tmp_path / "ends.py"
    script.write_text("import os, signal, sys\nos.kill(os.getpid(), getattr(signal, sys.argv[1]))\n")
    for name in ("SIGKILL", "SIGTERM"):
        before = _forked(server_log)
        warm = subprocess.run([PYTHON_CLI, str(script), name], capture_output=True, timeout=120)
        real = subprocess.run([sys.executable, str(script), name], capture_output=True, timeout=120)
        assert warm.returncode == real.returncode == -getattr(signal, name), warm.stderr
        assert _forked(server_log) == before + 1
