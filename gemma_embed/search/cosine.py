"""`search` and `search_many`: cosine top-k of query vectors over an output, through its approximate index when it
has a current one (indexed.py), else exact (exact.py)."""

from __future__ import annotations

import os

import torch

from gemma_embed.errors import UsageError
from gemma_embed.search.exact import exact_top
from gemma_embed.search.hits import SearchHit, make_hit
from gemma_embed.search.indexed import candidate_rows, rescored
from gemma_embed.search.rows import OutputRows, TableRows

BLOCK_ROWS = 65_536
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
    source = TableRows(opened.table) if opened is not None else OutputRows(index)
    k = max(1, int(k))
    if opened is not None and opened.searcher is not None:
        queries = prepare_queries(queries, opened.table.width, index)
        found = rescored(source, queries, opened.searcher.candidates(queries.numpy(), candidate_rows(source, k)), k)
    else:
        queries = prepare_queries(queries, None, index)
        found = exact_top(source, queries, k, max(1, int(block_rows)), index)
    return [[make_hit(rank, source, *entry) for rank, entry in enumerate(best, 1)] for best in found]
