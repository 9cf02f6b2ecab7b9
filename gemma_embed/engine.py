"""Encode stage: group the units of prepared items, run each group on the device in memory-planned batches
with out-of-memory back-off, and give every item its rows back.

Batches are sized in work (the units' padded length summed: tokens, patches, mel frames), not in a count: a
batch holds `work // length` units of its group's length, at most what the memory plan admits at that length, and
the work per batch is tuned once per stage (tuning.py). A group is one exact length (vision) or one rung of the
padding ladder (text, audio: batching.padded_length), so a unit computes at the same length in any batch."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gemma_embed import numerics
from gemma_embed.batching import Group, exact_buckets, padded_buckets, padded_length
from gemma_embed.cpu_threads import CpuThreads
from gemma_embed.device import DeviceOps
from gemma_embed.errors import DeviceError, ItemError
from gemma_embed.memory import allocator, planner
from gemma_embed.models.base import PreparedItem, Tower, Unit
from gemma_embed.sizes import human_bytes
from gemma_embed.tuned_sizes import TunedSizes, machine_key, tower_key
from gemma_embed.tuning import CPU_START, BatchCut, BatchTuner

ItemRows = torch.Tensor | ItemError  # an item's (or unit's) rows on the CPU, or why it has none
RowsCallback = Callable[[int, ItemRows], None]

# A decode window holds at least this many batches' work: each group of a window (one exact length, or one rung of
# the padding ladder) ends in a short remainder batch, and ragged units spread over many rungs. A unit's padding is
# its rung's whatever the window (batching.padded_length), so a larger window only saves batches. Computed with
# batching.padded_buckets over the token lengths of the text benchmark's 600 mixed lines (bench_text.py, the tiny
# tokenizer, 4096-token batches): 68 batches with windows of 4 batches' tokens, 25 with 16 (as with the whole corpus
# in one window; 12 would hold it), 8.0% padding in both. A prepared text or clip is small; an image's pixels are
# not.
WINDOW_BATCHES = {"exact": 4, "ragged": 16}


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
    # MPS and some CPU allocators raise a plain RuntimeError; cuBLAS says so when it cannot get its workspace.
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "CUBLAS_STATUS_ALLOC_FAILED" in text)


def is_fatal_device_error(exc: BaseException) -> bool:
    """A CUDA error that outlives the chunk (illegal address, device-side assert, launch failure): the context is
    broken and every later chunk would fail too. torch raises `torch.AcceleratorError` for these (a RuntimeError
    with "CUDA error: ..." in older torch)."""
    if is_out_of_memory(exc):
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return isinstance(exc, RuntimeError) and ("CUDA error" in str(exc) or "device-side assert" in str(exc))


# The cost scale learns only from chunks whose modelled transient is at least this big. Fixed overheads a chunk
# can add to the measured peak (cuBLAS/cuDNN workspaces: 32 MiB a handle on Hopper; allocator rounding to 2 MiB
# blocks) then raise the scale by at most ~12%, instead of multiplying it for good from a tiny chunk.
MIN_MEASURABLE_COST = 256 * 2**20
SAVE_SPACING = 20  # the tuner's state is saved at most once per 20 times a save's duration: at most 5% of the run


class Engine:
    def __init__(
        self,
        tower: Tower,
        space: str,
        budget_spec: planner.BudgetSpec = planner.BudgetSpec(),
        batch_cap: int | None = None,
        reporter=None,
        should_stop=None,
        device_ops: DeviceOps | None = None,
        cpu_threads: CpuThreads | None = None,
        tuned_sizes: TunedSizes | None = None,
    ):
        self.tower = tower
        self.space = space
        self.budget_spec = budget_spec
        self.batch_cap = batch_cap
        self.reporter = reporter
        # The device's memory numbers, peaks and cache; a test passes a fake device here.
        self.device_ops = device_ops or DeviceOps.for_device(tower.device)
        self.cost_scale = 1.0  # raised when a device measures more than the model predicts
        self.measured_chunks = 0
        # An explicit --batch-size is obeyed (under the memory cap); otherwise the work per batch is tuned for speed,
        # from a size that is fast on its own: the memory plan's on an accelerator, CPU_START (or less) on a CPU.
        unit = getattr(tower, "length_unit", "units")
        start = CPU_START if tower.device.type == "cpu" else None
        self.tuner = BatchTuner(start=start, unit=unit) if batch_cap is None else None
        # The tuner's state kept across runs on this machine and tower (--tuning-cache): saved when a pair or a
        # decision is added, at most once per SAVE_SPACING times a save's own duration (a cache, never the cost).
        self.tuned_sizes = tuned_sizes if self.tuner is not None else None
        self._tuned_key = ""
        self._saved: tuple = ()
        self._next_save = 0.0
        if self.tuned_sizes is not None and self.tuner is not None:
            self._tuned_key = f"{machine_key(tower.device)} | {tower_key(tower)} | {space}"
            state = self.tuned_sizes.load(self._tuned_key)
            if state is not None and self.tuner.resume(state, str(self.tuned_sizes.where)):
                self._saved = self.tuner.progress()
        self.backoffs = 0
        # On a CPU: the forwards' thread count, which follows the cores other work leaves (shared by a command's
        # engines); a change of it is a change of conditions for the tuner's comparison under way.
        self.cpu_threads = cpu_threads
        self._thread_changes = 0
        self.should_stop = should_stop or (lambda: None)  # raises to stop between chunks
        self.work_done = 0  # units' length encoded, after the first chunk
        self.work_seconds = 0.0
        self.real_work = 0  # every batch's units' lengths summed, and the same at the length the batch computes at
        self.padded_work = 0
        self._warm = False
        self._warned = False  # the budget-below-one-unit warning was given
        self._peak = 0  # the run's peak allocated device memory so far (peaks are reset per chunk)
        self.device_ops.reset_peak()

    def plan(self, length: int) -> ChunkPlan:
        """Chunk size for units of this length, from the device's memory as it is now."""
        free, total = self.device_ops.memory()
        cost = int(self.tower.unit_cost(length) * self.cost_scale)
        budget = planner.budget(free, total, self.budget_spec)
        return ChunkPlan(length, cost, free, total, budget, planner.chunk_size(cost, budget, self.batch_cap))

    def grouping(self) -> Callable[[list[int]], list[Group]]:
        """How units may share a batch: equal lengths only (vision), or equal rungs of the padding ladder (text,
        audio: batching.padded_length), so no unit's bytes depend on its batch."""
        return exact_buckets if self.tower.grouping == "exact" else padded_buckets

    def padding_share(self) -> float:
        """The share of the work computed so far that was padding."""
        return 1.0 - self.real_work / self.padded_work if self.padded_work else 0.0

    def chunking(self) -> dict:
        """The summary's `chunking` for this stage: the tuner's choice and why (or the fixed --batch-size), and
        the share of the computed work that was padding."""
        if self.tuner is None:
            reason = f"fixed by --batch-size {self.batch_cap} (under the memory cap)"
            report: dict = {"fixed": self.batch_cap, "reason": reason}
        else:
            report = self.tuner.report()
        if self.tower.grouping != "exact":
            unit = getattr(self.tower, "length_unit", "units")
            report["padding"] = f"{100 * self.padding_share():.1f}% of the {unit} computed"
        return report

    def peak_device_memory(self) -> int | None:
        """The most device memory live tensors held at any point of the run (weights included); None where the
        device keeps no statistics."""
        now = self.device_ops.peak()
        return None if now is None else max(self._peak, now)

    def _encode(self, batch: list[Unit]) -> list[torch.Tensor]:
        """One forward; each unit's rows on the host. The output crosses to the host in one copy and is split
        there."""
        ops = self.device_ops
        self._peak = max(self._peak, ops.peak() or 0)
        ops.reset_peak()
        before = ops.allocated()
        # On the CPU the forward's activations are host memory: reused from the heap, not faulted in
        # (memory/allocator.py).
        heap = allocator.heap_only() if self.tower.device.type == "cpu" else contextlib.nullcontext()
        # Kernels aligned so that the thread count (which follows the machine's load) never changes a byte.
        with heap, torch.inference_mode(), numerics.aligned(self.tower.device):
            on_device = self.tower.encode(batch, self.space)
            rows = on_device.to("cpu")
            del on_device
        if before is not None:
            self._learn_cost(batch, before)
        return list(torch.split(rows, [u.rows for u in batch]))

    def _learn_cost(self, batch: list[Unit], before: int) -> None:
        """Raise the cost scale when a chunk's measured transient exceeds the model's.

        The transient is the peak less what was allocated before the chunk and less what stays allocated after it
        (workspaces and caches a first call creates). The run's first chunk is skipped (one-off allocations), and
        so are chunks too small for the model's number to be measured against fixed overheads."""
        ops = self.device_ops
        self.measured_chunks += 1
        if self.measured_chunks == 1:
            return
        modelled = sum(self.tower.unit_cost(u.length) for u in batch)
        if modelled < MIN_MEASURABLE_COST:
            return
        transient = ops.peak() - max(before, ops.allocated())
        self.cost_scale = max(self.cost_scale, transient / modelled)

    def _release_cache(self) -> None:
        """Called only once the failed chunk's exception is gone: its traceback holds the chunk's activations,
        and releasing the cache while they are alive frees nothing."""
        self.device_ops.release_cache()

    def _device_failed(self, exc: BaseException) -> DeviceError:
        return DeviceError(
            f"{self.tower.device}: {' '.join(str(exc).split()) or type(exc).__name__} "
            f"(a device error that persists: the run stops; items already saved are kept, --resume finishes the run)"
        )

    def run(self, units: list[Unit], group: Group, keys: list[str], on_rows: RowsCallback) -> None:
        """Encode the group's units in batches of the tuned work (or --batch-size), each at most what the memory
        plan admits at the group's length. After every batch, `on_rows(index, rows)`
        receives each unit's rows on the CPU, or its failure, so finished items can leave at once."""
        if self.reporter:
            plan = self.plan(group.length)
            self.reporter.chunk_planned(plan, len(group.indices))
            self._warn_if_budget_below_one_unit(plan)
        indices = group.indices
        backoff: int | None = None  # after an out-of-memory error: the work a batch of this group may hold
        position = 0
        while position < len(indices):
            self.should_stop()
            head = group.length  # every unit computes at it: equal (exact) or padded to its rung (ragged)
            # One cut, which the tuner also reads to tell the sizes that would have cut this batch alike.
            cut = BatchCut(length=max(1, head), memory_rows=self._memory_rows(head, backoff),
                           remaining=len(indices) - position)  # fmt: skip
            target = self.tuner.size(cut.memory_rows * cut.length) if self.tuner else None
            end = position + (cut.rows_at(target) if target is not None else min(cut.memory_rows, cut.remaining))
            batch_ix = indices[position:end]
            batch = [units[i] for i in batch_ix]
            out_of_memory = isolate = False
            failure: ItemError | None = None
            self._set_threads()
            if len(batch) == 1 and (beyond := self._beyond_memory(batch[0], keys[batch_ix[0]])) is not None:
                position = end
                on_rows(batch_ix[0], beyond)
                continue
            try:
                started = time.perf_counter()
                rows_out = self._encode(batch)
                self._measured(batch, time.perf_counter() - started, target, cut)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a record, a retry or a stop
                if is_fatal_device_error(exc):
                    raise self._device_failed(exc) from exc
                if is_out_of_memory(exc) and len(batch) > 1:
                    out_of_memory = True
                elif len(batch) > 1:
                    isolate = True  # find the unit that fails so the others still get encoded
                else:
                    failure = ItemError.wrap(keys[batch_ix[0]], "encode", exc)
            # Past the handler the exception and its traceback are gone, and with them the failed batch's
            # activations: only now can the allocator's cache give that memory back.
            if out_of_memory:
                work = len(batch) * head
                backoff = work // 2
                if self.tuner:
                    self.tuner.limit(work)
                self.backoffs += 1
                self._release_cache()
                if self.reporter:
                    retry = max(1, backoff // max(1, head))
                    self.reporter.note(f"out of memory at chunk {len(batch)}: retrying with chunk {retry}")
                continue
            if isolate:
                rows_out = [self._run_single(units, i, keys) for i in batch_ix]
            elif failure is not None:
                rows_out = [failure]
                self._release_cache()
            position = end
            for i, r in zip(batch_ix, rows_out, strict=True):
                on_rows(i, r)
        # A back-off holds for the rest of this group only: the next group plans again from free memory.

    def _set_threads(self) -> None:
        if self.cpu_threads is None:
            return
        self.cpu_threads.before_batch()
        if self.cpu_threads.changes != self._thread_changes:
            self._thread_changes = self.cpu_threads.changes
            if self.tuner:
                self.tuner.conditions_changed()

    def _memory_rows(self, length: int, backoff: int | None) -> int:
        """Units of this length a batch may hold: the memory plan's (and --batch-size's), and after an
        out-of-memory error no more than its back-off."""
        rows = self.plan(length).chunk
        return rows if backoff is None else min(rows, max(1, backoff // max(1, length)))

    def _warn_if_budget_below_one_unit(self, plan: ChunkPlan) -> None:
        """An explicit --memory-budget smaller than one unit cannot be kept: chunks of 1 run over it. Say so
        once, with the cost, rather than silently running at chunk 1."""
        if self.budget_spec.explicit and plan.cost_per_unit > plan.budget and not self._warned:
            self._warned = True
            self.reporter.warning(
                f"--memory-budget allows {human_bytes(plan.budget)}, but one unit of length "
                f"{plan.length} needs {human_bytes(plan.cost_per_unit)}: units run one at a time, over "
                f"the budget"
            )

    def _measured(self, batch: list[Unit], seconds: float, target: int | None, cut: BatchCut) -> None:
        """Feed one batch's time to the tuner and to the rate that sizes decode windows. `cut`: how the batch was
        cut from its group (which tuned sizes would have cut the same batch)."""
        work = sum(u.length for u in batch)
        longest = max(u.length for u in batch)
        padded = len(batch) * (longest if self.tower.grouping == "exact" else padded_length(longest))
        self.real_work += work
        self.padded_work += padded
        if self.tuner:
            # A batch speaks for the size it was cut for when it holds at least half of it: a group's short last
            # batch does not.
            self.tuner.record(target, work, seconds, full=2 * padded >= target, cut=cut)
            self._keep_tuning()
        if self._warm:  # the first chunk pays one-off costs (allocator, thread pools, kernels)
            self.work_done += work
            self.work_seconds += seconds
        self._warm = True

    def _keep_tuning(self) -> None:
        if self.tuned_sizes is None or self.tuner is None or self.tuner.progress() == self._saved:
            return
        now = time.monotonic()
        if now < self._next_save:
            return
        self.tuned_sizes.save(self._tuned_key, self.tuner.state())
        self._saved = self.tuner.progress()
        self._next_save = now + SAVE_SPACING * (time.monotonic() - now)

    def work_per_second(self) -> float:
        """Measured encode rate in units' length (patches, frames) per second; 0 before it is known."""
        return self.work_done / self.work_seconds if self.work_seconds > 0 else 0.0

    def enough_work(self, units: int, work: int, seconds: float, early_first: bool = True) -> bool:
        """Whether a window of `units` units and `work` summed length keeps the device busy for about `seconds` at
        the measured rate, and fills `WINDOW_BATCHES` batches of the size wanted next (the tuned work, or
        --batch-size units). With `early_first`, until the first batch has run one batch is enough: the first
        records then leave after one batch's encode instead of a whole window's (128 HD images on a medium tower
        waited 15.0 s of a 34.6 s run for 16 batches before anything was written); the windows grow to
        WINDOW_BATCHES after it. A caller that gets every result at once (`Embedder.encode`) gains nothing from
        an early first record, and ragged units of one batch's work spread over the ladder's rungs: on 600 mixed
        lines, 8,192 tokens over 20 rungs made 20 small batches (2,400 tokens/s against 3,800 for a whole window's),
        43 batches a run against 24, though the run's wall moved by less than the machine's noise (bench/README.md,
        "Page faults in text forwards")."""
        full_window = self._warm or not early_first
        batches = WINDOW_BATCHES["exact" if self.tower.grouping == "exact" else "ragged"] if full_window else 1
        if self.tuner is None:
            full = units >= batches * (self.batch_cap or 1)
        else:
            full = work >= batches * (self.tuner.current or self.tuner.start or 1)
        return full and work >= self.work_per_second() * seconds

    def _beyond_memory(self, unit: Unit, key: str) -> ItemError | None:
        """The failure of a unit that alone needs more memory than the device has free (by the tower's cost
        model), before it is tried: a text of 30 000 tokens from a checkpoint that declares no max_seq_length asked
        a 2-core host for 25 GB, got it from an overcommitting kernel and ran for 97 s at 22 GB resident."""
        free, _ = self.device_ops.memory()
        cost = int(self.tower.unit_cost(unit.length) * self.cost_scale)
        if cost <= free:
            return None
        unit_name = getattr(self.tower, "length_unit", "units")
        return ItemError(
            key,
            "encode",
            f"needs about {human_bytes(cost)} of {self.tower.device} memory to encode alone ({unit.length} "
            f"{unit_name}), more than the {human_bytes(free)} free: not encoded"
            + (" (--max-text-bytes cuts texts shorter)" if unit_name == "tokens" else ""),
            "too-large",
        )

    def _run_single(self, units: list[Unit], i: int, keys: list[str]) -> torch.Tensor | ItemError:
        if (beyond := self._beyond_memory(units[i], keys[i])) is not None:
            return beyond
        failure = None
        try:
            return self._encode([units[i]])[0]
        except Exception as exc:  # noqa: BLE001
            if is_fatal_device_error(exc):
                raise self._device_failed(exc) from exc
            failure = ItemError.wrap(keys[i], "encode", exc)
        self._release_cache()  # outside the handler, as in `run`
        return failure


def encode_items(
    engine: Engine, items: list[PreparedItem], keys: list[str], on_item: Callable[[int, ItemRows], None]
) -> None:
    """Encode every unit of `items`, batched across items by the engine's grouping; `on_item(index, rows)`
    gets each item's rows (its units' rows in order, concatenated) or its failure as soon as its last unit
    is done, not when the whole window is."""
    units: list[Unit] = []
    unit_keys: list[str] = []
    for index, item in enumerate(items):
        for unit in item.units:
            unit.item = index
            units.append(unit)
            unit_keys.append(keys[index])
    remaining = [len(item.units) for item in items]
    collected: list[dict[int, ItemRows]] = [{} for _ in items]

    def on_rows(unit_index: int, rows: ItemRows) -> None:
        item = units[unit_index].item
        collected[item][unit_index] = rows
        remaining[item] -= 1
        if remaining[item] == 0:
            parts = [collected[item][i] for i in sorted(collected[item])]
            collected[item] = {}
            failed = next((r for r in parts if isinstance(r, ItemError)), None)
            on_item(item, failed if failed is not None else torch.cat(parts))

    for index, count in enumerate(remaining):
        if count == 0:  # nothing this stage could encode: never silently dropped
            on_item(index, ItemError(keys[index], "prepare", "the item gives nothing to encode", "unusable"))
    for group in engine.grouping()([u.length for u in units]):
        engine.run(units, group, unit_keys, on_rows)


# A later stage's input for one item, from the item and its rows from the stage before (ValueError: cannot be formed).
Feed = Callable[[PreparedItem, torch.Tensor], PreparedItem]


def encode_chain(
    engines: list[Engine],
    feeds: list[Feed | None],
    items: list[PreparedItem],
    keys: list[str],
    on_item: Callable[[int, ItemRows], None],
) -> None:
    """Every item through a chain of stages: stage 0 encodes the items' own units; each later stage `s` encodes
    `feeds[s](item, rows of stage s-1)`. `on_item(index, rows)` gets an item's last-stage rows, or its failure at
    whichever stage it failed, as soon as it is known; items of a window are batched together at every stage."""
    current = dict(enumerate(items))  # item index -> its input to the stage being run
    for stage, engine in enumerate(engines):
        last = stage == len(engines) - 1
        order = sorted(current)
        following: dict[int, PreparedItem] = {}

        def after(n: int, rows: ItemRows, order=order, following=following, last=last, stage=stage) -> None:
            index = order[n]
            if last or isinstance(rows, ItemError):
                on_item(index, rows)
                return
            try:
                following[index] = feeds[stage + 1](items[index], rows)
            except ValueError as exc:
                on_item(index, ItemError.wrap(keys[index], "prepare", exc))

        encode_items(engine, [current[i] for i in order], [keys[i] for i in order], after)
        current = following


def encode_chain_list(
    engines: list[Engine], feeds: list[Feed | None], items: list[PreparedItem], keys: list[str]
) -> list[ItemRows]:
    """`encode_chain`, collected: each item's rows (or failure) in item order."""
    results: list = [None] * len(items)
    encode_chain(engines, feeds, items, keys, results.__setitem__)
    return results
