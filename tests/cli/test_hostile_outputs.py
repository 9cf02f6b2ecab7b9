"""The command against what an attacker (or bad luck) leaves beside an output, as a user meets it: a lock file or a
parts folder that is a link to somewhere else is refused in one line naming it and nothing is written through it;
a search index that is not the output's (another faiss index of the same shape with its size and time set back,
another dimension, kind or count, a damaged table, a record naming a file outside the folder, a FIFO) is refused
in one line naming the file and saying to rebuild it, never answered from (issue 31)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import faiss
import numpy as np
import pytest
from helpers import EXE, ROOT, SAMPLE_MODEL, write_image
from hostile_helpers import GatedRun, snapshot
from safetensors import safe_open
from safetensors.numpy import save_file
from typer.testing import CliRunner

from gemma_embed.cli import app

EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
TEXTS = ["a cat on a warm windowsill", "markets fell on tuesday", "bake sourdough bread", "the quick brown fox"]
REBUILD = "; run gemma-embed index {out} again, or search with --exact"


def _cli(*args, stdin: str | None = None):
    result = CliRunner().invoke(app, [str(a) for a in args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def _one_error(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr
    return lines[0]


# ------------------------------------------------------------------------------------------ writes outside


def _victim(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "victim.txt"
    victim.write_bytes(b"someone's data\n" * 100)
    return victim


@pytest.mark.parametrize("made", ["symbolic link", "hard link"])
def test_a_lock_file_made_beforehand_as_a_link_is_refused_and_its_target_left_alone(tmp_path, made):
    victim = _victim(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out, lock = out_dir / "o.safetensors", out_dir / "o.lock"
    (os.symlink if made == "symbolic link" else os.link)(victim, lock)
    before = victim.read_bytes()
    code, stdout, stderr = _cli("text", "-", "--model", EG2, "-o", out, "-q", stdin="\n".join(TEXTS))
    assert code == 2
    why = f"a symbolic link to {victim}; not followed" if made == "symbolic link" else "a file with 2 names"
    assert _one_error(stderr).startswith(f"error: {lock}: not a gemma-embed lock file ({why}")
    assert victim.read_bytes() == before and not out.exists() and stdout == ""
    assert sorted(p.name for p in out_dir.iterdir()) == ["o.lock"]  # nothing else written, the link left as it was


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("three")
    for n in range(3):
        write_image(folder / f"img{n}.png", 40 + 10 * n, 30, n)
    return folder


def test_resume_refuses_a_parts_folder_replaced_by_a_link_and_writes_nothing_through_it(tmp_path, images):
    out = tmp_path / "out.safetensors"
    run = GatedRun(tmp_path, images, out)
    run.let_through(0)
    run.wait_for_parts(1)
    stopped = run.finish(signal.SIGINT)  # a real interrupted run: one item saved in its parts folder
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(run.parts, elsewhere / "parts")
    os.symlink(elsewhere / "parts", run.parts)
    before = snapshot(elsewhere)
    code, stdout, stderr = _cli("images", images, "--model", SAMPLE_MODEL, "-o", out, "--resume", "--flush-every", "1")
    assert code == 2
    line = _one_error(stderr)
    assert line == (
        f"error: {run.parts}: not a parts folder (a symbolic link to {elsewhere / 'parts'}; not followed); "
        f"remove it or run with --overwrite"
    )
    assert "free space" not in line and snapshot(elsewhere) == before and not out.exists()


def test_resume_refuses_a_part_file_replaced_by_a_link_and_leaves_its_target_alone(tmp_path, images):
    out = tmp_path / "out.safetensors"
    run = GatedRun(tmp_path, images, out)
    run.let_through(0)
    run.wait_for_parts(1)
    stopped = run.finish(signal.SIGINT)
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr
    part = sorted(run.parts.glob("part-*.safetensors"))[0]  # the interrupt may have saved a second one
    victim = _victim(tmp_path)
    shutil.copyfile(part, victim)  # a valid part's bytes: the link's target would be read, and replaced on resume
    part.unlink()
    part.symlink_to(victim)
    before = snapshot(victim.parent)
    code, stdout, stderr = _cli("images", images, "--model", SAMPLE_MODEL, "-o", out, "--resume", "--flush-every", "1")
    assert code == 2
    line = _one_error(stderr)
    assert line.startswith(f"error: {part}: not a part file (a symbolic link to {victim}; not followed)"), line
    assert snapshot(victim.parent) == before and not out.exists()


@pytest.mark.parametrize("named", ["../victim.safetensors", "{victim}"], ids=["leading out", "absolute"])
@pytest.mark.parametrize("command", ["inspect", "search", "export", "index", "resume"])
def test_a_sharded_outputs_index_naming_a_shard_outside_its_folder_is_refused(tmp_path, named, command):
    """OUT.index.json lists its shards by name: a name leading out of the output's folder (a forged or foreign
    index) is one error line from every reader and from --resume, and the file it names is left alone."""
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "o.safetensors"
    lines = "\n".join(f"{TEXTS[n % 4]} ({n})" for n in range(5))
    code, _, stderr = _cli("text", "-", "--model", EG2, "-o", out, "--shard-size", "2", "-q", stdin=lines)
    assert code == 0, stderr
    victim = tmp_path / "victim.safetensors"
    shutil.copyfile(folder / "o-00001.safetensors", victim)  # a shard's bytes: it would be read as one
    index = folder / "o.index.json"
    record = json.loads(index.read_text())
    name = named.format(victim=victim)
    record["shards"][1] = name
    index.write_text(json.dumps(record))
    before = snapshot(tmp_path)
    args = {
        "inspect": ("inspect", index),
        "search": ("search", index, "a cat"),
        "export": ("export", index, "--to", "npy", "-o", tmp_path / "e.npy"),
        "index": ("index", index),
        "resume": ("text", "-", "--model", EG2, "-o", out, "--shard-size", "2", "--resume"),
    }[command]
    code, stdout, stderr = _cli(*args, stdin=lines)
    assert code == 2 and stdout == ""
    line = _one_error(stderr)
    assert line.startswith(f"error: {index}: not a gemma-embed/1 index (names {name!r}, outside its folder)"), line
    assert snapshot(tmp_path) == before


def test_a_parts_folder_swapped_for_a_link_during_a_run_stops_it_without_writing_through_the_link(tmp_path, images):
    out = tmp_path / "out.safetensors"
    run = GatedRun(tmp_path, images, out)
    run.let_through(0)
    run.wait_for_parts(1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(run.parts, elsewhere / "parts")  # while the run holds batch 1 at its gate
    os.symlink(elsewhere / "parts", run.parts)
    before = snapshot(elsewhere)
    run.let_through(1)
    run.let_through(2)
    ended = run.finish()
    assert ended.returncode == 2, ended.stderr
    errors = [line for line in ended.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {run.parts}: not a parts folder (a symbolic link to {elsewhere / 'parts'}; not followed); "
        f"remove it or run with --overwrite"
    ]
    assert "Traceback" not in ended.stderr and snapshot(elsewhere) == before and not out.exists()


# ------------------------------------------------------------------------------------------ search trusts


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """Two outputs of 80 texts each (the same texts in another order: the same shape and size), each with its IVF
    index (one cell: 80 rows)."""
    made = {}
    for name, offset in (("a", 0), ("b", 1)):
        folder = tmp_path_factory.mktemp(name)
        out = folder / "o.safetensors"
        lines = [f"{TEXTS[(n + offset) % 4]} (document {n})" for n in range(80)]
        code, _, stderr = _cli("text", "-", "--model", EG2, "-o", out, "-q", stdin="\n".join(lines))
        assert code == 0, stderr
        code, _, stderr = _cli("index", out, "--kind", "ivf", "-q")
        assert code == 0, stderr
        made[name] = out
    assert os.path.getsize(made["a"].with_suffix(".faiss")) == os.path.getsize(made["b"].with_suffix(".faiss"))
    return made


@pytest.fixture
def copy(indexed, tmp_path):
    """A copy of output a and its index (times kept: it is current), inside tmp_path/out."""
    shutil.copytree(indexed["a"].parent, tmp_path / "out", copy_function=shutil.copy2)
    return tmp_path / "out" / "o.safetensors"


def _search(out, *extra):
    return _cli("search", out, "a cat", "--jsonl", *(extra if "-k" in extra else ("-k", "3", *extra)))


def _refused(out, file, reason: str, *extra) -> None:
    before = snapshot(out.parent)
    code, stdout, stderr = _search(out, *extra)
    assert code == 2 and stdout == ""
    line = _one_error(stderr)
    assert line.startswith(f"error: {file}: {reason}") and line.endswith(REBUILD.format(out=out)), line
    assert snapshot(out.parent) == before


def _same_time(path, like) -> None:
    st = os.stat(like)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _table(out):
    return out.with_name("o.search-index")


def _rewrite_table(out, arrays=None, record=None, keep_time: bool = True) -> None:
    """The table file rewritten by safetensors itself, its arrays or record changed; its time kept."""
    path = _table(out)
    with safe_open(str(path), framework="numpy") as fh:
        meta = fh.metadata()
        tensors = {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118 - safe_open has no iteration
    if arrays is not None:
        arrays(tensors)
    if record is not None:
        meta["record"] = json.dumps(record(json.loads(meta["record"])))
    st = os.stat(path)
    save_file(tensors, str(path), metadata=meta)
    if keep_time:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_an_intact_copy_answers_as_the_exact_search_does(copy):
    code, stdout, stderr = _search(copy)
    assert code == 0, stderr
    code, exact, _ = _search(copy, "--exact")
    assert code == 0 and [json.loads(r)["key"] for r in stdout.splitlines()] == [
        json.loads(r)["key"] for r in exact.splitlines()
    ]


def test_a_faiss_index_of_other_vectors_with_the_same_shape_size_and_time_is_refused(copy, indexed):
    faiss_file = copy.with_suffix(".faiss")
    original = faiss_file.read_bytes()
    shutil.copyfile(indexed["b"].with_suffix(".faiss"), faiss_file)
    _same_time(faiss_file, indexed["a"].with_suffix(".faiss"))
    assert faiss_file.stat().st_size == len(original) and faiss_file.read_bytes() != original
    _refused(copy, faiss_file, "not the file it was built with (its content digest differs)")
    assert _search(copy, "--exact")[0] == 0  # --exact sets it aside


def test_a_faiss_file_damaged_in_place_with_its_size_and_time_kept_is_refused(copy, indexed):
    faiss_file = copy.with_suffix(".faiss")
    data = bytearray(faiss_file.read_bytes())
    data[8:24] = b"\xff" * 16  # its header: faiss itself would fail with a RuntimeError
    faiss_file.write_bytes(bytes(data))
    _same_time(faiss_file, indexed["a"].with_suffix(".faiss"))
    _refused(copy, faiss_file, "not the file it was built with (its content digest differs)")


def _foreign(kind: str, rows: int, width: int):
    vectors = np.random.default_rng(0).standard_normal((rows, width)).astype(np.float32)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(width, 16, faiss.METRIC_INNER_PRODUCT)
    else:
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(width), width, 1, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
    index.add(vectors)
    return index


# case -> (the faiss index put in its place, what the line says once the record is forged to its size, time and
# digest: the checks of the index faiss reads)
SHAPES = {
    "another dimension": (lambda w: _foreign("ivf", 80, w // 2), "holds 80 vectors of {half} dimensions"),
    "another kind": (lambda w: _foreign("hnsw", 80, w), "a faiss IndexHNSWFlat, not the ivf index it was built as"),
    "more vectors than the output": (lambda w: _foreign("ivf", 500, w), "holds 500 vectors of {width} dimensions"),
}


@pytest.mark.parametrize("forged", [False, True], ids=["as it is", "record forged to match"])
@pytest.mark.parametrize("case", list(SHAPES))
def test_a_faiss_index_of_another_shape_is_refused_naming_it(copy, case, forged):
    make, reason = SHAPES[case]
    width = json.loads(safe_open(str(_table(copy)), framework="numpy").metadata()["record"])["width"]
    faiss_file = copy.with_suffix(".faiss")
    faiss.write_index(make(width), str(faiss_file))  # built and written by faiss itself
    if not forged:
        _refused(copy, faiss_file, "not the file it was built with (changed since, or an interrupted build?)")
        return
    from gemma_embed.store.digests import file_digests

    facts, st = file_digests(faiss_file), faiss_file.stat()
    _rewrite_table(
        copy,
        record=lambda r: {
            **r,
            "faiss": {**r["faiss"], **facts, "mtime_ns": st.st_mtime_ns},
        },
    )
    _refused(copy, faiss_file, reason.format(half=width // 2, width=width))


def test_an_index_record_that_is_a_json_list_is_refused_naming_the_table(copy):
    _rewrite_table(copy, record=lambda r: [r])
    _refused(copy, _table(copy), "not a gemma-embed-search/2 file (its record is a JSON list, not an object)")


def test_an_index_record_naming_a_file_outside_the_folder_is_refused_and_nothing_outside_read(copy, tmp_path):
    victim = tmp_path / "victim_rows.bin"
    shutil.copyfile(copy, victim)  # rows that would be searched if the name were followed
    before = victim.read_bytes()
    _rewrite_table(copy, record=lambda r: {**r, "files": [{**r["files"][0], "name": "../victim_rows.bin"}]})
    _refused(copy, _table(copy), "not a gemma-embed-search/2 file (its record names '../victim_rows.bin', outside")
    assert victim.read_bytes() == before


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda a: a.update(norms=a["norms"].byteswap()), "its row norms are not"),
        (lambda a: a.update(norms=-a["norms"]), "its row norms are not all finite and positive"),
        (lambda a: a.update(norms=a["norms"] * 1.5), "its row norms are not the output's rows'"),
        (lambda a: np.random.default_rng(1).shuffle(a["item_rows"]), "its item boundaries or line offsets do not rise"),
    ],
    ids=["norms byte-swapped", "norms negated", "norms of other vectors", "item_rows shuffled"],
)
def test_a_table_with_damaged_norms_or_item_rows_is_refused(copy, damage, reason):
    _rewrite_table(copy, arrays=damage)
    _refused(copy, _table(copy), reason)


@pytest.mark.parametrize("scale", [1e-6, 1e3], ids=["scaled down", "scaled up"])
def test_a_norm_damaged_where_the_sampled_check_does_not_look_is_refused(copy, scale):
    """A norm scaled down would score its row past a cosine of 1; one scaled up drops its item out of every answer
    without a word (exit 0, found by trying): the arrays' checksum refuses both when the table is opened."""
    from gemma_embed.store.row_table import NORM_SAMPLE_ROWS

    sampled = set(np.linspace(0, 79, NORM_SAMPLE_ROWS).astype(np.int64).tolist())  # the rows opening compares
    row = next(n for n in range(80) if n not in sampled)
    _rewrite_table(copy, arrays=lambda a: a["norms"].__setitem__(row, a["norms"][row] * scale))
    _refused(copy, _table(copy), "its arrays are not the ones it was written with (damaged)", "-k", "80")
    code, stdout, stderr = _search(copy, "-k", "80", "--exact")  # the output's own norms: every row, cosines <= 1
    assert code == 0, stderr
    scores = [json.loads(line)["score"] for line in stdout.splitlines()]
    assert len(scores) == 80 and max(scores) <= 1.0 + 1e-6


def test_an_item_boundary_moved_by_one_is_refused(copy):
    """Boundaries that still rise and meet the files' rows, one of them moved by a row: the wrong key for a row."""
    _rewrite_table(copy, arrays=lambda a: a["item_rows"].__setitem__(3, a["item_rows"][3] + 1))
    _refused(copy, _table(copy), "its arrays are not the ones it was written with (damaged)")


def test_an_output_rewritten_with_its_size_and_time_kept_is_refused(copy, indexed):
    st = copy.stat()
    shutil.copyfile(indexed["b"], copy)  # other rows, the same size
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    _refused(copy, _table(copy), "the output changed after it was indexed (o.safetensors holds other bytes")


@pytest.mark.parametrize("which", ["o.faiss", "o.search-index"])
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_index_file_that_is_a_fifo_or_a_device_is_refused_at_once(copy, which, kind):
    special = copy.with_name(which)
    special.unlink()
    if kind == "fifo":
        os.mkfifo(special)
        said = "not a regular file (a FIFO); not read"
    else:  # a link to /dev/zero: read, it would never end
        special.symlink_to("/dev/zero")
        said = "not a regular file (a character device); not read"
    # The command's own process: a FIFO opened for reading would wait for a writer forever (the timeout fails it).
    proc = subprocess.run(
        [EXE, "search", str(copy), "a cat", "-k", "3"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2 and proc.stdout == ""
    line = _one_error(proc.stderr)
    assert line == f"error: {special}: {said}" + REBUILD.format(out=copy)
