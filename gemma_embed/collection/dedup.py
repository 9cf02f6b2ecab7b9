"""Near-duplicate groups of an output (`gemma-embed dedup`, `gemma_embed.dedup`).

Two items are near duplicates when their unit vectors (collection/vectors.py) have cosine >= the threshold; the
groups are the connected components of that graph (as fastdup cuts its similarity graph), joined with the groups
of items of the same content (`sha256`), which are always one group whatever the threshold. One item a group is
kept, by the `keep` rule; `similarity` is each item's cosine to its group's kept item.

The vectors are never all in memory: they are read from the output's files a block at a time, or row by row
where a pair asks for them (`vectors.StoredRows`). Pairs come from one of two scans (`method`):
- `exact`: every pair, as float32 matrix products of tiles sized to bound memory (`tile_shape`): a panel of rows
  held (PANEL_SHARE of the vectors' bytes) against the rows after it, read a window of columns at a time. 2 x N^2
  x D operations: 100k x 768 is 7.7e12, about a minute at the 140 GFLOPS numpy reaches on the 2-core AMD EPYC;
  1M would be 100 times that (1.5 hours), hence
- `index`: IVF cells (faiss: spherical k-means trained on a sample) and each item's vector as 8-bit scalar codes
  (faiss SQ8, ranges from the same sample: a quarter of the float32 vectors' bytes), one pass over the output to
  make them; then, a block of items at a time, each item against every item of its `nprobe` nearest cells: the
  codes of a cell decoded once for all the block's items that probe it, scored by one matrix product (the
  scores faiss's range search gives, computed as numpy's products instead of one query at a time, which on 2
  cores was 85% of the time), at a threshold lowered by CODE_MARGIN for the codes' rounding; every pair so
  proposed is scored again from the float32 vectors, so scores are exact and only which pairs are found is
  approximate. Its recall (pairs found / pairs the exact scan finds, for RECALL_QUERIES sampled items scanned
  exactly in the same pass) is measured on every run and recorded.
`auto` is exact below EXACT_BELOW items. Figures (2-core AMD EPYC): bench/README.md.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gemma_embed.collection.graph import Components
from gemma_embed.collection.vectors import HeldRows, ItemVectors, UnitRows, item_rows
from gemma_embed.config import DEFAULT_THRESHOLD, EXACT_BELOW, DedupMethod, KeepRule, cosine
from gemma_embed.errors import UsageError
from gemma_embed.locations import Location

if TYPE_CHECKING:
    import pyarrow as pa

METHODS = tuple(m.value for m in DedupMethod)
KEEP_RULES = tuple(k.value for k in KeepRule)
# EXACT_BELOW (config.py): 150k items, where the exact scan's 2 x N^2 x D at 768 wide is about 2.5 min on the
# 2-core EPYC.
# Bytes of one tile of scores (float32) and its mask: a quarter of the vectors' bytes, within these bounds, so
# that the scan's peak stays near the vectors' own size.
TILE_BYTES = (16 << 20, 256 << 20)
TILE_COLUMNS = 16_384
PANEL_SHARE = 4  # the exact scan holds a quarter of the vectors' bytes (within TILE_BYTES) as its panel of rows
# IVF: cells of ~CELL_ITEMS items, trained on TRAIN_PER_CELL items a cell; each item searched in NPROBE cells.
CELL_ITEMS = 1_000
TRAIN_PER_CELL = 40
TRAIN_AT_LEAST = 20_000  # the codes' per-dimension ranges come from the training rows too
NPROBE = 8
# 8-bit codes (ranges trained on 20k rows) moved a cosine by at most 0.0046 (clustered) and 0.0057 (random unit
# vectors) over 2000 x 30000 pairs at 768 wide (faiss QT_8bit, measured on the 2-core EPYC): 0.03 is five times that.
CODE_MARGIN = 0.03
# Items a coarse search (nearest cells) takes at once: the cells found for an item depend on the block's size
# (the products' blocking), so it stays this.
SEARCH_BLOCK = 16_384
# Items scored against their cells at once (`scan_block`): the queries that probe a cell are scored by one matrix
# product, which numpy runs at 13 GFLOPS for 400 queries x 500 codes and 80 for 1300 x 1000 (2-core EPYC).
QUERIES_PER_CELL = 1_000
CELL_BYTES = 4 << 20  # a cell's decoded codes, and its scores, at most this at once
RECALL_QUERIES = 500
TRUTH_COLUMNS = 4_096  # the sampled items' scores against a block, this many items at a time (8 MB)
SIMILARITY_BLOCK = 4_096  # pairs scored at once for `similarity`
RESCORE_BLOCK = 4_096  # candidate pairs scored again at once
FAISS_EXTRA = "pip install 'gemma-embed[search]'"


class StageClock:
    """Wall and CPU seconds (`time.process_time`: every thread of the process) per stage, added to `into`
    ({stage: {"wall": s, "cpu": s}}) at each `lap`; nothing is kept where `into` is None."""

    def __init__(self, into: dict | None = None):
        self.into = into
        self.mark()

    def mark(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def lap(self, stage: str) -> None:
        if self.into is not None:
            spent = self.into.setdefault(stage, {"wall": 0.0, "cpu": 0.0})
            spent["wall"] += time.perf_counter() - self._wall
            spent["cpu"] += time.process_time() - self._cpu
        self.mark()


@dataclass
class DedupReport:
    """How the pairs were found: method, threshold, the index's recall where it was used, and counts."""

    method: str
    threshold: float
    keep: str
    items: int
    pairs: int = 0
    same_content: int = 0  # items grouped by an equal content hash
    recall: float | None = None  # index path: pairs found / pairs of the exact scan, on sampled items
    settings: dict = field(default_factory=dict)
    seconds: float = 0.0
    clock: StageClock = field(default_factory=StageClock)


def check_threshold(threshold: float) -> float:
    try:
        cosine(threshold)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"threshold: {exc}") from None
    return float(threshold)


def dedup(
    output: str | os.PathLike | Location,
    threshold: float = DEFAULT_THRESHOLD,
    keep: str = "first",
    method: str = "auto",
    seed: int = 0,
    vectors: ItemVectors | None = None,
    progress: Callable[[str], None] | None = None,
    ivf: dict | None = None,
    timings: dict | None = None,
) -> pa.Table:
    """Near-duplicate groups of `output` (see the module's note) as a pyarrow Table with the columns of
    `collection.GROUP_COLUMNS` (and `item`: the item's position in the output), one row per item in a group of two
    or more, ordered by group then output order; its schema metadata records how it was made (`read_record`).
    `ivf`: the index path's `cells` and `nprobe` instead of those chosen from the size (`ivf_settings`).
    `timings`: a dict that gets each stage's wall and CPU seconds (`StageClock`)."""
    from gemma_embed.collection.tables import groups_table

    threshold = check_threshold(threshold)
    keep, method = str(keep), str(method)
    if keep not in KEEP_RULES:
        raise UsageError(f"keep={keep!r}: choose {', '.join(KEEP_RULES)}")
    if method not in METHODS:
        raise UsageError(f"method={method!r}: choose {', '.join(METHODS)}")
    started = time.perf_counter()
    clock = StageClock(timings)
    opened: AbstractContextManager[ItemVectors] = nullcontext(vectors) if vectors is not None else item_rows(output)
    with opened as found:
        clock.lap("read")
        count = found.count
        chosen = method if method != "auto" else ("exact" if count < EXACT_BELOW else "index")
        report = DedupReport(chosen, threshold, keep, count, clock=clock)
        components = Components(count)
        report.same_content = _join_same_content(found.facts.digests, components)
        clock.lap("same content")
        scan = _exact_pairs if chosen == "exact" else _index_pairs
        report.settings = dict(ivf or {})
        report.pairs = scan(found.rows, threshold, components, report, seed, progress)
        labels = components.labels()
        group_of, kept, order = _groups(labels, _keep_order(found, keep))
        similarity = _similarity(found.rows, order, kept[group_of[order]])
        clock.lap("groups")
        report.seconds = time.perf_counter() - started
        table = groups_table(found, order, group_of[order], kept, similarity, report)
        clock.lap("table")
    return table


def _similarity(rows: UnitRows, order: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """float32 cosine of each item in `order` to its group's kept item (`kept`, one per item), 1.0 for a kept
    item itself; rows read SIMILARITY_BLOCK pairs at a time."""
    similarity = np.empty(len(order), np.float32)
    for begin in range(0, len(order), SIMILARITY_BLOCK):
        end = begin + SIMILARITY_BLOCK
        similarity[begin:end] = np.einsum("ij,ij->i", rows.take(order[begin:end]), rows.take(kept[begin:end]))
    return np.where(order == kept, 1.0, np.minimum(similarity, 1.0)).astype(np.float32)


# ------------------------------------------------------------------------------------------ same content


def _join_same_content(digests: pa.Array, components: Components) -> int:
    """An edge from each item to the first item with its content hash (null: none); returns how many items got
    one."""
    present = np.flatnonzero(~digests.is_null().to_numpy(zero_copy_only=False))
    if not len(present):
        return 0
    codes = digests.take(present).dictionary_encode().indices.to_numpy(zero_copy_only=False)
    _, first = np.unique(codes, return_index=True)  # each hash's first item among those present
    right = present[first[codes]]
    joined = right != present
    components.add(present[joined], right[joined])
    return int(joined.sum())


# ------------------------------------------------------------------------------------------ exact


def tile_shape(count: int, width: int) -> tuple[int, int]:
    """(rows, columns) of one tile of scores: TILE_BYTES' share of the vectors' bytes, 5 bytes an entry (the
    float32 score and its mask)."""
    low, high = TILE_BYTES
    budget = int(min(high, max(low, count * width * 4 // 4)))
    columns = max(1, min(count, TILE_COLUMNS))
    return max(1, min(count, budget // (5 * columns))), columns


def panel_rows(count: int, width: int) -> int:
    """Rows the exact scan holds at once: a whole number of tiles' rows, PANEL_SHARE of the vectors' bytes within
    TILE_BYTES."""
    low, high = TILE_BYTES
    rows, _ = tile_shape(count, width)
    budget = int(min(high, max(low, count * width * 4 // PANEL_SHARE)))
    return max(1, min(count, budget // (4 * max(1, width)))) // rows * rows or rows


def exact_pairs(vectors: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Every pair i < j with cosine >= threshold, by the blocked scan (for tests)."""
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    _scan_tiles(HeldRows(vectors), threshold, lambda i, j: pairs.append((i, j)))
    if not pairs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


def _scan_tiles(rows: UnitRows, threshold: float, found: Callable[[np.ndarray, np.ndarray], None]) -> int:
    """The upper triangle (i < j) of the Gram matrix, tile by tile; `found(i, j)` for the pairs at or above the
    threshold in each tile. Returns how many pairs.

    The tiles are those of rows r0 (a multiple of the tile's rows) against columns r0 + k x TILE_COLUMNS..: the
    same products whatever is held, so the same scores to the bit (a product's entries do not depend on where its
    rows and columns sit, only on its shape). A panel of rows is held; the columns from the panel's first row on
    are read a window of two tiles' columns at a time, and each tile whose first column falls in the window's
    first half is computed there."""
    count, width = rows.count, rows.width
    tile_rows, columns = tile_shape(count, width)
    panel = panel_rows(count, width)
    total = 0
    held = window = np.zeros((0, width), np.float32)
    for p0 in range(0, count, panel):
        p1 = min(count, p0 + panel)
        del held, window  # each gone before the next is read
        held = rows.block(p0, p1)
        window = np.zeros((0, width), np.float32)
        for w0 in range(p0, count, columns):
            del window
            window = rows.block(w0, min(count, w0 + 2 * columns))
            for r0 in range(p0, p1, tile_rows):
                c0 = r0 + max(0, -(-(w0 - r0) // columns)) * columns  # its tile's first column from w0 on
                if c0 >= min(count, w0 + columns):
                    continue
                r1, c1 = min(count, r0 + tile_rows), min(count, c0 + columns)
                scores = held[r0 - p0 : r1 - p0] @ window[c0 - w0 : c1 - w0].T
                hit = scores >= threshold
                if c0 < r1:  # the tile crosses the diagonal: only j > i
                    hit &= np.arange(c0, c1)[None, :] > np.arange(r0, r1)[:, None]
                i, j = np.nonzero(hit)
                if len(i):
                    found(i + r0, j + c0)
                    total += len(i)
    return total


def _exact_pairs(
    rows: UnitRows, threshold: float, components: Components, report: DedupReport, seed: int, progress: Any
) -> int:
    report.settings = {"tile": list(tile_shape(rows.count, rows.width))}
    total = _scan_tiles(rows, threshold, components.add)
    report.clock.lap("exact scan")
    return total


# ------------------------------------------------------------------------------------------ index


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise UsageError(f"dedup of this many items goes through a faiss index: {FAISS_EXTRA}") from None
    return faiss


def ivf_settings(count: int) -> dict:
    cells = max(1, min(count // TRAIN_PER_CELL, round(count / CELL_ITEMS)))
    return {"cells": cells, "nprobe": min(cells, NPROBE), "codes": "SQ8", "margin": CODE_MARGIN}


def scan_block(count: int, cells: int, nprobe: int) -> int:
    """Items scored against their cells at once: enough for about QUERIES_PER_CELL of them to probe each cell,
    a whole number of SEARCH_BLOCKs, no more than an eighth of the items."""
    wanted = -(-QUERIES_PER_CELL * cells // (max(1, nprobe) * SEARCH_BLOCK))
    return SEARCH_BLOCK * max(1, min(wanted, count // (8 * SEARCH_BLOCK)))


class CellCodes:
    """Each IVF cell's items (ascending) and their 8-bit codes (uint8 [items, D], held cell by cell), and the
    codes' ranges: code c of dimension d stands for vmin[d] + (c + 0.5) / 255 x vdiff[d] (faiss QT_8bit)."""

    def __init__(self, cells: int, trained: np.ndarray, width: int):
        vmin, vdiff = trained[:width], trained[width:]
        self.scale = (vdiff / 255).astype(np.float32)  # q . decode(c) = (q * scale) . c + q . offset
        self.offset = (vmin + 0.5 * vdiff / 255).astype(np.float32)
        self.cells = cells
        self._parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(cells)]
        self.items: list[np.ndarray] = []
        self.codes: list[np.ndarray] = []

    def add(self, begin: int, cells: np.ndarray, codes: np.ndarray) -> None:
        """The codes of items begin.. (`cells`: each one's cell)."""
        order = np.argsort(cells, kind="stable")
        bounds = np.searchsorted(cells[order], np.arange(self.cells + 1))
        for cell in np.flatnonzero(np.diff(bounds)).tolist():
            chosen = order[bounds[cell] : bounds[cell + 1]]
            self._parts[cell].append((chosen + begin, codes[chosen]))

    def finish(self) -> None:
        for cell in range(self.cells):
            parts, self._parts[cell] = self._parts[cell], []
            self.items.append(np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64))
            self.codes.append(np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, 0), np.uint8))

    def candidates(
        self, block: np.ndarray, begin: int, probes: np.ndarray, radius: float, everyone: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(query, item) for each item of a cell a query of `block` (items begin..) probes (`probes`: cells, -1
        for none) whose codes score above `radius`: the cell's codes decoded once for all the queries that probe
        it. Only items from `begin` on (a pair counts from its lower item), except for the queries `everyone`
        marks (the sampled ones, whose recall counts pairs either way)."""
        queries = np.repeat(np.arange(len(block), dtype=np.int64), probes.shape[1])
        cells = probes.reshape(-1).astype(np.int64)
        present = cells >= 0
        queries, cells = queries[present], cells[present]
        order = np.argsort(cells, kind="stable")
        queries, cells = queries[order], cells[order]
        bounds = np.searchsorted(cells, np.arange(self.cells + 1))
        offsets = block @ self.offset
        left: list[np.ndarray] = []
        right: list[np.ndarray] = []
        for cell in np.flatnonzero(np.diff(bounds)).tolist():
            codes, items = self.codes[cell], self.items[cell]
            probing = queries[bounds[cell] : bounds[cell + 1]]
            later = int(np.searchsorted(items, begin))
            self._score(block, offsets, probing, codes[later:], items[later:], radius, left, right)
            sampled = probing[everyone[probing]]
            if later and len(sampled):
                self._score(block, offsets, sampled, codes[:later], items[:later], radius, left, right)
        if not left:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(left), np.concatenate(right)

    def _score(
        self,
        block: np.ndarray,
        offsets: np.ndarray,
        queries: np.ndarray,
        codes: np.ndarray,
        items: np.ndarray,
        radius: float,
        left: list[np.ndarray],
        right: list[np.ndarray],
    ) -> None:
        """The pairs of `queries` (rows of `block`) and `items` (their `codes`) scoring above `radius`, appended
        to `left` and `right`; many items decoded in parts, many queries scored in parts (CELL_BYTES each)."""
        columns = max(1, CELL_BYTES // (4 * max(1, block.shape[1])))
        for c0 in range(0, len(codes), columns):
            decoded = codes[c0 : c0 + columns].astype(np.float32)
            rows = max(1, CELL_BYTES // (4 * len(decoded)))
            for q0 in range(0, len(queries), rows):
                asking = queries[q0 : q0 + rows]
                scaled = np.take(block, asking, axis=0)
                scaled *= self.scale
                scores = scaled @ decoded.T
                # most rows have no score above: the others looked at (the offset added to a row's maximum is the
                # maximum of its sums, to the bit)
                passing = np.flatnonzero(scores.max(axis=1) + offsets[asking] > radius)
                i, j = np.nonzero(scores[passing] + offsets[asking[passing], None] > radius)
                left.append(asking[passing[i]])
                right.append(items[c0 + j])


class SampleTruth:
    """The exact scan's pairs of RECALL_QUERIES sampled items, from the blocks of the pass that makes the codes."""

    def __init__(self, rows: UnitRows, sampled: np.ndarray, threshold: float):
        self.sampled = sampled
        self.vectors = rows.take(sampled)
        self.threshold = threshold
        self.found: list[list[np.ndarray]] = [[] for _ in sampled]

    def scan(self, begin: int, block: np.ndarray) -> None:
        """The pairs of the sampled items with the items of `block` (items begin..), TRUTH_COLUMNS at a time (a
        product's entries do not depend on its number of columns, save for a single one: none is left alone)."""
        if not len(self.sampled):
            return
        cuts = list(range(0, len(block), TRUTH_COLUMNS)) + [len(block)]
        if len(cuts) > 2 and cuts[-1] - cuts[-2] == 1:
            del cuts[-2]
        for c0, c1 in itertools.pairwise(cuts):
            hit_row, hit_column = np.nonzero(self.vectors @ block[c0:c1].T >= self.threshold)
            for row, column in zip(*_split_by(hit_row, hit_column + begin + c0), strict=True):
                self.found[row].append(column)

    def recall(self, found: dict[int, np.ndarray]) -> float:
        """Of the pairs (i, j), i sampled, j != i, that the exact scan finds, the share the index found."""
        wanted = hit = 0
        for i, parts in zip(self.sampled.tolist(), self.found, strict=True):
            truth = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            truth = truth[truth != i]
            wanted += len(truth)
            hit += int(np.isin(truth, found.get(i, [])).sum())
        return 1.0 if wanted == 0 else hit / wanted


def _split_by(keys: np.ndarray, values: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
    """(each distinct key, ascending; its values), for `keys` in ascending order."""
    if not len(keys):
        return [], []
    cut = np.flatnonzero(np.diff(keys)) + 1
    starts = np.concatenate([[0], cut])
    return keys[starts].tolist(), np.split(values, cut)


def _index_pairs(
    rows: UnitRows, threshold: float, components: Components, report: DedupReport, seed: int, progress: Any
) -> int:
    faiss = _faiss()
    count, width = rows.count, rows.width
    settings = {**ivf_settings(count), **report.settings}
    report.settings = settings
    if count < 2:
        return 0
    clock = report.clock
    rng = np.random.default_rng(seed)
    quantizer = faiss.IndexFlatIP(width)
    # trained only (cells and the codes' ranges), never filled: its cells and codes are kept here, by cell
    index = faiss.IndexIVFScalarQuantizer(
        quantizer, width, settings["cells"], faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
    )
    index.by_residual = False  # codes of the vectors themselves: their range is the training sample's
    index.cp.seed = int(seed)
    train_rows = min(count, max(settings["cells"] * TRAIN_PER_CELL, TRAIN_AT_LEAST))
    train = np.sort(rng.choice(count, train_rows, replace=False))
    index.train(rows.take(train))
    sampled = np.sort(rng.choice(count, min(count, RECALL_QUERIES), replace=False))
    clock.lap("train")
    cells = CellCodes(settings["cells"], faiss.vector_to_array(index.sq.trained), width)
    truth = SampleTruth(rows, sampled, threshold)
    for begin in range(0, count, SEARCH_BLOCK):  # each item's cell (as faiss's add finds it) and codes
        block = rows.block(begin, begin + SEARCH_BLOCK)
        _, assigned = quantizer.search(block, 1)
        cells.add(begin, assigned[:, 0], index.sq.compute_codes(block))
        truth.scan(begin, block)
        if progress is not None:
            progress(f"{begin + len(block)}/{count} items coded")
        del block  # gone before the next is read
    cells.finish()
    clock.lap("cells and codes")
    nprobe = min(int(settings["nprobe"]), int(settings["cells"]))
    total = 0
    found_for_sample: dict[int, np.ndarray] = {}
    step = scan_block(count, int(settings["cells"]), nprobe)
    for begin in range(0, count, step):
        block = rows.block(begin, begin + step)
        probes = np.concatenate(  # the cells faiss's range search would probe: searched SEARCH_BLOCK at a time
            [quantizer.search(block[at : at + SEARCH_BLOCK], nprobe)[1] for at in range(0, len(block), SEARCH_BLOCK)]
        )
        everyone = np.isin(np.arange(begin, begin + len(block)), sampled)
        left, right = cells.candidates(block, begin, probes, threshold - CODE_MARGIN, everyone)
        clock.lap("search")
        # the candidates that can count: each pair once (i < j; a self match is no pair), and the sampled items'
        left += begin
        asked = (left < right) | (np.isin(left, sampled) & (left != right))
        left, right = left[asked], right[asked]
        # every candidate scored again from the float32 vectors (the codes' scores are approximate)
        keep = _scores(rows, block, begin, left, right) >= threshold
        left, right = left[keep], right[keep]
        if len(sampled):
            mine = np.isin(left, sampled)
            order = np.argsort(left[mine], kind="stable")
            for i, partners in zip(*_split_by(left[mine][order], right[mine][order]), strict=True):
                found_for_sample[i] = partners
        upper = left < right
        components.add(left[upper], right[upper])
        total += int(upper.sum())
        clock.lap("rescore")
        if progress is not None:
            progress(f"{begin + len(block)}/{count} items searched")
        del block
    report.recall = truth.recall(found_for_sample)
    return total


def _scores(rows: UnitRows, block: np.ndarray, begin: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Cosines of the pairs (left, right), RESCORE_BLOCK at a time: left items of `block` (items begin..), right
    any item (read from the output where it is not in the block, each once a part)."""
    out = np.empty(len(left), np.float32)
    for part in range(0, len(left), RESCORE_BLOCK):
        a, b = left[part : part + RESCORE_BLOCK] - begin, right[part : part + RESCORE_BLOCK] - begin
        inside = (b >= 0) & (b < len(block))
        partners = np.empty((len(b), rows.width), np.float32)
        partners[inside] = block[b[inside]]
        outside, where = np.unique(b[~inside] + begin, return_inverse=True)
        partners[~inside] = rows.take(outside)[where]
        out[part : part + len(a)] = np.einsum("ij,ij->i", block[a], partners)
    return out


# ------------------------------------------------------------------------------------------ groups


def _keep_order(found: ItemVectors, rule: str) -> np.ndarray:
    """A rank for each item (lower: kept first), by the rule; ties go to the first in output order."""
    count = len(found.keys)
    if rule == "first":
        return np.arange(count)
    facts = found.facts
    if rule in ("largest", "smallest"):
        # pixels where the metadata has width and height, else bytes
        value = np.where(np.isnan(facts.pixels), facts.sizes, facts.pixels).astype(np.float64)
        if not np.isfinite(value).any():
            raise UsageError(f"keep={rule}: the output's items have no width and height, nor bytes")
        value = np.nan_to_num(-value if rule == "largest" else value, nan=np.inf)
    else:
        value = np.asarray(facts.mtimes, np.float64)
        if not np.isfinite(value).any():
            raise UsageError(f"keep={rule}: the output's items have no mtime")
        value = np.nan_to_num(-value if rule == "newest" else value, nan=np.inf)
    ranked = np.lexsort((np.arange(count), value))
    rank = np.empty(count, np.int64)
    rank[ranked] = np.arange(count)
    return rank


def _groups(labels: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each item's group number or -1, each group's kept item, the grouped items in table order). Groups of one
    item are none; groups are numbered in output order of their kept item."""
    count = len(labels)
    sizes = np.bincount(labels, minlength=count) if count else np.zeros(0, np.int64)
    grouped = np.flatnonzero(sizes[labels] > 1) if count else np.zeros(0, np.int64)
    # the kept item of each component: the lowest rank among its members
    best = np.full(count, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(best, labels[grouped], rank[grouped])
    by_rank = np.empty(count, np.int64)
    by_rank[rank] = np.arange(count)
    roots = np.unique(labels[grouped])
    kept = np.sort(by_rank[best[roots]])  # groups in output order of their kept item
    number_of_root = np.full(count, -1, np.int64)
    number_of_root[labels[kept]] = np.arange(len(kept))
    group_of = np.full(count, -1, np.int64)
    group_of[grouped] = number_of_root[labels[grouped]]
    order = grouped[np.lexsort((grouped, group_of[grouped]))]
    return group_of, kept, order
