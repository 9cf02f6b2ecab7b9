"""How a run is driven: one `Runner` protocol and its three implementations.

    pipeline.run: find the sources -> runner.load() (what will compute: `Planned`) -> the writer, made from it ->
    runner.embed(runner.take(sources), sink) -> writer.close() -> runner.finish(...) -> runner.info() (`RunInfo`)

- `LocalRunner`: this process embeds every item (the `Embedder` engine: decode threads, buckets, memory plan).
- `SliceRunner`: this process is one slice of several (`--num-slices K --slice-index I`, or a torchrun rank): it
  takes every K-th item, writes its own output and joins the slices when it finds them all done (distributed.py).
- `ray_data.RayRunner`: the decode and the encode run on a Ray cluster (`--ray`); the items come back here.

The pipeline knows only this protocol: it never asks which runner it has. What a runner tells it is `Planned` (the
facts the output's header records about the encoders, known before the first item) and, at the end, `RunInfo`
(what was planned, what was seen: items taken and passed to other slices, and how the encoders chunked).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gemma_embed import distributed
from gemma_embed.config import RunConfig, Space
from gemma_embed.locations import Location, location

if TYPE_CHECKING:
    from gemma_embed.decoding import Lookup
    from gemma_embed.embedder import Sink
    from gemma_embed.sources.base import Source


@dataclass(frozen=True)
class Planned:
    """What a run's encoders will compute, as the output's header records it: known once the runner is loaded,
    before the first item, whichever runner computes (a Ray actor reports its own view, checked against this)."""

    device: str
    dtype: str  # the compute dtype's name
    dtype_reason: str  # why that dtype (--dtype auto's choice, or the option)
    model_type: str
    space: Space
    width: int  # row width of the output
    preprocessing: dict  # the preparer's own description (processor settings), for --resume's fingerprint
    cpu_kernels: str = ""  # on a CPU: the kernels the forwards compute with (numerics.kernels(), JSON)


@dataclass
class RunInfo:
    """What a runner planned, what it saw and how its encoders went, for the run's result and summary."""

    planned: Planned
    taken: int = 0  # items this runner was given to embed
    left_to_other_slices: int = 0  # items of the input that belong to other slices
    chunking: dict = field(default_factory=dict)
    oom_backoffs: int = 0
    peak_device_memory: int | None = None  # bytes; None where the device keeps no statistics
    cpu_threads: dict | None = None  # on a CPU: the forwards' thread count and why


class Runner(Protocol):
    """One way to drive a run. Made cheaply (nothing loaded, no cluster reached); the pipeline then calls, in
    order: `begin`, `load`, `take` and `embed`, then `finish` once the writer has closed, and `info` for the result.
    """

    output: Location  # the file this process writes: the run's output, or a slice's own
    label: str  # how progress names the run ("images", "images [1/4]")
    # Whether its workers read each item's bytes themselves (on other machines): the sources then name where items
    # lie and carry no bytes: whole files by their location, collections (tar shards, parquet row groups, JSON-lines
    # and text files) as units whose items the workers find (`sources.base.Unit`).
    reads_items_itself: bool

    def begin(self) -> None:
        """Once the input is known to hold items, before anything loads."""

    def load(self) -> Planned:
        """Check every option against the checkpoint, then make ready what encodes (weights, actors)."""
        ...

    def take(self, sources: Iterable[Source]) -> Iterator[Source]:
        """The items this runner embeds, lazily, in input order."""
        ...

    def share(self, total: int) -> int:
        """How many of an input of `total` items this runner takes (a progress bar's total)."""
        ...

    def embed(
        self,
        sources: Iterable[Source],
        sink: Sink,
        lookup: Lookup | None,
        window_items: int | None,
        skipped: Counter | None = None,
    ) -> None:
        """Every source through decode, prepare and the stages; `sink` gets each item once, as it finishes.
        `skipped`: the find stage's count of what it passed over, which a runner whose workers find items (in units)
        adds theirs to."""

    def finish(self, positions: dict[str, int], note: Callable[[str], None]) -> Location | None:
        """After the writer closed: what else the run writes (a slice's join); the file that now names the whole
        output when it is not the writer's own, else None."""
        ...

    def info(self) -> RunInfo: ...


# ---------------------------------------------------------------------------------------------- one process


class LocalRunner:
    """Every item in this process, through one `Embedder`."""

    def __init__(self, config: RunConfig, reporter=None, should_stop: Callable[[], None] | None = None):
        self.config = config
        self.reporter = reporter
        self.should_stop = should_stop
        self.output = location(config.output)
        self.label = str(config.modality)
        self.embedder: Any = None
        self.engines: Any = None  # embedder.CommandEngines of the command, once loaded
        self.planned: Planned | None = None
        self.taken = 0

    local_rank = 0  # the device index under torchrun (a slice's); one process: the first
    reads_items_itself = False  # this process reads them: the fetch stage runs ahead of the decoders here

    def begin(self) -> None:
        pass

    def load(self) -> Planned:
        from gemma_embed.embedder import Embedder

        self.embedder = Embedder.from_config(self.config, self.reporter, self.should_stop, self.local_rank)
        self.engines = self.embedder.load(self.config.modality)  # every usage error first, from configs
        self.planned = planned(self.embedder, self.engines)
        return self.planned

    def take(self, sources: Iterable[Source]) -> Iterator[Source]:
        for source in sources:
            self.taken += 1
            yield source

    def share(self, total: int) -> int:
        return total

    def embed(
        self,
        sources: Iterable[Source],
        sink: Sink,
        lookup: Lookup | None,
        window_items: int | None,
        skipped: Counter | None = None,
    ) -> None:
        self.embedder.embed_stream(sources, self.config.modality, sink, lookup=lookup, window_items=window_items)

    def finish(self, positions: dict[str, int], note: Callable[[str], None]) -> Location | None:
        return None

    def info(self) -> RunInfo:
        engines = self.engines
        assert self.planned is not None and engines is not None, "info() comes after load()"
        peaks = [p for p in (e.peak_device_memory() for e in engines.engines) if p is not None]
        return RunInfo(
            self.planned,
            taken=self.taken,
            chunking=engines.chunking(),
            oom_backoffs=sum(e.backoffs for e in engines.engines),
            peak_device_memory=max(peaks) if peaks else None,
            cpu_threads=engines.cpu_threads.report() if engines.cpu_threads is not None else None,
        )


def planned(embedder, engines) -> Planned:
    """What an `Embedder` will compute for a command (its `CommandEngines`), as the header records it."""
    from gemma_embed import numerics

    stages = engines.stages
    choice = embedder.dtype_choice
    return Planned(
        device=str(embedder.device),
        dtype=choice.name,
        dtype_reason=choice.reason,
        model_type=embedder.model_type,
        space=stages.space,
        width=stages.width,
        preprocessing=stages.preparer.describe(),
        cpu_kernels=numerics.kernels_json() if embedder.device.type == "cpu" else "",
    )


class SliceRunner(LocalRunner):
    """This process's slice of the input (item i belongs to slice i % count), in this process, into the slice's
    own output; the last slice to finish joins them (distributed.py)."""

    def __init__(self, config: RunConfig, part: distributed.Slice, reporter=None, should_stop=None):
        super().__init__(config, reporter, should_stop)
        self.part = part
        self.output = part.output(config.output)
        self.label = f"{config.modality} [{part.index}/{part.count}]"
        self.local_rank = part.local_rank
        self.passed = 0

    def begin(self) -> None:
        distributed.begin_slice(self.config.output, self.part)

    def take(self, sources: Iterable[Source]) -> Iterator[Source]:
        for source in sources:
            if source.position % self.part.count == self.part.index:
                self.taken += 1
                yield source
            else:
                self.passed += 1

    def share(self, total: int) -> int:
        return len(range(self.part.index, total, self.part.count))

    def finish(self, positions: dict[str, int], note: Callable[[str], None]) -> Location | None:
        return distributed.finish_slice(self.config.output, self.part, positions, note)

    def info(self) -> RunInfo:
        info = super().info()
        info.left_to_other_slices = self.passed
        return info
