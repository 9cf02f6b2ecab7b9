"""gemma-embed: Gemma encoder-tower embeddings for large piles of media.

In memory, `Embedder(model).embed(inputs)` gives each input's rows (or an `ItemError`) and `.encode(inputs)` an
[N, D] array, as `SentenceTransformer.encode` does:

    vectors = gemma_embed.Embedder("google/embeddinggemma-2").encode(["a photo of a cat"], prompt_name="query")

For files to an output, describe a run with `RunConfig` (the same options as the command line, same defaults) and call
`run`; it returns a `RunResult`. Read outputs with `load`, `iter_items` and `read_metadata`:

    import gemma_embed

    result = gemma_embed.run(gemma_embed.RunConfig(
        modality="images", inputs=["photos/"], model="google/gemma-4-e2b-it", output="photos.safetensors"))
    print(result.ok, result.failed, result.output)

    rows = gemma_embed.load("photos.safetensors")            # {key: Tensor[rows, D]}, input order
    for key, tensor, item in gemma_embed.iter_items("photos.safetensors"):   # one item at a time
        ...
    meta = gemma_embed.read_metadata("photos.safetensors")   # header, keys and items; no tensors read

    groups = gemma_embed.dedup("photos.safetensors", threshold=0.95)  # near-duplicate groups (pyarrow Table)
    points = gemma_embed.layout("photos.safetensors", seed=0)         # 2D map with clusters (pyarrow Table)

`run` prints nothing unless given a `progress.Reporter`; bad items are failure records in the result, not
exceptions. `errors.UsageError` means the run could not start, `errors.RunError` that it could not write.
"""

from __future__ import annotations

__version__ = "0.1.0"
FORMAT = "gemma-embed/1"

# MKL's strict reproducibility mode, asked for before any product runs in this process: the same bytes at any
# thread count (cpu_kernels.py). A caller's own MKL_CBWR stands.
from gemma_embed.cpu_kernels import request_reproducible_gemm  # noqa: E402

request_reproducible_gemm()

# The library face. Names are resolved on first use: the runner and reader import torch, and
# `import gemma_embed` (so `gemma-embed --help`) must stay instant.
_LAZY = {
    "Embedder": "gemma_embed.embedder",
    "run": "gemma_embed.pipeline",
    "RunConfig": "gemma_embed.config",
    "RunResult": "gemma_embed.result",
    "load": "gemma_embed.store",
    "iter_items": "gemma_embed.store",
    "read_metadata": "gemma_embed.store",
    "dedup": "gemma_embed.collection.dedup",
    "layout": "gemma_embed.collection.layout",
    "ensure_groups": "gemma_embed.collection.kept",
    "ensure_map": "gemma_embed.collection.kept",
    "configure_for_long_runs": "gemma_embed.memory.allocator",
}

__all__ = ["FORMAT", "__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gemma_embed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
