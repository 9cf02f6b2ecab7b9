"""Several processes, one result: who takes which items, and who writes the index that joins them.

Item i of the input (in input order) belongs to slice i % count. A slice is a torchrun rank or a scheduler
array task (`--num-slices K --slice-index I`). Each slice writes its own output with its own parts (so
--resume works per slice) and a manifest of its items' input positions; when every slice is done, one
`OUT.index.json` joins them and `gemma_embed.load(OUT)` reads it as if one process had written everything.
Whichever slice finds every slice done writes it (the content is the same whoever writes it); there is no
process group and no barrier, so nothing can time out however unevenly the work is spread. File layouts are
`store`'s.

Locks (`store/lock.py`): each slice holds its own output's lock for its run; joining the slices takes the final
output's lock (a join waits for another join, never for a run), and a slice starting checks that no run is
writing the final output.

Under torchrun a finished rank still waits (polling the other ranks' manifests, without a timeout) and then
writes the index itself before it exits: torchrun tears every rank down as soon as one exits non-zero (exit 1
just means some items failed), so no rank may exit while another still works. Polling cannot hang: if a rank
dies, torchrun stops the waiting ones.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from gemma_embed import store
from gemma_embed.errors import UsageError
from gemma_embed.locations import Location
from gemma_embed.store.lock import MERGE, output_lock

# When a run holds the final output's lock while a slice is done: the slice's work is saved either way.
JOIN_LATER = "this slice's work is saved; when that run is done, run this slice again with --resume to join them"


@dataclass(frozen=True)
class Slice:
    index: int
    count: int
    torchrun: bool = False
    local_rank: int = 0

    @property
    def is_split(self) -> bool:
        return self.count > 1

    def output(self, output: Location) -> Location:
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


def writer_lock(output: Location, num_slices: int | None = None, slice_index: int | None = None):
    """The lock of the file this process writes: `output`, or its slice's own output when the input is split."""
    return output_lock(current_slice(num_slices, slice_index).output(output))


def take(sources: Iterable, part: Slice) -> Iterator:
    """This slice's sources (by their input position), lazily."""
    return (source for source in sources if source.position % part.count == part.index)


def begin_slice(output: Location, part: Slice) -> None:
    """Fail at once if a run (not split) is writing the final output; then forget this slice's manifest from an
    earlier run, so nobody takes the slice for done while it works."""
    with output_lock(output, MERGE, "wait for it to finish or choose another --output"):
        pass
    store.manifest_path(part.output(output)).rm_file(missing_ok=True)


def _join(output: Location, count: int) -> Location | None:
    with output_lock(output, MERGE, JOIN_LATER):
        return store.merge_slices(output, count)


def slices_done(output: Location, count: int) -> bool:
    return all(store.manifest_path(store.slice_path(output, i, count)).exists() for i in range(count))


def wait_for_slices(output: Location, count: int, poll_s: float = 0.2, max_poll_s: float = 5.0) -> None:
    """Until every slice has written its manifest; no timeout (see the module note)."""
    while not slices_done(output, count):
        time.sleep(poll_s)
        poll_s = min(max_poll_s, poll_s * 1.5)


def finish_slice(
    output: Location, part: Slice, positions: dict[str, int], note: Callable[[str], None]
) -> Location | None:
    """Record this slice's input positions; the last slice to finish writes the index. Under torchrun every rank
    waits for the others and then writes the (same) index, so it exists before any rank exits. Returns the index
    if this process wrote it."""
    store.guarded_write(lambda: store.write_manifest(part.output(output), positions), part.output(output))
    merged = _join(output, part.count)
    if merged is not None:
        return merged
    if not part.torchrun:
        note(f"slice {part.index} of {part.count} done; the last slice to finish writes the index")
        return None
    note(f"rank {part.index} of {part.count} done; waiting for the other ranks to finish (no timeout)")
    wait_for_slices(output, part.count)
    return _join(output, part.count)
