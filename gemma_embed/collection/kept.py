"""The tables kept beside an output, as the gallery asks for them: `ensure_groups` and `ensure_map` return the
table's path, computing it and writing it (atomically) when it is missing, stale (the output changed since it was
computed: `tables.stale_because`) or made with other settings than those asked for."""

from __future__ import annotations

import os
from typing import Any

from gemma_embed.collection import groups_path, map_path
from gemma_embed.collection.tables import stale_because, write_table
from gemma_embed.locations import Location
from gemma_embed.locations.written import output_location


def ensure_groups(
    output: str | os.PathLike | Location, threshold: float | None = None, keep: str | None = None, **options: Any
) -> Location:
    """The path of the output's groups' table (`groups_path`), computed with `dedup` and written when it is
    missing, stale (the output changed since) or made with another threshold or keep rule than those given
    (None: whatever it was made with; the defaults when it is computed)."""
    from gemma_embed.collection.dedup import DEFAULT_THRESHOLD, dedup

    path = groups_path(output_location(output))
    if stale_because(path, output, {"threshold": threshold, "keep": keep}) is None:
        return path
    table = dedup(
        output,
        threshold=DEFAULT_THRESHOLD if threshold is None else threshold,
        keep=keep or "first",
        **options,
    )
    return write_table(table, path)


def ensure_map(output: str | os.PathLike | Location, seed: int | None = None, **options: Any) -> Location:
    """The path of the output's map table (`map_path`), computed with `layout` and written when it is missing,
    stale, or made with another seed than the one given."""
    from gemma_embed.collection.layout import DEFAULT_SEED, layout

    path = map_path(output_location(output))
    if stale_because(path, output, {"seed": seed}) is None:
        return path
    table = layout(output, seed=DEFAULT_SEED if seed is None else seed, **options)
    return write_table(table, path)
