"""First contact, second round (issue 32, items 4, 5, 6, 8 and 9), each on the real command run as a subprocess:
output names checked against what is written there, `-` as standard output where a format streams, no rebuild
advice for a file that is no output, `--overwrite` the one way past an existing file (and not with `--resume`),
text search showing the matched text with keys that count from 0 as Python and pyarrow index, and `-q` keeping
the summary off a terminal. The references are outside the tool: safetensors' reader, pyarrow, Python's own
`str.splitlines`, `html.escape`, and a pseudo-terminal."""

from __future__ import annotations

import html
import io
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import EXE, ROOT, SAMPLE_MODEL, on_a_terminal
from safetensors import safe_open
from safetensors.numpy import save_file

import gemma_embed
from gemma_embed.errors import UsageError
from gemma_embed.export import export

EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
IMAGES = ROOT / "samples" / "media" / "images"
LONG = "a long line about " + "many things, " * 120  # over the 1000 characters a text item keeps
LINES = ["a cat sleeps on a warm windowsill", "", "stock markets fell sharply", LONG.strip(), "the quick brown fox"]
CELLS = ["how do I bake sourdough bread", "embeddings put texts & images in one <space>"]


def gemma_embed_cmd(*args, cwd: Path, env: dict | None = None, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run(
        [EXE, *map(str, args)],
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.PIPE,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def reference_rows(out: Path) -> tuple[list[str], list[np.ndarray]]:
    """Each item's rows as safetensors' own reader gives them: the `embeddings` tensor cut at `offsets`."""
    with safe_open(str(out), framework="numpy") as fh:
        rows, offsets = fh.get_tensor("embeddings"), fh.get_tensor("offsets")
        keys = json.loads(fh.metadata()["keys"])
    return keys, [rows[offsets[i] : offsets[i + 1]] for i in range(len(keys))]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """Two images as retrieval vectors (one row each), all sample images as soft tokens (many rows each: a JSON-lines
    export of them is over 1 MB, more than a pipe holds), and a text file's lines with a parquet file's cells."""
    root = tmp_path_factory.mktemp("first-contact-names")
    made = {
        "vectors": root / "vectors.safetensors",
        "soft": root / "soft.safetensors",
        "text": root / "text.safetensors",
    }
    pictures = [IMAGES / "tall.png", IMAGES / "pixel.png"]
    gemma_embed.run(gemma_embed.RunConfig(modality="images", inputs=pictures, model=str(EG2), output=made["vectors"]))
    gemma_embed.run(
        gemma_embed.RunConfig(modality="images", inputs=[IMAGES], model=str(SAMPLE_MODEL), output=made["soft"])
    )
    (root / "lines.txt").write_text("\n".join(LINES) + "\n")
    pq.write_table(pa.table({"text": CELLS}), root / "corpus.parquet")
    proc = gemma_embed_cmd(
        "text", "lines.txt", "corpus.parquet", "--column", "text", "--model", EG2, "-o", made["text"], "-q", cwd=root
    )
    assert proc.returncode == 0, proc.stderr
    return {**made, "root": root}


# ------------------------------------------------------------------------------------- item 4: output names


@pytest.mark.parametrize(
    "name, line",
    [
        ("out.npy", "error: out.npy: an embedding output is a .safetensors file, not .npy; name it out.safetensors"),
        ("out.index.json", "error: out.index.json: an embedding output is a .safetensors file, not .json; name it "
         "out.safetensors"),
        ("-", "error: -: an embedding output cannot go to standard output: it is saved in parts beside its name and "
         "renamed into place when done, so that an interrupted run can be resumed; write a file, then stream it with "
         "gemma-embed export FILE --to jsonl -o -"),
    ],
)  # fmt: skip
def test_an_embed_output_named_for_another_format_or_stdout_is_one_line_and_writes_nothing(tmp_path, name, line):
    proc = gemma_embed_cmd("images", IMAGES / "tall.png", "--model", SAMPLE_MODEL, "-o", name, cwd=tmp_path)
    assert (proc.returncode, proc.stderr.decode(), proc.stdout) == (2, line + "\n", b"")
    assert list(tmp_path.iterdir()) == []  # no file named -, no out.npy holding safetensors bytes, no errors file


def test_an_embed_output_named_as_a_folder_is_the_default_name_in_it_for_writers_and_readers(tmp_path):
    """`-o run/` (the trailing slash) writes run/embeddings.safetensors (-o's default name, in that folder) and the
    readers given `run/` read it there; a folder that does not exist is one line; `-o run` without the slash is
    still a folder where a file was meant, and export's -o keeps its own rule (a .parquet name)."""
    missing = gemma_embed_cmd("images", IMAGES / "tall.png", "--model", SAMPLE_MODEL, "-o", "missing/", cwd=tmp_path)
    assert (missing.returncode, missing.stderr.decode()) == (2, "error: missing: output folder does not exist\n")
    (tmp_path / "run").mkdir()
    done = gemma_embed_cmd("images", IMAGES / "tall.png", "--model", SAMPLE_MODEL, "-o", "run/", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == "run/embeddings.safetensors"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["embeddings.safetensors"]
    keys, rows = reference_rows(tmp_path / "run" / "embeddings.safetensors")
    shown = gemma_embed_cmd("inspect", "run/", "--json", cwd=tmp_path)
    assert shown.returncode == 0 and json.loads(shown.stdout)["keys"] == keys == [str(IMAGES / "tall.png")]
    exported = gemma_embed_cmd("export", "run/", "--to", "parquet", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    table = pq.read_table(tmp_path / "run" / "embeddings.parquet").to_pylist()
    assert np.array_equal(np.asarray(table[0]["embedding"], dtype=np.float32), rows[0])
    again = gemma_embed_cmd("images", IMAGES / "tall.png", "--model", SAMPLE_MODEL, "-o", "run", cwd=tmp_path)
    assert (again.returncode, again.stderr.decode()) == (2, "error: run: output path is a folder\n")
    elsewhere = gemma_embed_cmd("export", "run/", "--to", "parquet", "-o", "exp/", cwd=tmp_path)
    assert elsewhere.returncode == 2
    assert elsewhere.stderr.decode() == "error: exp: a parquet export is a .parquet file; name it exp.parquet\n"


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "PYTHONUNBUFFERED"])
@pytest.mark.parametrize("to", ["jsonl", "parquet"])
@pytest.mark.parametrize("output", ["vectors", "soft"])
def test_export_streams_jsonl_and_parquet_to_standard_output(outputs, tmp_path, output, to, unbuffered):
    """Every row arrives, also where stdout is unbuffered (a raw stream's write can write part of what it is
    given: the soft tokens' megabyte came out cut at 64 kB)."""
    env = {"PYTHONUNBUFFERED": unbuffered}
    proc = gemma_embed_cmd("export", outputs[output], "--to", to, "-o", "-", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    keys, rows = reference_rows(outputs[output])
    # The summary record stays off stdout, which carries the export; stderr says how many items went.
    assert proc.stderr.decode() == f"note: wrote {len(keys)} items to standard output\n"
    assert list(tmp_path.iterdir()) == []
    if to == "jsonl":
        records = [json.loads(line) for line in proc.stdout.decode("ascii").splitlines()]
    else:
        records = pq.read_table(io.BytesIO(proc.stdout)).to_pylist()
    one_row = output == "vectors"  # one row an item: a vector each; else each item's rows
    got = [np.asarray([r["embedding"]] if one_row else r["embedding"], dtype=np.float32) for r in records]
    assert [r["key"] for r in records] == keys
    assert all(np.array_equal(a, b) for a, b in zip(got, rows, strict=True))  # exactly the stored float32 rows


def test_export_refuses_npy_on_stdout_and_a_name_of_another_format(outputs, tmp_path):
    npy_out = gemma_embed_cmd("export", outputs["vectors"], "--to", "npy", "-o", "-", cwd=tmp_path)
    assert npy_out.returncode == 2 and npy_out.stdout == b""
    assert npy_out.stderr.decode() == (
        "error: -: an npy export cannot go to standard output: it is several files (OUT.npy, OUT.keys.txt, and "
        "OUT.offsets.npy for items of several rows); a parquet or JSON-lines export streams there\n"
    )
    for to, name, fix in (("npy", "x.parquet", "name it x.npy"), ("parquet", "x.npy", "name it x.parquet")):
        proc = gemma_embed_cmd("export", outputs["vectors"], "--to", to, "-o", name, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.decode().endswith(f"; {fix}\n"), proc.stderr
    assert list(tmp_path.iterdir()) == []  # neither `-` nor `-.keys.txt`, nor a mislabelled file


def test_a_reader_that_goes_away_ends_a_streamed_export_quietly(outputs, tmp_path):
    keys, rows = reference_rows(outputs["soft"])
    assert len(json.dumps([r.tolist() for r in rows])) > 1 << 20  # over a megabyte of JSON: no pipe holds it all
    proc = subprocess.Popen(
        [EXE, "export", str(outputs["soft"]), "--to", "jsonl", "-o", "-"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    start = os.read(proc.stdout.fileno(), 1000)  # a little of it, unbuffered, as `| head -c 1000` reads
    proc.stdout.close()  # then goes away
    assert proc.wait(timeout=120) == 0
    assert proc.stderr.read() == b""  # no BrokenPipeError, no "Exception ignored", no note of items written
    assert start.startswith(b'{"key": ' + json.dumps(keys[0]).encode() + b', "path": ')


def test_library_errors_name_parameters_where_the_command_line_names_flags(outputs, tmp_path):
    existing = tmp_path / "x.parquet"
    existing.write_bytes(b"mine")
    with pytest.raises(UsageError) as caught:
        export(outputs["vectors"], "parquet", existing)
    assert str(caught.value) == f"{existing}: exists; pass overwrite=True to replace it"
    proc = gemma_embed_cmd("export", outputs["vectors"], "--to", "parquet", "-o", existing, cwd=tmp_path)
    assert proc.stderr.decode() == f"error: {existing}: exists; pass --overwrite to replace it\n"
    assert existing.read_bytes() == b"mine"

    config = gemma_embed.RunConfig(
        modality="images", inputs=[IMAGES], model=str(SAMPLE_MODEL), output=outputs["soft"], overwrite=True, resume=True
    )
    with pytest.raises(UsageError) as caught:
        gemma_embed.run(config)
    assert str(caught.value).startswith("overwrite=True and resume=True contradict each other: overwrite=True starts")


# ---------------------------------------------------------------------------- item 5: no rebuild advice for strangers


def test_inspect_of_a_file_that_is_no_output_gives_no_rebuild_advice(outputs, tmp_path):
    proc = gemma_embed_cmd("inspect", ROOT / "README.md", cwd=tmp_path)
    assert proc.returncode == 2
    line = proc.stderr.decode()
    assert line.startswith(f"error: {ROOT / 'README.md'}: not a gemma-embed output (") and line.endswith(")\n")
    assert "rebuild" not in line and "--overwrite" not in line and line.count("\n") == 1

    # A gemma-embed output of another format version (safetensors' own writer, format changed) keeps the advice.
    with safe_open(str(outputs["vectors"]), framework="numpy") as fh:
        tensors = {name: fh.get_tensor(name) for name in ("embeddings", "offsets")}
        meta = {**fh.metadata(), "format": "gemma-embed/0"}
    old = tmp_path / "old.safetensors"
    save_file(tensors, str(old), metadata=meta)
    proc = gemma_embed_cmd("inspect", old, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.decode() == (
        f"error: {old}: not a gemma-embed/1 file (format='gemma-embed/0'); embed the inputs again with --overwrite to "
        f"rebuild it\n"
    )


# ------------------------------------------------------------------- item 6: --overwrite, the one way past a file


def test_overwrite_with_resume_is_a_usage_error_naming_both(outputs, tmp_path):
    out = tmp_path / "o.safetensors"
    out.write_bytes(outputs["vectors"].read_bytes())
    proc = gemma_embed_cmd(
        "images", IMAGES / "tall.png", "--model", EG2, "-o", out, "--overwrite", "--resume", cwd=tmp_path
    )
    assert proc.returncode == 2 and proc.stdout == b""
    assert proc.stderr.decode() == (
        "error: --overwrite and --resume contradict each other: --overwrite starts the output over, --resume finishes "
        "or adds to it; give one\n"
    )
    assert out.read_bytes() == outputs["vectors"].read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.safetensors"]


def test_search_html_replaces_an_existing_page_only_with_overwrite(outputs, tmp_path):
    page = tmp_path / "hits.html"
    page.write_text("my own page")
    refused = gemma_embed_cmd("search", outputs["vectors"], "a tall building", "--html", "hits.html", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == b""  # before any work: no table either
    assert refused.stderr.decode() == "error: hits.html: exists; pass --overwrite to replace it\n"
    assert page.read_text() == "my own page"
    replaced = gemma_embed_cmd(
        "search", outputs["vectors"], "a tall building", "--html", "hits.html", "--overwrite", cwd=tmp_path
    )
    assert replaced.returncode == 0, replaced.stderr
    assert page.read_text().startswith("<!doctype html>")
    to_stdout = gemma_embed_cmd("search", outputs["vectors"], "a tall building", "--html", "-", cwd=tmp_path)
    assert to_stdout.returncode == 2 and to_stdout.stderr.decode().startswith(
        "error: -: a search page cannot go to standard output: standard output carries the results"
    )


# ------------------------------------------------------------------------ item 8: the text, and keys from 0


def test_text_search_shows_the_text_and_its_key_indexes_the_source_from_zero(outputs):
    root = outputs["root"]
    lines = (root / "lines.txt").read_text().splitlines()  # Python's own numbering of the file's lines
    cells = pq.read_table(root / "corpus.parquet")["text"].to_pylist()  # pyarrow's of the table's rows
    query = "a cat sleeps on a warm windowsill"
    found = gemma_embed_cmd("search", outputs["text"], query, "--jsonl", "-k", "10", cwd=root)
    assert found.returncode == 0, found.stderr
    hits = [json.loads(line) for line in found.stdout.decode().splitlines()]
    assert len(hits) == len([t for t in LINES if t]) + len(CELLS)  # the blank line is no item
    for hit in hits:
        source, row = hit["key"].rsplit(":", 1)
        whole = (lines if source == "lines.txt" else cells)[int(row)]  # the key's number indexes the source
        assert hit["text"] == whole[:1000] and hit["text_cut"] is (len(whole) > 1000)
    assert hits[0]["key"] == "lines.txt:0" and hits[0]["text"] == query  # the first line is line 0
    assert {h["key"] for h in hits} >= {"lines.txt:2", "lines.txt:3", "corpus.parquet:0", "corpus.parquet:1"}

    table = gemma_embed_cmd("search", outputs["text"], query, "-k", "10", "--html", "hits.html", "--overwrite",
                            cwd=root, env={"COLUMNS": "70"})  # fmt: skip
    assert table.returncode == 0, table.stderr
    shown = table.stdout.decode().splitlines()
    assert shown[1].split() == ["rank", "score", "key", "text"]  # each path starts its key: not repeated
    assert all(len(line) <= 70 for line in shown[1:]), shown
    long_row = next(line for line in shown if "lines.txt:3" in line)
    assert long_row.endswith("\u2026") and "a long line about many" in long_row
    page = (root / "hits.html").read_text()
    assert all(html.escape(hit["text"]) in page for hit in hits)  # the page has each text whole, escaped


def test_resume_over_an_output_whose_lines_counted_from_one_renumbers_them(outputs, tmp_path):
    """An output written before (keys lines.txt:1.., metadata `line`, no text) reads as it is, and --resume over it
    reuses every line under its new key instead of keeping both."""
    (tmp_path / "lines.txt").write_text((outputs["root"] / "lines.txt").read_text())
    made = tmp_path / "made.safetensors"
    proc = gemma_embed_cmd("text", "lines.txt", "--model", EG2, "-o", made, "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with safe_open(str(made), framework="numpy") as fh:
        tensors = {name: fh.get_tensor(name) for name in ("embeddings", "offsets")}
        meta = dict(fh.metadata())
    new_keys = json.loads(meta["keys"])
    old_keys = [f"lines.txt:{int(k.rsplit(':', 1)[1]) + 1}" for k in new_keys]  # lines counted from 1
    old_items = [
        {**{name: v for name, v in item.items() if name not in ("row", "text")}, "line": int(k.rsplit(":", 1)[1])}
        for item, k in zip(json.loads(meta["items"]), old_keys, strict=True)
    ]
    old = tmp_path / "old.safetensors"
    save_file(tensors, str(old), metadata={**meta, "keys": json.dumps(old_keys), "items": json.dumps(old_items)})

    readable = gemma_embed_cmd("search", old, "the quick brown fox", "--jsonl", "-k", "1", cwd=tmp_path)
    assert readable.returncode == 0, readable.stderr
    (hit,) = [json.loads(line) for line in readable.stdout.decode().splitlines()]
    assert hit["key"] == "lines.txt:5" and "text" not in hit  # as it was written

    resumed = gemma_embed_cmd("text", "lines.txt", "--model", EG2, "-o", old, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout.decode().splitlines()[-1])
    assert (summary["resumed"], summary["kept"], summary["items"]) == (len(new_keys), 0, len(new_keys))
    keys, rows = reference_rows(old)
    assert keys == new_keys  # each line once, under the key a fresh run gives it
    _, fresh = reference_rows(made)
    assert all(np.array_equal(a, b) for a, b in zip(rows, fresh, strict=True))


# ----------------------------------------------------------------------------------- item 9: the small ones


def test_quiet_keeps_the_summary_off_a_terminal_and_gives_it_to_a_pipe(tmp_path):
    args = ["images", str(IMAGES / "tall.png"), "--model", str(SAMPLE_MODEL), "-o", "o.safetensors", "-q"]
    code, shown = on_a_terminal(args, tmp_path)
    assert (code, shown) == (0, b"")
    piped = gemma_embed_cmd(*args, "--overwrite", cwd=tmp_path)
    assert piped.returncode == 0 and piped.stderr == b""
    assert json.loads(piped.stdout)["type"] == "summary"  # a program reading stdout still gets it


def test_the_top_level_help_names_text():
    proc = subprocess.run(
        [EXE, "--help"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"}
    )
    assert proc.returncode == 0 and "images, video, audio and text" in proc.stdout
