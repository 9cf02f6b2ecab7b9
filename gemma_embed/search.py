"""Search an output: exact cosine top-k of a query vector, read block by block from disk, and its renderings.

The query's vector comes from the library's own run with the index's model and settings (the caller embeds it;
`check_query_settings` refuses a query made differently). `search` reads the index through `store` (single
file or shards; memory-mapped blocks), so an index far larger than memory needs one block of RAM. Scores are
cosine similarities whatever the stored vectors' norms. An item with several rows (`--pool frame` video, or
unpooled rows) scores by its best row, and the hit names that row and, for video, its frame's timestamp.

Renderers return text (the CLI prints it): a table, JSON lines, and one self-contained HTML page with thumbnails
of image and video hits and players for audio hits, all embedded as data: URIs.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gemma_embed import store
from gemma_embed.errors import UsageError

# Index metadata a query must share: the same model and revision, the same vector space, the same width.
QUERY_SETTINGS = ("model", "revision", "space", "dim")
BLOCK_ROWS = 65_536
THUMBNAIL_PX = 224
AUDIO_PREVIEW_S = 15.0


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

    def record(self) -> dict:
        """The JSON-lines form: everything but the item's full metadata."""
        out = asdict(self)
        del out["item"]
        return out


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    first, second = Path(a).expanduser(), Path(b).expanduser()
    return first.is_dir() and second.is_dir() and first.resolve() == second.resolve()


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


def search(index: str | os.PathLike, query: torch.Tensor, k: int = 10, block_rows: int = BLOCK_ROWS) -> list[SearchHit]:
    """The k items most similar to `query` (cosine, exact), best first."""
    files = store.output_index(index)
    query = torch.as_tensor(query).float().reshape(-1)
    norm = float(query.norm())
    if norm == 0 or not torch.isfinite(query).all():
        raise UsageError("the query vector is zero or not finite")
    query = query / norm
    k = max(1, int(k))
    best: dict[tuple[int, int], tuple[float, int]] = {}  # (file, item) -> (score, row within the item)
    one_row = [bool((file.offsets.diff() == 1).all()) for file in files]  # every item one row: no regrouping
    buffer = None  # float32 rows, reused: allocating a fresh block each time costs more than the arithmetic
    for block in store.iter_row_blocks(index, block_rows, files):
        if block.rows.shape[1] != query.shape[0]:
            raise UsageError(f"{index}: vectors have {block.rows.shape[1]} dimensions, the query {query.shape[0]}")
        if buffer is None or buffer.shape[0] < block.rows.shape[0]:
            buffer = torch.empty(block.rows.shape, dtype=torch.float32)
        rows = buffer[: block.rows.shape[0]]
        rows.copy_(block.rows)
        scores = rows @ query / torch.linalg.vector_norm(rows, dim=1).clamp_min(1e-12)
        scores = torch.nan_to_num(scores, nan=float("-inf"))
        offsets = files[block.file].offsets
        found = (
            _top_rows(scores, block.start, k) if one_row[block.file] else _top_items(scores, offsets, block.start, k)
        )
        for item, score, row in found:
            key = (block.file, item)
            if key not in best or score > best[key][0]:
                best[key] = (score, row)
        if len(best) > k:  # keep the k best so far: exact (see _top_items)
            best = dict(sorted(best.items(), key=lambda entry: -entry[1][0])[:k])
    ranked = sorted(best.items(), key=lambda entry: -entry[1][0])[:k]
    return [_hit(rank, files[f], item, score, row) for rank, ((f, item), (score, row)) in enumerate(ranked, 1)]


def _top_rows(scores: torch.Tensor, start: int, k: int):
    """Items of one row each: the block's k best rows are its k best items."""
    top = torch.topk(scores, min(k, scores.shape[0]))
    for score, index in zip(top.values.tolist(), top.indices.tolist(), strict=True):
        yield start + index, float(score), 0


def _top_items(scores: torch.Tensor, offsets: torch.Tensor, start: int, k: int):
    """(item, score, row within the item) of the block's k best items, each by its best row in the block.

    Exact over blocks: an item among the final k attains its score in some block, where fewer than k items score
    higher (each of them has at least that score overall), so that block lists it."""
    count_rows = scores.shape[0]
    positions = torch.arange(start, start + count_rows)
    items = torch.searchsorted(offsets, positions, right=True) - 1
    first = int(items[0])
    local = items - first
    count = int(local[-1]) + 1
    item_best = torch.full((count,), float("-inf")).scatter_reduce(0, local, scores, "amax")
    is_best = scores == item_best[local]
    best_row = torch.full((count,), count_rows, dtype=torch.long).scatter_reduce(
        0, local[is_best], torch.arange(count_rows)[is_best], "amin"
    )
    top = torch.topk(item_best, min(k, count))
    for score, index in zip(top.values.tolist(), top.indices.tolist(), strict=True):
        item = first + index
        yield item, float(score), start + int(best_row[index]) - int(offsets[item])


def _hit(rank: int, file: store.OutputFile, item_index: int, score: float, row: int) -> SearchHit:
    item = file.items[item_index]
    frame = _frame(file.header.get("pooling", ""), item, row)
    return SearchHit(
        rank=rank,
        score=score,
        key=file.keys[item_index],
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


def query_index(
    index: str | os.PathLike,
    query: Query,
    k: int = 10,
    model: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    prompt_name: str | None = None,
    prompt: str | None = None,
) -> list[SearchHit]:
    """Embed `query` in memory with the index's model and settings (an `Embedder`: the same engine the index was
    made with; nothing is written anywhere), refuse a query that came out different (model, revision, space,
    width), then search.

    Retrieval indexes (EmbeddingGemma 2): the query gets the checkpoint's `query` prompt unless `prompt_name` or
    `prompt` says otherwise. Soft-token indexes (Gemma 4): the query is a media file, pooled to its mean row.
    """
    from gemma_embed.embedder import Embedder
    from gemma_embed.errors import ItemError

    header = store.output_index(index)[0].header
    if model is not None:  # refuse another model before loading anything
        check_query_settings(
            header, {**{name: header.get(name) for name in QUERY_SETTINGS}, "model": model}, str(index)
        )
    space = header.get("space", "")
    if space != "retrieval" and query.text is not None:
        raise UsageError(
            f"{index}: holds {space or 'tower'} rows of {header.get('model_type') or 'a model'} with no text "
            f"encoder; search it with --image, --audio or --video, or index with an EmbeddingGemma 2 checkpoint"
        )
    if space == "retrieval" and prompt is None and prompt_name is None:
        prompt_name = _query_prompt_name(model or header["model"], header.get("revision") or None)
    budget = json.loads(header.get("preprocessing") or "{}").get("max_soft_tokens")
    same_kind = query.modality == header.get("modality") and query.modality != "text"
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
        max_soft_tokens=budget if same_kind else None,
    )
    value = query.text if query.text is not None else Path(query.file)
    (vector,) = embedder.embed([value], modality=query.modality)
    if isinstance(vector, ItemError):
        raise UsageError(f"cannot embed the query: {vector.message}")
    stages = embedder.stages(query.modality)
    made = {
        "model": embedder.config.model,
        "revision": embedder.config.revision or "",
        "space": str(stages.space),
        "dim": str(stages.width) if str(stages.space) == "retrieval" else "",
    }
    check_query_settings(header, made, str(index))
    return search(index, vector.float().mean(dim=0), k)


def _query_prompt_name(model: str, revision: str | None) -> str | None:
    """sentence-transformers' `encode_query` prompt: the checkpoint's prompt named "query", if it has one."""
    from gemma_embed.models.loading import resolve_checkpoint
    from gemma_embed.models.st_inputs import read_sentence_transformers

    return "query" if "query" in read_sentence_transformers(resolve_checkpoint(model, revision)).prompts else None


# ---------------------------------------------------------------------------------------------- renderings


def render_table(hits: list[SearchHit]) -> str:
    """Aligned plain text: rank, score, key, path, and the video time when any hit has one; keys and paths with
    their control characters escaped (`terminal.printable`), as on every line the tool shows people."""
    from gemma_embed.terminal import printable

    timed = any(h.timestamp is not None for h in hits)
    header = ["rank", "score", "key", "path"] + (["time_s"] if timed else [])
    rows = [
        [str(h.rank), f"{h.score:.4f}", printable(h.key), printable(h.path or "")]
        + ([_seconds(h.timestamp)] if timed else [])
        for h in hits
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return "\n".join(lines) + "\n"


def render_jsonl(hits: list[SearchHit]) -> str:
    return "".join(json.dumps(h.record(), ensure_ascii=True) + "\n" for h in hits)


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def render_html(hits: list[SearchHit], query: str, modality: str = "", index: str = "") -> str:
    """One self-contained page: every image and video thumbnail and audio clip is embedded (data: URIs)."""
    cards = []
    for hit in hits:
        media = _media_html(hit, modality)
        time = f" at {hit.timestamp:.2f} s" if hit.timestamp is not None else ""
        cards.append(
            "<li><div class=media>{}</div><div class=info><b>#{}</b> {:.4f}{}<br><code>{}</code><br><small>{}</small>"
            "</div></li>".format(
                media, hit.rank, hit.score, html.escape(time), html.escape(hit.key), html.escape(hit.path or "")
            )
        )
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>gemma-embed search</title><style>"
        "body{font-family:sans-serif;margin:2em}ul{list-style:none;padding:0}"
        "li{display:flex;gap:1em;align-items:center;margin:.6em 0}"
        ".media{width:" + str(THUMBNAIL_PX) + "px;text-align:center}img{max-width:100%}audio{width:100%}"
        "</style></head><body>"
        f"<h1>{html.escape(query)}</h1><p>index: <code>{html.escape(index)}</code>, {len(hits)} results</p>"
        f"<ul>{''.join(cards)}</ul></body></html>\n"
    )


def _media_html(hit: SearchHit, modality: str) -> str:
    if not hit.path:
        return ""
    kind = modality or _guess_modality(hit.item)
    try:
        if kind in ("images", "image"):
            from gemma_embed.media.image import decode_image

            return _img(decode_image(hit.path).image)
        if kind == "video":
            from PIL import Image

            from gemma_embed.media.video import decode_frame

            indices = hit.item.get("frame_indices") or [0]
            frame = hit.frame if hit.frame is not None else len(indices) // 2  # pooled: the middle frame
            return _img(Image.fromarray(decode_frame(hit.path, int(indices[frame]))))
        if kind == "audio":
            return f'<audio controls src="{_wav_uri(hit.path)}"></audio>'
    except Exception as exc:  # noqa: BLE001 - a missing or unreadable file is shown, not fatal
        return f"<small>(unavailable: {html.escape(' '.join(str(exc).split()))})</small>"
    return ""


def _guess_modality(item: dict) -> str:
    if "frame_indices" in item:
        return "video"
    if "sample_rate" in item or "duration_s" in item:
        return "audio"
    if "width" in item:
        return "images"
    return ""


def _img(image) -> str:
    image = image.convert("RGB")
    image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=80)
    return f'<img alt="" src="data:image/jpeg;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def _wav_uri(path: str) -> str:
    """The clip's first AUDIO_PREVIEW_S seconds as 16 kHz mono 16-bit WAV."""
    import soundfile

    from gemma_embed.media.audio import decode_audio

    rate = 16_000
    samples = decode_audio(path, sample_rate=rate).samples[: int(AUDIO_PREVIEW_S * rate)]
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode()
