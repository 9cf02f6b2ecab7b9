"""One map from a fault to its exit code and line, for every command (issue 30, item 6).

The four commands that read an output, run as the installed `gemma-embed` on a missing file and on random bytes
named like an output: one `error:` line naming the file, no traceback, nothing on stdout, nothing written, and the
same code per fault from all four. Then every command's fault path through `errors.kind_of`, and
docs/exit-codes.md against the map.
"""

from __future__ import annotations

import errno
import os
import random
import re
import signal
import subprocess

import pytest
from helpers import EXE, ROOT
from typer.testing import CliRunner

from gemma_embed import cli, errors

READERS = {
    "search": lambda f: ["search", f, "a tall building at night"],
    "index": lambda f: ["index", f],
    "inspect": lambda f: ["inspect", f],
    "export": lambda f: ["export", f, "--to", "npy"],
}
FAULTS = {
    # name of the file -> (its bytes, or None: it does not exist; the kind every command must report)
    "missing.safetensors": (None, errors.MISSING),
    "x.safetensors": (random.Random(30).randbytes(4096), errors.NOT_OURS),
    "x.index.json": (random.Random(31).randbytes(512), errors.NOT_OURS),
}


def _run_all(folder, file) -> dict[str, subprocess.CompletedProcess]:
    """The four commands on `file`, started together (each waits only for its own exit), offline and with an
    empty model cache: a command that went for a model instead of failing on the file would say so."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(folder / "hf"), "COLUMNS": "200"}
    started = {
        name: subprocess.Popen(
            [EXE, *args(str(file))], cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, args in READERS.items()
    }
    done = {}
    for name, proc in started.items():
        out, err = proc.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


@pytest.mark.parametrize("name", FAULTS)
def test_the_four_readers_report_a_fault_alike(tmp_path, name):
    content, kind = FAULTS[name]
    work = tmp_path / "work"
    work.mkdir()
    file = work / name
    if content is not None:
        file.write_bytes(content)
    before = sorted(work.iterdir())
    done = _run_all(tmp_path, file)
    for command, proc in done.items():
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {file}: "), (command, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert proc.stdout == "", (command, proc.stdout)
    assert {command: proc.returncode for command, proc in done.items()} == dict.fromkeys(READERS, kind.exit_code())
    assert sorted(work.iterdir()) == before, "a failed command wrote something beside the file"


def test_a_busy_output_is_its_own_kind_with_the_usage_code(tmp_path):
    """The lock's refusal is the map's `output busy` (same code 2 as before, docs/reliability.md)."""
    from gemma_embed.store.lock import output_lock

    out = tmp_path / "o.safetensors"
    with output_lock(out):
        proc = subprocess.run(
            [EXE, "images", str(ROOT / "samples" / "media" / "images"), "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == errors.BUSY.exit_code() == 2
    assert proc.stderr.splitlines() == [
        f"error: {out}: another gemma-embed run (PID {os.getpid()}) is writing this output; wait for it to finish "
        f"or choose another --output"
    ]


# ------------------------------------------------------------------------------------------ through the map

COMMANDS = {
    # each command with arguments that fault inside the command (past the option parser)
    "images": ["images", "nope.png"],
    "video": ["video", "nope.mp4"],
    "audio": ["audio", "nope.wav"],
    "text": ["text", "nope.txt"],
    "plan": ["plan", "nope.png"],
    "search": ["search", "nope.safetensors", "q"],
    "index": ["index", "nope.safetensors"],
    "inspect": ["inspect", "nope.safetensors"],
    "export": ["export", "nope.safetensors", "--to", "npy"],
    "models": ["models"],
    "dedup": ["dedup", "nope.safetensors"],
    "map": ["map", "nope.safetensors"],
    "serve": ["serve", "--output", "nope.safetensors", "--port", "0"],
}


def test_every_command_has_a_fault_case_here():
    from typer.main import get_command

    assert sorted(get_command(cli.app).commands) == sorted(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reports_through_the_one_map(tmp_path, monkeypatch, command):
    """The map's answer, whatever it is, is what the command exits with and what its line says."""
    seen: list[BaseException] = []
    marked = errors.ErrorKind("marked", 99, "a kind only this test has")

    def kind_of(exc):
        seen.append(exc)
        return marked

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(errors, "kind_of", kind_of)
    monkeypatch.setattr("gemma_embed.models.registry.models_text", lambda: (_ for _ in ()).throw(OSError("boom")))
    result = CliRunner().invoke(cli.app, COMMANDS[command])
    assert result.exit_code == 99, result.output
    assert seen and result.output.startswith("error: ") and len(result.output.splitlines()) == 1


def _invoke_raising(monkeypatch, exc: BaseException):
    """`inspect` with its library call raising `exc`."""

    def show(*args, **kwargs):
        raise exc

    monkeypatch.setattr("gemma_embed.show.show", show)
    return CliRunner().invoke(cli.app, ["inspect", "o.safetensors"])


@pytest.mark.parametrize(
    "exc, kind, line",
    [
        (MemoryError(), errors.OUT_OF_MEMORY, "error: out of memory"),
        (
            OSError(errno.ENOSPC, "No space left on device", "o.npy"),
            errors.RUN_STOPPED,
            "error: o.npy: No space left on device",
        ),
        (PermissionError(errno.EACCES, "Permission denied", "o.safetensors"), errors.NOT_OURS, None),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "o.safetensors"), errors.MISSING, None),
        (KeyboardInterrupt(), errors.INTERRUPTED, "note: interrupted by SIGINT"),
    ],
    ids=["memory", "disk-full", "permission", "missing", "ctrl-c"],
)
def test_faults_the_library_does_not_type_have_their_kind(monkeypatch, exc, kind, line):
    result = _invoke_raising(monkeypatch, exc)
    assert result.exit_code == kind.exit_code(signal.SIGINT) and errors.kind_of(exc) is kind
    (printed,) = result.output.splitlines()
    assert printed == (line or f"error: o.safetensors: {exc.strerror}")


def test_torch_out_of_memory_is_out_of_memory(monkeypatch):
    import torch

    result = _invoke_raising(monkeypatch, torch.OutOfMemoryError("CUDA out of memory.\nTried to allocate 2 GiB"))
    assert result.exit_code == errors.OUT_OF_MEMORY.code
    assert result.output.splitlines() == ["error: out of memory: CUDA out of memory. Tried to allocate 2 GiB"]


def test_a_fault_of_no_kind_is_a_bug_and_shows_its_traceback(monkeypatch):
    result = _invoke_raising(monkeypatch, TypeError("a bug"))
    assert isinstance(result.exception, TypeError) and errors.kind_of(result.exception) is None


# ------------------------------------------------------------------------------------------ the page

PAGE = ROOT / "docs" / "exit-codes.md"


def test_the_exit_codes_page_is_the_map():
    text = PAGE.read_text(encoding="utf-8")
    assert errors.exit_status_section() in text, "regenerate: python -c 'from gemma_embed import errors; ...'"
    assert errors.diagnostics_section() in text


def test_the_readme_names_every_code_and_links_the_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sentence = re.search(r"exit code 0: .*?\(\[Exit codes\]\(docs/exit-codes\.md\)\)", readme, re.S)
    assert sentence is not None
    codes = {kind.code for kind in errors.EXIT_STATUS if not kind.adds_signal}
    for code in codes:
        assert re.search(rf"\b{code}:\s", sentence.group(0)), code
    assert "130/143" in sentence.group(0)
    assert "](exit-codes.md)" in (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
