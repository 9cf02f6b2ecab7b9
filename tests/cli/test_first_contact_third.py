"""The first hour's stumbles of issue 48, through real processes: a file of another command given by name, a text
given where a file is read, a reader that closes stdout early, usage errors that came after torch's import, the
server's port in use, the embed summary on a terminal, and search's header. "At once" is asserted as "before torch
or transformers were imported" (helpers.reporting_cli), never as seconds: the times are in the report of the
issue."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess

import pytest
from helpers import EXE, ROOT, SAMPLE_MODEL, on_a_terminal, reporting_cli

import gemma_embed

EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
MEDIA = ROOT / "samples" / "media"
CLIP = MEDIA / "video" / "clip-h264.mp4"


@pytest.fixture(scope="module")
def text_output(tmp_path_factory):
    """Three hundred short texts as EmbeddingGemma 2 vectors: an `inspect` table longer than a small pipe holds."""
    folder = tmp_path_factory.mktemp("third")
    lines = folder / "lines.txt"
    lines.write_text("".join(f"line {n} of the corpus\n" for n in range(300)))
    out = folder / "out.safetensors"
    gemma_embed.run(gemma_embed.RunConfig(modality="text", inputs=[str(lines)], model=str(EG2), output=out))
    return out


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["images", CLIP, "--model", SAMPLE_MODEL],
            f"error: {CLIP}: not an image file; these are video files: gemma-embed video PATH...",
        ),
        (
            ["audio", MEDIA / "images" / "tall.png", "--model", SAMPLE_MODEL],
            f"error: {MEDIA / 'images' / 'tall.png'}: not an audio file; these are image files: gemma-embed images "
            "PATH...",
        ),
        (
            ["plan", CLIP, "--model", SAMPLE_MODEL],
            f"error: {CLIP}: not an image file; these are video files: gemma-embed plan --modality video PATH...",
        ),
    ],
    ids=["images-given-a-video", "audio-given-an-image", "plan-given-a-video"],
)
def test_a_file_of_another_command_is_a_usage_error_before_any_work(tmp_path, args, line):
    out = [] if args[0] == "plan" else ["-o", tmp_path / "out.safetensors"]
    proc, report = reporting_cli(*args, *out)
    assert proc.returncode == 2
    assert proc.stderr == line + "\n"  # the folder walk's own words for the command that takes these files
    assert proc.stdout == ""
    assert report["imported"] == []  # before torch: at once
    assert list(tmp_path.iterdir()) == []  # no output, no errors file


def test_a_file_of_its_own_kind_beside_the_other_command_runs_as_before(tmp_path):
    """Video files carry soundtracks: `audio clip.mp4` is the audio command's own (no usage error)."""
    proc, _ = reporting_cli("audio", CLIP, "--model", SAMPLE_MODEL, "-o", tmp_path / "a.safetensors", "-q")
    assert "these are" not in proc.stderr


def test_a_text_given_as_an_argument_says_how_to_give_it_on_stdin(tmp_path):
    proc, report = reporting_cli("text", "a cat", "--model", EG2, "-o", tmp_path / "t.safetensors")
    assert proc.returncode == 2
    assert proc.stderr == (
        'error: a cat: no such file or directory; to embed this text, give it on stdin: echo "a cat" | '
        "gemma-embed text -\n"
    )
    assert report["imported"] == [] and list(tmp_path.iterdir()) == []
    proc, _ = reporting_cli("text", tmp_path / "notes.txt", "--model", EG2)  # a file name: no hint
    assert proc.stderr == f"error: {tmp_path / 'notes.txt'}: no such file or directory\n"


def test_the_stdin_hint_quotes_the_text_for_the_shell():
    text = "it's $5"
    proc, _ = reporting_cli("text", text, "--model", EG2)
    echo, rest = proc.stderr.split("give it on stdin: ")[1].rstrip("\n").split(" | ")
    assert rest == "gemma-embed text -"
    assert subprocess.run(["sh", "-c", echo], capture_output=True, text=True).stdout == text + "\n"


@pytest.mark.parametrize(
    "name, line",
    [
        ("x.npy", "error: x.npy: an embedding output is a .safetensors file, not .npy; name it x.safetensors"),
        ("x.safetensors", "error: x.safetensors: exists; pass --overwrite to replace it or --resume to add to it"),
    ],
    ids=["npy", "exists"],
)
def test_output_usage_errors_come_before_torch_is_imported(tmp_path, monkeypatch, name, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.safetensors").write_bytes(b"mine")
    proc, report = reporting_cli("images", MEDIA / "images", "--model", SAMPLE_MODEL, "-o", name)
    assert proc.returncode == 2 and proc.stderr == line + "\n"
    assert report["imported"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.safetensors"]


def read_first_line_and_close(args) -> subprocess.Popen:
    """`gemma-embed ARGS | head -1` with a pipe of one page (F_SETPIPE_SZ): the command's output does not fit, so
    it is still writing when the reader goes away."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, 4096)
    proc = subprocess.Popen([EXE, *map(str, args)], stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.readline()  # one line, as head -1 takes it, then the reader goes
    return proc


@pytest.mark.parametrize("command", [["inspect", "--limit", "300"], ["search", "line 1", "-k", "300"]])
def test_a_reader_that_closes_stdout_early_is_exit_0_without_a_line(text_output, command):
    for _ in range(3):  # it was 1, three times of three
        name, *rest = command
        proc = read_first_line_and_close([name, text_output, *rest])
        assert proc.wait(timeout=120) == 0
        assert proc.stderr.read() == b""


def test_a_port_in_use_is_one_error_line_before_the_server_imports(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc, report = reporting_cli("serve", "--model", EG2, "--port", port)
    assert proc.returncode == 2
    assert proc.stderr == f"error: --host 127.0.0.1 --port {port}: cannot listen there: Address already in use\n"
    assert report["imported"] == []  # before torch (and fastapi, uvicorn): at once


def test_on_a_terminal_an_embed_run_says_when_it_loaded_and_ends_without_the_json_record(tmp_path):
    (tmp_path / "lines.txt").write_text("a cat\na dog\n")
    args = ["text", "lines.txt", "--model", EG2, "-o", "out.safetensors"]
    code, shown = on_a_terminal(args, tmp_path, stderr_too=True)
    shown = shown.decode("utf-8", "replace")
    assert code == 0
    assert "2 ok, 0 failed in " in shown and "-> out.safetensors" in shown  # the line for people
    assert '"type": "summary"' not in shown
    # Between `loading` and the end, a line once the model is in (the wait before it is imports and weights).
    lines = [line.strip() for line in shown.replace("\r", "\n").splitlines() if line.strip()]
    loading = lines.index(f"loading {EG2} ...")
    loaded = next(n for n, line in enumerate(lines) if line.startswith("loaded in "))
    assert loading < loaded < next(n for n, line in enumerate(lines) if "2 ok, 0 failed in " in line)
    assert re.fullmatch(r"loaded in \d+\.\d s on cpu \(float32\); encoding \.\.\.", lines[loaded])
    code, shown = on_a_terminal([*args, "--overwrite", "--jsonl"], tmp_path, stderr_too=True)  # JSON asked: given
    shown = shown.decode("utf-8", "replace")
    assert code == 0 and '"type": "summary"' in shown
    piped = subprocess.run([EXE, *map(str, args), "--overwrite"], cwd=tmp_path, capture_output=True, text=True)
    assert piped.returncode == 0 and '"type": "summary"' in piped.stdout  # a program reading stdout gets it
