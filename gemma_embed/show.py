"""`gemma-embed inspect`: read an output file and show it (stdout: it is the command's result)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

SKIP = {"keys", "items"}


def show(path: Path, limit: int = 20, as_json: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    from gemma_embed.store import iter_items, read_metadata

    meta = read_metadata(path)
    if as_json:
        print(json.dumps(meta, ensure_ascii=True, indent=2))
        return
    console = Console(file=sys.stdout)
    header = Table(show_header=False, box=None)
    for key, value in meta.items():
        if key not in SKIP:
            header.add_row(f"[bold]{key}", str(value))
    header.add_row("[bold]items", str(len(meta["keys"])))
    console.print(header)
    items = Table()
    for column in ("#", "key", "rows", "dim", "source"):
        items.add_column(column)
    for i, (key, rows, item) in enumerate(iter_items(path)):
        if limit and i >= limit:
            items.add_row("...", f"{len(meta['keys']) - limit} more", "", "", "")
            break
        extra = {k: v for k, v in item.items() if k not in ("path", "sha256", "mtime", "bytes", "rows")}
        items.add_row(str(i), key, str(rows.shape[0]), str(rows.shape[1]), json.dumps(extra))
    console.print(items)
