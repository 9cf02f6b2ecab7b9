"""The only place that knows the order of the stages.

sources -> decode -> prepare -> batch -> plan -> encode -> write -> report

Items are taken in windows (`decoding.py`): decoding and preprocessing of a window run in worker threads, then
the units of every item in the window are grouped, encoded in planned chunks and regrouped per item
(`engine.py`), pooled (`pooling.py`) and written in input order (`store.py`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from gemma_embed import distributed, memory, store
from gemma_embed.config import RunConfig
from gemma_embed.decoding import WINDOW_ITEMS, prepared_stream
from gemma_embed.device import dtype_name, resolve_device, resolve_dtype, use_device
from gemma_embed.engine import Engine, encode_items
from gemma_embed.errors import DeviceError, ItemError, UsageError
from gemma_embed.interrupts import Interrupted, stop_on_signals
from gemma_embed.modalities import ModalityStages, build_modality
from gemma_embed.pooling import pool_rows
from gemma_embed.progress import Reporter
from gemma_embed.result import RunResult
from gemma_embed.sources import Source, iter_sources

# Decode the next window while a CPU encodes this one? Off: on the CPU they compete for the same cores
# (bench/README.md has the measurements); on an accelerator the overlap is always on.
OVERLAP_ON_CPU = False


@dataclass
class Loaded:
    budget_spec: memory.BudgetSpec
    device: torch.device
    dtype: torch.dtype
    checkpoint: object
    stages: ModalityStages


def _load(config: RunConfig, local_rank: int = 0) -> Loaded:
    """What run and plan both need before touching any input: options checked, device, checkpoint, tower."""
    from gemma_embed.models.loading import resolve_checkpoint

    try:
        config.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    budget_spec = memory.parse_budget(config.memory_budget)
    device = resolve_device(config.device, local_rank)
    use_device(device)
    dtype = resolve_dtype(config.dtype, device)
    checkpoint = resolve_checkpoint(config.model, config.revision)
    return Loaded(budget_spec, device, dtype, checkpoint, build_modality(config, checkpoint, device, dtype))


def _header(config: RunConfig, loaded: Loaded) -> dict[str, str]:
    return store.make_header(
        model=config.model,
        revision=config.revision,
        modality=config.modality,
        space=config.space,
        pooling=config.pool,
        compute_dtype=dtype_name(loaded.dtype),
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
    part = distributed.current_slice(config.num_slices, config.slice_index)
    output = part.output(config.output)
    store.check_output_path(output, config.overwrite, config.resume)
    if part.is_split:
        store.check_output_path(config.output, config.overwrite, config.resume)
        distributed.begin_slice(config.output, part)
    loaded = _load(config, part.local_rank)
    writer = store.EmbeddingWriter(
        output,
        _header(config, loaded),
        config.output_dtype,
        flush_every=config.flush_every,
        resume=config.resume,
        shard_size=config.shard_size,
    )
    sources = distributed.take(iter_sources(config.inputs, config.modality, stdin, config.null_separated), part)
    result = RunResult(device=str(loaded.device), dtype=dtype_name(loaded.dtype))
    reporter.start(config.modality if not part.is_split else f"{config.modality} [{part.index}/{part.count}]", result)
    if reporter.live and "-" not in config.inputs:
        _count_in_background(config, part, reporter)
    with stop_on_signals() as stop:
        engine = Engine(
            loaded.stages.tower, config.space, loaded.budget_spec, config.batch_size, reporter, should_stop=stop.check
        )
        try:
            _embed_all(config, loaded.stages, engine, writer, sources, reporter, result, stop)
        except Interrupted as interrupted:
            store.guarded_write(writer.flush, writer.parts)
            store.write_errors(output, result.failures)
            reporter.note(
                f"interrupted by {interrupted}: {len(writer.saved)} items are saved in {writer.parts}; "
                f"run the same command with --resume to finish"
            )
            result.interrupted, result.signum, result.items = str(interrupted), interrupted.signum, len(writer)
            reporter.finish(result.finish())
            return result
        except DeviceError:
            # The device cannot go on: keep what is done, as after an interrupt, and end the run.
            store.guarded_write(writer.flush, writer.parts)
            store.write_errors(output, result.failures)
            reporter.note(f"{len(writer.saved)} items are saved in {writer.parts}; run with --resume to finish")
            raise
    result.output = store.guarded_write(writer.close, output)
    result.items = len(writer)
    store.write_errors(output, result.failures)
    if part.is_split:
        result.output = distributed.finish_slice(config.output, part, writer.order, reporter.note) or result.output
    result.peak_device_memory = engine.peak_device_memory()
    result.oom_backoffs = engine.backoffs
    result.chunking = engine.tuner.report() if engine.tuner else {"fixed": config.batch_size}
    reporter.finish(result.finish())
    return result


def _count_in_background(config: RunConfig, part: distributed.Slice, reporter: Reporter) -> None:
    """Give the progress bar its total (and an ETA) without delaying the first item: a second walk of the
    inputs, in a daemon thread. Never for stdin, which can be read only once."""

    def count() -> None:
        total = sum(1 for _ in distributed.take(iter_sources(config.inputs, config.modality), part))
        reporter.set_total(total)

    threading.Thread(target=count, name="count-inputs", daemon=True).start()


def _embed_all(
    config: RunConfig,
    stages: ModalityStages,
    engine: Engine,
    writer: store.EmbeddingWriter,
    sources: Iterable[Source],
    reporter: Reporter,
    result: RunResult,
    stop,
) -> None:
    window_items = max(1, min(stages.window_items or WINDOW_ITEMS, config.flush_every))
    is_done = writer.is_done if config.resume else None
    overlap = engine.tower.device.type != "cpu" or OVERLAP_ON_CPU
    for window in prepared_stream(stages, sources, config.workers, window_items, is_done=is_done, overlap=overlap):
        stop.check()
        results = encode_items(engine, [p.item for p in window], [p.source.key for p in window])
        for p, rows in zip(window, results, strict=True):
            if p.already_done:
                writer.keep(p.source.key, p.source.position)
                result.item_done(0, resumed=True)
                reporter.item_done(p.source.key, 0, resumed=True)
                continue
            error = p.error or (rows if isinstance(rows, ItemError) else None)
            if error is not None:
                result.item_failed(error)
                reporter.item_failed(error)
                if config.on_error == "stop":
                    result.stopped_at_first_failure = True
                    reporter.note("stopped at the first failure (--on-error stop); items done so far are written")
                    return
                continue
            pooled = pool_rows(rows, config.pool, p.item.rows_per_unit)
            store.guarded_write(
                lambda p=p, pooled=pooled: writer.add(p.source.key, pooled, p.item.meta, p.source.position),
                writer.parts,
            )
            result.item_done(int(pooled.shape[0]))
            reporter.item_done(p.source.key, int(pooled.shape[0]))


def plan(config: RunConfig, reporter: Reporter | None = None, stdin=None) -> dict:
    """Dry run: device, memory, buckets and the chunk each would get now. Loads the tower (for its cost model)
    but encodes nothing."""
    reporter = reporter or Reporter.silent()
    loaded = _load(config)
    engine = Engine(loaded.stages.tower, config.space, loaded.budget_spec, config.batch_size)
    sources = list(iter_sources(config.inputs, config.modality, stdin, config.null_separated))
    lengths: list[int] = []
    failures = []
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
        "free_memory": free,
        "total_memory": total,
        "budget": memory.budget(free, total, loaded.budget_spec),
        "items": len(sources),
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
