"""Where a run's results go: the `Writer` protocol the pipeline writes through, and the tool's own writer of it
(`SafetensorsWriter`: the `gemma-embed/1` output, its parts, --resume and the errors file, store/).

The pipeline makes its writer with a `WriterFactory` it is given (`pipeline.run(..., writer=...)`; the default is
`SafetensorsWriter`), from the run's options and what the runner will compute (`runners.Planned`), and from then on
knows only the protocol: items go in as they finish, `save` keeps what is done when the run stops early, `close`
writes the output. A write that fails (a full disk, an unwritable folder) is a `RunError` in one line that says
what was kept, raised by the writer itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gemma_embed import store
from gemma_embed.config import RunConfig, Space
from gemma_embed.locations import Location, location

if TYPE_CHECKING:
    import torch

    from gemma_embed.decoding import Lookup
    from gemma_embed.runners import Planned


class Writer(Protocol):
    """What the pipeline writes a run's items through. One writer per output, for the run's whole life."""

    path: Location  # the output it writes

    def lookup(self) -> Lookup | None:
        """--resume: which saved key an item's content can take its rows from; None when nothing is reused."""
        ...

    def add(self, key: str, rows: torch.Tensor, meta: dict, position: int) -> None:
        """A finished item: its rows (on the CPU) and metadata, and its place in the input."""

    def reuse(self, key: str, position: int, source_key: str, facts: dict) -> None:
        """An item whose rows are saved already, under `source_key` (same content); `facts` are its own file's."""

    def save(self) -> int:
        """The run stops early: keep what is done where a later --resume finds it; the number of items kept."""
        ...

    def close(self) -> Location:
        """Write the output; the path that names it (the file, or the index of its shards)."""
        ...

    def write_errors(self, failures: list[dict]) -> None:
        """The failure records beside the output (none: a stale errors file goes)."""

    def counts(self) -> dict[str, int]:
        """After `close`: items written, and existing items kept or pruned (--resume)."""
        ...

    def positions(self) -> dict[str, int]:
        """Each written key's place in this run's input (a slice's manifest)."""
        ...

    def where_saved(self) -> str:
        """Where `save` keeps unfinished work, for the note that says how to finish."""
        ...


WriterFactory = Callable[[RunConfig, Location, "Planned", Callable[[str], None]], Writer]


def header(config: RunConfig, planned: Planned) -> dict[str, str]:
    """The run-level metadata of every file of a `gemma-embed/1` output: its settings and what computed it."""
    return store.make_header(
        model=config.model,
        revision=config.revision,
        modality=config.modality,
        space=planned.space,
        pooling=config.pool,
        compute_dtype=planned.dtype,
        dtype_reason=planned.dtype_reason,
        device=planned.device,
        cpu_kernels=planned.cpu_kernels,
        model_type=planned.model_type,
        preprocessing=json.dumps(planned.preprocessing),
        # Retrieval vectors: their width (--dim), which a search query must share. Tower rows: none (as before).
        **({"dim": planned.width} if planned.space == Space.retrieval else {}),
    )


class SafetensorsWriter:
    """The `gemma-embed/1` output (store/): items flushed to parts as they finish, --resume from parts and an
    existing output, shards, the errors file. Every write is guarded: a failure is one RunError line."""

    def __init__(self, config: RunConfig, output: Location, planned: Planned, warn: Callable[[str], None]):
        self.path = location(output)
        self._writer = store.EmbeddingWriter(
            self.path,
            header(config, planned),
            config.output_dtype,
            flush_every=config.flush_every,
            resume=config.resume,
            prune=config.prune,
            shard_size=config.shard_size,
            warn=warn,
        )
        self._resume = config.resume

    def lookup(self) -> Lookup | None:
        return self._writer.reuse_index if self._resume else None

    def add(self, key: str, rows: torch.Tensor, meta: dict, position: int) -> None:
        store.guarded_write(lambda: self._writer.add(key, rows, meta, position), self._writer.parts)

    def reuse(self, key: str, position: int, source_key: str, facts: dict) -> None:
        self._writer.reuse(key, position, source_key, facts)

    def save(self) -> int:
        store.guarded_write(self._writer.flush, self._writer.parts)
        return self._writer.saved_in_parts

    def close(self) -> Location:
        return store.guarded_write(self._writer.close, self.path)

    def write_errors(self, failures: list[dict]) -> None:
        store.write_errors(self.path, failures)

    def counts(self) -> dict[str, int]:
        w = self._writer
        return {"items": w.items_written, "kept": w.kept, "pruned": w.pruned}

    def positions(self) -> dict[str, int]:
        return self._writer.positions()

    def where_saved(self) -> str:
        return str(self._writer.parts)
