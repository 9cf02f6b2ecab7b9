"""Encode stage: group the units of prepared items, run each group on the device in memory-planned chunks
with out-of-memory back-off, and give every item its rows back."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gemma_embed import memory
from gemma_embed.batching import Group, exact_buckets, ragged_groups
from gemma_embed.errors import ItemError
from gemma_embed.models.base import PreparedItem, Tower, Unit
from gemma_embed.tuning import ChunkTuner

# Ragged groups (audio) close when padding them to their longest unit would waste more than this share.
RAGGED_MAX_PADDING = 0.25


@dataclass(frozen=True)
class ChunkPlan:
    length: int
    cost_per_unit: int
    free: int
    total: int
    budget: int
    chunk: int


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    # MPS and some CPU allocators raise a plain RuntimeError.
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class Engine:
    def __init__(
        self,
        tower: Tower,
        space: str,
        budget_spec: memory.BudgetSpec = memory.BudgetSpec(),
        batch_cap: int | None = None,
        reporter=None,
        should_stop=None,
    ):
        self.tower = tower
        self.space = space
        self.budget_spec = budget_spec
        self.batch_cap = batch_cap
        self.reporter = reporter
        self.cost_scale = 1.0  # raised when a device measures more than the model predicts
        # An explicit --batch-size is obeyed (under the memory cap); otherwise the chunk is tuned for speed.
        self.tuner = ChunkTuner() if batch_cap is None else None
        self.backoffs = 0
        self.should_stop = should_stop or (lambda: None)  # raises to stop between chunks

    def plan(self, length: int) -> ChunkPlan:
        """Chunk size for units of this length, from the device's memory as it is now."""
        free, total = memory.device_memory(self.tower.device)
        cost = int(self.tower.unit_cost(length) * self.cost_scale)
        budget = memory.budget(free, total, self.budget_spec)
        return ChunkPlan(length, cost, free, total, budget, memory.chunk_size(cost, budget, self.batch_cap))

    def grouping(self) -> Callable[[list[int]], list[Group]]:
        """How units may share a batch: equal lengths only (vision), or ragged with capped padding (audio)."""
        if self.tower.grouping == "exact":
            return exact_buckets
        return lambda lengths: ragged_groups(lengths, RAGGED_MAX_PADDING)

    def _encode(self, batch: list[Unit]) -> list[torch.Tensor]:
        device = self.tower.device
        measure = device.type == "cuda"
        if measure:
            torch.cuda.reset_peak_memory_stats(device)
            baseline = torch.cuda.memory_allocated(device)
        with torch.inference_mode():
            rows = self.tower.encode(batch, self.space)
            rows = [r.to("cpu") for r in rows]
        if measure:
            peak = torch.cuda.max_memory_allocated(device) - baseline
            modelled = sum(self.tower.unit_cost(u.length) for u in batch)
            if modelled > 0:
                # The model never shrinks, but a device that measures more than modelled raises it for good.
                self.cost_scale = max(self.cost_scale, peak / modelled)
        return rows

    def _free_cache(self) -> None:
        if self.tower.device.type == "cuda":
            torch.cuda.empty_cache()
        elif self.tower.device.type == "mps":
            torch.mps.empty_cache()

    def run(self, units: list[Unit], group: Group, keys: list[str]) -> dict[int, torch.Tensor | ItemError]:
        """Encode the group's units, planned at its (padded) length. Rows on the CPU, or the failure, per index."""
        results: dict[int, torch.Tensor | ItemError] = {}
        indices = group.indices
        plan = self.plan(group.length)
        cap = plan.chunk  # the memory cap; lowered for this group by an out-of-memory back-off
        if self.reporter:
            self.reporter.chunk_planned(plan, len(indices))
        pending = list(indices)
        while pending:
            self.should_stop()
            size = self.tuner.size(cap) if self.tuner else cap
            batch_ix = tuple(pending[:size])
            batch = [units[i] for i in batch_ix]
            try:
                started = time.perf_counter()
                rows = self._encode(batch)
                if self.tuner:
                    self.tuner.record(len(batch), sum(u.length for u in batch), time.perf_counter() - started, cap)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a record or a retry
                if is_out_of_memory(exc) and len(batch) > 1:
                    cap = max(1, len(batch) // 2)
                    size = cap
                    if self.tuner:
                        self.tuner.limit(len(batch))
                    self.backoffs += 1
                    self._free_cache()
                    if self.reporter:
                        self.reporter.note(f"out of memory at chunk {len(batch)}: retrying with chunk {size}")
                    continue
                if len(batch) > 1:
                    # Isolate the unit that fails so the others still get encoded.
                    for i in batch_ix:
                        results.update(self._run_single(units, i, keys))
                else:
                    results[batch_ix[0]] = ItemError.wrap(keys[batch_ix[0]], "encode", exc)
                    self._free_cache()
                pending = pending[len(batch_ix) :]
                continue
            for i, r in zip(batch_ix, rows, strict=True):
                results[i] = r
            pending = pending[len(batch_ix) :]
        # A back-off holds for the rest of this group only: the next group plans again from free memory.
        return results

    def _run_single(self, units: list[Unit], i: int, keys: list[str]) -> dict[int, torch.Tensor | ItemError]:
        try:
            return {i: self._encode([units[i]])[0]}
        except Exception as exc:  # noqa: BLE001
            self._free_cache()
            return {i: ItemError.wrap(keys[i], "encode", exc)}


def encode_items(engine: Engine, items: list[PreparedItem | None], keys: list[str]) -> list:
    """Rows per item (a tensor, an ItemError, or None where `items` has None), all units of all items batched
    together by the engine's grouping."""
    units: list[Unit] = []
    unit_keys: list[str] = []
    for index, item in enumerate(items):
        if item is None:
            continue
        for unit in item.units:
            unit.item = index
            units.append(unit)
            unit_keys.append(keys[index])
    unit_rows: dict[int, torch.Tensor | ItemError] = {}
    for group in engine.grouping()([u.length for u in units]):
        unit_rows.update(engine.run(units, group, unit_keys))
    per_item: list[list] = [[] for _ in items]
    for i, unit in enumerate(units):
        per_item[unit.item].append(unit_rows[i])
    results: list = []
    for item, parts in zip(items, per_item, strict=True):
        if item is None:
            results.append(None)
            continue
        failed = next((r for r in parts if isinstance(r, ItemError)), None)
        results.append(failed if failed else torch.cat(parts) if parts else None)
    return results
