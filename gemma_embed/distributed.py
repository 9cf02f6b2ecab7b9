"""Several processes, one result: torchrun ranks or scheduler array tasks each take a deterministic slice.

Item i of the input (in input order) belongs to slice i % count. Each slice writes its own output
(`OUT-rank00001-of-00004.safetensors`, with its own parts, so --resume works per slice) and a small manifest of
its items' input positions. When every slice is done, one index `OUT.index.json` lists all slices' files with
the keys in input order, and `gemma_embed.load(OUT)` reads it as if one process had written everything.
Under torchrun, rank 0 writes the index after a barrier; array tasks (--num-shards/--shard-index) have no barrier,
so whichever task finds every slice done writes it (the content is the same whoever writes it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gemma_embed import FORMAT
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


def current_slice(num_shards: int | None = None, shard_index: int | None = None) -> Slice:
    """From --num-shards/--shard-index, else torchrun's RANK/WORLD_SIZE/LOCAL_RANK, else one slice."""
    if num_shards is not None or shard_index is not None:
        if num_shards is None or shard_index is None or not 0 <= shard_index < num_shards:
            raise UsageError("--num-shards N and --shard-index I go together, with 0 <= I < N")
        return Slice(shard_index, num_shards)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        return Slice(int(os.environ["RANK"]), world, torchrun=True, local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    return Slice(0, 1)


def take(sources: Iterable, part: Slice) -> Iterator:
    """This slice's sources (by their input position), lazily."""
    return (source for source in sources if source.position % part.count == part.index)


def slice_output(output: Path, part: Slice) -> Path:
    if not part.is_split:
        return Path(output)
    output = Path(output)
    stem = output.name.removesuffix(".safetensors")
    return output.with_name(f"{stem}-rank{part.index:05d}-of-{part.count:05d}.safetensors")


def manifest_path(slice_out: Path) -> Path:
    return slice_out.with_name(slice_out.name.removesuffix(".safetensors") + ".positions.json")


def write_manifest(slice_out: Path, positions: dict[str, int]) -> None:
    from gemma_embed.store import _atomic_text

    _atomic_text(manifest_path(slice_out), json.dumps(positions, ensure_ascii=True))


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


def merge_index(output: Path, count: int) -> Path | None:
    """Write OUT.index.json over every slice's files, keys in input order; None while a slice is unfinished."""
    from gemma_embed.store import _atomic_text, _read_header, index_path, output_files

    output = Path(output)
    shards: list[Path] = []
    located: list[tuple[int, str, int]] = []  # (input position, key, shard number)
    for index in range(count):
        out = slice_output(output, Slice(index, count))
        manifest = manifest_path(out)
        files = output_files(out)
        if not files or not manifest.exists():
            return None
        positions = json.loads(manifest.read_text())
        for file in files:
            for key in json.loads(_read_header(file)["keys"]):
                located.append((positions[key], key, len(shards)))
            shards.append(file)
    located.sort()
    index = {
        "format": FORMAT,
        "shards": [os.path.relpath(f, output.parent) for f in shards],
        "keys": {key: shard for _, key, shard in located},
    }
    path = index_path(output)
    _atomic_text(path, json.dumps(index, ensure_ascii=True))
    return path
