"""Search through an approximate index (index.py): the rows it proposes are rescored exactly from the output, so
only which items are found is approximate, never their scores."""

from __future__ import annotations

import numpy as np
import torch

from gemma_embed.search.hits import best_items
from gemma_embed.search.rows import TableRows


def candidate_rows(source: TableRows, k: int) -> int:
    """Rows to ask the index for: k items of one row each need k rows (asked for twice that: the extra ones are
    rescored exactly, which repairs the index's own rounding of near ties); items of many rows need more."""
    most = int(np.diff(source.table.item_rows).max()) if len(source.table.item_rows) > 1 else 1
    return min(source.table.rows, 2 * k * max(1, most))


def rescored(source: TableRows, queries: torch.Tensor, candidates: np.ndarray, k: int) -> list[list[tuple]]:
    """Exact cosines of the rows an approximate index proposed (-1: none), grouped into items: the hits' scores
    are the ones exact search gives them; only which items are found is approximate."""
    table = source.table
    found = []
    for q, proposed in enumerate(candidates):
        rows = np.unique(proposed[proposed >= 0])
        if not len(rows):
            found.append([])
            continue
        scores = (source.rows(rows) @ queries[q]) / torch.from_numpy(table.norms[rows]).clamp_min(1e-12)
        scores = torch.nan_to_num(scores, nan=float("-inf")).tolist()
        items = np.searchsorted(table.item_rows, rows, side="right") - 1
        entries = [
            (score, int(item), int(row - table.item_rows[item]))
            for score, item, row in zip(scores, items, rows, strict=True)
        ]
        found.append(best_items(entries, k))
    return found
