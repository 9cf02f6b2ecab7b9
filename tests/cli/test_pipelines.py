"""Pipelines and interruptions lose nothing: items stream out as they finish, a closed pipe, a second --resume or
an early Ctrl-C costs no work; files behave like any other tool's; bad arguments fail fast with one line."""

from __future__ import annotations

import hashlib
import io
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import EXE, ROOT, SAMPLE_MODEL, SLOW_CLI, record_batches, reporting_cli, run_images, write_image

import gemma_embed
from gemma_embed.config import DEFAULT_MODELS
from gemma_embed.models.gemma4 import Gemma4VisionTower

SAMPLE_IMAGES = ROOT / "samples" / "media" / "images"


def _tiny_images(folder: Path, count: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    sizes = [(24, 16), (16, 24), (20, 20), (40, 10)]
    for i in range(count):
        write_image(folder / f"img{i:03d}.png", *sizes[i % len(sizes)], seed=i)
    return folder


def _tool_lines(stderr: str) -> list[str]:
    """Every stderr line must be the tool's own: an error/warning/note line or the closing summary."""
    bad = [
        line
        for line in stderr.splitlines()
        if line and not line.startswith(("error: ", "warning: ", "note: ")) and " ok, " not in line
    ]
    assert not bad, bad
    return stderr.splitlines()


# ------------------------------------------------------------------------------------------ closed pipes


def test_head_closing_stdout_loses_nothing(tmp_path):
    # head exits on the first record, which comes after the first chunk: the other items' records then meet a
    # closed pipe (60 items, not more: only that there are records after the first matters).
    images = _tiny_images(tmp_path / "images", 60)
    out = tmp_path / "o.safetensors"
    tool = subprocess.Popen(
        [
            EXE,
            "images",
            str(images),
            "--model",
            str(SAMPLE_MODEL),
            "-o",
            str(out),
            "--jsonl",
            "--max-soft-tokens",
            "70",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    head = subprocess.run(["head", "-1"], stdin=tool.stdout, capture_output=True, timeout=300)
    tool.stdout.close()  # only head holds the read end now: when it exits, the pipe is closed
    stderr = tool.stderr.read().decode()
    assert tool.wait(timeout=300) == 0, stderr
    assert json.loads(head.stdout.decode())["type"] == "item"
    lines = _tool_lines(stderr)
    assert f"note: stdout closed; 60 items written to {out}" in lines
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert len(gemma_embed.load(out)) == 60


def test_closed_stderr_is_not_a_failure_either(tmp_path):
    images = _tiny_images(tmp_path / "images", 4)
    out = tmp_path / "o.safetensors"
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read stderr
    proc = subprocess.run(
        [EXE, "images", str(images), "--model", str(SAMPLE_MODEL), "-o", str(out), "--max-soft-tokens", "70"],
        stderr=write_end,
        stdout=subprocess.PIPE,
        timeout=300,
    )
    os.close(write_end)
    assert proc.returncode == 0
    assert json.loads(proc.stdout.decode().splitlines()[-1])["ok"] == 4
    assert len(gemma_embed.load(out)) == 4


# ------------------------------------------------------------------------------------------ --resume


def test_resume_from_another_folder_keeps_the_earlier_items(tmp_path, monkeypatch):
    first = _tiny_images(tmp_path / "a", 2)
    second = tmp_path / "b"
    second.mkdir()
    write_image(second / "other.png", 30, 18, seed=99)
    out = tmp_path / "o.safetensors"
    assert run_images([first], SAMPLE_MODEL, out, max_soft_tokens=70)[0] == 0
    before = gemma_embed.load(out)

    code, records, _ = run_images([second], SAMPLE_MODEL, out, max_soft_tokens=70, resume=True, overwrite=False)
    assert code == 0 and records[-1]["kept"] == 2 and records[-1]["items"] == 3
    after = gemma_embed.load(out)
    assert list(after) == ["img000.png", "img001.png", "other.png"]
    assert all(after[k].equal(before[k]) for k in before)

    # The same files under other keys (absolute paths on stdin): reused by content, not recomputed.

    batches = record_batches(monkeypatch, Gemma4VisionTower)
    listing = io.StringIO("".join(f"{p.resolve()}\n" for p in sorted(first.iterdir())))
    code, records, _ = run_images(
        ["-"], SAMPLE_MODEL, out, stdin=listing, max_soft_tokens=70, resume=True, overwrite=False
    )
    assert code == 0 and batches == []  # nothing reached the tower
    items = [r for r in records if r["type"] == "item"]
    assert [r["status"] for r in items] == ["resumed", "resumed"] and records[-1]["resumed"] == 2
    again = gemma_embed.load(out)
    for path in sorted(first.iterdir()):
        assert again[str(path.resolve())].equal(before[path.name])
    assert len(again) == 5  # the earlier keys are kept too

    # --prune drops what this input does not name, and says how many.
    code, records, _ = run_images(
        [second], SAMPLE_MODEL, out, max_soft_tokens=70, resume=True, overwrite=False, prune=True
    )
    assert code == 0 and records[-1]["pruned"] == 4 and records[-1]["resumed"] == 1
    assert list(gemma_embed.load(out)) == ["other.png"]


# ------------------------------------------------------------------------------------------ streaming


def _slow(
    *args, encode: float = 0.0, gate: Path | None = None, load: float = 0.0, marker: Path | None = None
) -> subprocess.Popen:
    extra = ["--encode", str(encode)] if encode else []
    if gate is not None:
        extra += ["--gate", str(gate)]
    if load:
        extra += ["--load", str(load), "--loading-marker", str(marker)]
    return subprocess.Popen([SLOW_CLI, *extra, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _lines(stream) -> queue.Queue:
    """A stream's lines as they come, read in a thread (so that a test waiting for one fails instead of hanging)."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


def test_records_stream_out_after_each_chunk_and_an_early_sigint_keeps_them(tmp_path):
    images = _tiny_images(tmp_path / "images", 8)
    out = tmp_path / "o.safetensors"
    gate = tmp_path / "gate"
    gate.mkdir()
    args = ["images", images, "--model", SAMPLE_MODEL, "-o", out, "--jsonl", "--batch-size", "1"]
    proc = _slow(*args, "--max-soft-tokens", "70", gate=gate)
    records = _lines(proc.stdout)
    for batch in range(3):
        # Each record comes after its own chunk, not after the window: chunk N+1 waits until record N is read.
        (gate / str(batch)).touch()
        record = json.loads(records.get(timeout=120))  # only against a hang: record N never came
        assert record["type"] == "item" and record["status"] == "ok"
    assert records.empty() and proc.poll() is None  # five of the eight chunks still to come, the fourth held

    # A SIGINT then leaves the items already reported saved; --resume reuses them.
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    stderr = stderr.decode()
    assert proc.returncode == 130, stderr
    notes = [line for line in _tool_lines(stderr) if line.startswith("note: interrupted by SIGINT: ")]
    assert len(notes) == 1 and "run the same command with --resume to finish" in notes[0]
    resumed = subprocess.run(
        [EXE, *map(str, args), "--max-soft-tokens", "70", "--resume"], capture_output=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr.decode()
    statuses = [json.loads(line)["status"] for line in resumed.stdout.decode().splitlines()[:-1]]
    assert statuses.count("resumed") >= 3 and len(statuses) == 8
    assert len(gemma_embed.load(out)) == 8


def test_sigint_while_loading_says_so(tmp_path):
    marker = tmp_path / "loading"
    proc = _slow(
        "images", SAMPLE_IMAGES, "--model", SAMPLE_MODEL, "-o", tmp_path / "o.safetensors", load=120, marker=marker
    )
    deadline = time.monotonic() + 120  # only against a hang: a process start on a loaded machine took 22 s
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert stderr.decode().splitlines()[0] == "note: interrupted while loading the model; nothing to save"
    summary = json.loads(stdout.decode().splitlines()[-1])
    assert summary["interrupted"] == "SIGINT" and summary["output"] is None
    assert not (tmp_path / "o.safetensors").exists() and not (tmp_path / "o.safetensors.parts").exists()


# ------------------------------------------------------------------------------------------ files


def test_identical_runs_give_identical_bytes_with_the_umasks_permissions(tmp_path):
    bad = tmp_path / "in" / "broken.png"
    images = _tiny_images(tmp_path / "in", 5)
    bad.write_bytes(b"not a png")

    def run(out: Path) -> None:
        subprocess.run(
            [EXE, "images", str(images), "--model", str(SAMPLE_MODEL), "-o", str(out), "--shard-size", "2", "-q"],
            capture_output=True,
            timeout=300,
            preexec_fn=lambda: os.umask(0o022),
        )

    digests = []
    for n in range(2):
        folder = tmp_path / f"run{n}"
        folder.mkdir()
        run(folder / "o.safetensors")
        files = sorted(p for p in folder.iterdir())
        assert [p.name for p in files] == [
            "o-00000.safetensors",
            "o-00001.safetensors",
            "o-00002.safetensors",
            "o.errors.jsonl",
            "o.index.json",
        ]
        assert all(p.stat().st_mode & 0o777 == 0o644 for p in files), [oct(p.stat().st_mode) for p in files]
        digests.append({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files})
    assert digests[0] == digests[1]


# ------------------------------------------------------------------------------------------ one-line errors


def _cli(*args, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [EXE, *map(str, args)], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def test_a_mistyped_model_folder_fails_at_once(tmp_path):
    proc, report = reporting_cli("images", SAMPLE_IMAGES, "--model", "./nope", "-o", tmp_path / "o.safetensors")
    assert report["imported"] == []  # at once: refused before torch is imported, let alone a model looked for
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: Invalid value for '--model': ./nope: no such folder (and not a hub id) "
        "(see 'gemma-embed images --help')"
    ]


def test_an_unreachable_hub_fails_fast_in_one_line(tmp_path):
    proc, report = reporting_cli(
        "images",
        SAMPLE_IMAGES,
        "--model",
        "someone/some-model",
        "-o",
        tmp_path / "o.safetensors",
        env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")},
    )
    # Fast: the tool's one probe, then huggingface_hub's one fetch of its agent registry (its own short timeout);
    # never huggingface_hub's download retries (five, with backoff: 25 s and six warning lines, measured).
    hub = ["127.0.0.1", 9]
    assert report["connects"][0] == hub and report["connects"].count(hub) <= 2, report["connects"]
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: someone/some-model: config.json is not in the local cache and 127.0.0.1 cannot be reached "
        "(Connection refused); pass a local checkpoint folder with --model, or download it where there is a "
        "network (hf download someone/some-model) and run with HF_HUB_OFFLINE=1"
    ]


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--memory-budget", "2"],
            "error: Invalid value for '--memory-budget': memory budget '2' has no unit: write 2GiB, 512MiB, ... "
            "or a share like 30% (see 'gemma-embed images --help')",
        ),
        (
            ["--device", "gpu"],
            "error: Invalid value for '--device': 'gpu': use auto, cpu, cuda, cuda:N or mps "
            "(see 'gemma-embed images --help')",
        ),
        (
            ["--model", ROOT / "samples" / "tiny-embeddinggemma"],
            f"error: {ROOT / 'samples' / 'tiny-embeddinggemma'}: this gemma3_text checkpoint has no vision tower; "
            "images need one of type gemma4_vision (Gemma 4 and EmbeddingGemma 2 checkpoints); siglip_vision_model "
            "(Gemma 3 checkpoints); gemma3n_vision (Gemma 3n checkpoints)",
        ),
    ],
    ids=["bare-budget", "bad-device", "unsupported-model"],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, line):
    proc = _cli("images", SAMPLE_IMAGES, "--model", SAMPLE_MODEL, "-o", tmp_path / "o.safetensors", *args)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [line]


def test_a_budget_below_one_unit_is_a_warning_with_the_cost(tmp_path):
    proc = _cli(
        "images",
        SAMPLE_IMAGES,
        "--model",
        SAMPLE_MODEL,
        "-o",
        tmp_path / "o.safetensors",
        "--memory-budget",
        "9MiB",
        "--max-soft-tokens",
        "280",
    )
    assert proc.returncode == 0
    warnings = [line for line in _tool_lines(proc.stderr) if line.startswith("warning: ")]
    assert len(warnings) == 1
    # On the CPU the budget covers the model too: 9 MiB less the tiny tower's 1.0 MiB of weights, half of the rest
    # for a chunk (memory.planner.host_plan), the other half for decoding.
    assert warnings[0].startswith("warning: --memory-budget allows 4.0 MiB, but one unit of length ")
    assert warnings[0].endswith(" MiB: units run one at a time, over the budget")


@pytest.mark.parametrize(
    "command", ["images", "video", "audio", "text", "plan", "search", "index", "inspect", "export", "models"]
)
def test_help_fits_80_columns(command):
    proc = _cli(command, "--help", env={"COLUMNS": "80"})
    lines = proc.stdout.splitlines()
    # A screen and a bit: the media commands' help grew by the four options of URL tables (--url-column, ...).
    assert proc.returncode == 0 and len(lines) <= 90, len(lines)
    assert all(len(line) <= 80 for line in lines)
    assert "…" not in proc.stdout and "<bool>" not in proc.stdout and "{PATH" not in proc.stdout
    # Each embedding command shows its own default model (text: an embedding checkpoint); plan takes --modality's.
    shown = re.findall(r"\[default: (google/[\w.-]+)\]", proc.stdout)
    assert shown == ([DEFAULT_MODELS[command]] if command in DEFAULT_MODELS else []), shown


def test_inspect_shows_paths_in_a_stable_order_and_fails_in_one_line(tmp_path):
    out = tmp_path / "o.safetensors"
    assert run_images([SAMPLE_IMAGES], SAMPLE_MODEL, out)[0] == 0  # in-process: what inspect reads, not how
    shown = [_cli("inspect", out, env={"COLUMNS": "200"}).stdout for _ in range(2)]  # two processes, two hash seeds
    assert shown[0] == shown[1]
    assert str(SAMPLE_IMAGES / "landscape.jpg") in shown[0]
    header = [line.split()[0] for line in shown[0].splitlines()[:4]]
    assert header == ["format", "model", "model_type", "modality"]  # the empty revision row is left out
    as_json = json.loads(_cli("inspect", out, "--json").stdout)
    assert list(as_json)[:2] == ["format", "model"] and len(as_json["items"]) == len(as_json["keys"]) == 7
    missing = _cli("inspect", tmp_path / "nope.safetensors")
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        f"error: {tmp_path / 'nope.safetensors'}: no such output (neither the file nor its .index.json)"
    ]
