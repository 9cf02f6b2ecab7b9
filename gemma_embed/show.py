"""`gemma-embed inspect`: read an output file and show it (stdout: it is the command's result)."""

from __future__ import annotations

import json
import os
import sys

# Header fields in the order people look for them; any others follow, sorted. Files written by older versions
# (through safetensors' own writer) store their metadata in a different order each time: never show that order.
HEADER_ORDER = (
    "format",
    "model",
    "revision",
    "model_type",
    "modality",
    "space",
    "pooling",
    "dtype",
    "compute_dtype",
    "dtype_reason",
    "device",
    "cpu_kernels",
    "preprocessing",
    "created_by",
)
LISTS = ("keys", "items")


def ordered_header(meta: dict) -> dict:
    """The metadata's scalar fields in a stable order."""
    known = [k for k in HEADER_ORDER if k in meta]
    rest = sorted(k for k in meta if k not in HEADER_ORDER and k not in LISTS)
    return {k: meta[k] for k in known + rest}


# What `pooling none` means in a file of retrieval vectors: no pooling of the towers' rows (`--pool`), while each item
# is one vector mean-pooled over its tokens by the checkpoint's sentence-transformers Pooling module (mean is the
# only mode the tool runs: `models/st_inputs.py`).
RETRIEVAL_POOLING = "the towers' rows unpooled; each item one vector, the checkpoint's mean over its tokens"


def shown_header(meta: dict) -> dict:
    """The header as `inspect` shows it to people: empty fields left out, every value the file's own (the pooling
    of retrieval vectors, `none`, with what it means beside it)."""
    header = {k: v for k, v in ordered_header(meta).items() if str(v) != ""}
    if header.get("space") == "retrieval" and header.get("pooling") == "none":
        header["pooling"] = f"none ({RETRIEVAL_POOLING})"
    return header


def show(path: str | os.PathLike, limit: int = 20, as_json: bool = False) -> None:
    """The header and the first `limit` items as tables; every cell is plain text (a name's control characters
    shown as escapes, never read as rich markup). `as_json`: the exact values as one JSON object."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from gemma_embed.store import item_shapes, read_metadata
    from gemma_embed.terminal import printable

    def cell(value, style: str = "") -> Text:
        return Text(printable(str(value)), style=style)

    meta = read_metadata(path)
    if as_json:
        print(json.dumps({**ordered_header(meta), "keys": meta["keys"], "items": meta["items"]}, ensure_ascii=True))
        return

    class Shown(Console):
        def on_broken_pipe(self) -> None:  # rich's own exits 1; a reader gone is the command line's (cli._exits)
            raise BrokenPipeError

    console = Shown(file=sys.stdout)
    header = Table(show_header=False, box=None)
    for key, value in shown_header(meta).items():
        header.add_row(cell(key, "bold"), cell(value))
    header.add_row(cell("items", "bold"), cell(len(meta["keys"])))
    console.print(header)
    texts = any(isinstance(item.get("text"), str) for item in meta["items"])  # a text output: its texts, cut
    items = Table()
    for column in ("#", "key", "rows", "dim", "path"):
        items.add_column(column, overflow="fold")
    if texts:  # one line each, in at most a third of the width: the other columns keep theirs
        items.add_column("text", overflow="ellipsis", no_wrap=True, max_width=max(10, console.width // 3))
    for i, (key, rows, width, item) in enumerate(item_shapes(path)):
        if limit and i >= limit:
            items.add_row("...", f"{len(meta['keys']) - limit} more", "", "", "", *([""] if texts else []))
            break
        shown = [cell(i), cell(key), cell(rows), cell(width), cell(item.get("path", ""))]
        items.add_row(*shown, *([cell(item.get("text", ""))] if texts else []))
    console.print(items)
