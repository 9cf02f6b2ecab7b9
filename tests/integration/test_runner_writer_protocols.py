"""The pipeline's two seams on the driving side: a `writers.Writer` it is given (here one that keeps everything in
memory, written in this file alone) receives exactly the items the safetensors writer writes, and a run through each
`runners.Runner` of one process (the whole input; two slices joined) gives the same output bit for bit."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import ROOT

import gemma_embed
from gemma_embed import RunConfig
from gemma_embed.distributed import current_slice
from gemma_embed.runners import LocalRunner, Planned, RunInfo, SliceRunner
from gemma_embed.sources import iter_sources

GEMMA4 = ROOT / "samples" / "tiny-gemma4"
IMAGES = ROOT / "samples" / "media" / "images"


class MemoryWriter:
    """A Writer of the protocol, from this test alone: rows and metadata in a dict, nothing on disk."""

    made: list[MemoryWriter] = []

    def __init__(self, config: RunConfig, output: Path, planned: Planned, warn) -> None:
        self.path = Path(output)
        self.planned = planned
        self.items: dict[str, tuple[int, torch.Tensor, dict]] = {}
        self.failures: list[dict] = []
        self.closed = False
        MemoryWriter.made.append(self)

    def lookup(self):
        return None

    def add(self, key, rows, meta, position) -> None:
        self.items[key] = (position, rows.clone(), dict(meta))

    def reuse(self, key, position, source_key, facts) -> None:
        raise AssertionError("nothing is resumed here")

    def save(self) -> int:
        return len(self.items)

    def close(self) -> Path:
        self.closed = True
        return self.path

    def write_errors(self, failures) -> None:
        self.failures = list(failures)

    def counts(self) -> dict[str, int]:
        return {"items": len(self.items), "kept": 0, "pruned": 0}

    def positions(self) -> dict[str, int]:
        return {key: position for key, (position, _, _) in self.items.items()}

    def where_saved(self) -> str:
        return "memory"


def options(output: Path, **more) -> RunConfig:
    return RunConfig(modality="images", inputs=[str(IMAGES)], model=str(GEMMA4), output=output, **more)


def test_a_writer_given_to_the_pipeline_gets_every_item_the_safetensors_output_holds(tmp_path):
    reference = gemma_embed.run(options(tmp_path / "ref.safetensors"))
    expected = gemma_embed.load(reference.output)
    MemoryWriter.made.clear()
    result = gemma_embed.run(options(tmp_path / "mem.safetensors"), writer=MemoryWriter)
    (writer,) = MemoryWriter.made
    assert writer.closed and result.ok == len(expected) and result.items == len(expected)
    assert not (tmp_path / "mem.safetensors").exists()  # nothing written but through the writer
    assert sorted(writer.items, key=lambda k: writer.items[k][0]) == list(expected)
    for key, rows in expected.items():
        assert torch.equal(writer.items[key][1].to(rows.dtype), rows), key
    assert writer.planned.width == rows.shape[1] and writer.planned.device == result.device


def test_each_runner_of_one_process_reports_what_it_took_and_gives_the_same_rows(tmp_path):
    whole = LocalRunner(options(tmp_path / "whole.safetensors"))
    assert isinstance(whole.load(), Planned)
    sources = list(iter_sources([str(IMAGES)], "images"))
    taken = list(whole.take(iter(sources)))
    assert taken == sources and whole.info().taken == len(sources)

    config = options(tmp_path / "sliced.safetensors", num_slices=2, slice_index=0)
    part = current_slice(2, 0)
    first = SliceRunner(config, part)
    first.load()
    mine = list(first.take(iter(sources)))
    info = first.info()
    assert isinstance(info, RunInfo)
    assert [s.position for s in mine] == [p for p in range(len(sources)) if p % 2 == 0]
    assert (info.taken, info.left_to_other_slices) == (len(mine), len(sources) - len(mine))
    assert first.output.name == "sliced-rank00000-of-00002.safetensors"

    single = gemma_embed.run(options(tmp_path / "single.safetensors"))
    for index in (0, 1):
        gemma_embed.run(options(tmp_path / "sliced.safetensors", num_slices=2, slice_index=index))
    joined, expected = gemma_embed.load(tmp_path / "sliced.safetensors"), gemma_embed.load(single.output)
    assert list(joined) == list(expected)
    for key, rows in expected.items():
        assert torch.equal(joined[key], rows), key
