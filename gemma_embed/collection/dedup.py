"""Near-duplicate groups of an output (`gemma-embed dedup`, `gemma_embed.dedup`).

Two items are near duplicates when their unit vectors (collection/vectors.py) have cosine >= the threshold; the
groups are the connected components of that graph (as fastdup cuts its similarity graph), joined with the groups
of items of the same content (`sha256`), which are always one group whatever the threshold. One item a group is
kept, by the `keep` rule; `similarity` is each item's cosine to its group's kept item.

Pairs come from one of two scans (`method`):
- `exact`: every pair, as float32 matrix products of tiles sized to bound memory (`tile_shape`). 2 x N^2 x D
  operations: 100k x 768 is 7.7e12, about a minute at the 140 GFLOPS numpy reaches on the 2-core AMD EPYC;
  1M would be 100 times that (1.5 hours), hence
- `index`: a faiss IVF index (cells from spherical k-means, vectors stored as 8-bit scalar codes: a quarter of
  the float32 vectors' bytes) answers a range search for every item in its `nprobe` nearest cells, at a threshold
  lowered by CODE_MARGIN for the codes' rounding; every pair it proposes is scored again from the float32
  vectors, so scores are exact and only which pairs are found is approximate. Its recall (pairs found / pairs the
  exact scan finds, for RECALL_QUERIES sampled items scanned exactly) is measured on every run and recorded.
`auto` is exact below EXACT_BELOW items.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gemma_embed.collection.graph import Components
from gemma_embed.collection.vectors import ItemVectors, item_vectors
from gemma_embed.config import DEFAULT_THRESHOLD, EXACT_BELOW, DedupMethod, KeepRule, cosine
from gemma_embed.errors import UsageError

METHODS = tuple(m.value for m in DedupMethod)
KEEP_RULES = tuple(k.value for k in KeepRule)
# EXACT_BELOW (config.py): 150k items, where the exact scan's 2 x N^2 x D at 768 wide is about 2.5 min on the
# 2-core EPYC.
# Bytes of one tile of scores (float32) and its mask: a quarter of the vectors' bytes, within these bounds, so
# that the scan's peak stays near the vectors' own size.
TILE_BYTES = (16 << 20, 256 << 20)
TILE_COLUMNS = 16_384
# IVF: cells of ~CELL_ITEMS items, trained on TRAIN_PER_CELL items a cell; each item searched in NPROBE cells.
CELL_ITEMS = 1_000
TRAIN_PER_CELL = 40
TRAIN_AT_LEAST = 20_000  # the codes' per-dimension ranges come from the training rows too
NPROBE = 8
# 8-bit codes (ranges trained on 20k rows) moved a cosine by at most 0.0046 (clustered) and 0.0057 (random unit
# vectors) over 2000 x 30000 pairs at 768 wide (faiss QT_8bit, measured on the 2-core EPYC): 0.03 is five times that.
CODE_MARGIN = 0.03
SEARCH_BLOCK = 16_384  # items per range search call (its result arrays stay small)
RECALL_QUERIES = 500
RECALL_BLOCK_BYTES = 64 << 20
FAISS_EXTRA = "pip install 'gemma-embed[search]'"


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


def check_threshold(threshold: float) -> float:
    try:
        cosine(threshold)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"threshold: {exc}") from None
    return float(threshold)


def dedup(
    output: str | os.PathLike,
    threshold: float = DEFAULT_THRESHOLD,
    keep: str = "first",
    method: str = "auto",
    seed: int = 0,
    vectors: ItemVectors | None = None,
    progress: Callable[[str], None] | None = None,
    ivf: dict | None = None,
):
    """Near-duplicate groups of `output` (see the module's note) as a pyarrow Table with the columns of
    `collection.GROUP_COLUMNS` (and `item`: the item's position in the output), one row per item in a group of two
    or more, ordered by group then output order; its schema metadata records how it was made (`read_record`).
    `ivf`: the index path's `cells` and `nprobe` instead of those chosen from the size (`ivf_settings`)."""
    from gemma_embed.collection.tables import groups_table

    threshold = check_threshold(threshold)
    keep, method = str(keep), str(method)
    if keep not in KEEP_RULES:
        raise UsageError(f"keep={keep!r}: choose {', '.join(KEEP_RULES)}")
    if method not in METHODS:
        raise UsageError(f"method={method!r}: choose {', '.join(METHODS)}")
    started = time.perf_counter()
    found = vectors if vectors is not None else item_vectors(output)
    count = len(found.keys)
    chosen = method if method != "auto" else ("exact" if count < EXACT_BELOW else "index")
    report = DedupReport(chosen, threshold, keep, count)
    components = Components(count)
    report.same_content = _join_same_content(found.facts.digests, components)
    scan = _exact_pairs if chosen == "exact" else _index_pairs
    report.settings = dict(ivf or {})
    report.pairs = scan(found.vectors, threshold, components, report, seed, progress)
    labels = components.labels()
    group_of, kept, order = _groups(labels, _keep_order(found, keep))
    similarity = np.einsum("ij,ij->i", found.vectors[order], found.vectors[kept[group_of[order]]]) if len(order) else []
    similarity = np.where(order == kept[group_of[order]], 1.0, np.minimum(similarity, 1.0)).astype(np.float32)
    report.seconds = time.perf_counter() - started
    return groups_table(found, order, group_of[order], kept, similarity, report)


# ------------------------------------------------------------------------------------------ same content


def _join_same_content(digests: list[str | None], components: Components) -> int:
    """An edge from each item to the first item with its content hash; returns how many items got one."""
    first: dict[str, int] = {}
    left, right = [], []
    for i, digest in enumerate(digests):
        if digest is None:
            continue
        j = first.setdefault(digest, i)
        if j != i:
            left.append(i)
            right.append(j)
    components.add(np.asarray(left, np.int64), np.asarray(right, np.int64))
    return len(left)


# ------------------------------------------------------------------------------------------ exact


def tile_shape(count: int, width: int) -> tuple[int, int]:
    """(rows, columns) of one tile of scores: TILE_BYTES' share of the vectors' bytes, 5 bytes an entry (the
    float32 score and its mask)."""
    low, high = TILE_BYTES
    budget = int(min(high, max(low, count * width * 4 // 4)))
    columns = max(1, min(count, TILE_COLUMNS))
    return max(1, min(count, budget // (5 * columns))), columns


def exact_pairs(vectors: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Every pair i < j with cosine >= threshold, by the blocked scan (for tests and the recall measurement)."""
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    _scan_tiles(vectors, threshold, lambda i, j: pairs.append((i, j)))
    if not pairs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


def _scan_tiles(vectors: np.ndarray, threshold: float, found: Callable[[np.ndarray, np.ndarray], None]) -> int:
    """The upper triangle (i < j) of the Gram matrix, tile by tile; `found(i, j)` for the pairs at or above the
    threshold in each tile. Returns how many pairs."""
    count, width = vectors.shape
    rows, columns = tile_shape(count, width)
    total = 0
    for r0 in range(0, count, rows):
        r1 = min(count, r0 + rows)
        block = vectors[r0:r1]
        for c0 in range(r0, count, columns):
            c1 = min(count, c0 + columns)
            scores = block @ vectors[c0:c1].T
            hit = scores >= threshold
            if c0 < r1:  # the tile crosses the diagonal: only j > i
                hit &= np.arange(c0, c1)[None, :] > np.arange(r0, r1)[:, None]
            i, j = np.nonzero(hit)
            if len(i):
                found(i + r0, j + c0)
                total += len(i)
    return total


def _exact_pairs(vectors, threshold, components: Components, report: DedupReport, seed, progress) -> int:
    report.settings = {"tile": list(tile_shape(*vectors.shape))}
    return _scan_tiles(vectors, threshold, components.add)


# ------------------------------------------------------------------------------------------ index


def _faiss():
    try:
        import faiss
    except ImportError:
        raise UsageError(f"dedup of this many items goes through a faiss index: {FAISS_EXTRA}") from None
    return faiss


def ivf_settings(count: int) -> dict:
    cells = max(1, min(count // TRAIN_PER_CELL, round(count / CELL_ITEMS)))
    return {"cells": cells, "nprobe": min(cells, NPROBE), "codes": "SQ8", "margin": CODE_MARGIN}


def _index_pairs(vectors, threshold, components: Components, report: DedupReport, seed, progress) -> int:
    faiss = _faiss()
    count, width = vectors.shape
    settings = {**ivf_settings(count), **report.settings}
    report.settings = settings
    if count < 2:
        return 0
    rng = np.random.default_rng(seed)
    quantizer = faiss.IndexFlatIP(width)
    index = faiss.IndexIVFScalarQuantizer(
        quantizer, width, settings["cells"], faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
    )
    index.by_residual = False  # codes of the vectors themselves: their range is the training sample's
    index.cp.seed = int(seed)
    train_rows = min(count, max(settings["cells"] * TRAIN_PER_CELL, TRAIN_AT_LEAST))
    train = np.sort(rng.choice(count, train_rows, replace=False))
    index.train(np.ascontiguousarray(vectors[train]))
    for begin in range(0, count, SEARCH_BLOCK):
        index.add(vectors[begin : begin + SEARCH_BLOCK])
    index.nprobe = settings["nprobe"]
    total = 0
    sampled = np.sort(rng.choice(count, min(count, RECALL_QUERIES), replace=False))
    found_for_sample: dict[int, np.ndarray] = {}
    for begin in range(0, count, SEARCH_BLOCK):
        end = min(count, begin + SEARCH_BLOCK)
        left, right = _range_candidates(index, vectors[begin:end], threshold - CODE_MARGIN)
        left += begin
        # every candidate scored again from the float32 vectors (the codes' scores are approximate)
        keep = _scores(vectors, left, right) >= threshold
        left, right = left[keep], right[keep]
        for i in sampled[(sampled >= begin) & (sampled < end)]:
            found_for_sample[int(i)] = right[left == i]
        upper = left < right  # each pair once (a self match, i == i, is no pair)
        components.add(left[upper], right[upper])
        total += int(upper.sum())
        if progress is not None:
            progress(f"{end}/{count} items searched")
    report.recall = _recall(vectors, threshold, sampled, found_for_sample)
    return total


def _range_candidates(index, queries: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
    lims, _, ids = index.range_search(np.ascontiguousarray(queries), float(radius))
    left = np.repeat(np.arange(len(queries), dtype=np.int64), np.diff(lims).astype(np.int64))
    return left, ids.astype(np.int64)


def _scores(vectors: np.ndarray, left: np.ndarray, right: np.ndarray, block: int = 1 << 16) -> np.ndarray:
    out = np.empty(len(left), np.float32)
    for begin in range(0, len(left), block):
        a, b = left[begin : begin + block], right[begin : begin + block]
        out[begin : begin + block] = np.einsum("ij,ij->i", vectors[a], vectors[b])
    return out


def _recall(vectors: np.ndarray, threshold: float, sampled: np.ndarray, found: dict[int, np.ndarray]) -> float:
    """Of the pairs (i, j), i sampled, j != i, that the exact scan finds, the share the index found."""
    if not len(sampled):
        return 1.0
    wanted = hit = 0
    step = max(1, RECALL_BLOCK_BYTES // (4 * len(vectors)))  # score rows held at once: 64 MB at 1M items
    for begin in range(0, len(sampled), step):
        part = sampled[begin : begin + step]
        scores = vectors[part] @ vectors.T
        for row, i in enumerate(part):
            truth = np.flatnonzero(scores[row] >= threshold)
            truth = truth[truth != i]
            wanted += len(truth)
            hit += int(np.isin(truth, found.get(int(i), [])).sum())
    return 1.0 if wanted == 0 else hit / wanted


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
