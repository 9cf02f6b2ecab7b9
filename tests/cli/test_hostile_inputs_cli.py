"""The command against hostile inputs, as a user runs it: a model folder that ships code runs none of it, a pickle
named model.safetensors is one error line, and names with escape sequences, BEL and newlines reach the terminal
escaped while the JSON records keep them exactly."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess

import pytest
from helpers import EXE, ROOT, write_image
from hostile_helpers import EVIL_VARIANTS, control_bytes, evil_checkpoint
from typer.testing import CliRunner

from gemma_embed.cli import app
from gemma_embed.terminal import printable

GEMMA4 = ROOT / "samples" / "tiny-gemma4"
DATA_LINES = "hello\ny\nworld\n"  # 'y' is what transformers' "run the custom code? [y/N]" prompt would read


def _invoke(*args, stdin: str | None = None):
    """The command in this process (CliRunner): a fresh process costs ~4 s of imports; the installed command's
    own process is run where the bytes on its stderr are the point."""
    return CliRunner().invoke(app, [str(a) for a in args], input=stdin, env={"COLUMNS": "400"})


def _json_only(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]  # fails on any line that is not JSON


def test_a_model_folder_with_its_own_tokenizer_code_runs_none_of_it(tmp_path):
    folder, marker = evil_checkpoint(tmp_path, "tokenizer")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "hf-modules")}
    proc = subprocess.run(
        [EXE, "text", "-", "--model", "evil/"],  # as the issue ran it, from the folder above the model
        input=DATA_LINES.encode(),
        capture_output=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 2, stderr
    assert not marker.exists()
    assert len(stderr.splitlines()) == 1 and stderr.startswith("error: evil/: tokenizer_config.json names auto_map")
    assert _json_only(proc.stdout.decode()) == []
    assert not (tmp_path / "hf-modules").exists()  # transformers did not even copy the code to import it


@pytest.mark.parametrize("variant", ["config", "processor"])
def test_auto_map_in_the_config_or_a_processor_config_runs_nothing(tmp_path, variant):
    folder, marker = evil_checkpoint(tmp_path, variant)
    result = _invoke("text", "-", "--model", folder, "-o", tmp_path / "out.safetensors", stdin=DATA_LINES)
    assert result.exit_code == 2, result.stderr
    assert not marker.exists()
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {folder}: {EVIL_VARIANTS[variant][0]} names auto_map")
    assert _json_only(result.stdout) == []


def test_a_pickle_named_model_safetensors_is_one_error_line(tmp_path, image_dir):
    folder, marker = tmp_path / "ckpt", tmp_path / "MARKER"
    shutil.copytree(GEMMA4, folder)

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('ran')",))

    (folder / "model.safetensors").write_bytes(pickle.dumps({"weights": Payload()}))
    result = _invoke("images", image_dir, "--model", folder, "-o", tmp_path / "out.safetensors")
    assert result.exit_code == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {folder}: model.safetensors is not a safetensors file (")
    assert "Traceback" not in result.stderr and result.stdout == "" and not marker.exists()


# Names a terminal would act on: an OSC title change ended by BEL, a bare BEL, a newline forging a tool line, a
# clear-screen sequence, and a name that is not UTF-8 at all.
HOSTILE_NAMES = (
    "title\x1b]0;owned\x07.png",
    "bell\x07.png",
    "forged\nnote: all 1000 items verified.png",
    os.fsdecode(b"caf\xe9 \x1b[2J.png"),
)
BAD_NAME = "bad\x1b[31m\nerror: not me\x07.png"  # not an image: its error line is printed


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """The installed command on a folder of such names, one of them a bad file: (folder, output, process)."""
    root = tmp_path_factory.mktemp("hostile")
    folder = root / "images"
    folder.mkdir()
    for seed, name in enumerate(HOSTILE_NAMES):
        write_image(folder / name, 48 + 8 * seed, 40, seed)
    (folder / BAD_NAME).write_bytes(b"this is text, not a PNG\n")
    out = root / "out.safetensors"
    proc = subprocess.run(
        [EXE, "images", str(folder), "--model", str(GEMMA4), "-o", str(out), "--jsonl", "--max-soft-tokens", "70"],
        capture_output=True,
        timeout=300,
    )
    return folder, out, proc


def test_names_reach_stderr_escaped_and_the_records_exactly(hostile_run):
    folder, out, proc = hostile_run
    assert proc.returncode == 1, proc.stderr  # one item failed
    assert control_bytes(proc.stderr) == []
    stderr = proc.stderr.decode()
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {printable(BAD_NAME)}: ")
    assert not any(line.startswith(("note: all", "error: not me")) for line in stderr.splitlines())
    records = _json_only(proc.stdout.decode("utf-8"))
    items = {r["key"]: r["status"] for r in records if r["type"] == "item"}
    expected = dict.fromkeys(HOSTILE_NAMES, "ok") | {BAD_NAME: "failed"}  # keys: paths under the folder
    assert items == expected


def test_inspect_and_search_tables_escape_the_names(hostile_run):
    folder, out, proc = hostile_run
    shown = _invoke("inspect", out, "--limit", "0")
    assert shown.exit_code == 0, shown.stderr
    assert control_bytes(shown.stdout.encode("utf-8", "surrogateescape")) == []
    for name in HOSTILE_NAMES:
        assert printable(name) in shown.stdout and printable(str(folder / name)) in shown.stdout  # key, path
    exact = json.loads(_invoke("inspect", out, "--json").stdout)
    assert sorted(exact["keys"]) == sorted(HOSTILE_NAMES)

    query = folder / HOSTILE_NAMES[0]
    hits = _invoke("search", out, "--image", query, "-k", "4")
    assert hits.exit_code == 0, hits.stderr
    assert control_bytes(hits.stdout.encode("utf-8", "surrogateescape")) == []
    scoring, header, *rows = hits.stdout.splitlines()
    assert scoring == "each query is the mean of its rows; score: cosine similarity with each item's best row"
    assert header.split() == ["rank", "score", "key", "path"] and len(rows) == 4
    assert rows[0].split()[2] == printable(query.name)  # the image itself ranks first
    for name in HOSTILE_NAMES:  # each key and path once, escaped, on its own row
        assert sum(printable(name) in row and row.endswith(printable(str(folder / name))) for row in rows) == 1
