"""The only place that knows the order of the stages.

sources -> decode -> prepare -> batch -> plan -> encode -> write -> report

Items are taken in windows (`decoding.py`): decoding and preprocessing of a window run in worker threads, then
the units of every item in the window are grouped, encoded in planned chunks and regrouped per item
(`engine.py`), pooled (`pooling.py`) and written in input order (`store.py`).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from gemma_embed import capture, distributed, memory, store
from gemma_embed.config import RunConfig, Space
from gemma_embed.decoding import WINDOW_ITEMS, Prepared, prepared_stream
from gemma_embed.device import choose_dtype, dtype_name, resolve_device, use_device
from gemma_embed.engine import Engine, encode_items
from gemma_embed.errors import DeviceError, ItemError, UsageError
from gemma_embed.interrupts import Interrupted, stop_on_signals
from gemma_embed.modalities import ModalityStages, build_modality
from gemma_embed.pooling import pool_rows
from gemma_embed.progress import Reporter
from gemma_embed.result import RunResult
from gemma_embed.sources import Source, count_sources, iter_sources, require_input, skipped_note
from gemma_embed.sources.text import iter_text_sources

# Decode the next window while a CPU encodes this one? Off: on the CPU they compete for the same cores
# (bench/README.md has the measurements); on an accelerator the overlap is always on.
OVERLAP_ON_CPU = False
# A decode window holds about this many seconds of encode work at the measured rate: items leave (written,
# reported) within seconds of the start, and a stop loses little, while a GPU still gets full buckets.
WINDOW_SECONDS = 4.0


@dataclass
class Loaded:
    budget_spec: memory.BudgetSpec
    device: torch.device
    dtype: torch.dtype
    checkpoint: object
    stages: ModalityStages
    dtype_reason: str = ""
    host: memory.HostPlan | None = None  # host memory shared out: model, decode side, encode (on a CPU)


def _load(config: RunConfig, local_rank: int = 0) -> Loaded:
    """What run and plan both need before touching any input: options checked, device, checkpoint, tower."""
    from gemma_embed.models.loading import resolve_checkpoint, stored_dtype

    try:
        config.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    budget_spec = memory.parse_budget(config.memory_budget)
    device = resolve_device(config.device, local_rank)
    use_device(device)
    checkpoint = resolve_checkpoint(config.model, config.revision)
    stored = stored_dtype(checkpoint) if config.dtype == "auto" else (None, "")  # auto: the checkpoint's dtype
    choice = choose_dtype(config.dtype, device, *stored)
    stages = build_modality(config, checkpoint, device, choice.dtype)
    on_cpu = device.type == "cpu"
    model = memory.resident_bytes(stages.tower, stages.second) if on_cpu else 0
    host = memory.host_plan(*memory.device_memory("cpu"), budget_spec, model, host_is_device=on_cpu)
    return Loaded(budget_spec, device, choice.dtype, checkpoint, stages, choice.reason, host)


def _header(config: RunConfig, loaded: Loaded) -> dict[str, str]:
    return store.make_header(
        model=config.model,
        revision=config.revision,
        modality=config.modality,
        space=loaded.stages.space,
        pooling=config.pool,
        compute_dtype=dtype_name(loaded.dtype),
        dtype_reason=loaded.dtype_reason,
        device=str(loaded.device),
        model_type=getattr(loaded.checkpoint.config, "model_type", ""),
        preprocessing=json.dumps(loaded.stages.preparer.describe()),
        # Retrieval vectors: their width (--dim), which a search query must share. Tower rows: none (as before).
        **({"dim": loaded.stages.width} if loaded.stages.second is not None else {}),
    )


@dataclass
class Encoders:
    """A run's encode stages: the tower (stage 1; none for text) and, for retrieval vectors, the text model
    (stage 2). Each is an Engine of its own: its own memory plan, cost scale and chunk tuning."""

    first: Engine | None
    second: Engine | None

    @classmethod
    def build(cls, config: RunConfig, loaded: Loaded, reporter=None, should_stop=None) -> Encoders:
        def engine(tower, space) -> Engine | None:
            if tower is None:
                return None
            spec = loaded.host.chunk_spec(loaded.budget_spec)
            return Engine(tower, space, spec, config.batch_size, reporter, should_stop)

        stages = loaded.stages
        if stages.second is None:
            return cls(engine(stages.tower, stages.space), None)
        # Stage 1 gives the rows the text model takes into its sequence: the towers' language-space rows.
        return cls(engine(stages.tower, Space.language), engine(stages.second, stages.space))

    @property
    def engines(self) -> list[Engine]:
        return [e for e in (self.first, self.second) if e is not None]

    @property
    def pacer(self) -> Engine:
        """The engine whose measured rate sizes the decode windows (the first stage items go through)."""
        return self.first or self.second

    def chunking(self, batch_size: int | None) -> dict:
        report = {e: e.tuner.report() if e.tuner else {"fixed": batch_size} for e in self.engines}
        if self.second is None:
            return report[self.first]
        return {"stage1": report.get(self.first), "stage2": report[self.second]}

    def peak_device_memory(self) -> int | None:
        peaks = [p for p in (e.peak_device_memory() for e in self.engines) if p is not None]
        return max(peaks) if peaks else None


def run(config: RunConfig, reporter: Reporter | None = None, stdin=None) -> RunResult:
    """Embed every item of `config.inputs` (this process's slice of them) into `config.output`.

    Returns a `RunResult` (counts, failures, output path, chunking). A bad item is a failure record, never an
    exception; `UsageError` means the run could not start, `RunError` that it could not write.
    """
    reporter = reporter or Reporter.silent()
    if config.prune and not config.resume:
        raise UsageError("--prune goes with --resume (it drops items of the existing output)")
    part = distributed.current_slice(config.num_slices, config.slice_index)
    output = part.output(config.output)
    store.check_output_path(output, config.overwrite, config.resume)
    if part.is_split:
        store.check_output_path(config.output, config.overwrite, config.resume)
        distributed.begin_slice(config.output, part)
    skipped: Counter = Counter()  # files the folder walk passes over, by extension
    found = require_input(  # before loading a model
        _find(config, stdin, skipped), config.inputs, config.modality, config.ext, skipped, config.dataset
    )
    result = RunResult()
    with stop_on_signals(immediate=True) as stop:
        try:
            loaded = _load(config, part.local_rank)
        except Interrupted as interrupted:
            reporter.note("interrupted while loading the model; nothing to save")
            result.interrupted, result.signum = str(interrupted), interrupted.signum
            reporter.finish(result.finish())
            return result
        stop.immediate = False  # from here on a signal stops at the next chunk, and finished items are saved
        writer = store.EmbeddingWriter(
            output,
            _header(config, loaded),
            config.output_dtype,
            flush_every=config.flush_every,
            resume=config.resume,
            prune=config.prune,
            shard_size=config.shard_size,
        )
        sources = distributed.take(found, part)
        result = RunResult(device=str(loaded.device), dtype=dtype_name(loaded.dtype), dtype_reason=loaded.dtype_reason)
        reporter.start(
            str(config.modality) if not part.is_split else f"{config.modality} [{part.index}/{part.count}]", result
        )
        if reporter.live and "-" not in config.inputs:
            _count_in_background(config, part, reporter)
        captured = capture.Capture(reporter)  # library messages go to the items that cause them, not stderr
        with captured:
            encoders = Encoders.build(config, loaded, reporter, stop.check)
            try:
                _embed_all(
                    config,
                    loaded.stages,
                    encoders,
                    writer,
                    sources,
                    _Finisher(config, writer, reporter, result),
                    stop,
                    host_budget=loaded.host.decode,
                )
            except Interrupted as interrupted:
                store.guarded_write(writer.flush, writer.parts)
                store.write_errors(output, result.failures)
                saved = writer.saved_in_parts
                if saved:
                    reporter.note(
                        f"interrupted by {interrupted}: {saved} items are saved in {writer.parts}; "
                        f"run the same command with --resume to finish"
                    )
                else:
                    reporter.note(f"interrupted by {interrupted} before any item finished; nothing to save")
                result.skipped = sum(skipped.values())
                result.interrupted, result.signum, result.items = str(interrupted), interrupted.signum, saved
                reporter.finish(result.finish())
                return result
            except DeviceError:
                # The device cannot go on: keep what is done, as after an interrupt, and end the run.
                store.guarded_write(writer.flush, writer.parts)
                store.write_errors(output, result.failures)
                reporter.note(f"{writer.saved_in_parts} items are saved in {writer.parts}; run with --resume to finish")
                raise
    result.skipped = sum(skipped.values())
    if note := skipped_note(config.modality, skipped):
        reporter.note(note)
    if captured.outside and not config.debug:
        reporter.note(f"{captured.outside} library messages outside any item were hidden (--debug shows them)")
    result.output = store.guarded_write(writer.close, output)
    result.items, result.kept, result.pruned = writer.items_written, writer.kept, writer.pruned
    store.write_errors(output, result.failures)
    if part.is_split:
        result.output = (
            distributed.finish_slice(config.output, part, writer.positions(), reporter.note) or result.output
        )
    result.peak_device_memory = encoders.peak_device_memory()
    result.oom_backoffs = sum(e.backoffs for e in encoders.engines)
    result.chunking = encoders.chunking(config.batch_size)
    reporter.finish(result.finish())
    return result


def _count_in_background(config: RunConfig, part: distributed.Slice, reporter: Reporter) -> None:
    """Give the progress bar its total (and an ETA) without delaying the first item: a second, cheap walk of
    the inputs (tar headers, parquet footers), in a daemon thread. Never for stdin, which can be read only once."""

    def count() -> None:
        if config.modality == "text":  # lines: read the files once more
            total = sum(1 for _ in distributed.take(_find(config), part))
        else:
            total = count_sources(config.inputs, config.modality, config.ext, config.collection)
        if total is not None:
            reporter.set_total(total if config.modality == "text" else len(range(part.index, total, part.count)))

    threading.Thread(target=count, name="count-inputs", daemon=True).start()


class _StopAtFirstFailure(Exception):
    """--on-error stop: a failure ended the run; what is done is written."""


class _Finisher:
    """The last stages for one item: pool its rows, hand them to the writer, report it, count it."""

    def __init__(self, config: RunConfig, writer: store.EmbeddingWriter, reporter: Reporter, result: RunResult):
        self.config, self.writer, self.reporter, self.result = config, writer, reporter, result

    def reused(self, p: Prepared) -> None:
        self.writer.reuse(p.source.key, p.source.position, p.reuse, p.facts)
        self.result.item_done(0, resumed=True)
        self.reporter.item_done(p.source.key, 0, resumed=True)

    def failed(self, error: ItemError, warnings: list[str] | None = None) -> None:
        error.warnings = error.warnings or list(warnings or [])
        self.result.item_failed(error)
        self.reporter.item_failed(error)
        if self.config.on_error == "stop":
            raise _StopAtFirstFailure

    def done(self, p: Prepared, rows) -> None:
        if isinstance(rows, ItemError):
            self.failed(rows, p.warnings)
            return
        pooled = pool_rows(rows, self.config.pool, p.item.rows_per_unit)
        store.guarded_write(
            lambda: self.writer.add(p.source.key, pooled, p.item.meta, p.source.position), self.writer.parts
        )
        self.result.item_done(int(pooled.shape[0]), warnings=p.warnings)
        self.reporter.item_done(p.source.key, int(pooled.shape[0]), warnings=p.warnings)


def _encode_window(stages: ModalityStages, encoders: Encoders, to_encode: list[Prepared], finish: _Finisher) -> None:
    """Every item of a window through the encode stages; each is finished as soon as its last stage is done."""
    keys = [p.source.key for p in to_encode]
    if encoders.second is None:
        encode_items(encoders.first, [p.item for p in to_encode], keys, lambda i, rows: finish.done(to_encode[i], rows))
        return
    staged: list[tuple[Prepared, object]] = []  # (item, its stage-2 input: token ids with the stage-1 rows)

    def after_stage1(p: Prepared, rows) -> None:
        if isinstance(rows, ItemError):
            finish.failed(rows, p.warnings)
            return
        try:
            staged.append((p, stages.preparer.second_stage(p.item, rows)))
        except ValueError as exc:
            finish.failed(ItemError.wrap(p.source.key, "prepare", exc), p.warnings)

    with_units = [p for p in to_encode if p.item.units]
    if with_units:
        encode_items(
            encoders.first,
            [p.item for p in with_units],
            [p.source.key for p in with_units],
            lambda i, rows: after_stage1(with_units[i], rows),
        )
    for p in to_encode:
        if not p.item.units:  # text: no stage 1
            after_stage1(p, None)
    encode_items(
        encoders.second,
        [second for _, second in staged],
        [p.source.key for p, _ in staged],
        lambda i, vector: finish.done(staged[i][0], vector),
    )


def _embed_all(
    config: RunConfig,
    stages: ModalityStages,
    encoders: Encoders,
    writer: store.EmbeddingWriter,
    sources: Iterable[Source],
    finish: _Finisher,
    stop,
    host_budget: int | None = None,
) -> None:
    window_items = max(1, min(stages.window_items or WINDOW_ITEMS, config.flush_every))
    pacer = encoders.pacer
    overlap = pacer.tower.device.type != "cpu" or OVERLAP_ON_CPU
    windows = prepared_stream(
        stages,
        sources,
        config.workers,
        window_items,
        lookup=writer.find_reusable if config.resume else None,
        overlap=overlap,
        enough_work=lambda units, work: pacer.enough_work(units, work, WINDOW_SECONDS),
        host_budget=host_budget,
    )
    try:
        for window in windows:
            stop.check()
            to_encode = []
            for p in window:
                if p.reuse is not None:
                    finish.reused(p)
                elif p.error is not None:
                    finish.failed(p.error)
                else:
                    to_encode.append(p)
            _encode_window(stages, encoders, to_encode, finish)
            # Let this window's prepared tensors go now: the loop variable would hold them while the next
            # window decodes (measured: ~150 MB of pixels at a 100-item window of 70-token images).
            window.clear()
            to_encode.clear()
    except _StopAtFirstFailure:
        finish.result.stopped_at_first_failure = True
        finish.reporter.note("stopped at the first failure (--on-error stop); items done so far are written")


def plan(config: RunConfig, reporter: Reporter | None = None, stdin=None) -> dict:
    """Dry run: device, memory, buckets and the chunk each would get now. Loads the towers (for their cost models)
    but encodes nothing."""
    reporter = reporter or Reporter.silent()
    skipped: Counter = Counter()
    found = _find(config, stdin, skipped)
    sources = list(require_input(found, config.inputs, config.modality, config.ext, skipped, config.dataset))
    loaded = _load(config)
    encoders = Encoders.build(config, loaded)
    lengths: dict[Engine, list[int]] = {engine: [] for engine in encoders.engines}
    failures = []
    with capture.Capture(reporter):
        for window in prepared_stream(loaded.stages, sources, config.workers, host_budget=loaded.host.decode):
            for p in window:
                if p.error:
                    failures.append(p.error.as_record())
                    continue
                if encoders.first is not None:
                    lengths[encoders.first] += [u.length for u in p.item.units]
                if encoders.second is not None:  # stage 2: one sequence per item
                    lengths[encoders.second].append(len(p.item.sequence.input_ids))
    free, total = memory.device_memory(loaded.device)
    buckets = []
    for stage, engine in enumerate(encoders.engines, start=1):
        for group in engine.grouping()(lengths[engine]):
            chunk_plan = engine.plan(group.length)
            bucket = {"length": group.length, "units": len(group.indices)}
            if encoders.second is not None:
                bucket["stage"] = stage if encoders.first is not None else 2
            buckets.append({**bucket, "cost_per_unit": chunk_plan.cost_per_unit, "chunk": chunk_plan.chunk})
    result = {
        "type": "plan",
        "modality": str(config.modality),
        "space": str(loaded.stages.space),
        "device": str(loaded.device),
        "dtype": dtype_name(loaded.dtype),
        "dtype_reason": loaded.dtype_reason,
        "free_memory": free,
        "total_memory": total,
        "budget": memory.budget(free, total, loaded.budget_spec),
        "host": loaded.host.as_dict(),
        "items": len(sources),
        "skipped": sum(skipped.values()),
        "units": sum(len(v) for v in lengths.values()),
        "buckets": buckets,
        "failures": failures,
        "chunking": (
            f"fixed at --batch-size {config.batch_size} (under each bucket's memory cap)"
            if config.batch_size
            else "tuned at run time: the fastest measured size within each bucket's memory cap"
        ),
    }
    reporter.show_plan(result)
    return result


def _find(config: RunConfig, stdin=None, skipped: Counter | None = None) -> Iterator[Source]:
    """The find stage: files, folders, stdin lists, tar shards, parquet files and a --dataset; for text, the
    lines of files (or stdin), or whole files."""
    if config.modality == "text":
        return iter_text_sources(config.inputs, stdin, config.per_file, config.ext, skipped)
    return iter_sources(
        config.inputs, config.modality, stdin, config.null_separated, config.ext, skipped, config.collection
    )
