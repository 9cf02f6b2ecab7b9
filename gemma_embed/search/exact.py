"""Exact search: one pass over an output's rows, block by block, for every query of a call; each item scores by
its best row."""

from __future__ import annotations

import torch

from gemma_embed.errors import UsageError
from gemma_embed.search.hits import best_items

# Up to this many queries, float16 rows are scored by torch's float16 matrix-vector product (float32
# accumulation, reads the rows once, no float32 copy: 36 ms against 107 ms for the float32 copy and product at
# 200k x 384 on this 2-core machine) and the block's best are rescored exactly; more queries share one float32
# copy of each block and one matrix product.
FAST_QUERIES = 4


def exact_top(source, queries: torch.Tensor, k: int, block_rows: int, index) -> list[list[tuple[float, int, int]]]:
    count = queries.shape[0]
    found: list[list[tuple]] = [[] for _ in range(count)]  # per query: (score, global item, row in item)
    one_row = {}
    buffer = None  # float32 rows, reused: allocating a fresh block each time costs more than the arithmetic
    for file, start, rows, norms in source.blocks(block_rows):
        if rows.shape[1] != queries.shape[1]:
            raise UsageError(f"{index}: vectors have {rows.shape[1]} dimensions, the query {queries.shape[1]}")
        offsets = source.offsets(file)
        if file not in one_row:
            one_row[file] = bool((offsets.diff() == 1).all())  # every item one row: no regrouping
        first = int(source.first_item[file])
        if one_row[file] and norms is not None and rows.dtype == torch.float16 and count <= FAST_QUERIES:
            for q in range(count):
                scores, positions = _fast_float16_top(rows, queries[q], norms, k)
                found[q] += zip(
                    scores.tolist(), (first + start + positions).tolist(), [0] * len(positions), strict=True
                )
            continue
        if rows.dtype == torch.float32:
            block = rows
        else:
            if buffer is None or buffer.shape[0] < rows.shape[0]:
                buffer = torch.empty(rows.shape, dtype=torch.float32)
            block = buffer[: rows.shape[0]]
            block.copy_(rows)
        if norms is None:
            norms = torch.linalg.vector_norm(block, dim=1)
        scores = torch.nan_to_num((queries @ block.T) / norms.clamp_min(1e-12), nan=float("-inf"))
        if one_row[file]:
            top = torch.topk(scores, min(k, scores.shape[1]), dim=1)
            for q in range(count):
                items = (first + start + top.indices[q]).tolist()
                found[q] += zip(top.values[q].tolist(), items, [0] * len(items), strict=True)
        else:
            for q, entries in enumerate(_top_items(scores, offsets, start, k)):
                found[q] += [(score, first + item, row) for item, score, row in entries]
    return [best_items(entries, k) for entries in found]


def _fast_float16_top(rows: torch.Tensor, query: torch.Tensor, norms: torch.Tensor, k: int):
    """The block's k best rows for one query, exact: torch's float16 product (float32 accumulation, result
    rounded to float16) ranks the rows within a proven error, and every row that could still be among the k best
    is rescored in float32.

    Error of a row's approximate cosine, for a unit query and D dimensions: the query's rounding to float16 and the
    result's each at most 2^-11 of the row's norm, float32 accumulation at most D 2^-24 of it (measured: 8e-5 at
    most over 1M rows, against this bound of 1.0e-3 at 768). A row outside `margin` of the k-th approximate score
    is beaten by k rows whatever the rounding."""
    safe = norms.clamp_min(1e-12)
    approx = torch.nan_to_num((rows @ query.half()).float() / safe, nan=float("-inf"))
    margin = 2 * (2.0**-10 + rows.shape[1] * 2.0**-24) * 1.001 + 4e-6
    kth = torch.topk(approx, min(k, approx.shape[0])).values[-1]
    candidates = torch.nonzero(approx >= kth - margin).reshape(-1)
    exact = torch.nan_to_num((rows[candidates].float() @ query) / safe[candidates], nan=float("-inf"))
    top = torch.topk(exact, min(k, exact.shape[0]))
    return top.values, candidates[top.indices]


def _top_items(scores: torch.Tensor, offsets: torch.Tensor, start: int, k: int) -> list[list[tuple]]:
    """Per query, (item, score, row within the item) of the block's k best items, each by its best row in the
    block.

    Exact over blocks: an item among the final k attains its score in some block, where fewer than k items score
    higher (each of them has at least that score overall), so that block lists it."""
    count, count_rows = scores.shape
    positions = torch.arange(start, start + count_rows)
    items = torch.searchsorted(offsets, positions, right=True) - 1
    first = int(items[0])
    local = (items - first).expand(count, count_rows)
    width = int(local[0, -1]) + 1
    item_best = torch.full((count, width), float("-inf")).scatter_reduce(1, local, scores, "amax")
    is_best = scores == item_best.gather(1, local)
    row_numbers = torch.where(is_best, torch.arange(count_rows).expand(count, count_rows), count_rows)
    best_row = torch.full((count, width), count_rows, dtype=torch.long).scatter_reduce(1, local, row_numbers, "amin")
    top = torch.topk(item_best, min(k, width), dim=1)
    out = []
    for q in range(count):
        entries = []
        for score, index in zip(top.values[q].tolist(), top.indices[q].tolist(), strict=True):
            item = first + index
            entries.append((item, float(score), start + int(best_row[q, index]) - int(offsets[item])))
        out.append(entries)
    return out
