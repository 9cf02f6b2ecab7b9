"""gemma-embed: Gemma encoder-tower embeddings for large piles of media."""

from __future__ import annotations

__version__ = "0.1.0"
FORMAT = "gemma-embed/1"

__all__ = ["FORMAT", "__version__", "load", "iter_items", "read_metadata"]


def __getattr__(name: str):
    # The reader pulls in torch; keep `import gemma_embed` (and so `gemma-embed --help`) instant.
    if name in ("load", "iter_items", "read_metadata"):
        from gemma_embed import store

        return getattr(store, name)
    raise AttributeError(name)
