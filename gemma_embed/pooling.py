"""Pooling of an item's rows: pure tensor functions, no devices or files."""

from __future__ import annotations

import torch


def pool_rows(rows: torch.Tensor, pool: str, rows_per_unit: int | None = None) -> torch.Tensor:
    """none: all rows; mean: one row (float32 mean); frame: one row per unit (video frame)."""
    if pool == "none":
        return rows
    if pool == "mean":
        return rows.float().mean(dim=0, keepdim=True)
    if pool == "frame":
        if not rows_per_unit:
            raise ValueError("--pool frame needs items made of frames")
        return rows.float().reshape(-1, rows_per_unit, rows.shape[-1]).mean(dim=1)
    raise ValueError(f"unknown pooling {pool!r}")
