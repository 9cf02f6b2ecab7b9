"""Search an output: cosine top-k of query vectors, exact (read block by block from disk) or through an approximate
index (`gemma-embed index`, index.py), and its renderings. One module a job:

- `queries`: what to look for (`Query`), collected from texts, a queries file and media; `query_many` embeds them
  with the index's model and settings (one `Embedder`; `check_query_settings` refuses a query made differently);
- `cosine`: `search` and `search_many`, which pick the exact scan or the index; `rows`: what is searched (an
  output's rows in blocks, with its keys and item boundaries, from its headers or its row table);
- `exact`: the scan. It reads the output through `store` (single file or shards; memory-mapped blocks), so an
  output far larger than memory needs one block of RAM, and scores every query of a call in the same pass;
- `indexed`: through an approximate index, which proposes candidate rows; the hits' scores are their exact
  cosines, recomputed from the output's rows;
- `hits`: `SearchHit`, and how scored rows become hits;
- `lines` (a table, JSON lines) and `page` (one self-contained HTML page with thumbnails of image and video hits
  and players for audio hits, all embedded as data: URIs): renderers that return text (the CLI prints it).

Scores are cosine similarities whatever the stored vectors' norms. An item with several rows (`--pool frame`
video, or unpooled rows) scores by its best row, and the hit names that row and, for video, its frame's timestamp.
With the output's row table (written by `gemma-embed index`, store/row_table.py) the search reads no JSON header:
row norms, item boundaries and the hits' keys come from the table, rows from memory-mapped files.
"""

from __future__ import annotations

from gemma_embed.search.cosine import BLOCK_ROWS, search, search_many
from gemma_embed.search.exact import FAST_QUERIES
from gemma_embed.search.hits import SearchHit
from gemma_embed.search.lines import render_jsonl, render_results, render_table
from gemma_embed.search.page import (
    AUDIO_PREVIEW_S,
    THUMBNAIL_PX,
    preview_image,
    render_html,
    render_html_many,
    thumbnail_jpeg,
)
from gemma_embed.search.queries import (
    QUERY_SETTINGS,
    Query,
    QueryResult,
    check_query_settings,
    collect_queries,
    query_index,
    query_many,
    scoring,
)

__all__ = [
    "AUDIO_PREVIEW_S",
    "BLOCK_ROWS",
    "FAST_QUERIES",
    "QUERY_SETTINGS",
    "THUMBNAIL_PX",
    "Query",
    "QueryResult",
    "SearchHit",
    "check_query_settings",
    "collect_queries",
    "preview_image",
    "query_index",
    "query_many",
    "render_html",
    "render_html_many",
    "render_jsonl",
    "render_results",
    "render_table",
    "scoring",
    "search",
    "search_many",
    "thumbnail_jpeg",
]
