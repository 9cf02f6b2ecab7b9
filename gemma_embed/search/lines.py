"""The forms of hits shown as lines of text: an aligned table, JSON lines, and many queries' results in either."""

from __future__ import annotations

import json

from gemma_embed.search.hits import SearchHit
from gemma_embed.search.queries import QueryResult

# The least room the text column of a table keeps, however narrow the terminal: a few words.
MIN_TEXT_COLUMNS = 20


def render_table(hits: list[SearchHit], width: int | None = None) -> str:
    """Aligned plain text: rank, score, key, path, the video time when any hit has one, and a text item's text;
    every cell with its control characters escaped (`terminal.printable`), as on every line the tool shows people.
    The path column is left out where every path is the start of its key already (`lines.txt` of `lines.txt:4`).
    With `width` (the terminal's columns) the text is cut to the room left on the line, ending in an ellipsis."""
    from gemma_embed.terminal import cut_to_width, printable

    timed = any(h.timestamp is not None for h in hits)
    texts = any(h.text is not None for h in hits)
    paths = not texts or any(not h.key.startswith(h.path or "") for h in hits)
    header = ["rank", "score", "key"] + (["path"] if paths else []) + (["time_s"] if timed else [])
    rows = [
        [str(h.rank), f"{h.score:.4f}", printable(h.key)]
        + ([printable(h.path or "")] if paths else [])
        + ([_seconds(h.timestamp)] if timed else [])
        for h in hits
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    if texts:
        room = None if width is None else max(MIN_TEXT_COLUMNS, width - sum(w + 2 for w in widths))
        header.append("text")
        for row, hit in zip(rows, hits, strict=True):
            text = printable(hit.text or "")
            row.append(cut_to_width(text, room, cut=hit.text_cut) if room is not None else text)
        widths.append(0)  # the last column: not padded
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return "\n".join(lines) + "\n"


def render_jsonl(hits: list[SearchHit], result: QueryResult | None = None) -> str:
    """One JSON record per hit; with `result`, each carries its query (text or file, modality, place in the list)."""
    extra = {**result.query.record(), "query_index": result.position} if result is not None else {}
    return "".join(json.dumps({**extra, **h.record()}, ensure_ascii=True) + "\n" for h in hits)


def render_results(results: list[QueryResult], jsonl: bool = False, width: int | None = None) -> str:
    """Many queries' hits: JSON lines carrying their query, or one table per query under its title (one query:
    its table alone), texts cut to `width` columns."""
    if jsonl:
        return "".join(render_jsonl(r.hits, r) for r in results if r.error is None)
    answered = [r for r in results if r.error is None]
    head = f"{answered[0].scoring}\n" if answered and answered[0].scoring else ""
    if len(results) == 1:
        return head + render_table(answered[0].hits, width) if answered else ""
    return head + "\n".join(
        f"query {r.position + 1}: {r.query.describe()}\n" + render_table(r.hits, width) for r in answered
    )


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"
