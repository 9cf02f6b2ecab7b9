"""Several processes, one result: who takes which items, and who writes the index that joins them.

Item i of the input (in input order) belongs to slice i % count. A slice is a torchrun rank or a scheduler
array task (`--num-slices K --slice-index I`). Each slice writes its own output with its own parts (so
--resume works per slice) and a manifest of its items' input positions; when every slice is done, one
`OUT.index.json` joins them and `gemma_embed.load(OUT)` reads it as if one process had written everything.
Under torchrun, rank 0 writes the index after a barrier; array tasks have no barrier, so whichever task finds
every slice done writes it (the content is the same whoever writes it). File layouts are `store.py`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gemma_embed import store
from gemma_embed.errors import UsageError


@dataclass(frozen=True)
class Slice:
    index: int
    count: int
    torchrun: bool = False
    local_rank: int = 0

    @property
    def is_split(self) -> bool:
        return self.count > 1

    def output(self, output: Path) -> Path:
        """This slice's own output file."""
        return store.slice_path(output, self.index, self.count)


def current_slice(num_slices: int | None = None, slice_index: int | None = None) -> Slice:
    """From --num-slices/--slice-index, else torchrun's RANK/WORLD_SIZE/LOCAL_RANK, else one slice."""
    if num_slices is not None or slice_index is not None:
        if num_slices is None or slice_index is None or not 0 <= slice_index < num_slices:
            raise UsageError("--num-slices N and --slice-index I go together, with 0 <= I < N")
        return Slice(slice_index, num_slices)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        return Slice(int(os.environ["RANK"]), world, torchrun=True, local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    return Slice(0, 1)


def take(sources: Iterable, part: Slice) -> Iterator:
    """This slice's sources (by their input position), lazily."""
    return (source for source in sources if source.position % part.count == part.index)


def barrier() -> None:
    """torchrun: wait for every rank (gloo works whatever the device, and only a barrier is needed)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")
    dist.barrier()


def finish_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def finish_slice(output: Path, part: Slice, positions: dict[str, int], note: Callable[[str], None]) -> Path | None:
    """Record this slice's input positions, then let the right process join all slices: rank 0 after a
    barrier, or whichever array task finds every slice done. Returns the index if this process wrote it."""
    store.guarded_write(lambda: store.write_manifest(part.output(output), positions), part.output(output))
    if part.torchrun:
        barrier()
        merged = store.merge_slices(output, part.count) if part.index == 0 else None
        barrier()  # nobody exits (and lets torchrun tear the group down) before the index exists
        finish_group()
        return merged
    merged = store.merge_slices(output, part.count)
    if merged is None:
        note(f"slice {part.index} of {part.count} done; the last slice to finish writes the index")
    return merged
