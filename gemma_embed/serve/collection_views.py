"""The gallery's Map and Duplicates views, server side: the map's points and the duplicate groups of an output, read
from the parquet tables kept beside it (gemma_embed.collection: `gemma-embed map OUT`, `gemma-embed dedup OUT`).

The library's `ensure_map(output)` / `ensure_groups(output)` give the kept table's path, computing it when it is
missing or stale (a table the commands wrote with their defaults is read as it is); where it cannot (a missing
extra, an output it cannot use), the answer is a 404 with its reason and the command that writes the table. Each
table is read once per version of its file (its size and modification time) and kept, encoded, for the next request.

The map goes out columnar, not one object per point: x and y as little-endian float32, the cluster and the item's
place in the output as little-endian int32, each base64 (100k points: 2.1 MB of JSON, decoded by the page into
typed arrays without a parse per point). The clusters' names and sizes come beside them, once each. Items' captions
and thumbnails are asked for by place, a few at a time (`records`), as the page shows them.
"""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from gemma_embed.errors import GemmaEmbedError
from gemma_embed.locations import Location, location
from gemma_embed.serve.collections import Collection
from gemma_embed.serve.openai_shapes import ApiError

MAX_RECORDS = 500  # places one `records` request may name: a page of the grid, never the whole collection
MAX_GROUPS = 100  # groups one `duplicates` page may hold
GROUP_ITEMS_SHOWN = 24  # items of one group listed (the rest counted): a 5,000-item group stays one small answer
KINDS = {  # view -> (the library's function, the command that writes its table)
    "map": ("ensure_map", "gemma-embed map"),
    "groups": ("ensure_groups", "gemma-embed dedup"),
}


class TableMissing(Exception):
    """No table for this view, and none could be computed: the reason, for the user."""


def kept_table(kind: str, output) -> Location:
    """The path of the output's `kind` table (map, groups), computed and kept by the library on first use
    (`collection.kept`); TableMissing, with the library's reason and the command to run, where it cannot be."""
    from gemma_embed.collection import kept
    from gemma_embed.unused_packages import let_in_unused_packages

    let_in_unused_packages()  # `gemma-embed serve` kept SciPy out at its start; the tables need it (as dedup, map)
    function, command = KINDS[kind]
    try:
        return location(getattr(kept, function)(output))
    except (GemmaEmbedError, ImportError, ValueError, OSError) as exc:  # a missing extra, an output it cannot use
        raise TableMissing(f"{' '.join(str(exc).split())} (or run `{command} {output}`)") from None


def _packed(values: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype=dtype).tobytes()).decode("ascii")


def _places(collection: Collection, keys: list[str], kind: str) -> np.ndarray:
    """Each row's place in the output; a key the output does not hold means the table was made from another
    version of it."""
    found = (collection.place(str(key)) for key in keys)
    places = np.fromiter((-1 if place is None else place for place in found), np.int64, len(keys))
    unknown = [k for k, p in zip(keys, places, strict=True) if p < 0]
    if unknown:
        command = KINDS[kind][1]
        raise ApiError(
            409,
            f"the {kind} table of {collection.name} names {len(unknown)} item(s) the output does not hold "
            f"(first: {unknown[0]!r}): it was made from another version; run `{command} {collection.path}` again",
            code="stale_table",
        )
    return places


@dataclass
class _Kept:
    version: tuple
    answer: Any


class Views:
    """The map and groups of the served outputs, each read once per version of its table."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}  # one computation per output and kind at a time
        self._kept: dict[tuple[str, str], _Kept] = {}

    def _read(self, collection: Collection, kind: str, build) -> Any:
        with self._lock:
            lock = self._locks.setdefault((collection.name, kind), threading.Lock())
        with lock:
            try:
                path = kept_table(kind, collection.path)
            except TableMissing as exc:
                raise ApiError(404, str(exc), code=f"no_{kind}") from None
            info = path.info()
            version = (str(path), info.get("size"), info.get("mtime_ns", info.get("mtime")))
            kept = self._kept.get((collection.name, kind))
            if kept is None or kept.version != version:
                import pyarrow.parquet as pq

                with path.open("rb") as fh:
                    table = pq.read_table(fh)
                kept = _Kept(version, build(collection, table))
                self._kept[(collection.name, kind)] = kept
            return kept.answer

    # ------------------------------------------------------------------------------------------ the map
    def map(self, collection: Collection) -> dict:
        return self._read(collection, "map", _map_answer)

    # ------------------------------------------------------------------------------------------ the groups
    def groups(self, collection: Collection, offset: int, limit: int) -> dict:
        every = self._read(collection, "groups", _groups_of)
        page = every["groups"][offset : offset + limit]
        return {
            "object": "duplicates",
            "output": collection.name,
            "groups": every["count"],
            "items": every["items"],
            "to_drop": every["items"] - every["count"],
            "offset": offset,
            "data": [_group_answer(collection, group) for group in page],
        }


def _map_answer(collection: Collection, table) -> dict:
    keys = table.column("key").to_pylist()
    places = _places(collection, keys, "map")
    cluster = table.column("cluster").to_numpy(zero_copy_only=False).astype(np.int64)
    names = table.column("cluster_name").to_pylist()
    numbers, first, sizes = np.unique(cluster, return_index=True, return_counts=True)
    clusters = [
        {"id": number, "name": str(names[row]) if number >= 0 and names[row] is not None else "", "size": size}
        for number, row, size in zip(numbers.tolist(), first.tolist(), sizes.tolist(), strict=True)
    ]
    return {
        "object": "map",
        "output": collection.name,
        "points": len(keys),
        "x": _packed(table.column("x").to_numpy(zero_copy_only=False), "<f4"),
        "y": _packed(table.column("y").to_numpy(zero_copy_only=False), "<f4"),
        "cluster": _packed(cluster, "<i4"),
        "place": _packed(places, "<i4"),
        "clusters": clusters,
    }


def _groups_of(collection: Collection, table) -> dict:
    """The groups in their numbers' order, each item's place, similarity and mark; the kept item first, then the
    others most similar first."""
    keys = table.column("key").to_pylist()
    places = _places(collection, keys, "groups")
    group = table.column("group").to_numpy(zero_copy_only=False).astype(np.int64)
    keep = table.column("keep").to_numpy(zero_copy_only=False).astype(bool)
    similarity = table.column("similarity").to_numpy(zero_copy_only=False).astype(np.float64)
    order = np.lexsort((-similarity, ~keep, group))
    groups: list[dict] = []
    for row in order.tolist():
        if not groups or groups[-1]["group"] != int(group[row]):
            groups.append({"group": int(group[row]), "rows": []})
        groups[-1]["rows"].append((int(places[row]), bool(keep[row]), float(similarity[row])))
    return {"groups": groups, "count": len(groups), "items": len(keys)}


def _group_answer(collection: Collection, group: dict) -> dict:
    shown = group["rows"][:GROUP_ITEMS_SHOWN]
    return {
        "group": group["group"],
        "size": len(group["rows"]),
        "items": [
            {**record(collection, place), "keep": keep, "similarity": similarity} for place, keep, similarity in shown
        ],
    }


# ------------------------------------------------------------------------------------------ items by place
def record(collection: Collection, place: int) -> dict:
    """What the page shows of one item: its place, key, path, caption and thumbnail route."""
    item = collection.item(place)
    if item is None:
        raise ApiError(404, f"{collection.name} has no item {place}", code="not_found")
    path = item.meta.get("path")
    return {
        "index": place,
        "key": item.key,
        "path": path,
        "caption": item.caption,
        "thumbnail": collection.thumbnail_route(place, path),
    }


def read_count(text: str, name: str) -> int:
    if not text.isdigit() or len(text) > 9:
        raise ApiError(400, f"{name}: a whole number, 0 or more", name)
    return int(text)


def read_places(text: str) -> list[int]:
    """`at=3,17,42`: places in the output, at most MAX_RECORDS."""
    parts = [p for p in text.split(",") if p]
    if not parts or not all(p.isdigit() for p in parts):
        raise ApiError(400, "at: give places in the output, as 3,17,42", "at")
    if len(parts) > MAX_RECORDS:
        raise ApiError(413, f"at: {len(parts)} places, over the {MAX_RECORDS} one request may name", "at")
    return [int(p) for p in parts]


# ------------------------------------------------------------------------------------------ the routes
def add_routes(app, service) -> None:
    """`GET /v1/outputs/{name}/map`, `/duplicates?offset=&limit=` and `/records?at=3,17`: JSON, behind the same
    gate (key, security headers, log) as every route; tables are read in a thread, never on the event loop."""
    import asyncio

    views = Views()

    @app.get("/v1/outputs/{name}/map")
    async def map_points(name: str):
        collection = service.collection(name)
        return await asyncio.to_thread(views.map, collection)

    @app.get("/v1/outputs/{name}/duplicates")
    async def duplicates(name: str, offset: str = "0", limit: str = "30"):
        collection = service.collection(name)
        first, count = read_count(offset, "offset"), read_count(limit, "limit")
        if not 1 <= count <= MAX_GROUPS:
            raise ApiError(400, f"limit: from 1 to {MAX_GROUPS} groups", "limit")
        return await asyncio.to_thread(views.groups, collection, first, count)

    @app.get("/v1/outputs/{name}/records")
    async def records(name: str, at: str = ""):
        collection = service.collection(name)
        places = read_places(at)
        found = await asyncio.to_thread(lambda: [record(collection, place) for place in places])
        return {"object": "list", "output": collection.name, "data": found}
