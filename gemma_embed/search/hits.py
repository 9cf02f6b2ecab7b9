"""What a search answers: `SearchHit`, and how scored rows become hits (each item once, by its best row; a
video hit's frame and time)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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


def best_items(entries: list[tuple[float, int, int]], k: int) -> list[tuple[float, int, int]]:
    """The k best (score, item, row) with each item once (an item split over two blocks: its better part), best
    first, equal scores in output order."""
    best: dict[int, tuple[float, int]] = {}
    for score, item, row in entries:
        if item not in best or score > best[item][0]:
            best[item] = (score, row)
    ranked = sorted(best.items(), key=lambda entry: (-entry[1][0], entry[0]))[:k]
    return [(score, item, row) for item, (score, row) in ranked]


def make_hit(rank: int, source, score: float, item_index: int, row: int) -> SearchHit:
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
