"""What is searched: an output's rows in blocks, with what a hit needs (its key, metadata, item boundaries), read
either from every file's header (`OutputRows`) or from the output's row table (`TableRows`)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import torch

from gemma_embed import store


class OutputRows:
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


class TableRows:
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
