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


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens, (B, L, E) and (B, L) -> (B, E), accumulated in float32 as sentence-transformers'
    Pooling does (a mask of all zeros gives zeros, never a division by zero)."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    total = (hidden * weights).sum(dim=1, dtype=torch.float32)
    count = weights.sum(dim=1, dtype=torch.float32).clamp(min=1e-9)
    return total / count


def l2_normalize(vectors: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(vectors, p=2, dim=-1)


def truncate_dim(vectors: torch.Tensor, dim: int | None) -> torch.Tensor:
    """Matryoshka truncation: the first `dim` components, renormalised (sentence-transformers' `truncate_dim`
    keeps the first `dim` components; `normalize_embeddings=True` renormalises them, as this does)."""
    if dim is None or dim >= vectors.shape[-1]:
        return vectors
    if dim < 1:
        raise ValueError(f"cannot truncate to {dim} dimensions")
    return l2_normalize(vectors[..., :dim])
