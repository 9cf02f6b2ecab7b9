"""The text command on hostile inputs, made the hostile way and run as a user runs it: a line of 128 MiB (written in
chunks) in a JSON-lines and a text file, gzip bombs of 320 MiB, a damaged gzip stream, lone surrogate escapes,
records nested 5000 deep, JSON lists as keys, blank lines and cells. Each run asserts its exit code, the one
`error:` or `note:` line that names the file, the records of OUT.errors.jsonl, and that the other rows are embedded;
the runs over large inputs also that the process's peak RSS (VmHWM) stays far below the large line's size.

--max-text-bytes is set low (64 KiB, 16 KiB) so that a bound too large to be the limit shows; the default (256 KiB)
is the one docs/inputs.md documents. Cuts are checked against sentence-transformers on the whole text.
"""

from __future__ import annotations

import gzip
import json
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import EXE, ROOT
from memory_helpers import cli_peak

import gemma_embed
from gemma_embed.sizes import human_bytes

EG = ROOT / "samples" / "tiny-embeddinggemma"  # EmbeddingGemma: max_seq_length 32, so a cut text is still read whole
GEMMA4 = ROOT / "samples" / "tiny-gemma4"
MiB = 1 << 20
LONG = 128 * MiB  # the long line's size: far more than the process may grow by
PIECE = b"lorem ipsum dolor sit amet " * 4096  # 108 KiB, written again and again


def gemma_embed_cmd(*args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *map(str, args)], input=stdin, capture_output=True, timeout=600)


def lines_of(stderr: str, prefix: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


def errors_file(out) -> list[dict]:
    path = out.with_name(out.name.removesuffix(".safetensors") + ".errors.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def write_long(out, size: int = LONG) -> int:
    """At least `size` bytes of words without a line break, a piece at a time; how many."""
    written = 0
    while written < size:
        out.write(PIECE)
        written += len(PIECE)
    return written


def items(path) -> dict[str, dict]:
    from gemma_embed.store import read_metadata

    meta = read_metadata(path)
    return dict(zip(meta["keys"], meta["items"], strict=True))


@pytest.mark.slow
def test_a_128_mib_json_lines_value_is_cut_while_read_and_the_process_does_not_grow_by_it(tmp_path):
    table = tmp_path / "corpus.jsonl"
    with open(table, "wb") as out:
        out.write(b'{"id": 1, "text": "first row"}\n{"id": 2, "text": "')
        write_long(out)
        out.write(b'"}\n{"id": 3, "text": "last row"}\n')
    out = tmp_path / "out.safetensors"
    run = cli_peak(
        ["text", table, "--column", "text", "--model", EG, "-o", out, "--max-text-bytes", "64KiB"], cap=3 << 30
    )
    assert run["code"] == 0, run["stderr"]
    assert lines_of(run["stderr"], "error:") == []
    (note,) = lines_of(run["stderr"], "note: cut")
    assert note.startswith("note: cut 1 text at --max-text-bytes 64.0 KiB") and note.endswith(f": {table}:1")
    assert list(gemma_embed.load(out)) == [f"{table}:0", f"{table}:1", f"{table}:2"]
    cut = items(out)[f"{table}:1"]
    assert cut["bytes"] == 64 * 1024 and cut["cut_from_bytes"] > LONG  # the record's size: its text was not read
    grew = run["peak"] - run["loaded"]
    print(f"peak {run['peak'] / MiB:.0f} MiB, {grew / MiB:.0f} MiB above the loaded process")
    assert grew < 64 * MiB, (run["peak"], run["loaded"])  # half the line: it was never held


@pytest.mark.slow
def test_a_128_mib_line_of_a_text_file_is_passed_over_with_long_text_skip(tmp_path):
    lines = tmp_path / "notes.txt"
    with open(lines, "wb") as out:
        out.write(b"a first short line\n")
        size = write_long(out)
        out.write(b"\na last short line\n")
    out = tmp_path / "out.safetensors"
    args = ["text", lines, "--model", EG, "-o", out, "--max-text-bytes", "64KiB", "--long-text", "skip"]
    run = cli_peak(args, cap=3 << 30)
    assert run["code"] == 0, run["stderr"]
    assert lines_of(run["stderr"], "error:") == []
    assert lines_of(run["stderr"], "note: passed over") == [
        f"note: passed over 1 text over --max-text-bytes 64.0 KiB (--long-text skip): {lines}:1 (row 1 is "
        f"{human_bytes(size)}, over --max-text-bytes 64.0 KiB: skipped (--long-text cut embeds its first 64.0 KiB))"
    ]
    assert list(gemma_embed.load(out)) == [f"{lines}:0", f"{lines}:2"]
    assert errors_file(out) == []  # passed over, not failed
    assert run["peak"] - run["loaded"] < 32 * MiB, (run["peak"], run["loaded"])


def test_a_cut_text_gives_the_vector_sentence_transformers_gives_the_whole_text(tmp_path):
    """EmbeddingGemma reads 32 tokens of this checkpoint's texts (max_seq_length): a 1 MiB line cut at 16 KiB, and
    a parquet cell of 2 MiB cut at its Arrow length, embed as the whole texts do in sentence-transformers."""
    from sentence_transformers import SentenceTransformer

    long_line = (PIECE * 10)[: 1 * MiB].decode()
    cell = "cellule " * (2 * MiB // 8)
    lines, table = tmp_path / "long.txt", tmp_path / "cells.parquet"
    lines.write_text(f"short one\n{long_line}\n")
    pq.write_table(pa.table({"text": [cell, "short two"]}), table)
    out = tmp_path / "out.safetensors"
    proc = gemma_embed_cmd(
        "text", lines, table, "--column", "text", "--model", EG, "-o", out, "--max-text-bytes", "16KiB",
        "--prompt-name", "document",
    )  # fmt: skip
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    (note,) = lines_of(stderr, "note: cut")
    assert note.endswith(f": {lines}:1, {table}:0")
    ours = gemma_embed.load(out)
    assert list(ours) == [f"{lines}:0", f"{lines}:1", f"{table}:0", f"{table}:1"]
    meta = items(out)
    assert meta[f"{lines}:1"]["cut_from_bytes"] == MiB and meta[f"{table}:0"]["cut_from_bytes"] == len(cell)
    texts = ["short one", long_line, cell, "short two"]
    reference = SentenceTransformer(str(EG), device="cpu").encode(texts, prompt_name="document")
    for key, expected in zip(ours, reference, strict=True):
        got = ours[key].numpy().reshape(-1)
        assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-5, key


@pytest.mark.slow
def test_gzip_bombs_stop_after_64_mib_and_a_damaged_stream_names_its_file(tmp_path):
    """A .jsonl.gz and a .txt.gz that inflate to 320 MiB each (gzip members of 1 MiB each, about 330 KB in all, as
    `cat a.gz b.gz` makes and every gzip reader reads), and a .jsonl.gz cut in two: each is one error line naming
    it, and the rows read before are embedded."""
    records, text, cut = tmp_path / "rows.jsonl.gz", tmp_path / "lines.txt.gz", tmp_path / "cut.jsonl.gz"
    ones, blanks = gzip.compress(b"a" * MiB), gzip.compress(b"\n" * MiB)  # blank lines: a bomb need not be one line
    records.write_bytes(
        gzip.compress(b'{"text": "row zero"}\n{"text": "row one"}\n{"text": "')
        + ones * 320
        + gzip.compress(b'"}\n{"text": "after the bomb"}\n')
    )
    text.write_bytes(gzip.compress(b"line one\nline two\n") + blanks * 320)
    whole = gzip.compress(b"".join(b'{"text": "row %d"}\n' % i for i in range(4000)))
    cut.write_bytes(whole[: len(whole) // 2])
    out = tmp_path / "out.safetensors"
    run = cli_peak(["text", records, text, cut, "--column", "text", "--model", EG, "-o", out], cap=3 << 30)
    assert run["code"] == 1, run["stderr"]
    errors = lines_of(run["stderr"], "error:")
    assert len(errors) == 3, errors
    for path, line in zip((records, text, cut), errors, strict=True):
        assert line.startswith(f"error: {path}: cannot read it to the end ("), line
    assert "more than 200 times its compressed size (a gzip bomb?)" in errors[0] and "gzip bomb" in errors[1]
    assert "damaged gzip stream" in errors[2]
    keys = list(gemma_embed.load(out))
    assert keys[:4] == [f"{records}:0", f"{records}:1", f"{text}:0", f"{text}:1"]
    assert len(keys) > 4 + 1000 and all(k.startswith(f"{cut}:") for k in keys[4:])  # the rows before the cut
    kinds = {r["key"]: r["error"] for r in errors_file(out)}
    assert kinds == {str(records): "too-large", str(text): "too-large", str(cut): "unreadable"}
    assert run["peak"] - run["loaded"] < 64 * MiB, (run["peak"], run["loaded"])


def test_surrogates_deep_records_and_json_keys_are_named_failures_and_the_run_goes_on(tmp_path):
    deep = "[" * 5000 + "]" * 5000
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(
            [
                '{"id": "r0", "text": "fine"}',
                '{"id": "r1", "text": "a lone \\ud800 surrogate"}',
                '{"id": "r2", "text": "deep", "extra": ' + deep + "}",
                '{"id": [1, 2], "text": "a list as key"}',
                '{"id": {"a": 1}, "text": "an object as key"}',
                '{"id": true, "text": "a boolean key"}',
                '{"id": 7, "text": "a pair \\ud83d\\ude00 is fine"}',
            ]
        )
        + "\n"
    )
    first_deep = tmp_path / "first-deep.jsonl"  # checked before the model loads: must not raise either
    first_deep.write_text('{"id": "d0", "text": ' + deep + '}\n{"id": "d1", "text": "after"}\n')
    out = tmp_path / "out.safetensors"
    proc = gemma_embed_cmd("text", rows, first_deep, "--column", "text", "--key-column", "id", "--model", EG, "-o", out)
    stderr = proc.stderr.decode()
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert lines_of(stderr, "error:") == [
        f"error: r1: row 1 of {rows}: field 'text' holds a lone surrogate escape (\\ud800 at character 7), "
        "not Unicode text",
        f"error: {rows}:2: row 2 nests deeper than 128 levels: not read",
        f"error: {rows}:3: row 3: its --key-column 'id' holds a JSON list, not a key (a string or a number)",
        f"error: {rows}:4: row 4: its --key-column 'id' holds a JSON object, not a key (a string or a number)",
        f"error: {first_deep}:0: row 0 nests deeper than 128 levels: not read",
    ]
    assert list(gemma_embed.load(out)) == ["r0", "true", "7", "d1"]  # JSON's spelling of true, not Python's
    kinds = [r["error"] for r in errors_file(out)]
    assert kinds == ["undecodable", "too-deep", "bad-key", "bad-key", "too-deep"]


def test_blank_lines_and_cells_follow_one_rule_passed_over_or_failed_with_on_error_stop(tmp_path):
    lines, rows, table = tmp_path / "lines.txt", tmp_path / "rows.jsonl", tmp_path / "cells.parquet"
    lines.write_text("a line\n\n   \nanother line\n")
    rows.write_text('{"text": "x"}\n{"text": "  "}\n{"text": null}\n{"other": 1}\n')
    pq.write_table(pa.table({"text": ["y", "", None]}), table)
    out = tmp_path / "out.safetensors"
    inputs = [lines, rows, table, "--column", "text", "--model", EG, "-o", out]
    proc = gemma_embed_cmd("text", *inputs)
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    assert lines_of(stderr, "error:") == []
    assert lines_of(stderr, "note: passed over") == [  # counted by line; a run of blank lines named once
        f"note: passed over 7 blank texts (nothing to embed): {lines}:1 (rows 1 to 2 are blank), {rows}:1 (row 1: "
        f"its text is blank), {rows}:2 (row 2 has no text (field 'text' is missing or null)) and 3 more"
    ]
    assert list(gemma_embed.load(out)) == [f"{lines}:0", f"{lines}:3", f"{rows}:0", f"{table}:0"]
    assert errors_file(out) == []
    summary = json.loads(proc.stdout.decode().splitlines()[-1])
    assert summary["passed_over"] == {"blank": 7} and summary["failed"] == 0
    # The same rule, failing: --on-error stop ends the run at the first blank text, typed by what happened.
    proc = gemma_embed_cmd("text", *inputs, "--overwrite", "--on-error", "stop")
    stderr = proc.stderr.decode()
    assert proc.returncode == 1, stderr
    assert lines_of(stderr, "error:") == [f"error: {lines}:1: rows 1 to 2 are blank"]
    # Items before it are saved (and one encoded in the same batch may be); none of the tables' rows.
    assert f"{lines}:0" in gemma_embed.load(out) and set(gemma_embed.load(out)) <= {f"{lines}:0", f"{lines}:3"}
    assert errors_file(out) == [
        {"key": f"{lines}:1", "stage": "find", "error": "blank", "message": "rows 1 to 2 are blank", "warnings": []}
    ]


def test_the_errors_file_says_what_happened_to_a_missing_input_not_an_exception_class(tmp_path):
    from PIL import Image

    good = tmp_path / "good.png"
    Image.new("RGB", (32, 32), (200, 40, 40)).save(good)
    missing, out = tmp_path / "gone.png", tmp_path / "out.safetensors"
    proc = gemma_embed_cmd("images", "-", "--model", GEMMA4, "-o", out, stdin=f"{missing}\n{good}\n".encode())
    assert proc.returncode == 1, proc.stderr.decode()
    assert lines_of(proc.stderr.decode(), "error:") == [f"error: {missing}: no such file or directory"]
    assert errors_file(out) == [
        {
            "key": str(missing),
            "stage": "find",
            "error": "missing",
            "message": "no such file or directory",
            "warnings": [],
        }
    ]


def test_an_output_whose_items_nest_5000_deep_is_one_error_line_for_every_reader(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    lines, out = tmp_path / "lines.txt", tmp_path / "out.safetensors"
    lines.write_text("one\ntwo\n")
    assert gemma_embed_cmd("text", lines, "--model", EG, "-o", out).returncode == 0
    with safe_open(str(out), "pt") as f:
        meta, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    meta["items"] = meta["items"].replace('"row": 0', '"row": ' + "[" * 5000 + "]" * 5000, 1)
    deep = tmp_path / "deep.safetensors"
    save_file(tensors, str(deep), metadata=meta)
    for command in (["inspect", deep], ["export", deep, "--to", "parquet"], ["search", deep, "one"]):
        proc = gemma_embed_cmd(*command)
        stderr = proc.stderr.decode()
        assert proc.returncode == 2, (command, stderr)
        assert stderr.splitlines() == [
            f"error: {deep}: not a gemma-embed/1 file (items is nested deeper than 132 levels, which no "
            "gemma-embed output is); embed the inputs again with --overwrite to rebuild it"
        ], command
