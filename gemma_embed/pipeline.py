"""The only place that knows the order of the stages.

sources -> decode -> prepare -> batch -> plan -> encode -> write -> report

Items are taken in windows: decoding and preprocessing of a window run in worker threads, then the units of
every item in the window are grouped (exact patch-count buckets, or ragged groups), encoded in planned chunks,
regrouped per item, and written in input order.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from gemma_embed import memory
from gemma_embed.batching import exact_buckets, ragged_groups
from gemma_embed.config import RunConfig
from gemma_embed.engine import Engine
from gemma_embed.errors import ItemError, UsageError
from gemma_embed.media import file_facts
from gemma_embed.modalities import Modality, build_modality
from gemma_embed.models.base import PreparedItem, Tower, Unit
from gemma_embed.progress import Reporter
from gemma_embed.sources import Source, iter_sources
from gemma_embed.store import EmbeddingWriter, check_output_path

WINDOW_ITEMS = 256
RAGGED_MAX_PADDING = 0.25


# --------------------------------------------------------------------------------------- device and dtype


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UsageError(f"--device {name!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine")
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


def decode_and_prepare(modality: Modality, source: Source) -> Prepared:
    if source.error:
        return Prepared(source, error=ItemError(source.key, "find", source.error, "FileNotFoundError"))
    stage = "decode"
    try:
        facts = file_facts(source.path)
        decoded = modality.decode(source.path)
        stage = "prepare"
        item = modality.preparer.prepare(decoded)
    except Exception as exc:  # noqa: BLE001 - a bad file is a record, never the end of the run
        if isinstance(exc, IsADirectoryError):
            exc = ValueError("is a directory, not a media file")
        return Prepared(source, error=ItemError.wrap(source.key, stage, exc))
    item.meta = {"path": source.path, **facts, **item.meta}
    return Prepared(source, item=item)


def prepared_stream(modality: Modality, sources: Iterable[Source], workers: int) -> Iterator[list[Prepared]]:
    """Windows of prepared items, in input order; decoding runs in threads ahead of the consumer."""
    it = iter(sources)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="decode") as pool:
        while window := list(itertools.islice(it, modality.window_items or WINDOW_ITEMS)):
            yield list(pool.map(lambda s: decode_and_prepare(modality, s), window))


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


def run(config: RunConfig, reporter: Reporter, stdin=None) -> int:
    """Embed every item; returns the exit code (0 all written, 1 some failed)."""
    from gemma_embed.models.loading import resolve_checkpoint

    check_output_path(config.output, config.overwrite)
    budget_spec = _budget_spec(config)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    checkpoint = resolve_checkpoint(config.model, config.revision)
    modality = build_modality(config, checkpoint, device, dtype)
    engine = Engine(modality.tower, config.space, budget_spec, config.batch_size, reporter)
    writer = EmbeddingWriter(config.output, _header(config, checkpoint, modality, device, dtype),
                             config.output_dtype)
    sources = list(iter_sources(config.inputs, config.modality, stdin, config.null_separated))
    reporter.start(f"{config.modality}", total=len(sources))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    stopped = False
    for window in prepared_stream(modality, sources, config.workers):
        results = encode_window(engine, window)
        for p, rows in zip(window, results, strict=True):
            error = p.error or (rows if isinstance(rows, ItemError) else None)
            if error is not None:
                reporter.item_failed(error)
                if config.on_error == "stop":
                    stopped = True
                    break
                continue
            pooled = pool_rows(rows, config.pool, p.item.rows_per_unit)
            writer.add(p.source.key, pooled, p.item.meta)
            reporter.item_done(p.source.key, int(pooled.shape[0]))
        if stopped:
            reporter.note("stopped at the first failure (--on-error stop); items done so far are written")
            break
    out = writer.close()
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    reporter.finish({"output": str(out), "items": len(writer), "failures": reporter.failures,
                     "peak_device_memory": peak, "oom_backoffs": engine.backoffs,
                     "device": str(device), "dtype": str(dtype).removeprefix("torch.")})
    return 1 if reporter.failed else 0


def _budget_spec(config: RunConfig) -> memory.BudgetSpec:
    try:
        return memory.parse_budget(config.memory_budget)
    except ValueError as exc:
        raise UsageError(f"--memory-budget: {exc}") from exc


def plan(config: RunConfig, reporter: Reporter, stdin=None) -> dict:
    """Dry run: device, memory, buckets and the chunk each would get now. Loads the tower (for its cost model)
    but encodes nothing."""
    from gemma_embed.models.loading import resolve_checkpoint

    budget_spec = _budget_spec(config)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    checkpoint = resolve_checkpoint(config.model, config.revision)
    modality = build_modality(config, checkpoint, device, dtype)
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
        buckets.append({"length": group.length, "units": len(group.indices),
                        "cost_per_unit": chunk_plan.cost_per_unit, "chunk": chunk_plan.chunk})
    result = {"type": "plan", "modality": config.modality, "device": str(device),
              "dtype": str(dtype).removeprefix("torch."), "free_memory": free, "total_memory": total,
              "budget": memory.budget(free, total, budget_spec), "items": len(sources), "units": len(lengths),
              "buckets": buckets, "failures": failures}
    reporter.show_plan(result)
    return result
