"""`gemma-embed index OUT`: an approximate-search index beside an output, and the checks before a search uses it.

Two files beside the output, named after it:
- `OUT.search-index`: the output's row table (store/row_table.py: norms, item boundaries, keys) and the index's
  record: which output it covers (every file's name, size and modification time), rows, width, the
  kind and its settings, and the recall@10 it measured when built;
- `OUT.faiss`: the faiss index (a plain faiss file; none for `flat`).

Kinds (`--kind`):
- `flat`: exact search over the output itself through the row table: no copy of the vectors (the output's rows,
  memory-mapped, are the flat index; a faiss flat index would hold the same values again);
- `ivf`: faiss IVF (spherical k-means cells, rows stored as float16), `nprobe` chosen at build time: twice the
  smallest that finds TARGET_RECALL of the exact top 10 for sampled rows of the output;
- `hnsw`: faiss HNSW (32 links a node, float16 storage), `efSearch` chosen the same way;
- `auto`: flat below FLAT_BELOW_ROWS rows; above, IVF with cells from the row count, unless IVF would have to scan
  more than half of its cells to reach the target recall (data without clusters, such as random vectors: then
  no approximate index does better than the exact scan), when it stays flat and the record says why.

faiss (faiss-cpu, the `[search]` extra) over usearch: at 50,000 x 384 clustered vectors on this 2-core machine
(shared), faiss HNSW32 built in 75 s and usearch (connectivity 16, f16) in 207 s for the same recall@10 (0.98 at
ef 16, 1.00 at ef 64) and latency (1.3 ms a query); faiss IVF256 built in 17 s with recall 1.00 at nprobe 4; and
only faiss has IVF and flat kinds. At 200,000 random vectors neither reached recall 0.95 (usearch 0.40 at ef 1024,
IVF1024 0.79 at nprobe 512), which is why `auto` measures before it chooses.

Hits found through an index are rescored exactly from the output's rows: their scores are the exact search's, only
which items are found is approximate. Every file appears atomically, the faiss file first, the record last: an
interrupted build leaves the previous index whole (or none), and running `index` again rebuilds.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np

from gemma_embed import store
from gemma_embed.errors import IndexNotCurrent, UsageError
from gemma_embed.locations import Location, filesystem_for, location
from gemma_embed.store import row_table
from gemma_embed.store.digests import file_digests, sampled_sha256
from gemma_embed.store.layout import relative_name

KINDS = ("auto", "flat", "ivf", "hnsw")
METRICS = ("cosine",)
FLAT_BELOW_ROWS = 100_000
TARGET_RECALL = 0.97  # on the output's own rows (then one step more, see _build_faiss)
SAMPLE_QUERIES = 200
TRAIN_ROWS_PER_LIST = 50  # faiss's k-means warns below 39 training rows a cell
HNSW_LINKS = 32
HNSW_EF_CONSTRUCTION = 80
ADD_BLOCK_ROWS = 65_536
EXTRA = "pip install 'gemma-embed[search]'"


def faiss_path(output: str | os.PathLike) -> Location:
    stem = row_table.output_stem(output)
    return stem.with_name(stem.name + ".faiss")


def _faiss(why: str, instead: str = ""):
    try:
        import faiss
    except ImportError:
        raise UsageError(f"{why} needs faiss, which is not installed: {EXTRA}{instead}") from None
    return faiss


# ------------------------------------------------------------------------------------------ opening


@dataclass
class Opened:
    """A current index: the output's row table, and the faiss searcher (None for flat, or with `exact`)."""

    table: row_table.RowTable
    record: dict
    searcher: _Searcher | None


class _Searcher:
    def __init__(self, index, record: dict, where: Location, output: Location):
        self.index = index
        self.rows, self.where, self.output = int(record["rows"]), where, output
        settings = record["settings"]
        if "nprobe" in settings:
            index.nprobe = int(settings["nprobe"])
        if "ef_search" in settings:
            index.hnsw.efSearch = int(settings["ef_search"])

    def candidates(self, queries: np.ndarray, rows: int) -> np.ndarray:
        """The `rows` best rows of each unit query by inner product (-1 where the index has fewer)."""
        _, ids = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), int(rows))
        if ids.size and int(ids.max()) >= self.rows:  # damaged past what its digest samples: not our rows
            raise IndexNotCurrent(self.where, f"proposes row {int(ids.max())} of an output of {self.rows}", self.output)
        return ids


def open_index(output: str | os.PathLike, exact: bool = False) -> Opened | None:
    """The output's index when it has one that is current; None when it has none. An index that cannot be trusted
    for the output as it is now (made for another output or before it changed, from other vectors, damaged, not a
    regular file) is refused in one line, `IndexNotCurrent`, that says to rebuild it; with `exact` it is only set
    aside (the exact search reads the output itself).

    What is checked, on every open (cheaply: measured in bench/bench_index_checks.py): the record's fields and the
    names it reads (inside the output's folder, the output's own files), each file's size, time and sampled
    content digest against the record (store/digests.py), the table's arrays against each other and sampled rows
    of the output (`row_table.check_table`), and the faiss file's digest, kind, width and count."""
    output = location(output)
    path = row_table.table_path(output)
    if not path.lexists():
        return None
    try:
        return _open_checked(output, path, exact)
    except IndexNotCurrent:
        if exact:
            return None
        raise


def _open_checked(output: Location, path: Location, exact: bool) -> Opened:
    def refuse(where: Location, reason: str) -> IndexNotCurrent:
        return IndexNotCurrent(where, reason, output)

    try:
        record = row_table.read_record(path)
    except (ValueError, OSError) as exc:  # a FIFO or device in its place is a NotRegularFile, a ValueError
        raise refuse(path, _reason(exc, path)) from None
    problem = _mismatch(record, output)
    if problem is not None:
        raise refuse(path, problem)
    try:
        table = row_table.load_table(path, record)
    except (ValueError, OSError) as exc:
        raise refuse(path, _reason(exc, path)) from None
    if exact or record["kind"] == "flat":
        return Opened(table, record, None)
    faiss = _faiss(f"{path}: searching an {record['kind']} index", ", or search with --exact")
    index_file = faiss_path(output)
    return Opened(table, record, _Searcher(_read_faiss(faiss, index_file, record, refuse), record, index_file, output))


def _reason(exc: BaseException, file: Location) -> str:
    """An error's message without the file's name in front (the refusal names the file itself)."""
    text = " ".join((getattr(exc, "strerror", None) or str(exc)).split())
    return text.removeprefix(f"{file}: ")


def _read_faiss(faiss, index_file: Location, record: dict, refuse):
    """The index's faiss file, if it is the one the record was built with: the same size and time, the same
    sampled content digest, and, read, an index of the recorded kind over the output's rows and width."""
    recorded = record.get("faiss")
    if not isinstance(recorded, dict) or not index_file.lexists():
        raise refuse(index_file, f"missing (an interrupted build?); {record['kind']} indexes have one")
    try:
        with index_file.input_by_name() as (fh, name):
            size, mtime_ns = index_file.size_and_time(fh)
            if (size, mtime_ns) != (recorded["size"], recorded["mtime_ns"]):
                raise refuse(index_file, "not the file it was built with (changed since, or an interrupted build?)")
            if sampled_sha256(fh, size) != recorded["sampled_sha256"]:
                raise refuse(index_file, "not the file it was built with (its content digest differs)")
            index = faiss.read_index(name)
    except (ValueError, OSError) as exc:  # a FIFO or device in its place: refused unopened
        raise refuse(index_file, _reason(exc, index_file)) from None
    except RuntimeError as exc:  # faiss's own error for bytes it cannot read
        raise refuse(index_file, f"not a faiss index faiss can read ({_reason(exc, index_file)[:200]})") from None
    kinds = {"ivf": faiss.IndexIVF, "hnsw": faiss.IndexHNSW}
    if not isinstance(index, kinds[record["kind"]]):
        raise refuse(index_file, f"a faiss {type(index).__name__}, not the {record['kind']} index it was built as")
    if index.d != record["width"] or index.ntotal != record["rows"]:
        raise refuse(
            index_file,
            f"holds {index.ntotal} vectors of {index.d} dimensions, the output {record['rows']} of {record['width']}",
        )
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise refuse(index_file, "does not rank by inner product, as a cosine index does")
    return index


def _mismatch(record: dict, output: Location) -> str | None:
    recorded = record["output"]
    try:
        listed = row_table.listing(output)  # read once: a sharded output's index lists every key
    except (FileNotFoundError, ValueError) as exc:  # a damaged OUT.index.json: a DamagedFile, a ValueError
        return str(exc)
    names, now = [e["name"] for e in recorded], [relative_name(f, output.parent) for f in listed]
    if now != names:
        return f"made for another output ({', '.join(names)}), not {', '.join(now)}"
    files = now[1:] if listed[0].suffix == ".json" else now  # the rows are in the files, not the shard index
    if [f["name"] for f in record["files"]] != files:
        return f"its rows are read from {', '.join(f['name'] for f in record['files'])}, not the output's files"
    changed = row_table.compare_fingerprint(recorded, output, listed)
    return None if changed is None else f"the output changed after it was indexed ({changed})"


def output_model(output: str | os.PathLike) -> str | None:
    """The model an output was made with, from its header (torch is not imported); None when the output cannot
    be read: whoever reads it next says why."""
    try:
        return output_header(output).get("model") or None
    except (OSError, ValueError, UsageError):
        return None


def output_header(output: str | os.PathLike) -> dict:
    """The output's run metadata (model, space, width...): from its current index when it has one (no JSON
    header parsed), else from its first file."""
    path = row_table.table_path(output)
    if path.lexists():
        try:
            record = row_table.read_record(path)
            if _mismatch(record, location(output)) is None:
                return record["header"]
        except (ValueError, OSError):
            pass  # open_index says what is wrong with it
    files = store.output_files(output)
    if not files:
        raise FileNotFoundError(f"{output}: no such output (neither the file nor its .index.json)")
    return store.read_header(files[0])


# ------------------------------------------------------------------------------------------ building


def build_index(output: str | os.PathLike, kind: str = "auto", metric: str = "cosine", reporter=None) -> dict:
    """Build the output's index (see the module's docstring) and return its record. `reporter` (progress.Reporter)
    gets the build's steps as notes."""
    output = location(output)
    filesystem_for(output)  # a protocol the tool cannot read is refused naming the output, not the file beside it
    if kind not in KINDS:
        raise UsageError(f"--kind {kind}: choose one of {', '.join(KINDS)}")
    if metric not in METRICS:
        raise UsageError(f"--metric {metric}: only {', '.join(METRICS)} is supported")
    if kind in ("ivf", "hnsw"):
        _faiss(f"gemma-embed index --kind {kind}")  # before any work
    store.check_output_folder(row_table.table_path(output))  # the line every command gives, before any work
    started = time.monotonic()
    say = _Notes(reporter)
    # Before reading, with the content's digests: a change while building makes the index stale.
    fingerprint = row_table.fingerprint(output, digests=True)
    try:
        table, lines = row_table.build_table(output, lambda done, total: say.progress("read", done, total))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if table.rows == 0:
        raise UsageError(f"{output}: holds no rows to index")
    chosen = kind if kind != "auto" else ("flat" if table.rows < FLAT_BELOW_ROWS else "ivf")
    say.note(f"{table.rows} rows x {table.width}: {chosen}" + (" (auto)" if kind == "auto" else ""))
    record = {"kind": chosen, "requested": kind, "metric": metric, "settings": {}, "recall_at_10": 1.0}
    built = None
    if chosen != "flat":
        faiss = _faiss(f"gemma-embed index --kind {chosen}")
        built, record = _build_faiss(faiss, table, chosen, record, say)
        if kind == "auto" and record["settings"].get("nprobe", 0) > record["settings"].get("nlist", 0) // 2:
            record = {
                **record,
                "kind": "flat",
                "reason": (
                    f"IVF needed nprobe {record['settings']['nprobe']} of {record['settings']['nlist']} cells for "
                    f"recall@10 {record['recall_at_10']:.2f} on sampled rows; past half the cells the exact scan "
                    f"costs no more"
                ),
                "recall_at_10": 1.0,
            }
            say.note(record["reason"] + ": flat")
            built = None
    index_file = faiss_path(output)
    if built is not None:
        with index_file.temp_path() as tmp:
            faiss.write_index(built, tmp)
        info = index_file.info()
        record["faiss"] = {
            "name": index_file.name,
            "size": info["size"],
            "mtime_ns": info["mtime_ns"],
            **{k: v for k, v in file_digests(index_file).items() if k != "size"},
        }
    record["output"] = fingerprint
    record["seconds"] = round(time.monotonic() - started, 3)
    path = row_table.table_path(output)
    record = row_table.write_table(path, record, table, lines)
    if built is None:
        index_file.rm_file(missing_ok=True)  # an earlier build's, which the new record does not name
    wrote = f"{path} and {index_file}" if built is not None else str(path)
    say.note(f"wrote {wrote} in {record['seconds']:.1f} s")
    return record


def _build_faiss(faiss, table: row_table.RowTable, kind: str, record: dict, say) -> tuple:
    width, rows = table.width, table.rows
    sample = np.unique(np.linspace(0, rows - 1, min(SAMPLE_QUERIES, rows)).astype(np.int64))
    queries = _unit_rows(table, sample)
    if kind == "ivf":
        nlist = int(2 ** round(math.log2(max(16.0, math.sqrt(rows)))))
        nlist = max(1, min(nlist, rows // TRAIN_ROWS_PER_LIST or 1))
        quantizer = faiss.IndexFlatIP(width)
        index = faiss.IndexIVFScalarQuantizer(
            quantizer, width, nlist, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT, False
        )
        index.cp.spherical = True  # cosine: cells around unit centroids
        train = np.unique(np.linspace(0, rows - 1, min(rows, TRAIN_ROWS_PER_LIST * nlist)).astype(np.int64))
        say.note(f"training IVF: {nlist} cells on {len(train)} rows")
        index.train(_unit_rows(table, train))
        settings = {"nlist": nlist, "storage": "float16", "train_rows": int(len(train))}
        knob, values = "nprobe", [2**i for i in range(int(math.log2(nlist)) + 1)]
        if values[-1] != nlist:
            values.append(nlist)
    else:
        index = faiss.IndexHNSWSQ(width, faiss.ScalarQuantizer.QT_fp16, HNSW_LINKS, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.train(queries)  # float16 storage: nothing learnt but the format
        settings = {"links": HNSW_LINKS, "ef_construction": HNSW_EF_CONSTRUCTION, "storage": "float16"}
        knob, values = "ef_search", [16, 32, 64, 128, 256, 512, 1024]
    truth = _exact_top(table, queries, sample, index, say)
    best, reached = None, None
    for value in values:
        if knob == "nprobe":
            index.nprobe = value
        else:
            index.hnsw.efSearch = value
        _, found = index.search(queries, 11)
        best = (value, _recall(found, truth, sample))
        if reached is not None or value == values[-1]:
            break
        if best[1] >= TARGET_RECALL:
            # One step more than the rows themselves need: a model's queries are near its rows, not among them
            # (measured, 4,000 clustered rows: HNSW at the rows' ef 16 found 0.87 for perturbed rows).
            reached = value
    settings[knob] = best[0]
    say.note(f"{knob} {best[0]}: recall@10 {best[1]:.3f} on {len(sample)} sampled rows")
    return index, {**record, "settings": settings, "recall_at_10": round(best[1], 4), "sample_queries": len(sample)}


def _exact_top(table: row_table.RowTable, queries: np.ndarray, sample: np.ndarray, index, say) -> np.ndarray:
    """Add every row to `index` (unit rows, block by block) and, in the same pass, the exact 11 best rows of each
    sampled query (itself among them)."""
    import torch

    q = torch.from_numpy(queries)
    best_scores = torch.full((len(sample), 11), float("-inf"))
    best_rows = torch.full((len(sample), 11), -1, dtype=torch.long)
    done = 0
    for file in table.files:
        view = file.rows_view()
        for start in range(0, file.rows, ADD_BLOCK_ROWS):
            block = row_table.as_float32(view[start : start + ADD_BLOCK_ROWS], file.dtype)
            block = block / torch.from_numpy(table.norms[done : done + len(block)]).clamp_min(1e-12)[:, None]
            index.add(block.numpy())
            scores = torch.cat([best_scores, q @ block.T], dim=1)
            ids = torch.cat([best_rows, torch.arange(done, done + len(block)).expand(len(sample), -1)], dim=1)
            top = torch.topk(scores, 11, dim=1)
            best_scores, best_rows = top.values, ids.gather(1, top.indices)
            done += len(block)
            say.progress("add", done, table.rows)
    return best_rows.numpy()


def _recall(found: np.ndarray, truth: np.ndarray, sample: np.ndarray) -> float:
    """recall@10 of the index's rows against the exact rows, each query's own row left out of both."""
    total = 0.0
    for row, ours, exact in zip(sample, found, truth, strict=True):
        want = [r for r in exact if r != row and r >= 0][:10]
        got = [r for r in ours if r != row and r >= 0][:10]
        total += len(set(want) & set(got)) / max(1, len(want))
    return total / len(sample)


def _unit_rows(table: row_table.RowTable, rows: np.ndarray) -> np.ndarray:
    """Rows (global numbers, sorted) as unit float32 vectors."""
    out = np.empty((len(rows), table.width), np.float32)
    files = np.searchsorted(table.file_rows, rows, side="right") - 1
    for number in np.unique(files):
        chosen = np.flatnonzero(files == number)
        local = rows[chosen] - table.file_rows[number]
        file = table.files[number]
        out[chosen] = row_table.as_float32(file.rows_view()[local], file.dtype).numpy()
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(out)


class _Notes:
    """The build's steps for people, through the reporter: phases, and progress every tenth of the rows."""

    def __init__(self, reporter):
        self.reporter = reporter
        self.shown: dict[str, int] = {}

    def note(self, message: str) -> None:
        if self.reporter is not None:
            self.reporter.note(f"index: {message}")

    def progress(self, phase: str, done: int, total: int) -> None:
        tenth = 10 * done // max(1, total)
        if tenth > self.shown.get(phase, 0) and total >= ADD_BLOCK_ROWS:
            self.shown[phase] = tenth
            verb = "read norms of" if phase == "read" else "added"
            self.note(f"{verb} {done} of {total} rows")
