"""Vectors quantized as sentence-transformers' `quantize_embeddings` does it (`encode(..., precision=...)`), so that
code ported from `SentenceTransformer.encode` gets the same bytes: int8 and uint8 map each dimension's range over the
given vectors to 256 steps; binary and ubinary keep one bit a dimension (its sign), eight to a byte. Pure numpy."""

from __future__ import annotations

import numpy as np

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: choose one of {', '.join(PRECISIONS)}")


def quantize(vectors: np.ndarray, precision: str) -> np.ndarray:
    """[N, D] float vectors in `precision`. int8 and uint8 need at least two vectors to know each dimension's range
    (sentence-transformers refuses one likewise): quantize a representative batch, not a single query."""
    check_precision(precision)
    vectors = np.asarray(vectors, dtype=np.float32)
    if precision == "float32":
        return vectors
    if precision.endswith("binary"):
        packed = np.packbits(vectors > 0, axis=-1)
        return (packed - 128).astype(np.int8) if precision == "binary" else packed
    if vectors.shape[0] < 2:
        raise ValueError(
            f"precision={precision!r} takes each dimension's range from the vectors quantized together: give at "
            f"least two inputs (one vector has no range)"
        )
    starts = vectors.min(axis=0)
    steps = (vectors.max(axis=0) - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    levels = np.clip(np.floor((vectors - starts) / steps), 0, 255)
    return levels.astype(np.uint8) if precision == "uint8" else (levels - 128).astype(np.int8)
