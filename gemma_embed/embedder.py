"""The engine every way in shares: `Embedder(model).embed(list)` from Python, the command line's runs (pipeline.py)
and `search`'s queries all go through `Embedder.embed_stream`.

    decode -> prepare (worker threads, bounded windows) -> stage 1 -> ... -> stage n (engines: buckets, ragged
    batches, memory plan, OOM back-off, chunk tuning) -> pool

An Embedder resolves its checkpoint, device and dtype once, and builds a command's stages the first time that
command is asked for (from the family registry, checking every option before any tensor is read); towers are
loaded only then, and a tower two commands share (images and video: the vision tower) is loaded once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gemma_embed.config import MEDIA_MODALITIES, Modality, Pool, RunConfig, Space, python_spelling, stage_options
from gemma_embed.cpu_threads import CpuThreads
from gemma_embed.decoding import WINDOW_ITEMS, Prepared, prepared_stream
from gemma_embed.errors import ItemError, UsageError
from gemma_embed.locations import location
from gemma_embed.memory import allocator
from gemma_embed.modalities import ModalityStages
from gemma_embed.sources.base import Source
from gemma_embed.sources.fetch import FetchPolicy
from gemma_embed.tuned_sizes import TunedSizes

# Decode the next window while a CPU encodes this one? Off: on the CPU they compete for the same cores
# (bench/README.md has the measurements); on an accelerator the overlap is always on.
OVERLAP_ON_CPU = False
# A decode window holds about this many seconds of encode work at the measured rate: items leave (written,
# reported) within seconds of the start, and a stop loses little, while a GPU still gets full buckets.
WINDOW_SECONDS = 4.0
# What a command's stages depend on besides the checkpoint: a change in any of them is another set of stages. The
# options whose `Option.stage` is one `Embedder.command` builds (config.ROUTE_STAGES);
# tests/integration/test_stage_options.py checks them against the fields building a command's stages reads.
STAGE_OPTIONS = stage_options()


class Sink(Protocol):
    """Where finished items go, in completion order (the writer and reporter for a run; a list for `embed`)."""

    def reused(self, prepared: Prepared) -> None: ...

    def failed(self, error: ItemError, warnings: list[str] | None = None) -> None: ...

    def done(self, prepared: Prepared, rows) -> None: ...


@dataclass
class CommandEngines:
    """One command's stages and the engines that run them, for one set of stage options."""

    stages: ModalityStages
    engines: list
    host: Any = None  # planner.HostPlan: the host's memory shared out (model, decode side, encode on a CPU)
    loaded: bool = False
    cpu_threads: Any = None  # cpu_threads.CpuThreads of the engines' forwards on a CPU; None on an accelerator

    @property
    def pacer(self):
        """The engine whose measured rate sizes the decode windows (the first stage items go through)."""
        return self.engines[0]

    def chunking(self) -> dict:
        report = [e.chunking() for e in self.engines]
        if len(report) == 1 and self.stages.space != Space.retrieval:
            return report[0]
        # Retrieval vectors: by stage, as the output's readers know them (stage1: the tower; none for text).
        return {"stage1": report[0] if len(report) > 1 else None, "stage2": report[-1]}


@dataclass
class _Collected:
    """A Sink for `embed`: each input's pooled rows, or its failure, in its slot (and on a progress bar, when
    the caller asked for one)."""

    results: list
    order: dict[str, int] = field(default_factory=dict)
    progress: Any = None  # a progress.Reporter drawing a bar, or None

    def reused(self, prepared: Prepared) -> None:  # pragma: no cover - embed() looks nothing up
        raise AssertionError("embed() reuses nothing")

    def failed(self, error: ItemError, warnings: list[str] | None = None) -> None:
        error.warnings = error.warnings or list(warnings or [])
        self.results[self.order[error.key]] = error
        if self.progress is not None:
            self.progress.result.item_failed(error)
            self.progress.item_failed(error)

    def done(self, prepared: Prepared, rows) -> None:
        self.results[self.order[prepared.source.key]] = rows
        if self.progress is not None:
            self.progress.result.item_done(int(rows.shape[0]))
            self.progress.item_done(prepared.source.key, int(rows.shape[0]))


@contextlib.contextmanager
def _progress_bar(show: bool | None, total: int):
    """`encode(show_progress_bar=True)`: a bar on stderr for this call (a Reporter's, which names no item and
    prints no summary line); None otherwise: the library prints nothing unless asked."""
    if not show:
        yield None
        return
    from gemma_embed.progress import Reporter
    from gemma_embed.result import RunResult

    reporter = Reporter(live=True, emit_json=False)
    reporter.start("encode", RunResult(), total=total)
    try:
        yield reporter
    finally:
        reporter._stop_live()


def is_single_input(inputs: Any) -> bool:
    """Whether `inputs` is one input rather than a batch of them, as sentence-transformers decides it (a list, a
    tuple or a numpy array of strings or objects is a batch) except that audio as `(samples, rate)` is one input."""
    if _is_audio(inputs):
        return True
    if isinstance(inputs, (list, tuple)):
        return False
    kind = getattr(getattr(inputs, "dtype", None), "kind", None)
    return not (getattr(inputs, "ndim", 0) >= 1 and kind in ("U", "O"))


class Embedder:
    """A checkpoint ready to embed: `embed(inputs)` (rows per input) and `encode(inputs)` (an [N, D] array of
    pooled or retrieval vectors, as `SentenceTransformer.encode` returns).

    Options are the command line's (RunConfig fields): `space`, `pool`, `dim`, `prompt_name`, `prompt`,
    `max_soft_tokens`, `fps`, `max_frames`, `window_s`, `batch_size`, `memory_budget`, `cpu_threads`, `workers`,
    `revision`.
    """

    def __init__(
        self,
        model: str | os.PathLike,
        device: str = "auto",
        dtype: str = "auto",
        truncate_dim: int | None = None,
        **options: Any,
    ):
        if truncate_dim is not None:  # sentence-transformers' name of `dim`, as SentenceTransformer(truncate_dim=)
            if options.get("dim") not in (None, truncate_dim):
                raise UsageError(f"truncate_dim={truncate_dim} and dim={options['dim']}: give one of them")
            options["dim"] = truncate_dim
        with _python_words({"dim": "truncate_dim"} if truncate_dim is not None else None):
            self._setup(RunConfig(model=str(model), device=device, dtype=dtype, **options))

    @classmethod
    def from_config(
        cls, config: RunConfig, reporter=None, should_stop: Callable[[], None] | None = None, local_rank: int = 0
    ) -> Embedder:
        """The Embedder of a run (the pipeline's): its options, its reporter, its stop flag, its rank's device."""
        embedder = cls.__new__(cls)
        embedder._setup(config, reporter, should_stop, local_rank)
        return embedder

    def _setup(self, config: RunConfig, reporter=None, should_stop=None, local_rank: int = 0) -> None:
        from gemma_embed.device import choose_dtype, resolve_device, use_device
        from gemma_embed.models.loading import resolve_checkpoint, stored_dtype

        try:
            config.check()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        self.config = config
        self.reporter = reporter
        self.should_stop = should_stop
        self.device = resolve_device(config.device, local_rank)
        use_device(self.device)
        self.checkpoint = resolve_checkpoint(config.model, config.revision)
        stored = stored_dtype(self.checkpoint) if config.dtype == "auto" else (None, "")  # the checkpoint's dtype
        self.dtype_choice = choose_dtype(config.dtype, self.device, *stored)
        self._commands: dict[tuple, CommandEngines] = {}
        self._towers: dict[tuple, Any] = {}  # loaded towers, shared between commands
        self._elsewhere: dict[str, Embedder] = {}  # encode(device=...): this Embedder on other devices
        self._similarity_fn_name: str | None = None  # set by the caller; else the checkpoint's (similarity_fn_name)

    # ------------------------------------------------------------------------------------------ stages
    @property
    def dtype(self):
        return self.dtype_choice.dtype

    @property
    def model_type(self) -> str:
        return getattr(self.checkpoint.config, "model_type", "")

    def command(self, modality: str | Modality, **options: Any) -> CommandEngines:
        """The stages of one command with these options (the Embedder's own, updated by `options`), checked and
        built on first use, towers not loaded yet."""
        from gemma_embed.engine import Engine
        from gemma_embed.models import registry

        try:
            config = dataclasses.replace(self.config, modality=Modality(modality), **options)
            config.check()
        except ValueError as exc:  # a keyword's value (batch_size=-3), named as the caller wrote it
            raise UsageError(str(exc)) from None
        key = (config.modality, *(getattr(config, name) for name in STAGE_OPTIONS))
        if key not in self._commands:
            chosen = registry.resolve(config, self.checkpoint)  # every usage error, from configs alone
            stages = chosen.build(config, self.checkpoint, self.device, self.dtype)
            for stage in stages.chain:  # one tower object per tower, whichever command asks
                stage_key = (type(stage.tower).__name__, getattr(stage.tower, "dim", None))
                shared = self._towers.setdefault(stage_key, stage.tower)
                if shared is not stage.tower:
                    object.__setattr__(stage, "tower", shared)
            host = self._host_plan(stages)
            threads = CpuThreads(config.cpu_threads) if self.device.type == "cpu" else None
            engines = [
                Engine(
                    stage.tower,
                    str(stage.space),
                    host.chunk_spec(config.memory_budget),
                    config.batch_size,
                    self.reporter,
                    self.should_stop,
                    cpu_threads=threads,
                    tuned_sizes=TunedSizes.from_setting(config.tuning_cache),
                )
                for stage in stages.chain
            ]
            self._commands[key] = CommandEngines(stages, engines, host, cpu_threads=threads)
        return self._commands[key]

    def _host_plan(self, stages: ModalityStages):
        """How host memory is shared out (planner.host_plan): on a CPU the host is the device, so the towers'
        weights, the decode side and the encode's chunks share one budget; read now (after loading, the model's
        weights are part of what is used)."""
        from gemma_embed.memory import planner, readings

        on_cpu = self.device.type == "cpu"
        towers = {id(t): t for t in stages.towers}.values()
        model = sum(t.weight_bytes() for t in towers) if on_cpu else 0
        free, total = readings.device_memory("cpu")
        return planner.host_plan(free, total, self.config.memory_budget, model, host_is_device=on_cpu)

    def stages(self, modality: str | Modality, **options: Any) -> ModalityStages:
        return self.command(modality, **options).stages

    def load(self, modality: str | Modality, **options: Any) -> CommandEngines:
        """The command's stages and engines with its towers' weights read (each tower once)."""
        command = self.command(modality, **options)
        if not command.loaded:
            for tower in command.stages.towers:
                tower.load()
            command.host = self._host_plan(command.stages)  # free memory as it is with the weights in place
            for engine in command.engines:
                engine.budget_spec = command.host.chunk_spec(self.config.memory_budget)
            command.loaded = True
        return command

    # ------------------------------------------------------------------------------------------ streaming
    def embed_stream(
        self,
        sources: Iterable[Source],
        modality: str | Modality,
        sink: Sink,
        lookup=None,
        window_items: int | None = None,
        early_first: bool = True,
        **options: Any,
    ) -> CommandEngines:
        """Every source through decode, prepare and the command's chain of stages; `sink` gets each item as it
        finishes (reused by `lookup`, failed, or its pooled rows), in completion order. Returns the command's
        `CommandEngines` (their chunking, backoffs and peaks). `early_first`: the first window is one batch, so
        the first items reach `sink` soon (`Engine.enough_work`); False where the caller waits for all of them."""
        command = self.load(modality, **options)
        stages, pool = command.stages, Pool(options.get("pool", self.config.pool))
        limit = stages.window_items or WINDOW_ITEMS  # the command's own (text: longer) or the default
        window = max(1, min(limit, window_items or limit))
        pacer = command.pacer
        windows = prepared_stream(
            stages,
            sources,
            self.config.workers,
            window,
            lookup=lookup,
            overlap=self.device.type != "cpu" or OVERLAP_ON_CPU,
            enough_work=lambda units, work: pacer.enough_work(units, work, WINDOW_SECONDS, early_first),
            host_budget=command.host.decode,
            fetch=FetchPolicy.of(self.config),
        )
        # Closed however the loop ends: a stop signal (or a failed device) raises here while the stream is
        # suspended mid-window, with decodes waiting for room that only its close releases. Left to the garbage
        # collector, the exception's traceback kept it open and the process hung at exit, joining those decode
        # threads (seen: an interrupted run printed its summary, then never exited).
        threads = command.cpu_threads.running() if command.cpu_threads is not None else contextlib.nullcontext()
        with contextlib.closing(windows), threads:
            for batch in windows:
                if self.should_stop is not None:
                    self.should_stop()
                self.encode_window(command, batch, sink, pool)
                # Let this window's prepared tensors go now: the loop variable would hold them while the next
                # window decodes (measured: ~150 MB of pixels at a 100-item window of 70-token images).
                batch.clear()
        return command

    def encode_window(
        self, command: CommandEngines, batch: list[Prepared], sink: Sink, pool: Pool | str | None = None
    ) -> None:
        """One window of decoded items through the command's chain of stages (batched together at every stage) and
        pooling; `sink` gets each item: reused, failed (at decode or at any stage) or its pooled rows. The
        streaming loop above runs it per window, a Ray actor (ray_data.py) per batch it is given."""
        from gemma_embed.engine import encode_chain
        from gemma_embed.pooling import pool_rows

        pool = Pool(pool if pool is not None else self.config.pool)
        to_encode: list[Prepared] = []
        at: list[int] = []  # each item to encode: its place in the window
        # An item that failed to decode is passed on once every item before it in the window is: records keep
        # input order around a failure, and --on-error stop ends the run with the items before the bad one saved
        # (the window's encodes come after its decodes, so reported at once it would stop them all).
        held: dict[int, ItemError] = {}
        passed = [False] * len(batch)
        cursor = 0

        def pass_on_held() -> None:
            nonlocal cursor
            while cursor < len(batch):
                if cursor in held:
                    passed[cursor] = True
                    sink.failed(held.pop(cursor))
                if not passed[cursor]:
                    return
                cursor += 1

        for place, p in enumerate(batch):
            if p.reuse is not None:
                passed[place] = True
                sink.reused(p)
            elif p.error is not None:
                held[place] = p.error
            else:
                to_encode.append(p)
                at.append(place)
        pass_on_held()

        def finished(index: int, rows) -> None:
            p = to_encode[index]
            passed[at[index]] = True
            if isinstance(rows, ItemError):
                sink.failed(rows, p.warnings)
            else:
                sink.done(p, pool_rows(rows, pool, p.item.rows_per_unit))
            pass_on_held()

        feeds = [stage.feed for stage in command.stages.chain]
        # The window's CPU forwards reuse the heap the first grew; it goes back when the window is done.
        kept = allocator.heap_kept() if self.device.type == "cpu" else contextlib.nullcontext()
        with kept:
            keys = [p.source.key for p in to_encode]
            encode_chain(command.engines, feeds, [p.item for p in to_encode], keys, finished)
        pass_on_held()
        to_encode.clear()

    # ------------------------------------------------------------------------------------------ in memory
    def embed(self, inputs: Any, modality: str | Modality | None = None, **options: Any) -> Any:
        """One result per input, in order: its rows (a float tensor, pooled as `pool` says), or an `ItemError`
        for an input that cannot be embedded. Inputs: file paths (`str` or `Path`), bytes, PIL images, audio as
        `(samples, sample_rate)` or `{"array": ..., "sampling_rate": ...}`, and strings of text. One input given
        alone (not in a list) gives its one result, not a list (as `SentenceTransformer.encode` does).

        Without `modality`, each input's kind is its type's: a PIL image is an image, audio is a pair with a rate;
        a `Path` (or a `str` where the checkpoint embeds no text) is a file, of the command whose decoders take
        its extension. Where the checkpoint embeds text, a `str` is what sentence-transformers takes it for
        (`sentence_transformers_modality`): a path to an existing file with one of its image, video or audio
        extensions (or an http(s) URL so named, or a `data:image/` URI) is that file, for a checkpoint that embeds
        that modality; any other string is text. `modality=` decides for every input instead."""
        single = is_single_input(inputs)
        with _python_words():
            results = self._embed([inputs] if single else list(inputs), modality, **options)
        return results[0] if single else results

    def _embed(
        self, inputs: list, modality: str | Modality | None = None, progress: Any = None, **options: Any
    ) -> list:
        results: list = [None] * len(inputs)
        by_modality: dict[Modality, list[Source]] = {}
        for index, value in enumerate(inputs):
            key = f"input{index}"
            try:
                kind = Modality(modality) if modality is not None else self._modality_of(value)
                by_modality.setdefault(kind, []).append(_source(key, value, kind, index))
            except (UsageError, ValueError, TypeError) as exc:
                results[index] = ItemError(key, "find", str(exc), type(exc).__name__)
        for kind, sources in by_modality.items():
            sink = _Collected(results, {s.key: s.position for s in sources}, progress)
            self.embed_stream(sources, kind, sink, early_first=False, **options)  # every result returns at once
        return results

    def encode(
        self,
        inputs: Any,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        output_value: str | None = "sentence_embedding",
        precision: str = "float32",
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        device: str | None = None,
        normalize_embeddings: bool = False,
        truncate_dim: int | None = None,
        *,
        modality: str | Modality | None = None,
        dim: int | None = None,
        pool: Any = None,
        chunk_size: int | None = None,
    ):
        """One vector per input, as `SentenceTransformer.encode` gives them, with its keywords and their meaning:
        retrieval vectors, or a tower's rows mean-pooled. A list of inputs gives an [N, D] float32 numpy array (a
        torch tensor with `convert_to_tensor=True`; a list of 1-D tensors with `convert_to_numpy=False`); one input
        alone gives its [D] vector. `batch_size` caps the inputs a device batch holds (None: the engine's own
        choice), `truncate_dim` (or `dim`) keeps the first dimensions renormalised, `normalize_embeddings` scales
        each vector to unit length, `precision` quantizes as sentence-transformers' `quantize_embeddings` does
        (int8, uint8, binary, ubinary), `device` computes on that device (towers loaded there once),
        `show_progress_bar` draws a bar on stderr. An ItemError is raised for the first input that cannot be
        embedded (`embed` keeps going instead)."""
        import torch

        from gemma_embed.quantize import check_precision, quantize

        try:
            check_precision(precision)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if output_value != "sentence_embedding":
            raise UsageError(
                f"output_value={output_value!r}: encode gives one vector an item; an item's rows (its soft tokens) "
                f"come from embed(inputs, pool='none')"
            )
        if pool is not None or chunk_size is not None:
            raise UsageError(
                "pool and chunk_size (sentence-transformers' multi-process pool) are not used: the Embedder batches "
                "the inputs on its device itself; leave them out"
            )
        if truncate_dim is not None and dim is not None and truncate_dim != dim:
            raise UsageError(f"truncate_dim={truncate_dim} and dim={dim}: give one of them")
        # The caller's own keyword in an error: sentence-transformers' `truncate_dim` is RunConfig's `dim`.
        words = _python_words({"dim": "truncate_dim"} if truncate_dim is not None else None)
        with words:
            embedder = self._on(device)
        single = is_single_input(inputs)
        values = [inputs] if single else list(inputs)
        if not values:  # nothing to encode: what sentence-transformers gives for it
            return torch.zeros(0) if convert_to_tensor else (np_empty() if convert_to_numpy else [])
        options: dict[str, Any] = {
            "prompt_name": prompt_name,
            "prompt": prompt,
            "dim": truncate_dim if truncate_dim is not None else dim,
            "batch_size": batch_size,
        }
        options = {name: value for name, value in options.items() if value is not None}
        if embedder._space(modality, values) != Space.retrieval:
            options["pool"] = Pool.mean
        with words, _progress_bar(show_progress_bar, len(values)) as progress:
            rows = embedder._embed(values, modality, progress=progress, **options)
        failed = next((r for r in rows if isinstance(r, ItemError)), None)
        if failed is not None:
            raise failed
        vectors = torch.stack([r.float().reshape(-1) for r in rows])
        if normalize_embeddings:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
        if precision != "float32":
            try:
                vectors = torch.from_numpy(quantize(vectors.numpy(), precision))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        if convert_to_tensor:
            out: Any = vectors
        elif convert_to_numpy:
            out = vectors.numpy()
        else:
            out = list(vectors)
        return out[0] if single else out

    def encode_query(self, inputs: Any, **options: Any):
        """`encode` with the checkpoint's `query` prompt, as sentence-transformers' `encode_query`."""
        return self.encode(inputs, prompt_name="query", **options)

    def encode_document(self, inputs: Any, **options: Any):
        """`encode` with the checkpoint's `document` prompt, as sentence-transformers' `encode_document`."""
        return self.encode(inputs, prompt_name="document", **options)

    # ------------------------------------------------------------------------------------------ sentence-transformers
    # The small methods code written for `SentenceTransformer` calls around `encode`, with its meaning.

    @property
    def similarity_fn_name(self) -> str:
        """The similarity `similarity` computes: set here, else the checkpoint's (its sentence-transformers
        config), else cosine, as sentence-transformers decides it."""
        from gemma_embed import similarity

        if self._similarity_fn_name is None:
            setup = self._sentence_setup()
            self._similarity_fn_name = (setup.similarity_fn_name if setup else None) or similarity.DEFAULT
        return self._similarity_fn_name

    @similarity_fn_name.setter
    def similarity_fn_name(self, name: str) -> None:
        from gemma_embed import similarity

        try:
            self._similarity_fn_name = similarity.check_name(name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def similarity(self, embeddings1: Any, embeddings2: Any):
        """[N, M] float32 tensor of `similarity_fn_name` scores of each vector of `embeddings1` against each of
        `embeddings2` (arrays, tensors or lists of them; a 1-D vector is one), as sentence-transformers scores."""
        from gemma_embed import similarity

        return similarity.similarity(self.similarity_fn_name, embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any):
        """[N] float32 tensor: `embeddings1[i]` against `embeddings2[i]`, with `similarity_fn_name`."""
        from gemma_embed import similarity

        return similarity.similarity_pairwise(self.similarity_fn_name, embeddings1, embeddings2)

    @property
    def truncate_dim(self) -> int | None:
        """The dimensions `encode` keeps (`truncate_dim` or `dim` given to the Embedder); None: all of them."""
        return self.config.dim

    def get_embedding_dimension(self) -> int:
        """The width of the vectors `encode` gives by default: the checkpoint's retrieval vectors (or the first
        command's rows, for a checkpoint of towers), `truncate_dim` when it is smaller."""
        from gemma_embed.models.registry import find_family

        family = find_family(self.checkpoint.config)
        commands = list(family.commands) if family is not None else []
        if not commands:  # `command` says why this checkpoint runs nothing
            self.command(Modality.text)
        kind = Modality.text if Modality.text in commands else commands[0]
        return self.stages(kind).width

    @property
    def max_seq_length(self) -> int | None:
        """The most tokens of a text the checkpoint reads (the rest is cut, as sentence-transformers cuts it: its
        tokenizer's `model_max_length`, which the checkpoint's `max_seq_length` sets); None for a checkpoint that
        embeds no text."""
        from gemma_embed.models.registry import find_family

        family = find_family(self.checkpoint.config)
        if family is None or Modality.text not in family.commands:
            return None
        former = getattr(self.stages(Modality.text).preparer, "former", None)
        return int(former.max_length) if former is not None else None

    def get_max_seq_length(self) -> int | None:
        """`max_seq_length`, as sentence-transformers' method gives it."""
        return self.max_seq_length

    def get_sentence_embedding_dimension(self) -> int:
        """`get_embedding_dimension` under sentence-transformers' older name."""
        return self.get_embedding_dimension()

    def _sentence_setup(self):
        """What the checkpoint's sentence-transformers files say (`st_inputs.SentenceTransformerSetup`), or None
        for a checkpoint without them (the Gemma towers)."""
        if not hasattr(self, "_st_setup"):
            from gemma_embed.models.st_inputs import MODULES_FILE, read_sentence_transformers

            found = (self.checkpoint.folder / MODULES_FILE).is_file()
            self._st_setup = read_sentence_transformers(self.checkpoint) if found else None
        return self._st_setup

    def __repr__(self) -> str:
        """The checkpoint, its family, device and dtype, what each command gives, and for a sentence-transformers
        checkpoint its module stack, as `SentenceTransformer`'s repr lists it."""
        from gemma_embed.models.registry import find_family

        family = find_family(self.checkpoint.config)
        lines = [
            f"  model: {self.config.model} ({family.name if family else '?'}, model_type {self.model_type})",
            f"  device: {self.device}, dtype: {self.dtype_choice.name}",
        ]
        if family is not None:
            spaces = {str(kind): str(support.spaces[0]) for kind, support in family.commands.items()}
            lines.append("  commands: " + ", ".join(f"{kind} ({space})" for kind, space in spaces.items()))
        if self.config.dim is not None:
            lines.append(f"  truncate_dim: {self.config.dim}")
        setup = self._sentence_setup()
        if setup is not None:
            lines.append(f"  similarity_fn_name: {self.similarity_fn_name}")
            lines.append(f"  (0): Transformer(modalities: {', '.join(setup.modalities)})")
            stack = [f"Pooling(mode: {setup.pooling_mode}, include_prompt: {setup.include_prompt})"]
            for step in setup.head:
                if isinstance(step, str):
                    stack.append("Normalize()")
                else:
                    activation = step.activation.rsplit(".", 1)[-1]
                    stack.append(f"Dense({step.in_features} -> {step.out_features}, bias: {step.bias}, {activation})")
            lines += [f"  ({n}): {module}" for n, module in enumerate(stack, start=1)]
        return "Embedder(\n" + "\n".join(lines) + "\n)"

    def _on(self, device: str | None) -> Embedder:
        """This Embedder, or (for `encode(..., device=...)` naming another device) one like it on that device,
        made once and kept: its towers are loaded there the first time it is used."""
        from gemma_embed.device import resolve_device

        if device is None or resolve_device(str(device)) == self.device:
            return self
        wanted = str(resolve_device(str(device)))
        if wanted not in self._elsewhere:
            self._elsewhere[wanted] = Embedder.from_config(
                dataclasses.replace(self.config, device=wanted), self.reporter, self.should_stop
            )
        return self._elsewhere[wanted]

    def _space(self, modality, inputs) -> Space:
        kinds = {Modality(modality)} if modality is not None else set()
        if not kinds:
            for value in inputs:
                try:
                    kinds.add(self._modality_of(value))
                except (UsageError, ValueError, TypeError):
                    continue
        spaces = {self.command(kind).stages.space for kind in kinds}
        return Space.retrieval if spaces == {Space.retrieval} else Space.language

    def _modality_of(self, value: Any) -> Modality:
        from gemma_embed.models.registry import find_family

        family = find_family(self.checkpoint.config)
        supported = set(family.commands) if family is not None else set()
        if _is_pil(value):
            return Modality.images
        if _is_audio(value):
            return Modality.audio
        if isinstance(value, str) and Modality.text in supported:  # sentence-transformers' rule for a string
            kind = sentence_transformers_modality(value)
            return kind if kind in supported else Modality.text
        if isinstance(value, (str, os.PathLike)):
            from gemma_embed.sources.files import extensions

            suffix = location(value).suffix.lower()
            for kind in (Modality.images, Modality.video, Modality.audio):
                if kind in supported and suffix in extensions(kind):
                    return kind
            raise ValueError(f"{value}: no command of this checkpoint reads {suffix or 'files without a suffix'}")
        if isinstance(value, (bytes, bytearray)):
            media = sorted(m for m in supported if m.is_media)
            if len(media) == 1:
                return media[0]
            raise ValueError("bytes of which kind? pass modality= (images, video or audio)")
        raise TypeError(
            f"cannot embed a {type(value).__name__}: give a path, bytes, a PIL image, (samples, rate) or text"
        )


# sentence-transformers' modality detection of a string (`sentence_transformers.base.modality.infer_modality`): a
# media file when it ends with one of its kind's extensions (in any case) and is a file, or is an http(s) URL (no
# space) whose path ends so; `data:image/...` is an image. Anything else is text; so is a media string for a
# checkpoint without that modality.
ST_EXTENSIONS = {
    Modality.images: (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tiff", ".webp"),
    Modality.video: (".mp4", ".avi", ".mov", ".wmv", ".flv", ".mkv"),
    Modality.audio: (".mp3", ".wav", ".ogg", ".flac", ".aac"),
}


def sentence_transformers_modality(value: str) -> Modality:
    """The modality sentence-transformers gives the string `value` (ST_EXTENSIONS)."""
    if value.startswith("data:image/"):
        return Modality.images
    is_url = value.startswith(("http://", "https://")) and " " not in value
    if is_url:
        from urllib.parse import urlparse

        try:
            named = urlparse(value).path.lower()
        except ValueError:
            return Modality.text
    else:
        named = value.lower()
    for kind, suffixes in ST_EXTENSIONS.items():
        if named.endswith(suffixes) and (is_url or _local_file(value)):
            return kind
    return Modality.text


def _local_file(value: str) -> bool:
    """Whether `value` names a file on this machine (`os.path.isfile`, through the seam)."""
    try:
        place = location(value)
    except (UsageError, ValueError):
        return False
    return place.is_local and place.isfile()


def np_empty():
    """`encode([])` as sentence-transformers gives it: an empty float64 array of shape (0,)."""
    import numpy as np

    return np.zeros(0)


class _python_words:
    """Usage errors raised to a Python caller name options as keywords (`dim`, `overwrite=True`), not flags;
    `renamed` maps a RunConfig field to the keyword the caller gave it under (`dim` -> `truncate_dim`). One
    instance can be entered again (encode's device check, then its run)."""

    def __init__(self, renamed: dict[str, str] | None = None):
        self.renamed = renamed or {}

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> None:
        if isinstance(exc, UsageError):
            message = python_spelling(str(exc))
            for field, keyword in self.renamed.items():
                message = re.sub(rf"(?<![\w=-]){field}\b(?!=)", keyword, message)
            raise exc.reworded(message) from None


def _is_pil(value: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is a dependency
        return False
    return isinstance(value, Image.Image)


def _is_audio(value: Any) -> bool:
    if isinstance(value, dict):
        return "array" in value and "sampling_rate" in value
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], int) and hasattr(value[0], "shape")


def _source(key: str, value: Any, modality: Modality, position: int) -> Source:
    """An in-memory input as a Source: a file by its path, bytes and text by their bytes, other values as they
    are (the modality's decoder takes them)."""
    if isinstance(value, os.PathLike):  # a Path (or any location): a file, named as the seam names it
        return Source(key, str(location(value)), position=position)
    if isinstance(value, str) and modality in MEDIA_MODALITIES and value.startswith("data:"):  # a data URI: its bytes
        import urllib.request

        with urllib.request.urlopen(value) as opened:  # noqa: S310 - a data: URI is decoded here, nothing fetched
            return Source(key, key, position=position, data=opened.read())
    if isinstance(value, str) and modality in MEDIA_MODALITIES:
        return Source(key, value, position=position)
    if isinstance(value, str):  # text: as the command line reads a line
        return Source(key, key, position=position, data=value.encode("utf-8"))
    if isinstance(value, (bytes, bytearray)):
        return Source(key, key, position=position, data=bytes(value))
    return Source(key, key, position=position, value=value)
