"""The outputs a server searches (`--output`, repeated): each opened once, by name, with its index when it has one.

A collection is known by a name (its file name without `.safetensors` / `.index.json`; a repeated name gets `-2`,
`-3`), never by a path from a client: the gallery's images are the items of these outputs, looked up by their place
in the output, and their files are the ones the output's metadata names. Nothing else on disk can be asked for.

Searching is `search.search_many` over the output (through its `gemma-embed index` when it has a current one, as
`gemma-embed search` does); the query vector is made by the server's engine with the output's settings
(service.py), and checked against them as `search.check_query_settings` checks a command line's query.
"""

from __future__ import annotations

import functools
import json
import threading
from dataclasses import dataclass

import numpy as np

from gemma_embed.errors import UsageError
from gemma_embed.locations import Location, location
from gemma_embed.store.row_table import output_stem

CAPTION_FIELDS = ("caption", "text", "title")  # item metadata a gallery card shows, first found


@dataclass
class Item:
    key: str
    meta: dict

    @property
    def caption(self) -> str | None:
        shown = (self.meta.get(f) for f in CAPTION_FIELDS)
        return next((str(v) for v in shown if isinstance(v, (str, int, float)) and not isinstance(v, bool)), None)


class Collection:
    """One output: its header, its index (row table and faiss searcher) when current, and its items by place."""

    def __init__(self, name: str, path: Location):
        from gemma_embed import index as ann

        self.name = name
        self.path = path
        try:
            self.header = ann.output_header(path)
            self.opened = ann.open_index(path)  # a stale or broken index is refused here, in one line
        except (OSError, ValueError) as exc:
            raise UsageError(f"--output {exc}") from None  # the reader's message names the file
        self._lock = threading.RLock()  # the lazy tables below are built once, by one thread

    @property
    def model(self) -> str:
        return self.header.get("model", "")

    @property
    def modality(self) -> str:
        return self.header.get("modality", "")

    @property
    def space(self) -> str:
        return self.header.get("space", "")

    @property
    def dim(self) -> int | None:
        return int(self.header["dim"]) if self.header.get("dim") else None

    @property
    def max_soft_tokens(self) -> int | None:
        return json.loads(self.header.get("preprocessing") or "{}").get("max_soft_tokens")

    @property
    def text_queries(self) -> bool:
        """Whether a text finds its items: retrieval vectors (EmbeddingGemma 2) share one space with text."""
        return self.space == "retrieval"

    def describe(self) -> dict:
        return {
            "name": self.name,
            "model": self.model,
            "modality": self.modality,
            "space": self.space,
            "items": int(self._first_item[-1]),
            "text_queries": self.text_queries,
            "index": self.opened.record.get("kind") if self.opened is not None else None,
        }

    # ------------------------------------------------------------------------------------------ items
    @functools.cached_property
    def _files(self):
        from gemma_embed import store

        return store.output_index(self.path)

    @functools.cached_property
    def _first_item(self) -> np.ndarray:
        counts = [len(f.offsets) - 1 for f in self._files]
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    @functools.cached_property
    def _places(self) -> dict[str, int]:
        return {key: place for place, key in enumerate(self._keys())}

    def _keys(self) -> list[str]:
        with self._lock:
            return [key for file in self._files for key in file.keys]

    def item(self, place: int) -> Item | None:
        """The item at this place of the output (0-based), or None where there is none."""
        if not 0 <= place < int(self._first_item[-1]):
            return None
        file = int(np.searchsorted(self._first_item, place, side="right")) - 1
        local = place - int(self._first_item[file])
        return Item(self._files[file].keys[local], self._files[file].items[local])

    def place(self, key: str) -> int | None:
        with self._lock:
            return self._places.get(key)

    def search(self, vector: np.ndarray, k: int, exact: bool = False) -> list:
        """The k items nearest `vector` (cosine), best first: `search.SearchHit`s."""
        import torch

        from gemma_embed.search import search_many

        opened = None if exact else self.opened
        return search_many(self.path, torch.from_numpy(vector).reshape(1, -1), k, exact=exact, opened=opened)[0]

    def thumbnail_route(self, place: int | None, path) -> str | None:
        """The route of an item's picture (`thumbnail`), for images and video that name a file; None for others."""
        from urllib.parse import quote

        if self.modality not in ("images", "video") or not path or place is None:
            return None
        return f"/v1/outputs/{quote(self.name, safe='')}/items/{place}/thumbnail"

    def thumbnail(self, place: int) -> bytes | None:
        """A JPEG of the item's picture (an image, or a video's middle sampled frame); None for other items.
        Raises the decoder's error when its file is missing or unreadable."""
        from gemma_embed.search import preview_image, thumbnail_jpeg

        found = self.item(place)
        if found is None or not found.meta.get("path"):
            return None
        picture = preview_image(str(found.meta["path"]), found.meta, None, self.modality)
        return thumbnail_jpeg(picture) if picture is not None else None


def open_collections(paths: tuple[Location, ...]) -> dict[str, Collection]:
    """Every --output, named; an output that cannot be read is a UsageError naming it."""
    found: dict[str, Collection] = {}
    for path in paths:
        base = output_stem(path).name or "output"
        name, number = base, 1
        while name in found:
            number += 1
            name = f"{base}-{number}"
        found[name] = Collection(name, location(path))
    return found
