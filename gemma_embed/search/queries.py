"""The queries of a search: collected from texts, a queries file and media files, embedded with the index's model
and settings (`query_many`: one `Embedder`; `check_query_settings` refuses a query made differently), then
searched together (cosine.py); `scoring` says how they were embedded and scored."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gemma_embed.errors import UsageError
from gemma_embed.locations import filesystem_for, location
from gemma_embed.search.cosine import search_many
from gemma_embed.search.hits import SearchHit

# Index metadata a query must share: the same model and revision, the same vector space, the same width.
QUERY_SETTINGS = ("model", "revision", "space", "dim")


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
        return f"each query is the mean of its rows; score: cosine similarity with {rows}"
    prompts = prompts or {}
    asked = prompt if prompt is not None else prompts.get(prompt_name or "")
    made = json.loads(header.get("preprocessing") or "{}").get("prompt")
    names = {text: name for name, text in prompts.items()}

    def said(text: str | None) -> str:
        if text in names:
            return f"the {names[text]} prompt"
        return f"the prompt {json.dumps(text)}" if text else "no prompt"

    differ = (asked or None) != (made or None)
    embedded = (
        f"queries embedded with {said(asked)}, items with {said(made)}"
        if differ
        else f"queries and items embedded with {said(asked)}"
    )
    line = f"{embedded}; score: cosine similarity of the vectors"
    if media_queries and differ:
        same = f"--prompt-name {names[made]}" if made in names else f"--prompt {json.dumps(made or '')}"
        line += f"; {same} embeds a query as its items were, to find an item itself"
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
