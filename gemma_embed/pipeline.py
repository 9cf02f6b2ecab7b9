"""The only place that knows the order of a run: sources -> runner -> writer -> report.

    find (sources/) -> decode, prepare, encode, pool (a `runners.Runner`: this process's Embedder, a slice of the
    input, or a Ray cluster) -> write (a `writers.Writer`: the safetensors output with its parts and --resume)
    -> report (progress.py, result.py)

Everything that can make the whole run wrong (an option, the command for this checkpoint, a missing input path, the
output path) is checked before any weight is read. A run ends one way: `_finish` saves what is done, whether the
input ran out, a signal stopped it or the device failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import Counter
from collections.abc import Iterator

from gemma_embed import capture, distributed, store
from gemma_embed.config import RunConfig, Space, python_spelling
from gemma_embed.decoding import Prepared, prepared_stream
from gemma_embed.embedder import Embedder
from gemma_embed.errors import DeviceError, ItemError, UsageError
from gemma_embed.interrupts import Interrupted, StopFlag, stop_on_signals
from gemma_embed.locations import location
from gemma_embed.memory import planner, readings
from gemma_embed.progress import Reporter
from gemma_embed.result import RunResult
from gemma_embed.runners import LocalRunner, Runner, SliceRunner
from gemma_embed.sources import Source, check_given_paths, count_sources, iter_sources, require_input, skipped_note
from gemma_embed.sources.base import row_place
from gemma_embed.sources.fetch import FetchPolicy
from gemma_embed.sources.text import iter_text_sources
from gemma_embed.writers import SafetensorsWriter, Writer, WriterFactory


def run(
    config: RunConfig,
    reporter: Reporter | None = None,
    stdin=None,
    own_process: bool = False,
    writer: WriterFactory = SafetensorsWriter,
) -> RunResult:
    """Embed every item of `config.inputs` (this process's slice of them) into `config.output`.

    Returns a `RunResult` (counts, failures, output path, chunking). A bad item is a failure record, never an
    exception; `UsageError` means the run could not start (its message names options as RunConfig's fields:
    `overwrite=True`), `RunError` that it could not write.

    The process is left alone unless `own_process` (the command line): then SIGINT, SIGTERM, SIGHUP and SIGQUIT stop
    the run at the next safe point (saving what is done), and what libraries print (Python warnings, logging, C code
    on fd 2) is captured into the items that caused it. `writer` makes the run's `writers.Writer` (default: the
    gemma-embed/1 safetensors output).
    """
    try:
        with distributed.writer_lock(config.output, config.num_slices, config.slice_index):  # one writer per output
            return _run(config, reporter, stdin, own_process, writer)
    except UsageError as exc:
        if own_process:  # the command line's words
            raise
        raise exc.reworded(python_spelling(str(exc))) from None


def _run(config: RunConfig, reporter: Reporter | None, stdin, own_process: bool, make_writer: WriterFactory):
    reporter = reporter or Reporter.silent()
    if config.prune and not config.resume:
        raise UsageError("--prune goes with --resume (it drops items of the existing output)")
    signals = stop_on_signals(immediate=True) if own_process else contextlib.nullcontext(StopFlag())
    with signals as stop:
        runner = runner_for(config, reporter, stop.check)  # before anything is read: the options go together
        store.check_output_path(runner.output, config.overwrite, config.resume)
        if runner.output != config.output:  # a slice: the joined output must not be clobbered either
            store.check_output_path(config.output, config.overwrite, config.resume)
        skipped: Counter = Counter()  # files the folder walk passes over, by extension
        waiting = "waiting for the first input"  # a list on stdin may take its time
        try:
            found = _require_input(config, stdin, skipped, deferred=runner.reads_items_itself)  # before loading a model
            runner.begin()
            waiting = "loading the model"
            reporter.loading(config.model)
            planned = runner.load()  # every usage error first, from configs; then the weights
            reporter.loaded(planned.device, planned.dtype)
        except Interrupted as interrupted:
            reporter.note(f"interrupted while {waiting}; nothing to save")
            result = RunResult(interrupted=str(interrupted), signum=interrupted.signum)
            reporter.finish(result.finish())
            return result
        stop.immediate = False  # from here on a signal stops at the next chunk, and finished items are saved
        writer = make_writer(config, runner.output, planned, reporter.warning)
        result = RunResult(device=planned.device, dtype=planned.dtype, dtype_reason=planned.dtype_reason)
        reporter.start(runner.label, result)
        if reporter.live and "-" not in config.inputs:
            _count_in_background(config, runner, reporter)
        # Library messages go to the items that cause them, not stderr (command line only: it changes the process).
        captured = capture.Capture(reporter) if own_process else None
        ending: Interrupted | DeviceError | None = None
        with captured or contextlib.nullcontext():
            try:
                sink = _Finisher(config, writer, reporter, result)
                runner.embed(runner.take(found), sink, writer.lookup(), config.flush_every, skipped)
            except _StopAtFirstFailure:
                result.stopped_at_first_failure = True
                reporter.note("stopped at the first failure (--on-error stop); items done so far are written")
            except (Interrupted, DeviceError) as stopped:
                ending = stopped
    return _finish(config, runner, writer, result, reporter, skipped, captured, ending)


def _finish(config, runner: Runner, writer: Writer, result, reporter, skipped, captured, ending) -> RunResult:
    """The one way a run ends: what is done is saved (the output, or the parts when the run stopped early), the
    failures written beside it, the result completed and reported."""
    result.skipped = sum(skipped.values())
    if ending is not None:  # a signal or the device stopped the run: keep the parts, say how to finish
        saved = writer.save()
        writer.write_errors(result.failures)
        if isinstance(ending, DeviceError):
            reporter.note(f"{saved} items are saved in {writer.where_saved()}; run with --resume to finish")
            raise ending
        if saved:
            reporter.note(
                f"interrupted by {ending}: {saved} items are saved in {writer.where_saved()}; "
                f"run the same command with --resume to finish"
            )
        else:
            reporter.note(f"interrupted by {ending} before any item finished; nothing to save")
        result.interrupted, result.signum, result.items = str(ending), ending.signum, saved
        reporter.finish(result.finish())
        return result
    if note := skipped_note(config.modality, skipped):
        reporter.note(note)
    for note in result.passed_over_notes(config.max_text_bytes):
        reporter.note(note)
    if captured is not None and captured.outside and not config.debug:
        reporter.note(f"{captured.outside} library messages outside any item were hidden (--debug shows them)")
    result.output = writer.close()
    counts = writer.counts()
    result.items, result.kept, result.pruned = counts["items"], counts["kept"], counts["pruned"]
    writer.write_errors(result.failures)
    result.output = runner.finish(writer.positions(), reporter.note) or result.output
    info = runner.info()
    result.peak_device_memory = info.peak_device_memory
    result.oom_backoffs = info.oom_backoffs
    result.chunking = info.chunking
    result.cpu_threads = info.cpu_threads
    reporter.finish(result.finish())
    return result


def runner_for(config: RunConfig, reporter=None, should_stop=None) -> Runner:
    """The runner a run's options ask for: `--ray`, a slice (--num-slices, torchrun), or this process. Nothing is
    loaded; UsageError for options that cannot go together."""
    part = distributed.current_slice(config.num_slices, config.slice_index)
    if config.ray is not None:
        from gemma_embed.ray_data import RayRunner, require_ray

        require_ray()
        if part.is_split:
            raise UsageError("--ray runs the whole input as one Ray job: leave out --num-slices (and torchrun)")
        return RayRunner(config, reporter, should_stop)
    if part.is_split:
        return SliceRunner(config, part, reporter, should_stop)
    return LocalRunner(config, reporter, should_stop)


def _count_in_background(config: RunConfig, runner: Runner, reporter: Reporter) -> None:
    """Give the progress bar its total (and an ETA) without delaying the first item: a second, cheap walk of
    the inputs (tar headers, parquet footers), in a daemon thread. Never for stdin, which can be read only once,
    nor for inputs on other machines when the runner's workers read the items (counting would read here what
    they read: a remote shard's headers come with its members, a read-ahead block at a time)."""
    if runner.reads_items_itself and not all(location(given).is_local for given in config.inputs):
        return

    def count() -> None:
        if config.modality == "text":  # lines: read the files once more
            total = sum(1 for _ in _find(config))
        else:
            total = count_sources(config.inputs, config.modality, config.ext, config.collection)
        if total is not None:
            reporter.set_total(runner.share(total))

    threading.Thread(target=count, name="count-inputs", daemon=True).start()


class _StopAtFirstFailure(Exception):
    """--on-error stop: a failure ended the run; what is done is written."""


class _Finisher:
    """The last stages for one item (the runner's sink): hand its pooled rows to the writer, report it, count
    it."""

    def __init__(self, config: RunConfig, writer: Writer, reporter: Reporter, result: RunResult):
        self.config, self.writer, self.reporter, self.result = config, writer, reporter, result

    def reused(self, p: Prepared) -> None:
        self.writer.reuse(p.source.key, p.source.position, p.reuse, p.facts)
        self.result.item_done(0, resumed=True)
        self.reporter.item_done(p.source.key, 0, resumed=True)

    def failed(self, error: ItemError, warnings: list[str] | None = None) -> None:
        error.warnings = error.warnings or list(warnings or [])
        if error.skipped and self.config.on_error != "stop":  # a blank or (--long-text skip) long text
            self.result.item_passed_over(error)
            self.reporter.item_passed_over(error)
            return
        self.result.item_failed(error)
        self.reporter.item_failed(error)
        if self.config.on_error == "stop":
            raise _StopAtFirstFailure

    def done(self, p: Prepared, rows) -> None:
        self.writer.add(p.source.key, rows, p.item.meta, p.source.position)
        if "cut_from_bytes" in p.item.meta:
            place = row_place(p.source)
            self.result.text_cut(p.source.key if place is None else f"{p.source.key} ({place})")
        self.result.item_done(int(rows.shape[0]), warnings=p.warnings)
        self.reporter.item_done(p.source.key, int(rows.shape[0]), warnings=p.warnings)


def plan(config: RunConfig, reporter: Reporter | None = None, stdin=None, own_process: bool = False) -> dict:
    """Dry run: device, memory, buckets and the chunk each would get now. Reads configs, processor files and the
    inputs; no tensor of the checkpoint, and nothing is encoded. `own_process`: as for `run`."""
    reporter = reporter or Reporter.silent()
    skipped: Counter = Counter()
    sources = list(_require_input(config, stdin, skipped, plan=True))
    embedder = Embedder.from_config(config)
    command = embedder.command(config.modality)
    stages = command.stages
    lengths: list[list[int]] = [[] for _ in command.engines]
    failures = []
    with capture.Capture(reporter) if own_process else contextlib.nullcontext():
        fetch = FetchPolicy.of(config)
        for window in prepared_stream(stages, sources, config.workers, host_budget=command.host.decode, fetch=fetch):
            for p in window:
                if p.error:
                    if not p.error.skipped:  # a blank text is passed over, as the run would
                        failures.append(p.error.as_record())
                    continue
                for index, stage in enumerate(stages.chain):
                    lengths[index] += stage.lengths(p.item) if stage.feed else [u.length for u in p.item.units]
    free, total = readings.device_memory(embedder.device)
    retrieval = stages.space == Space.retrieval
    buckets = []
    for index, engine in enumerate(command.engines):
        for group in engine.grouping()(lengths[index]):
            chunk_plan = engine.plan(group.length)
            bucket = {"length": group.length, "units": len(group.indices)}
            if retrieval:  # stage 1 the tower, stage 2 the text model (text has only that one)
                bucket["stage"] = index + 1 if len(stages.chain) > 1 else 2
            buckets.append({**bucket, "cost_per_unit": chunk_plan.cost_per_unit, "chunk": chunk_plan.chunk})
    result = {
        "type": "plan",
        "modality": str(config.modality),
        "space": str(stages.space),
        "device": str(embedder.device),
        "dtype": embedder.dtype_choice.name,
        "dtype_reason": embedder.dtype_choice.reason,
        "free_memory": free,
        "total_memory": total,
        "budget": planner.budget(free, total, config.memory_budget),
        "host": command.host.as_dict(),
        "items": len(sources),
        "skipped": sum(skipped.values()),
        "units": sum(len(v) for v in lengths),
        "buckets": buckets,
        "failures": failures,
        "chunking": (
            f"fixed at --batch-size {config.batch_size} (under each bucket's memory cap)"
            if config.batch_size
            else "tuned at run time: the fastest work a batch, under each batch's memory cap"
        ),
    }
    reporter.show_plan(result)
    return result


def _require_input(
    config: RunConfig, stdin, skipped: Counter, plan: bool = False, deferred: bool = False
) -> Iterator[Source]:
    """The run's sources, lazily; UsageError before anything loads for a path given that does not exist, or an
    input with nothing to embed at all. `deferred`: collections (tar shards, parquet row groups, JSON-lines and
    text files) left whole as units, for a runner whose workers find their items themselves."""
    if config.url_column is not None and config.column is not None:
        raise UsageError("--url-column names the column of URLs: leave out --column")
    check_given_paths(config.inputs, config.modality, config.ext, plan)
    return require_input(
        _find(config, stdin, skipped, deferred),
        config.inputs,
        config.modality,
        config.ext,
        skipped,
        config.dataset,
        plan,
    )


def _find(config: RunConfig, stdin=None, skipped: Counter | None = None, deferred: bool = False) -> Iterator[Source]:
    """The find stage: files, folders, stdin lists, tar shards, parquet and JSON-lines files and a --dataset; for
    text, the lines of files (or stdin), or whole files, and the rows of tables and of a --dataset. `deferred`:
    collections as units (`sources.base.Unit`), their items found where they are read."""
    collection = dataclasses.replace(config.collection, deferred=True) if deferred else config.collection
    if config.modality == "text":
        return iter_text_sources(config.inputs, stdin, config.per_file, config.ext, skipped, collection)
    return iter_sources(config.inputs, config.modality, stdin, config.null_separated, config.ext, skipped, collection)
