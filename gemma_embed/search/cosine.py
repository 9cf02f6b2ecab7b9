"""`search` and `search_many`: cosine top-k of query vectors over an output, through its approximate index when it
has a current one (indexed.py), else exact (exact.py)."""

from __future__ import annotations

import os

import torch

from gemma_embed.errors import IndexNotCurrent, UsageError
from gemma_embed.search.exact import exact_top
from gemma_embed.search.hits import SearchHit, make_hit
from gemma_embed.search.indexed import candidate_rows, rescored
from gemma_embed.search.rows import OutputRows, TableRows
from gemma_embed.store.row_table import table_path

BLOCK_ROWS = 65_536
# No cosine exceeds 1; rounding of float16 rows and float32 sums gives at most 1e-6 more. A hit scoring past this
# through a row table was divided by a wrong norm (a damaged table, which its sampled check can miss).
COSINE_MAX = 1.0 + 1e-3
_UNSET = object()


def prepare_queries(queries: torch.Tensor, width: int | None, index) -> torch.Tensor:
    queries = torch.as_tensor(queries).float()
    queries = queries.reshape(1, -1) if queries.dim() == 1 else queries.reshape(queries.shape[0], -1)
    norms = queries.norm(dim=1)
    if not torch.isfinite(queries).all() or bool((norms == 0).any()):
        raise UsageError("the query vector is zero or not finite")
    if width is not None and queries.shape[1] != width:
        raise UsageError(f"{index}: vectors have {width} dimensions, the query {queries.shape[1]}")
    return queries / norms[:, None]


def search(
    index: str | os.PathLike, query: torch.Tensor, k: int = 10, block_rows: int = BLOCK_ROWS, exact: bool = False
) -> list[SearchHit]:
    """The k items most similar to `query` (cosine), best first: through the output's approximate index when it
    has a current one (a stale one is refused), else (or with `exact`) exact."""
    return search_many(index, torch.as_tensor(query).reshape(1, -1), k, block_rows, exact)[0]


def search_many(
    index: str | os.PathLike,
    queries: torch.Tensor,
    k: int = 10,
    block_rows: int = BLOCK_ROWS,
    exact: bool = False,
    opened=_UNSET,
) -> list[list[SearchHit]]:
    """`search` for each row of `queries` [Q, D], answered together: one pass over the output's rows for all of
    them (exact), or one batched call to the index. `opened`: the output's `index.open_index`, when the caller
    has it."""
    from gemma_embed import index as ann

    if opened is _UNSET:
        opened = ann.open_index(index, exact=exact)
    asked = queries
    source = TableRows(opened.table) if opened is not None else OutputRows(index)
    k = max(1, int(k))
    if opened is not None and opened.searcher is not None:
        queries = prepare_queries(queries, opened.table.width, index)
        found = rescored(source, queries, opened.searcher.candidates(queries.numpy(), candidate_rows(source, k)), k)
    else:
        queries = prepare_queries(queries, None, index)
        found = exact_top(source, queries, k, max(1, int(block_rows)), index)
    best = max((entry[0] for entries in found for entry in entries), default=0.0)
    if opened is not None and best > COSINE_MAX:  # a norm the table records is wrong at a row it found
        if exact:  # set aside, as --exact sets aside any index it cannot trust: the output's own rows and norms
            return search_many(index, asked, k, block_rows, exact, opened=None)
        raise IndexNotCurrent(table_path(index), f"a row's recorded norm is wrong (it scored {best:.3g})", index)
    return [[make_hit(rank, source, *entry) for rank, entry in enumerate(best, 1)] for best in found]
