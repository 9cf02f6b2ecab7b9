"""`gemma-embed dedup` and `gemma-embed map` as a user runs them (issue 49): the groups' table beside the output,
the drop list on stdout with `--drop-list -` (the summary then on stderr), the one-line JSON summary otherwise,
and one `error:` line with the usage code for a missing output, a threshold out of range, a table named other than
.parquet and a file that exists without --overwrite."""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest
from helpers import EXE

from gemma_embed import cli, errors
from gemma_embed.collection import groups_path, map_path, planted
from gemma_embed.collection.tables import read_record, read_table
from gemma_embed.export import read_keys


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    """300 random vectors with 10 exact and 10 near repeats, one key holding a newline."""
    rng = np.random.default_rng(0)
    vectors, _ = planted.with_repeats(rng.standard_normal((300, 32)), 10, 10, 0.1, seed=1)
    keys = [f"i{i:04d}" for i in range(len(vectors))]
    keys[-1] = "a\nkey"
    folder = tmp_path_factory.mktemp("cli")
    return planted.write_vectors(folder / "out.safetensors", vectors, keys=keys)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=300)


def test_drop_list_on_stdout_is_every_grouped_key_not_kept(output):
    proc = run("dedup", str(output.path), "--threshold", "0.9", "--drop-list", "-")
    assert proc.returncode == 0, proc.stderr
    table = read_table(groups_path(output))
    dropped = [key for key, kept in zip(table["key"].to_pylist(), table["keep"].to_pylist(), strict=True) if not kept]
    assert len(dropped) == 20 and "a\nkey" in dropped
    assert proc.stdout == "".join(line + "\n" for line in [k.replace("\n", "\\n") for k in dropped])
    assert proc.stderr.splitlines() == [
        f"note: wrote {groups_path(output)}",
        f"note: {read_record(table)['groups']} groups, 20 items to drop",
    ]


def test_the_summary_is_one_json_line_and_a_drop_list_file_reads_back(output, tmp_path):
    listed = tmp_path / "drop.txt"
    table = tmp_path / "groups.parquet"
    proc = run("dedup", str(output.path), "--threshold", "0.9", "-o", str(table), "--drop-list", str(listed), "-q")
    assert proc.returncode == 0 and proc.stderr == ""
    (line,) = proc.stdout.splitlines()
    summary = json.loads(line)
    assert summary["type"] == "dedup" and summary["drop"] == 20 and summary["table"] == str(table)
    assert summary["groups"] == read_record(table)["groups"] and summary["method"] == "exact"
    kept = read_table(table).to_pylist()
    assert read_keys(listed) == [row["key"] for row in kept if not row["keep"]]


def _error(capsys, monkeypatch, *args) -> tuple[int, str]:
    monkeypatch.setattr("sys.argv", ["gemma-embed", *map(str, args)])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    return exited.value.code, re.sub(r" \(see '.*--help'\)$", "", line)


@pytest.mark.parametrize("command", ["dedup", "map"])
def test_a_missing_output_is_one_line_and_the_missing_code(capsys, monkeypatch, tmp_path, command):
    missing = tmp_path / "nope.safetensors"
    assert _error(capsys, monkeypatch, command, missing) == (
        errors.MISSING.code,
        f"error: {missing}: no such output (neither the file nor its .index.json)",
    )
    assert not groups_path(missing).lexists() and not map_path(missing).lexists()


@pytest.mark.parametrize("value", ["1.5", "-1.01", "nan"])
def test_a_threshold_out_of_range_is_a_usage_error(capsys, monkeypatch, output, value):
    code, line = _error(capsys, monkeypatch, "dedup", output.path, "--threshold", value)
    assert code == errors.USAGE.code
    assert line == f"error: Invalid value for '--threshold': a cosine is between -1 and 1, got {float(value)}"


def test_a_table_not_named_parquet_is_refused_before_any_work(capsys, monkeypatch, output, tmp_path):
    code, line = _error(capsys, monkeypatch, "dedup", output.path, "-o", tmp_path / "groups.npy")
    assert code == errors.USAGE.code
    named = tmp_path / "groups.npy"
    assert line == f"error: {named}: a duplicates table is a .parquet file, not .npy; name it groups.parquet"


@pytest.mark.parametrize("option", ["-o", "--drop-list"])
def test_an_existing_file_is_replaced_only_with_overwrite(capsys, monkeypatch, output, tmp_path, option):
    there = tmp_path / ("t.parquet" if option == "-o" else "drop.txt")
    there.write_text("mine")
    code, line = _error(capsys, monkeypatch, "dedup", output.path, option, there)
    assert (code, line) == (errors.USAGE.code, f"error: {there}: exists; pass --overwrite to replace it")
    assert there.read_text() == "mine"


def test_map_writes_its_table_and_a_one_line_summary(output, tmp_path):
    table = tmp_path / "map.parquet"
    proc = run("map", str(output.path), "-o", str(table), "--seed", "2")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    record = read_record(table)
    assert summary["type"] == "map" and summary["items"] == 320 == read_table(table).num_rows
    assert record["seed"] == 2 and summary["clusters"] == record["clusters"]
    assert proc.stderr.splitlines() == [f"note: wrote {table}"]
