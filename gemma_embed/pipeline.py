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
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from gemma_embed import capture, distributed, memory, store
from gemma_embed.config import RunConfig
from gemma_embed.decoding import WINDOW_ITEMS, Prepared, prepared_stream
from gemma_embed.device import choose_dtype, dtype_name, resolve_device, use_device
from gemma_embed.engine import Engine, encode_items
from gemma_embed.errors import DeviceError, ItemError, UsageError
from gemma_embed.interrupts import Interrupted, stop_on_signals
from gemma_embed.modalities import ModalityStages, build_modality
from gemma_embed.pooling import pool_rows
from gemma_embed.progress import Reporter
from gemma_embed.result import RunResult
from gemma_embed.sources import Source, iter_sources, require_input, skipped_note

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
    return Loaded(budget_spec, device, choice.dtype, checkpoint, stages, choice.reason)


def _header(config: RunConfig, loaded: Loaded) -> dict[str, str]:
    return store.make_header(
        model=config.model,
        revision=config.revision,
        modality=config.modality,
        space=config.space,
        pooling=config.pool,
        compute_dtype=dtype_name(loaded.dtype),
        dtype_reason=loaded.dtype_reason,
        device=str(loaded.device),
        model_type=getattr(loaded.checkpoint.config, "model_type", ""),
        preprocessing=json.dumps(loaded.stages.preparer.describe()),
    )


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
    found = iter_sources(config.inputs, config.modality, stdin, config.null_separated, config.ext, skipped)
    found = require_input(found, config.inputs, config.modality, config.ext, skipped)  # before loading a model
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
            engine = Engine(
                loaded.stages.tower,
                config.space,
                loaded.budget_spec,
                config.batch_size,
                reporter,
                should_stop=stop.check,
            )
            try:
                _embed_all(
                    config, loaded.stages, engine, writer, sources, _Finisher(config, writer, reporter, result), stop
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
    result.peak_device_memory = engine.peak_device_memory()
    result.oom_backoffs = engine.backoffs
    result.chunking = engine.tuner.report() if engine.tuner else {"fixed": config.batch_size}
    reporter.finish(result.finish())
    return result


def _count_in_background(config: RunConfig, part: distributed.Slice, reporter: Reporter) -> None:
    """Give the progress bar its total (and an ETA) without delaying the first item: a second walk of the
    inputs, in a daemon thread. Never for stdin, which can be read only once."""

    def count() -> None:
        total = sum(1 for _ in distributed.take(iter_sources(config.inputs, config.modality, ext=config.ext), part))
        reporter.set_total(total)

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


def _embed_all(
    config: RunConfig,
    stages: ModalityStages,
    engine: Engine,
    writer: store.EmbeddingWriter,
    sources: Iterable[Source],
    finish: _Finisher,
    stop,
) -> None:
    window_items = max(1, min(stages.window_items or WINDOW_ITEMS, config.flush_every))
    overlap = engine.tower.device.type != "cpu" or OVERLAP_ON_CPU
    windows = prepared_stream(
        stages,
        sources,
        config.workers,
        window_items,
        lookup=writer.find_reusable if config.resume else None,
        overlap=overlap,
        enough_work=lambda units, work: engine.enough_work(units, work, WINDOW_SECONDS),
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
            encode_items(
                engine,
                [p.item for p in to_encode],
                [p.source.key for p in to_encode],
                lambda index, rows, batch=to_encode: finish.done(batch[index], rows),
            )
            # Let this window's prepared tensors go now: the loop variable would hold them while the next
            # window decodes (measured: ~150 MB of pixels at a 100-item window of 70-token images).
            window.clear()
            to_encode.clear()
    except _StopAtFirstFailure:
        finish.result.stopped_at_first_failure = True
        finish.reporter.note("stopped at the first failure (--on-error stop); items done so far are written")


def plan(config: RunConfig, reporter: Reporter | None = None, stdin=None) -> dict:
    """Dry run: device, memory, buckets and the chunk each would get now. Loads the tower (for its cost model)
    but encodes nothing."""
    reporter = reporter or Reporter.silent()
    skipped: Counter = Counter()
    found = iter_sources(config.inputs, config.modality, stdin, config.null_separated, config.ext, skipped)
    sources = list(require_input(found, config.inputs, config.modality, config.ext, skipped))
    loaded = _load(config)
    engine = Engine(loaded.stages.tower, config.space, loaded.budget_spec, config.batch_size)
    lengths: list[int] = []
    failures = []
    with capture.Capture(reporter):
        for window in prepared_stream(loaded.stages, sources, config.workers):
            for p in window:
                if p.error:
                    failures.append(p.error.as_record())
                else:
                    lengths += [u.length for u in p.item.units]
    free, total = memory.device_memory(loaded.device)
    buckets = []
    for group in engine.grouping()(lengths):
        chunk_plan = engine.plan(group.length)
        buckets.append(
            {
                "length": group.length,
                "units": len(group.indices),
                "cost_per_unit": chunk_plan.cost_per_unit,
                "chunk": chunk_plan.chunk,
            }
        )
    result = {
        "type": "plan",
        "modality": str(config.modality),
        "device": str(loaded.device),
        "dtype": dtype_name(loaded.dtype),
        "dtype_reason": loaded.dtype_reason,
        "free_memory": free,
        "total_memory": total,
        "budget": memory.budget(free, total, loaded.budget_spec),
        "items": len(sources),
        "skipped": sum(skipped.values()),
        "units": len(lengths),
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
