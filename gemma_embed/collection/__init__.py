"""What people do with a collection's vectors once they are written: near-duplicate groups (`gemma-embed dedup`)
and a 2D map with clusters (`gemma-embed map`), both read by the gallery (`gemma-embed serve --output OUT`).

Each is a parquet table kept beside the output it was computed from (`groups_path`, `map_path`): the commands
write it there by default, and the gallery reads it from there, computing it on first use when it is missing.
The columns below are the tables' contract between the commands, the library and the gallery.
"""

from __future__ import annotations

import os

from gemma_embed.locations import Location
from gemma_embed.store.row_table import output_stem

GROUPS_SUFFIX = ".duplicates.parquet"
MAP_SUFFIX = ".map.parquet"

# One row per item that is in a group of two or more: `group` numbers the groups from 0 in output order of their
# kept item, `keep` marks exactly one item per group, `similarity` is the cosine to the group's kept item (1.0 for
# the kept item itself), `path` the item's source as its metadata names it.
GROUP_COLUMNS = ("key", "group", "keep", "similarity", "path")
# One row per item of the output, in output order: `x`, `y` the 2D layout, `cluster` the cluster's number (-1 for
# points in no cluster), `cluster_name` the cluster's name (its most central items' keys), `path` as above.
MAP_COLUMNS = ("key", "x", "y", "cluster", "cluster_name", "path")


def groups_path(output: str | os.PathLike | Location) -> Location:
    """Where `gemma-embed dedup OUT` keeps OUT's groups by default: OUT's name with `.duplicates.parquet`."""
    stem = output_stem(output)
    return stem.with_name(stem.name + GROUPS_SUFFIX)


def map_path(output: str | os.PathLike | Location) -> Location:
    """Where `gemma-embed map OUT` keeps OUT's map by default: OUT's name with `.map.parquet`."""
    stem = output_stem(output)
    return stem.with_name(stem.name + MAP_SUFFIX)
