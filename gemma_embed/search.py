"""Search an output: cosine top-k of query vectors, exact (read block by block from disk) or through an approximate
index (`gemma-embed index`, index.py), and its renderings.

Query vectors come from the library's own run with the index's model and settings (`query_many` embeds them with
one `Embedder`; `check_query_settings` refuses a query made differently). Exact search reads the output through
`store` (single file or shards; memory-mapped blocks), so an output far larger than memory needs one block of RAM,
and scores every query of a call in the same pass over the rows. Scores are cosine similarities whatever the
stored vectors' norms. An item with several rows (`--pool frame` video, or unpooled rows) scores by its best row,
and the hit names that row and, for video, its frame's timestamp.

With the output's row table (written by `gemma-embed index`, store/row_table.py) the search reads no JSON header:
row norms, item boundaries and the hits' keys come from the table, rows from memory-mapped files. With an
approximate index the index proposes candidate rows and the hits' scores are their exact cosines, recomputed
from the output's rows.

Renderers return text (the CLI prints it): a table, JSON lines, and one self-contained HTML page with thumbnails
of image and video hits and players for audio hits, all embedded as data: URIs.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from gemma_embed import store
from gemma_embed.errors import UsageError
from gemma_embed.locations import filesystem_for, location

# Index metadata a query must share: the same model and revision, the same vector space, the same width.
QUERY_SETTINGS = ("model", "revision", "space", "dim")
BLOCK_ROWS = 65_536
THUMBNAIL_PX = 224
AUDIO_PREVIEW_S = 15.0
# Up to this many queries, float16 rows are scored by torch's float16 matrix-vector product (float32
# accumulation, reads the rows once, no float32 copy: 36 ms against 107 ms for the float32 copy and product at
# 200k x 384 on this 2-core machine) and the block's best are rescored exactly; more queries share one float32
# copy of each block and one matrix product.
FAST_QUERIES = 4
_UNSET = object()


@dataclass
class SearchHit:
    rank: int
    score: float
    key: str
    path: str | None
    row: int  # the item's best row (its frame with --pool frame)
    frame: int | None  # a video hit's best sampled frame (position in its frame list)
    timestamp: float | None  # that frame's time, seconds from the first frame
    item: dict

    @property
    def text(self) -> str | None:
        """A text item's text as its output stores it (its first `models.base.STORED_TEXT_CHARS` characters); None
        for media, and for outputs written before texts were stored."""
        text = self.item.get("text")
        return text if isinstance(text, str) else None

    @property
    def text_cut(self) -> bool:
        """Whether the stored text is the beginning of a longer one (`chars`: the whole text's length)."""
        chars = self.item.get("chars")
        return self.text is not None and isinstance(chars, int) and chars > len(self.text)

    def record(self) -> dict:
        """The JSON-lines form: everything but the item's full metadata, with a text item's text."""
        out = asdict(self)
        del out["item"]
        if self.text is not None:
            out.update(text=self.text, text_cut=self.text_cut)
        return out


def _same_model(a: str, b: str) -> bool:
    """Whether two --model values name one checkpoint: the same id, or folders that are one folder."""
    if a == b:
        return True
    first, second = location(a).expanduser(), location(b).expanduser()
    return first.isdir() and second.isdir() and first.realpath() == second.realpath()


def check_query_settings(index_header: dict, query_settings: dict, index_name: str = "index") -> None:
    """Refuse, in one line, a query embedded with other settings than the index (the QUERY_SETTINGS fields either
    side records)."""
    for name in QUERY_SETTINGS:
        made = str(index_header.get(name, "") or "")
        asked = str(query_settings.get(name, "") or "")
        if not made and not asked:
            continue
        same = _same_model(made, asked) if name == "model" else made == asked
        if not same:
            raise UsageError(
                f"{index_name}: made with {name}={made or 'none'!s}, the query has {name}={asked or 'none'!s}; "
                f"embed the query with the index's settings"
            )


# ------------------------------------------------------------------------------------------ what is searched


class _OutputRows:
    """An output read as today's readers read it: every file's header (keys, items, offsets), rows in blocks
    through `store.iter_row_blocks`, norms computed from each block. For outputs without a row table."""

    def __init__(self, index: str | os.PathLike):
        self.index = index
        self.files = store.output_index(index)
        self.header = self.files[0].header
        counts = [len(f.offsets) - 1 for f in self.files]
        self.first_item = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.dtypes = ["" for _ in self.files]

    def offsets(self, file: int) -> torch.Tensor:
        return self.files[file].offsets

    def blocks(self, block_rows: int) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor | None]]:
        for block in store.iter_row_blocks(self.index, block_rows, self.files):
            yield block.file, block.start, block.rows, None

    def entry(self, item: int) -> tuple[str, dict, str]:
        file = int(np.searchsorted(self.first_item, item, side="right")) - 1
        local = item - int(self.first_item[file])
        return self.files[file].keys[local], self.files[file].items[local], self.files[file].header.get("pooling", "")


class _TableRows:
    """An output read through its row table: norms, item boundaries and hit metadata from the table, rows
    memory-mapped in their files (no JSON header is parsed)."""

    def __init__(self, table):
        self.table = table
        self.header = table.header
        self.first_item = table.file_items
        self.views = table.views()  # mapped once per table, for every search through it

    def offsets(self, file: int) -> torch.Tensor:
        items = self.table.item_rows[self.table.file_items[file] : self.table.file_items[file + 1] + 1]
        return torch.from_numpy(items - self.table.file_rows[file])

    def blocks(self, block_rows: int) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor | None]]:
        for number, (file, view) in enumerate(zip(self.table.files, self.views, strict=True)):
            base = int(self.table.file_rows[number])
            for start in range(0, file.rows, block_rows):
                rows = torch.from_numpy(view[start : start + block_rows])
                if file.dtype == "BF16":
                    rows = rows.view(torch.bfloat16)
                yield number, start, rows, torch.from_numpy(self.table.norms[base + start : base + start + len(rows)])

    def rows(self, global_rows: np.ndarray) -> torch.Tensor:
        """The given rows (any order) as float32, read from their files."""
        from gemma_embed.store.row_table import as_float32

        files = np.searchsorted(self.table.file_rows, global_rows, side="right") - 1
        out = torch.empty(len(global_rows), self.table.width)
        for number in np.unique(files):
            chosen = np.flatnonzero(files == number)
            local = global_rows[chosen] - self.table.file_rows[number]
            out[torch.from_numpy(chosen)] = as_float32(self.views[number][local], self.table.files[number].dtype)
        return out

    def entry(self, item: int) -> tuple[str, dict, str]:
        key, meta = self.table.entry(item)
        return key, meta, self.header.get("pooling", "")


def _prepare_queries(queries: torch.Tensor, width: int | None, index) -> torch.Tensor:
    queries = torch.as_tensor(queries).float()
    queries = queries.reshape(1, -1) if queries.dim() == 1 else queries.reshape(queries.shape[0], -1)
    norms = queries.norm(dim=1)
    if not torch.isfinite(queries).all() or bool((norms == 0).any()):
        raise UsageError("the query vector is zero or not finite")
    if width is not None and queries.shape[1] != width:
        raise UsageError(f"{index}: vectors have {width} dimensions, the query {queries.shape[1]}")
    return queries / norms[:, None]


# ------------------------------------------------------------------------------------------------ search


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
    source = _TableRows(opened.table) if opened is not None else _OutputRows(index)
    k = max(1, int(k))
    if opened is not None and opened.searcher is not None:
        queries = _prepare_queries(queries, opened.table.width, index)
        found = _rescored(source, queries, opened.searcher.candidates(queries.numpy(), _candidate_rows(source, k)), k)
    else:
        queries = _prepare_queries(queries, None, index)
        found = _exact(source, queries, k, max(1, int(block_rows)), index)
    return [[_hit(rank, source, *entry) for rank, entry in enumerate(best, 1)] for best in found]


def _candidate_rows(source: _TableRows, k: int) -> int:
    """Rows to ask the index for: k items of one row each need k rows (asked for twice that: the extra ones are
    rescored exactly, which repairs the index's own rounding of near ties); items of many rows need more."""
    most = int(np.diff(source.table.item_rows).max()) if len(source.table.item_rows) > 1 else 1
    return min(source.table.rows, 2 * k * max(1, most))


def _exact(source, queries: torch.Tensor, k: int, block_rows: int, index) -> list[list[tuple[float, int, int]]]:
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
    return [_best(entries, k) for entries in found]


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


def _best(entries: list[tuple[float, int, int]], k: int) -> list[tuple[float, int, int]]:
    """The k best (score, item, row) with each item once (an item split over two blocks: its better part), best
    first, equal scores in output order."""
    best: dict[int, tuple[float, int]] = {}
    for score, item, row in entries:
        if item not in best or score > best[item][0]:
            best[item] = (score, row)
    ranked = sorted(best.items(), key=lambda entry: (-entry[1][0], entry[0]))[:k]
    return [(score, item, row) for item, (score, row) in ranked]


def _rescored(source: _TableRows, queries: torch.Tensor, candidates: np.ndarray, k: int) -> list[list[tuple]]:
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
        found.append(_best(entries, k))
    return found


def _hit(rank: int, source, score: float, item_index: int, row: int) -> SearchHit:
    key, item, pooling = source.entry(item_index)
    frame = _frame(pooling, item, row)
    return SearchHit(
        rank=rank,
        score=score,
        key=key,
        path=item.get("path"),
        row=row,
        frame=frame,
        timestamp=float(item["timestamps"][frame]) if frame is not None else None,
        item=item,
    )


def _frame(pooling: str, item: dict, row: int) -> int | None:
    """The sampled frame a video item's best row belongs to; None for one pooled row or non-video items."""
    times = item.get("timestamps")
    if not times or pooling == "mean" or (pooling != "frame" and int(item.get("rows", 0) or 0) == 1):
        return None  # one vector for the whole video
    per_frame = 1 if pooling == "frame" else int(item.get("rows_per_frame") or 0)
    frame = row // per_frame if per_frame else -1
    return frame if 0 <= frame < len(times) and times[frame] is not None else None


# ------------------------------------------------------------------------------------------- the query


@dataclass
class Query:
    """What to look for: a text, or a media file of one modality ("images", "video", "audio")."""

    text: str | None = None
    file: str | None = None
    modality: str = "text"

    def describe(self) -> str:
        return self.text if self.text is not None else f"{self.modality}: {self.file}"

    def record(self) -> dict:
        """The query's fields in a JSON-lines hit record."""
        return {"query": self.text if self.text is not None else self.file, "query_modality": self.modality}


@dataclass
class QueryResult:
    """One query's answer: its hits, or why it could not be embedded (the other queries are answered)."""

    query: Query
    position: int  # the query's place in the list asked for
    hits: list[SearchHit]
    error: str | None = None
    scoring: str = ""  # how the query was embedded and the items scored (`scoring`), the table's first line


def collect_queries(
    texts: Sequence[str] = (),
    queries_file: str | os.PathLike | None = None,
    media: dict[str, Sequence[str | os.PathLike]] | None = None,
    stdin=None,
) -> list[Query]:
    """Queries in order: `texts`, then the lines of `queries_file` (one text per line, blank lines skipped; "-"
    reads standard input), then each modality's files (a folder: the files in it that modality's command reads,
    sorted)."""
    from gemma_embed.sources.files import extensions

    found = [Query(text=text) for text in texts]
    if queries_file is not None:
        if str(queries_file) == "-":
            text = (stdin or sys.stdin).read()
        else:
            try:
                text = location(queries_file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = getattr(exc, "strerror", None) or exc
                raise UsageError(f"{queries_file}: cannot read the queries: {reason}") from None
        found += [Query(text=line) for line in text.splitlines() if line.strip()]
    for modality, paths in (media or {}).items():
        for given in paths:
            path = location(given)
            if path.isdir():
                wanted = extensions(modality)
                files = [p for p in path.ls() if p.isfile() and p.suffix.lower() in wanted]  # sorted by name
                if not files:
                    raise UsageError(f"{path}: no {modality} files in this folder")
                found += [Query(file=str(p), modality=modality) for p in files]
            else:
                found.append(Query(file=str(path), modality=modality))
    return found


def query_index(
    index: str | os.PathLike,
    query: Query,
    k: int = 10,
    model: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    prompt_name: str | None = None,
    prompt: str | None = None,
    exact: bool = False,
) -> list[SearchHit]:
    """One query: `query_many` with a list of one, its failure raised as a UsageError."""
    (result,) = query_many(index, [query], k, model, device, dtype, prompt_name, prompt, exact)
    if result.error is not None:
        raise UsageError(f"cannot embed the query: {result.error}")
    return result.hits


def query_many(
    index: str | os.PathLike,
    queries: Sequence[Query],
    k: int = 10,
    model: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    prompt_name: str | None = None,
    prompt: str | None = None,
    exact: bool = False,
) -> list[QueryResult]:
    """Embed every query in memory with the index's model and settings (one `Embedder`, so the model loads once;
    each modality's queries in one batch; nothing is written anywhere), refuse queries that came out different
    (model, revision, space, width), then search for all of them together (`search_many`).

    Retrieval indexes: queries get the prompt the index's family names for queries (`Family.queries`; the
    EmbeddingGemma families: the checkpoint's `query` prompt) unless `prompt_name` or `prompt` says otherwise.
    Soft-token indexes: queries are media files, pooled to their mean row.
    A query that cannot be embedded (an unreadable file) gets its error; the others are answered."""
    from gemma_embed import index as ann
    from gemma_embed.embedder import Embedder
    from gemma_embed.errors import ItemError

    filesystem_for(location(index))  # a protocol the tool cannot read is refused naming the output itself
    header = ann.output_header(index)
    if model is not None:  # refuse another model before loading anything
        check_query_settings(
            header, {**{name: header.get(name) for name in QUERY_SETTINGS}, "model": model}, str(index)
        )
    space = header.get("space", "")
    if space != "retrieval" and any(q.text is not None for q in queries):
        raise UsageError(
            f"{index}: holds {space or 'tower'} rows of {header.get('model_type') or 'a model'} with no text "
            f"encoder; search it with --image, --audio or --video{_text_query_families(header.get('modality', ''))}"
        )
    opened = ann.open_index(index, exact=exact)  # a stale index is refused before the model loads
    prompts: dict[str, str] = {}
    if space == "retrieval":
        prompts, query_prompt = _query_prompts(model or header["model"], header.get("revision") or None)
        if prompt is None and prompt_name is None:
            prompt_name = query_prompt
    budget = json.loads(header.get("preprocessing") or "{}").get("max_soft_tokens")
    embedder = Embedder(
        model or header["model"],
        device=device,
        dtype=dtype,
        revision=header.get("revision") or None,
        space=space or "auto",
        pool="none" if space == "retrieval" else "mean",
        dim=int(header["dim"]) if header.get("dim") else None,
        prompt=prompt,
        prompt_name=prompt_name,
    )
    vectors: list = [None] * len(queries)
    by_modality: dict[str, list[int]] = {}
    for position, query in enumerate(queries):
        by_modality.setdefault(query.modality, []).append(position)
    for modality, positions in by_modality.items():
        same_kind = modality == header.get("modality") and modality != "text"
        options = {"max_soft_tokens": budget} if same_kind else {}
        values = [queries[p].text if queries[p].text is not None else location(queries[p].file) for p in positions]
        for position, vector in zip(positions, embedder.embed(values, modality=modality, **options), strict=True):
            vectors[position] = vector
        stages = embedder.stages(modality, **options)
        made = {
            "model": embedder.config.model,
            "revision": embedder.config.revision or "",
            "space": str(stages.space),
            "dim": str(stages.width) if str(stages.space) == "retrieval" else "",
        }
        check_query_settings(header, made, str(index))
    how = scoring(header, prompt_name, prompt, any(q.text is None for q in queries), prompts)
    answered = [p for p, v in enumerate(vectors) if not isinstance(v, ItemError)]
    by_position = {}
    if answered:
        wanted = torch.stack([vectors[p].float().mean(dim=0) for p in answered])
        by_position = dict(zip(answered, search_many(index, wanted, k, exact=exact, opened=opened), strict=True))
    return [
        QueryResult(query, p, by_position.get(p, []), None if p in by_position else _one_line(vectors[p].message), how)
        for p, query in enumerate(queries)
    ]


def scoring(
    header: dict,
    prompt_name: str | None,
    prompt: str | None,
    media_queries: bool,
    prompts: dict[str, str] | None = None,
) -> str:
    """One line for the table's head: which prompt the queries were embedded with and which the items were
    (retrieval indexes; `prompts`: the checkpoint's named prompts), or how a media query became one vector
    (soft-token indexes), and how an item's rows are scored. A media query embedded with another prompt than its
    items scores its own item below 1: the line then says how to find the item itself (the items' prompt)."""
    pooling = header.get("pooling") or "none"
    if header.get("space") != "retrieval":
        rows = {"mean": "each item's mean row", "frame": "each item's best frame row"}.get(
            pooling, "each item's best row"
        )
        return f"query: the mean of its rows; scoring: cosine with {rows}"
    prompts = prompts or {}
    asked = prompt if prompt is not None else prompts.get(prompt_name or "")
    made = json.loads(header.get("preprocessing") or "{}").get("prompt")
    names = {text: name for name, text in prompts.items()}

    def said(text: str | None) -> str:
        return names[text] if text in names else (json.dumps(text) if text else "none")

    line = f"prompt: {said(asked)} (items: {said(made)}); scoring: cosine with each item's vector"
    if media_queries and (asked or None) != (made or None):
        same = f"--prompt-name {names[made]}" if made in names else f"--prompt {json.dumps(made or '')}"
        line += f"; {same} finds an indexed item itself"
    return line


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def _query_prompts(model: str, revision: str | None) -> tuple[dict[str, str], str | None]:
    """The checkpoint's named prompts and the one a query gets by default, as its family declares them
    (`Family.queries`)."""
    from gemma_embed.models.family import Queries
    from gemma_embed.models.loading import resolve_checkpoint
    from gemma_embed.models.registry import find_family

    checkpoint = resolve_checkpoint(model, revision)
    family = find_family(checkpoint.config)
    queries = family.queries if family is not None else Queries()  # no family: the Embedder then says why
    prompts = queries.prompts_of(checkpoint)
    return prompts, queries.default_prompt(prompts)


def _text_query_families(modality: str) -> str:
    """How to make an output of `modality` that text can search: the families that put its items and texts in
    one retrieval space."""
    from gemma_embed.config import Modality, Space
    from gemma_embed.models.registry import serving

    try:
        kind = Modality(modality)
    except ValueError:
        return ""
    able = [f for f in serving(kind, Space.retrieval) if f in serving(Modality.text, Space.retrieval)]
    return f", or index with an {' or '.join(f.name for f in able)} checkpoint" if able else ""


# ---------------------------------------------------------------------------------------------- renderings


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


def render_html(hits: list[SearchHit], query: str, modality: str = "", index: str = "") -> str:
    """One self-contained page: every image and video thumbnail and audio clip is embedded (data: URIs)."""
    return render_html_many([(query, hits)], modality, index)


def render_html_many(groups: list[tuple[str, list[SearchHit]]], modality: str = "", index: str = "") -> str:
    """One page for many queries: each query's title and hits (one query: its title is the page's)."""
    sections = []
    for query, hits in groups:
        cards = []
        for hit in hits:
            media = _media_html(hit, modality)
            time = f" at {hit.timestamp:.2f} s" if hit.timestamp is not None else ""
            text = ""
            if hit.text is not None:  # the text as stored, whole; an ellipsis where it is a longer text's beginning
                text = f"<p class=text>{html.escape(hit.text)}{'&hellip;' if hit.text_cut else ''}</p>"
            cards.append(
                "<li><div class=media>{}</div><div class=info><b>#{}</b> {:.4f}{}<br><code>{}</code><br>"
                "<small>{}</small>{}</div></li>".format(
                    media,
                    hit.rank,
                    hit.score,
                    html.escape(time),
                    html.escape(hit.key),
                    html.escape(hit.path or ""),
                    text,
                )
            )
        heading = "h1" if len(groups) == 1 else "h2"
        sections.append(
            f"<{heading}>{html.escape(query)}</{heading}><p>index: <code>{html.escape(index)}</code>, "
            f"{len(hits)} results</p><ul>{''.join(cards)}</ul>"
        )
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>gemma-embed search</title><style>"
        "body{font-family:sans-serif;margin:2em}ul{list-style:none;padding:0}"
        "li{display:flex;gap:1em;align-items:center;margin:.6em 0}"
        ".media{width:" + str(THUMBNAIL_PX) + "px;text-align:center}img{max-width:100%}audio{width:100%}"
        ".text{white-space:pre-wrap;margin:.3em 0 0}"
        "</style></head><body>" + "".join(sections) + "</body></html>\n"
    )


def _media_html(hit: SearchHit, modality: str) -> str:
    if not hit.path:
        return ""
    kind = modality or _guess_modality(hit.item)
    try:
        if kind == "audio":
            return f'<audio controls src="{_wav_uri(hit.path)}"></audio>'
        picture = preview_image(hit.path, hit.item, hit.frame, kind)
        return _img(picture) if picture is not None else ""
    except Exception as exc:  # noqa: BLE001 - a missing or unreadable file is shown, not fatal
        return f"<small>(unavailable: {html.escape(' '.join(str(exc).split()))})</small>"


def preview_image(path: str, item: dict, frame: int | None = None, modality: str = ""):
    """What a hit shows, as a PIL image: an image item's picture, a video item's frame (`frame`, or the middle
    sampled one); None for other items. Raises the decoder's error for a missing or unreadable file."""
    kind = modality or _guess_modality(item)
    if kind in ("images", "image"):
        from gemma_embed.media.image import decode_image

        return decode_image(path).image
    if kind == "video":
        from PIL import Image

        from gemma_embed.media.video import decode_frame

        indices = item.get("frame_indices") or [0]
        frame = frame if frame is not None else len(indices) // 2  # pooled: the middle frame
        return Image.fromarray(decode_frame(path, int(indices[frame])))
    return None


def _guess_modality(item: dict) -> str:
    if "frame_indices" in item:
        return "video"
    if "sample_rate" in item or "duration_s" in item:
        return "audio"
    if "width" in item:
        return "images"
    return ""


def thumbnail_jpeg(image) -> bytes:
    """A picture at most THUMBNAIL_PX on its longer side, as JPEG bytes (the page's and the server's thumbnails)."""
    image = image.convert("RGB")
    image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=80)
    return buffer.getvalue()


def _img(image) -> str:
    return f'<img alt="" src="data:image/jpeg;base64,{base64.b64encode(thumbnail_jpeg(image)).decode()}">'


def _wav_uri(path: str) -> str:
    """The clip's first AUDIO_PREVIEW_S seconds as 16 kHz mono 16-bit WAV."""
    import soundfile

    from gemma_embed.media.audio import decode_audio

    rate = 16_000
    samples = decode_audio(path, sample_rate=rate).samples[: int(AUDIO_PREVIEW_S * rate)]
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode()
