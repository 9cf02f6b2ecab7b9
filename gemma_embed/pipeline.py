"""The only place that knows the order of the stages.

sources -> decode -> prepare -> batch -> plan -> encode -> write -> report

Items are taken in windows: decoding and preprocessing of a window run in worker threads, then the units of
every item in the window are grouped (exact patch-count buckets, or ragged groups), encoded in planned chunks,
regrouped per item, and written in input order.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from gemma_embed import distributed, memory
from gemma_embed.batching import exact_buckets, ragged_groups
from gemma_embed.config import RunConfig
from gemma_embed.engine import Engine
from gemma_embed.errors import ItemError, RunError, UsageError
from gemma_embed.interrupts import Interrupted, stop_on_signals
from gemma_embed.media import file_facts
from gemma_embed.modalities import Modality, build_modality
from gemma_embed.models.base import PreparedItem, Tower, Unit
from gemma_embed.progress import Reporter
from gemma_embed.sources import Source, iter_sources
from gemma_embed.store import EmbeddingWriter, check_output_path, write_errors

WINDOW_ITEMS = 256
WINDOW_BYTES = 1 << 30  # prepared tensors held per window (pixels of 1120-token images are ~31 MB each)
RAGGED_MAX_PADDING = 0.25
# Decode the next window while a CPU encodes this one? Off: on the CPU they compete for the same cores
# (bench/README.md has the measurements); on an accelerator the overlap is always on.
OVERLAP_ON_CPU = False


# --------------------------------------------------------------------------------------- device and dtype


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            # One GPU per local rank under torchrun; the current device otherwise.
            index = local_rank % torch.cuda.device_count() if local_rank else torch.cuda.current_device()
            return torch.device("cuda", index)
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UsageError(f"--device {name!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine")
    if device.type == "cuda" and device.index is None and local_rank:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {name}: MPS is not available on this machine")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _grouping(tower: Tower) -> Callable[[list[int]], list]:
    if tower.grouping == "exact":
        return exact_buckets
    return lambda lengths: ragged_groups(lengths, RAGGED_MAX_PADDING)


# ------------------------------------------------------------------------------------------------ stages


@dataclass
class Prepared:
    source: Source
    item: PreparedItem | None = None
    error: ItemError | None = None
    already_done: bool = False  # --resume: this key's rows are saved for this exact content


def decode_and_prepare(
    modality: Modality, source: Source, is_done: Callable[[str, str], bool] | None = None
) -> Prepared:
    if source.error:
        return Prepared(source, error=ItemError(source.key, "find", source.error, "FileNotFoundError"))
    stage = "decode"
    try:
        facts = file_facts(source.path)
        if is_done is not None and is_done(source.key, facts["sha256"]):
            return Prepared(source, already_done=True)
        decoded = modality.decode(source.path)
        stage = "prepare"
        item = modality.preparer.prepare(decoded)
    except Exception as exc:  # noqa: BLE001 - a bad file is a record, never the end of the run
        if isinstance(exc, PermissionError):
            exc = PermissionError(f"permission denied: {exc.strerror or exc}")
        return Prepared(source, error=ItemError.wrap(source.key, stage, exc))
    item.meta = {"path": source.path, **facts, **item.meta}
    return Prepared(source, item=item)


def prepared_nbytes(prepared: Prepared) -> int:
    if prepared.item is None:
        return 0
    return sum(t.nbytes for u in prepared.item.units for t in u.inputs.values() if hasattr(t, "nbytes"))


def prepared_stream(
    modality: Modality,
    sources: Iterable[Source],
    workers: int,
    window_items: int = WINDOW_ITEMS,
    window_bytes: int = WINDOW_BYTES,
    is_done: Callable[[str, str], bool] | None = None,
    overlap: bool = True,
) -> Iterator[list[Prepared]]:
    """Windows of prepared items, in input order, each at most `window_items` items or `window_bytes` of
    prepared tensors.

    Sources are pulled lazily. With `overlap`, worker threads keep decoding ahead while the caller encodes a
    window (the device works while the CPU decodes); how far ahead adapts to the items' size so that the work in
    flight also stays near one window's bytes. Without it (encoding on the CPU itself), the workers decode only
    the window being built: decoding beside a CPU encode steals the cores the encode's threads spin on
    (measured on 2 cores: encode 72 ms/image beside a decode thread against 35 ms alone). Memory stays flat
    however many files there are.
    """
    it = iter(sources)
    inflight: deque = deque()
    seen_items, seen_bytes = 0, 0
    window: list[Prepared] = []
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="decode") as pool:

        def top_up() -> None:
            average = seen_bytes / seen_items if seen_items else 0
            ahead = window_items if not average else int(window_bytes // max(1.0, average))
            ahead = max(2 * workers, min(window_items, ahead))
            if not overlap:
                ahead = min(ahead, window_items - len(window))
            while len(inflight) < ahead:
                source = next(it, None)
                if source is None:
                    return
                inflight.append(pool.submit(decode_and_prepare, modality, source, is_done))

        top_up()
        size = 0
        while inflight:
            prepared = inflight.popleft().result()
            nbytes = prepared_nbytes(prepared)
            seen_items, seen_bytes = seen_items + 1, seen_bytes + nbytes
            window.append(prepared)
            size += nbytes
            if len(window) >= window_items or size >= window_bytes:
                yield window
                window, size = [], 0
            top_up()
        if window:
            yield window


def pool_rows(rows: torch.Tensor, pool: str, rows_per_unit: int | None = None) -> torch.Tensor:
    """none: all rows; mean: one row (float32 mean); frame: one row per unit (video frame)."""
    if pool == "none":
        return rows
    if pool == "mean":
        return rows.float().mean(dim=0, keepdim=True)
    if pool == "frame":
        if not rows_per_unit:
            raise ValueError("--pool frame needs items made of frames")
        return rows.float().reshape(-1, rows_per_unit, rows.shape[-1]).mean(dim=1)
    raise ValueError(f"unknown pooling {pool!r}")


def encode_window(engine: Engine, prepared: list[Prepared]) -> list[torch.Tensor | ItemError | None]:
    """Rows per prepared item (None where it had already failed), all units of the window batched together."""
    units: list[Unit] = []
    keys: list[str] = []
    for index, p in enumerate(prepared):
        if p.item is None:
            continue
        for unit in p.item.units:
            unit.item = index
            units.append(unit)
            keys.append(p.source.key)
    unit_rows: dict[int, torch.Tensor | ItemError] = {}
    for group in _grouping(engine.tower)([u.length for u in units]):
        unit_rows.update(engine.run(units, group, keys))
    per_item: list[list] = [[] for _ in prepared]
    for i, unit in enumerate(units):
        per_item[unit.item].append(unit_rows[i])
    results: list[torch.Tensor | ItemError | None] = []
    for p, parts in zip(prepared, per_item, strict=True):
        if p.item is None:
            results.append(None)
            continue
        failed = next((r for r in parts if isinstance(r, ItemError)), None)
        results.append(failed if failed else torch.cat(parts) if parts else None)
    return results


# ------------------------------------------------------------------------------------------------ run


def _header(config: RunConfig, checkpoint, modality: Modality, device, dtype) -> dict[str, str]:
    return {
        "model": config.model,
        "revision": config.revision or "",
        "modality": config.modality,
        "space": config.space,
        "pooling": config.pool,
        "compute_dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "model_type": getattr(checkpoint.config, "model_type", ""),
        "preprocessing": json.dumps(modality.preparer.describe()),
    }


@dataclass
class Loaded:
    budget_spec: memory.BudgetSpec
    device: torch.device
    dtype: torch.dtype
    checkpoint: object
    modality: Modality


def _load(config: RunConfig, local_rank: int = 0) -> Loaded:
    """What run and plan both need before touching any input: options checked, device, checkpoint, tower."""
    from gemma_embed.models.loading import resolve_checkpoint

    budget_spec = _budget_spec(config)
    device = resolve_device(config.device, local_rank)
    dtype = resolve_dtype(config.dtype, device)
    checkpoint = resolve_checkpoint(config.model, config.revision)
    return Loaded(budget_spec, device, dtype, checkpoint, build_modality(config, checkpoint, device, dtype))


def run(config: RunConfig, reporter: Reporter, stdin=None) -> int:
    """Embed every item (of this process's slice); returns the exit code (0 all written, 1 some failed,
    128+signal interrupted)."""
    part = distributed.current_slice(config.num_shards, config.shard_index)
    output = distributed.slice_output(config.output, part)
    check_output_path(output, config.overwrite, config.resume)
    if part.is_split:
        check_output_path(config.output, config.overwrite, config.resume)
    loaded = _load(config, part.local_rank)
    budget_spec, device, dtype, checkpoint, modality = (
        loaded.budget_spec,
        loaded.device,
        loaded.dtype,
        loaded.checkpoint,
        loaded.modality,
    )
    writer = EmbeddingWriter(
        output,
        _header(config, checkpoint, modality, device, dtype),
        config.output_dtype,
        flush_every=config.flush_every,
        resume=config.resume,
        shard_size=config.shard_size,
    )
    sources = distributed.take(iter_sources(config.inputs, config.modality, stdin, config.null_separated), part)
    reporter.start(config.modality if not part.is_split else f"{config.modality} [{part.index}/{part.count}]")
    if reporter.live and "-" not in config.inputs:
        _count_in_background(config, part, reporter)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with stop_on_signals() as stop:
        engine = Engine(modality.tower, config.space, budget_spec, config.batch_size, reporter, should_stop=stop.check)
        try:
            _embed_all(config, modality, engine, writer, sources, reporter, stop)
        except Interrupted as interrupted:
            _save(writer.flush, writer.parts)
            write_errors(output, reporter.failures)
            reporter.note(
                f"interrupted by {interrupted}: {len(writer.saved)} items are saved in {writer.parts}; "
                f"run the same command with --resume to finish"
            )
            reporter.finish({"output": None, "interrupted": str(interrupted), "items": len(writer)})
            return 128 + interrupted.signum
    written = _save(writer.close, output)
    write_errors(output, reporter.failures)
    if part.is_split:
        written = _merge_slices(config.output, part, writer, reporter) or written
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    reporter.finish(
        {
            "output": str(written),
            "items": len(writer),
            "failures": reporter.failures,
            "peak_device_memory": peak,
            "oom_backoffs": engine.backoffs,
            "chunking": engine.tuner.report() if engine.tuner else {"fixed": config.batch_size},
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
        }
    )
    return 1 if reporter.failed else 0


def _count_in_background(config: RunConfig, part: distributed.Slice, reporter: Reporter) -> None:
    """Give the progress bar its total (and an ETA) without delaying the first item: a second walk of the
    inputs, in a daemon thread. Never for stdin, which can be read only once."""
    import threading

    def count() -> None:
        total = sum(1 for _ in distributed.take(iter_sources(config.inputs, config.modality), part))
        reporter.set_total(total)

    threading.Thread(target=count, name="count-inputs", daemon=True).start()


def _merge_slices(output, part: distributed.Slice, writer: EmbeddingWriter, reporter: Reporter):
    """Record this slice's input positions, then (rank 0 after a barrier, or whichever array task finds every
    slice done) write the index that joins all slices."""
    _save(lambda: distributed.write_manifest(writer.path, writer.order), writer.path)
    if part.torchrun:
        distributed.barrier()
        merged = distributed.merge_index(output, part.count) if part.index == 0 else None
        distributed.barrier()  # nobody exits (and lets torchrun tear the group down) before the index exists
        distributed.finish_group()
        return merged
    merged = distributed.merge_index(output, part.count)
    if merged is None:
        reporter.note(f"slice {part.index} of {part.count} done; the last slice to finish writes the index")
    return merged


def _embed_all(
    config: RunConfig,
    modality: Modality,
    engine: Engine,
    writer: EmbeddingWriter,
    sources: Iterable[Source],
    reporter: Reporter,
    stop,
) -> None:
    window_items = max(1, min(modality.window_items or WINDOW_ITEMS, config.flush_every))
    is_done = writer.is_done if config.resume else None
    overlap = engine.tower.device.type != "cpu" or OVERLAP_ON_CPU
    for window in prepared_stream(modality, sources, config.workers, window_items, is_done=is_done, overlap=overlap):
        stop.check()
        results = encode_window(engine, window)
        for p, rows in zip(window, results, strict=True):
            if p.already_done:
                writer.keep(p.source.key, p.source.position)
                reporter.item_done(p.source.key, 0, resumed=True)
                continue
            error = p.error or (rows if isinstance(rows, ItemError) else None)
            if error is not None:
                reporter.item_failed(error)
                if config.on_error == "stop":
                    reporter.note("stopped at the first failure (--on-error stop); items done so far are written")
                    return
                continue
            pooled = pool_rows(rows, config.pool, p.item.rows_per_unit)
            _save(
                lambda p=p, pooled=pooled: writer.add(p.source.key, pooled, p.item.meta, p.source.position),
                writer.parts,
            )
            reporter.item_done(p.source.key, int(pooled.shape[0]))


def _save(action: Callable, where):
    """Run a write; a full disk or unwritable folder ends the run with one clear line (parts stay intact)."""
    try:
        return action()
    except OSError as exc:
        raise RunError(
            f"{where}: cannot write: {exc.strerror or exc}; finished parts are kept, free space "
            f"and run again with --resume"
        ) from exc


def _budget_spec(config: RunConfig) -> memory.BudgetSpec:
    try:
        return memory.parse_budget(config.memory_budget)
    except ValueError as exc:
        raise UsageError(f"--memory-budget: {exc}") from exc


def plan(config: RunConfig, reporter: Reporter, stdin=None) -> dict:
    """Dry run: device, memory, buckets and the chunk each would get now. Loads the tower (for its cost model)
    but encodes nothing."""
    loaded = _load(config)
    budget_spec, device, dtype, modality = loaded.budget_spec, loaded.device, loaded.dtype, loaded.modality
    engine = Engine(modality.tower, config.space, budget_spec, config.batch_size)
    sources = list(iter_sources(config.inputs, config.modality, stdin, config.null_separated))
    lengths: list[int] = []
    failures = []
    for window in prepared_stream(modality, sources, config.workers):
        for p in window:
            if p.error:
                failures.append(p.error.as_record())
            else:
                lengths += [u.length for u in p.item.units]
    free, total = memory.device_memory(device)
    buckets = []
    for group in _grouping(modality.tower)(lengths):
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
        "modality": config.modality,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "free_memory": free,
        "total_memory": total,
        "budget": memory.budget(free, total, budget_spec),
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
