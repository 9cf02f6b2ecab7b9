"""Ray Data: the same run on a Ray cluster (the optional `[ray]` extra; `import gemma_embed` never imports ray).

    rows (bytes, paths or text in a column)
      -> map_batches(decode_batch)           CPU tasks: the tool's decoders and preparers (decode_and_prepare)
      -> map_batches(Embed, concurrency=N)   actors, one Embedder each: buckets, memory plan, OOM back-off, pooling
      -> rows with `embedding`, `key`, `meta` (JSON), `error` (JSON; null when it worked)

The command line's run puts one stage before those: `find_batch`, CPU tasks that find the items of the units the
driver sends (a tar shard, a parquet row group, a JSON-lines or text file: `sources.base.Unit`) with the find
stage's own readers, where the unit is read.

From Python, on a dataset of your own:

    import ray
    from gemma_embed.ray_data import embed_dataset

    ds = ray.data.read_parquet("s3://bucket/images/")               # a column `image` of bytes (or paths)
    out = embed_dataset(ds, "google/gemma-4-e2b-it", "images", column="image", key_column="id",
                        concurrency=4, num_gpus=1)                     # an actor per GPU
    out.write_parquet("s3://bucket/embeddings/")

`embedding` is the item's rows (a list of vectors) or, where every item is one vector (pooled, retrieval), that
vector. A row that cannot be decoded or encoded comes back with its `error` record, never as an exception that
ends the job; Ray restarts an actor that dies and retries its batch (`max_restarts`, `max_task_retries`).

The command line's `--ray [ADDRESS]` is `RayRunner`, one of the pipeline's runners (runners.py): the pipeline finds
the sources, holds the one writer and reports, as in any run; the decode and the encode run on the cluster, and each
finished item comes back to the driver, which writes the tool's own output (parts, --resume by content hash, input
order).

Why not Ray Data's own readers (`read_webdataset`, `read_parquet`, `read_json`, `read_binary_files`) for the units:
they read on the workers too, but each would be a second find stage with other keys and other failures. A bad
shard raises in `read_webdataset` (or is skipped whole, with a handler) without naming the members lost; a row
group that cannot be read fails `read_parquet`'s whole job where the tool fails its rows by key and goes on; none
gives a row's number in its file (the FILE:ROW key), a tar member's sidecars as the tool names them, the item size
limit before a byte is read, --key-column's repeats or the path cells' checks. `find_batch` runs the tool's own
readers instead, so a Ray run's items, keys, order and failures are the single-process run's by construction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from gemma_embed.config import RAY_DEFAULT, Modality, Pool, RunConfig, Space
from gemma_embed.decoding import WINDOW_ITEMS, Prepared, decode_and_prepare, source_error
from gemma_embed.embedder import CommandEngines, Embedder, Sink
from gemma_embed.errors import DeviceError, GemmaEmbedError, ItemError, UsageError
from gemma_embed.interrupts import Interrupted
from gemma_embed.locations import Location, location
from gemma_embed.models.base import PreparedItem
from gemma_embed.runners import Planned, RunInfo, planned
from gemma_embed.sources.base import Source
from gemma_embed.sources.fetch import FetchPolicy
from gemma_embed.sources.table import Keys, checked_key
from gemma_embed.sources.tar import Shard

EXTRA = "pip install 'gemma-embed[ray]'"
# Items per decode task: small, so decoding spreads over the cluster's CPUs and the first items leave early.
DECODE_BATCH = 16
# CPUs a find task asks for: reading a unit waits on storage more than it computes. Other than the decode tasks'
# count, so that Ray does not fuse the two stages (a fused task would decode a whole shard's items itself).
FIND_CPUS = 0.5
UNIT_ITEMS = 1 << 32  # an item's id: its unit's position in the input times this, plus its index in the unit
# Columns of Python objects between the stages (Ray serializes them itself, between its own processes).
SOURCE_COLUMN = "__gemma_embed_source"  # the pipeline's rows: a Source each
PREPARED_COLUMN = "__gemma_embed_prepared"  # decoded and prepared, for the encode actors


def require_ray():
    """The ray module, or one UsageError naming the extra."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise UsageError(f"--ray needs Ray Data, which is not installed: {EXTRA}") from None
    return ray


# ---------------------------------------------------------------------------------------------- find (CPU)


def find_batch(batch: Any, tally: Any = None) -> Iterator[dict]:
    """`map_batches` function (batch_format="numpy", a generator): the driver's rows, a Source each. An item
    passes as it is; a unit (a tar shard, a parquet row group, a JSON-lines or text file) gives its items here, found
    by the find stage's own readers (`Unit.items`), with its own --key-column values (the driver checks them against
    the rest of the run's: `RayRunner`). Each item's position becomes its id, `item_id(the row's position, its index
    in the unit)`, unique and in input order. Out: DECODE_BATCH items at a time, so a unit's items spread over the
    decode tasks and memory holds one batch of them here; what a unit passes over (tar members) goes to `tally`."""
    found = []
    for source in batch[SOURCE_COLUMN]:
        for index, item in enumerate(_items_of(source, tally)):
            found.append(dataclasses.replace(item, position=item_id(source.position, index)))
            if len(found) == DECODE_BATCH:
                yield {SOURCE_COLUMN: _objects(found)}
                found = []
    if found:
        yield {SOURCE_COLUMN: _objects(found)}


def item_id(position: int, index: int) -> int:
    return position * UNIT_ITEMS + index


def _items_of(source: Source, tally: Any) -> Iterator[Source]:
    if source.unit is None:
        yield source
        return
    skipped: Counter = Counter()
    yield from source.unit.items(Keys(), skipped)
    if skipped and tally is not None:
        import ray

        ray.get(tally.put.remote(source.position, skipped))


class Tally:
    """An actor (no CPU) that keeps what the find tasks passed over (tar members not taken, by extension or kind),
    by unit: a task Ray retried puts its unit's count again, in place of the first."""

    def __init__(self) -> None:
        self.counts: dict[int, Counter] = {}

    def put(self, position: int, counts: Counter) -> None:
        self.counts[position] = counts

    def all(self) -> dict[int, Counter]:
        return self.counts


# ---------------------------------------------------------------------------------------------- decode (CPU)

_STAGES: dict[str, Any] = {}  # per worker process: the command's decode and prepare stages, by config


def _decode_stages(config: RunConfig):
    """The command's stages for decoding: the checkpoint's processor files only, no tensor read, on the CPU
    whatever device the encode actors use (preparers do not depend on it)."""
    key = repr(config)  # a frozen dataclass of plain values: its repr is its identity
    if key not in _STAGES:
        decode_only = dataclasses.replace(config, device="cpu", ray=None)
        _STAGES[key] = Embedder.from_config(decode_only).command(config.modality).stages
    return _STAGES[key]


def decode_batch(
    batch,
    config: RunConfig,
    column: str | None = None,
    key_column: str | None = None,
    lookup: Callable[[str, str], str | None] | None = None,
):
    """`map_batches` function (batch_format="numpy"): every row decoded and prepared by the command's own
    decoders (`decode_and_prepare`). A row is the pipeline's Source, or a cell of `column`: bytes, a file path,
    or (text) a string; its key is `key_column`'s value, else the path, else `sha256:` of its content. Out: the
    key, the position and the prepared item; a failure is the prepared item's error."""
    import numpy as np

    stages = _decode_stages(config)
    fetch = FetchPolicy.of(config)  # the worker reads remote items itself: the driver sent their locations
    keys, positions, prepared = [], [], []
    for source in _sources(batch, config.modality, column, key_column):
        p = decode_and_prepare(stages, source, lookup, fetch)
        p.source = dataclasses.replace(source, data=None, value=None)  # its bytes stay here
        _compact(p)
        keys.append(_safe_key(source.key))
        positions.append(source.position)
        prepared.append(p)
    return {
        "key": np.array(keys, dtype=object),
        "position": np.array(positions, np.int64),
        PREPARED_COLUMN: _objects(prepared),
    }


def _objects(values: list):
    """A numpy column of Python objects (Ray Data stores it as such), never unpacked into an array of arrays."""
    import numpy as np

    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def _compact(prepared: Prepared) -> None:
    """Each prepared tensor on its own storage. A unit's tensor is often a view of one array for the whole item
    (a video's frames), and pickle writes a view's whole storage: 32 frames would carry 32 copies of them all."""
    if prepared.item is None:
        return
    for unit in prepared.item.units:
        for name, value in unit.inputs.items():
            storage = getattr(value, "untyped_storage", None)
            if storage is not None and storage().nbytes() > value.nbytes:
                unit.inputs[name] = value.clone()


def _sources(batch, modality: Modality, column: str | None, key_column: str | None) -> Iterator[Source]:
    names = list(batch)
    if SOURCE_COLUMN in names:
        yield from batch[SOURCE_COLUMN]
        return
    if column is None or column not in names:
        raise UsageError(f"column={column!r}: the dataset's columns are {', '.join(names)}")
    values = batch[column].tolist()
    keys = batch[key_column].tolist() if key_column is not None else [None] * len(values)
    for value, key in zip(values, keys, strict=True):
        if isinstance(value, dict):  # datasets' Image/Audio/Video struct: bytes, else its path
            value = value.get("bytes") or value.get("path")
        if isinstance(value, str) and modality == Modality.text:
            value = value.encode("utf-8")
            yield Source(str(key) if key is not None else _content_key(value), "text", position=-1, data=value)
        elif isinstance(value, str):
            yield Source(str(key) if key is not None else value, value, position=-1)
        elif isinstance(value, (bytes, bytearray)):
            data = bytes(value)
            name = str(key) if key is not None else _content_key(data)
            yield Source(name, name, position=-1, data=data)
        else:
            name = str(key) if key is not None else "row"
            yield Source(name, name, error=f"{column}: no bytes, path or text in this row ({type(value).__name__})")


def _content_key(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


def _safe_key(key: str) -> str:
    """The key as Arrow text: itself, or escaped reversibly when it is not UTF-8 (a file name's bytes)."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        from gemma_embed.export import escape_name

        return escape_name(key)
    return key


# ---------------------------------------------------------------------------------------------- encode (actor)


class Embed:
    """`map_batches` callable class (batch_format="numpy"): one `Embedder` per actor, the command's towers
    loaded once; each batch of prepared rows (from `decode_batch`) goes through the tool's engine as one window.

    Out, per row: `key`, `position`, `embedding` (list<list<float32>>: the rows; list<float32> where each item is
    one vector), `rows`, `meta` (the item's metadata as JSON), `warnings`, `error` (the failure record as JSON,
    else null), `reused_from` (--resume: the saved key whose rows it takes) and `source` (its Source's key, path,
    row and row_key as JSON). Rows cross to Arrow as float32
    (exact for every compute dtype); the store converts them to the output dtype as it does in any run.
    """

    def __init__(
        self,
        model: str | None = None,
        modality: str | Modality = Modality.images,
        config: RunConfig | None = None,
        expect: Planned | None = None,
        **options: Any,
    ):
        if config is None:
            config = RunConfig(model=str(model), modality=Modality(modality), **options)
        self.config = dataclasses.replace(config, ray=None)
        self.embedder = Embedder.from_config(self.config)
        self.engines = self.embedder.load(self.config.modality)
        if expect is not None:
            _check_same(expect, planned(self.embedder, self.engines))
        self.one_vector = one_vector_per_item(self.engines, self.config.pool)

    def __call__(self, batch):
        prepared = list(batch[PREPARED_COLUMN])
        rows = _Rows(prepared)
        self.embedder.encode_window(self.engines, prepared, rows, self.config.pool)
        return rows.table(self.one_vector)


def one_vector_per_item(engines: CommandEngines, pool: Pool | str) -> bool:
    return engines.stages.space == Space.retrieval or Pool(pool) == Pool.mean


class _Rows(Sink):
    """The actor's sink: one output row per prepared row, in the batch's order."""

    def __init__(self, prepared: list[Prepared]):
        self.prepared = prepared
        self.records: list[dict | None] = [None] * len(prepared)
        self.slots: dict[str, deque] = defaultdict(deque)
        for index, p in enumerate(prepared):
            self.slots[p.source.key].append(index)

    def _put(self, key: str, **record: Any) -> None:
        self.records[self.slots[key].popleft()] = record

    def reused(self, prepared: Prepared) -> None:
        self._put(prepared.source.key, reused_from=json.dumps(prepared.reuse), meta=json.dumps(prepared.facts))

    def failed(self, error: ItemError, warnings: list[str] | None = None) -> None:
        error.warnings = error.warnings or list(warnings or [])
        record = {**error.as_record(), "traceback": error.traceback_text, "count": error.count}
        self._put(error.key, error=json.dumps(record), warnings=list(error.warnings))

    def done(self, prepared: Prepared, rows) -> None:
        matrix = rows.detach().to("cpu").float().contiguous().numpy()
        self._put(prepared.source.key, rows=matrix, meta=json.dumps(prepared.item.meta), warnings=prepared.warnings)

    def table(self, one_vector: bool):
        import numpy as np
        import pyarrow as pa

        vectors, null, outer, inner, flat = [], [], [0], [0], []
        for record in self.records:
            matrix = (record or {}).get("rows")
            null.append(matrix is None)
            if matrix is not None:
                flat.append(matrix.reshape(-1))
                if one_vector:
                    outer.append(outer[-1] + matrix.size)
                else:
                    for _ in range(matrix.shape[0]):
                        inner.append(inner[-1] + matrix.shape[1])
                    outer.append(outer[-1] + matrix.shape[0])
            else:
                outer.append(outer[-1])
            vectors.append(0 if matrix is None else int(matrix.shape[0]))
        values = pa.array(np.concatenate(flat) if flat else np.zeros(0, np.float32), pa.float32())
        if not one_vector:
            values = pa.ListArray.from_arrays(pa.array(inner, pa.int32()), values)
        mask = pa.array(null, pa.bool_())
        embedding = pa.ListArray.from_arrays(pa.array(outer, pa.int32()), values, mask=mask)
        records = [r or {} for r in self.records]
        return pa.table(
            {
                "key": pa.array([_safe_key(p.source.key) for p in self.prepared], pa.string()),
                "position": pa.array([p.source.position for p in self.prepared], pa.int64()),
                "embedding": embedding,
                "rows": pa.array(vectors, pa.int64()),
                "meta": pa.array([r.get("meta") for r in records], pa.string()),
                "warnings": pa.array([list(r.get("warnings") or []) for r in records], pa.list_(pa.string())),
                "error": pa.array([r.get("error") for r in records], pa.string()),
                "reused_from": pa.array([r.get("reused_from") for r in records], pa.string()),
                "source": pa.array([_identity(p.source) for p in self.prepared], pa.string()),
            }
        )


def _identity(source: Source) -> str:
    """What the driver needs of an item's Source (found on a worker, or by the driver): its key (any string: JSON
    keeps a file name's lone surrogates), path, row and `row_key`, as JSON."""
    row = source.meta.get("row")
    return json.dumps({"key": source.key, "path": source.path, "row": row, "row_key": source.row_key})


# ---------------------------------------------------------------------------------------------- a dataset


def embed_dataset(
    ds,
    model: str | None = None,
    modality: str | Modality = Modality.images,
    column: str | None = None,
    key_column: str | None = None,
    concurrency: int = 1,
    num_gpus: float = 0,
    num_cpus: float = 1,
    batch_size: int | None = None,
    config: RunConfig | None = None,
    lookup: Callable[[str, str], str | None] | None = None,
    expect: Planned | None = None,
    embed_class: type = Embed,
    actor_options: dict | None = None,
    decode_retries: int = 3,
    **options: Any,
):
    """`ds` decoded on the CPUs (tasks) and embedded by `concurrency` actors of `embed_class`, each with
    `num_gpus`/`num_cpus` (Ray's own options); `options` are the command line's (RunConfig fields: `pool`, `dim`,
    `prompt_name`, `memory_budget`, ...). Returns the lazy dataset of `Embed`'s rows.

    An actor that dies (a node lost, a process killed) is restarted and its batch retried: Ray Data's defaults
    are `max_restarts=-1` and `max_task_retries=-1` (no limit); `actor_options` (Ray's remote options for the
    actors) changes them. A decode task whose worker dies is retried `decode_retries` times. Items that fail are
    rows with an `error`; no item's failure is an exception here."""
    if config is None:
        config = RunConfig(model=str(model), modality=Modality(modality), **options)
    try:
        config.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    import warnings

    from ray.data import ActorPoolStrategy

    window = batch_size or WINDOW_ITEMS
    with warnings.catch_warnings():
        # Ray 2.60 deprecates per-stage remote options (removed in 2.64: pyproject's range stops before it). The
        # decode tasks' own retry count is one, and it keeps the stages apart: Ray fuses a task stage into the
        # next actor stage when their options agree, and decoding would then run inside the actors.
        warnings.filterwarnings("ignore", "`ray_remote_args` is deprecated")
        decoded = ds.map_batches(
            decode_batch,
            batch_format="numpy",
            batch_size=DECODE_BATCH,
            num_cpus=1,
            max_retries=decode_retries,
            fn_kwargs={"config": config, "column": column, "key_column": key_column, "lookup": lookup},
        )
        return decoded.map_batches(
            embed_class,
            batch_format="numpy",
            batch_size=window,
            compute=ActorPoolStrategy(size=concurrency),
            num_gpus=num_gpus,
            num_cpus=num_cpus,
            fn_constructor_kwargs={"config": config, "expect": expect},
            **(actor_options or {}),
        )


# ---------------------------------------------------------------------------------------------- the pipeline's


def _describe(config: RunConfig) -> Planned:
    """What the encode actors will compute (`runners.Planned`), from configs alone, as an `Embedder` with the
    encode's resources sees it: no weight is read."""
    embedder = Embedder.from_config(dataclasses.replace(config, ray=None))
    return planned(embedder, embedder.command(config.modality))


def _probe(config: RunConfig) -> Planned | GemmaEmbedError:
    """`_describe`, run where the actors will run (a task with their resources): its failure comes back to the
    driver as a value, its own one line."""
    try:
        return _describe(config)
    except GemmaEmbedError as exc:
        return exc


def _check_same(expected: Planned, found: Planned) -> None:
    """An actor computes what the header says, or it refuses to start (a cluster of mixed machines with
    --dtype auto: choose the dtype)."""
    device_type = str(found.device).split(":")[0]
    expected_type = str(expected.device).split(":")[0]
    for name, want, got in (("device", expected_type, device_type), ("dtype", expected.dtype, found.dtype)):
        if want != got:
            raise UsageError(
                f"a Ray actor would compute with {name} {got}, the output says {want}: "
                f"give --device and --dtype explicitly on a cluster of mixed machines"
            )
    if expected.width != found.width:
        raise UsageError(f"a Ray actor would give rows of {found.width} values, the output says {expected.width}")


@contextlib.contextmanager
def _signal_handlers_kept():
    """`ray.init` installs its own SIGTERM handler in the driver: the run's (or the caller's) handlers are put
    back, so a SIGTERM still saves what is done (interrupts.py) and the library takes nothing over."""
    import signal
    import threading

    from gemma_embed.interrupts import STOP_SIGNALS

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


class ClusterError(DeviceError):
    """The Ray job failed as a whole (an actor that cannot start, retries used up): the run stops, the items
    that came back are saved, --resume finishes."""


class RayRunner:
    """`--ray`: a `runners.Runner` whose find (of collections' items), decode and encode run on a Ray cluster. The
    driver (this process) lists the inputs and sends them, a block at a time, to the object store: locations, never
    bytes. A whole file (local, an object, a URL) goes by its location, and the decode task reads it (the run's
    fetch policy); a collection goes as a unit (a tar shard, a parquet row group: the driver reads its footer, a
    JSON-lines or text file: `sources.base.Unit`) whose items a find task reads and finds itself (`find_batch`).
    What only the driver can read travels as bytes: lines of its stdin and a --dataset's rows. (Before, the find
    stage here reads the parquet footers, and the first record of a JSON-lines file named on the command line, to
    check the columns before a model loads.)

    The job keeps the input's order (Ray Data's `preserve_order`): each item comes back here in input order, once (a
    batch Ray retried after an actor died comes back once), is numbered as the single-process run numbers it, has its
    --key-column value checked against the earlier rows' (each unit knows only its own), and goes to the pipeline's
    sink as if it had run here. Connecting and asking what the actors compute happen in `load`."""

    embed_class: type = Embed  # the encode actors' class
    reads_items_itself = True  # find and decode tasks open each item's location (or unit) on their own machine

    def __init__(self, config: RunConfig, reporter=None, should_stop=None):
        self.ray = require_ray()
        self.config = config
        self.reporter = reporter
        self.should_stop = should_stop
        self.output = location(config.output)
        self.label = str(config.modality)
        self.actors = 1
        self.num_gpus = 0
        self.planned: Planned | None = None
        self.taken = 0

    def begin(self) -> None:
        pass

    def load(self) -> Planned:
        self._connect()
        gpus = int(self.ray.cluster_resources().get("GPU", 0))
        self.num_gpus = 1 if gpus and self.config.device != "cpu" else 0
        self.actors = max(1, gpus) if self.num_gpus else 1
        if self.num_gpus:  # what a GPU actor computes: asked of a task with its resources
            described = self.ray.get(self.ray.remote(_probe).options(num_gpus=self.num_gpus).remote(self.config))
        else:  # CPU actors compute as this machine would (an actor that would not refuses to start: _check_same)
            described = _probe(self.config)
        if isinstance(described, GemmaEmbedError):
            raise described
        self.planned = described
        return described

    def _connect(self) -> None:
        ray = self.ray
        if ray.is_initialized():  # a caller's own session (a test's local cluster, a notebook)
            return
        address = None if self.config.ray in (None, RAY_DEFAULT) else self.config.ray
        try:
            with _signal_handlers_kept():
                ray.init(address=address, log_to_driver=False, include_dashboard=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UsageError(
                f"--ray {self.config.ray}: cannot reach a Ray cluster: {' '.join(str(exc).split())}"
            ) from None

    def take(self, sources: Iterable[Source]) -> Iterator[Source]:
        yield from sources  # every one; `taken` counts the items that come back (a unit gives many)

    def share(self, total: int) -> int:
        return total

    def embed(
        self,
        sources: Iterable[Source],
        sink: Sink,
        lookup=None,
        window_items: int | None = None,
        skipped: Counter | None = None,
    ) -> None:
        """Every source through the cluster (find tasks, decode tasks, then the encode actors); `sink` gets each
        item as it comes back, in input order, once. `skipped` gets what the find tasks passed over."""
        ray = self.ray
        blocks, tally = self._blocks(sources)
        if not blocks:
            return
        ds = ray.data.from_pandas_refs(blocks)
        found = ds.map_batches(
            find_batch, batch_format="numpy", batch_size=None, num_cpus=FIND_CPUS, fn_kwargs={"tally": tally}
        )
        out = embed_dataset(
            found,
            config=self.config,
            lookup=lookup,
            concurrency=self.actors,
            num_gpus=self.num_gpus,
            batch_size=window_items,
            expect=self.planned,
            embed_class=self.embed_class,
        )
        context = getattr(out, "context", None)
        if context is not None:  # this job's own copy of the settings
            context.enable_progress_bars = False
            context.execution_options.preserve_order = True  # input order: numbers and --key-column checks
        try:
            self._receive(out, sink)
        finally:
            if tally is not None:
                with contextlib.suppress(Exception):  # a job that failed may leave it unreachable
                    for counts in ray.get(tally.all.remote()).values():
                        if skipped is not None:
                            skipped.update(counts)
                    ray.kill(tally)
        if not self.taken:  # units that held no item, and nothing else: no input, as the find stage says
            from gemma_embed.sources import no_input_message

            config = self.config
            raise UsageError(
                no_input_message(config.inputs, config.modality, config.ext, skipped or Counter(), config.dataset)
            )

    def _blocks(self, sources: Iterable[Source]) -> tuple[list, Any]:
        """The sources in the object store, a block at a time (this process holds one block at most): whole files
        DECODE_BATCH to a block, each unit a block of its own (a find task each). With the tally actor when a unit
        may pass members over (a tar shard)."""
        ray = self.ray
        import pandas as pd

        blocks, rows, tally = [], [], None

        def put(rows: list[Source]) -> None:
            blocks.append(ray.put(pd.DataFrame({SOURCE_COLUMN: _objects(rows)})))

        for source in sources:
            if source.unit is None:
                rows.append(source)
                if len(rows) == DECODE_BATCH:
                    put(rows)
                    rows = []
                continue
            if rows:
                put(rows)
                rows = []
            put([source])
            if tally is None and isinstance(source.unit, Shard):
                tally = ray.remote(num_cpus=0)(Tally).remote()
        if rows:
            put(rows)
        return blocks, tally

    def _receive(self, out: Any, sink: Sink) -> None:
        """The job's rows, in input order: each item once, numbered, its --key-column value checked, to the sink. A
        stop (the sink's, a signal) ends the job here, at once."""
        seen: set[int] = set()
        keys = Keys()  # the run's --key-column values, in input order (each unit checked only its own)
        width = int(self.planned.width)
        with contextlib.closing(_batches(out)) as batches:
            for batch in batches:
                if self.should_stop is not None:
                    self.should_stop()
                embeddings = batch.column("embedding").combine_chunks()
                for index, record in enumerate(batch.drop_columns(["embedding"]).to_pylist()):
                    ident = int(record["position"])
                    if ident in seen:
                        continue
                    seen.add(ident)
                    found = json.loads(record["source"])
                    meta = {"row": found["row"]} if found["row"] is not None else {}
                    position, self.taken = self.taken, self.taken + 1
                    source = Source(found["key"], found["path"], position=position, meta=meta, row_key=found["row_key"])
                    checked = checked_key(source, keys)
                    if checked is not source:  # an earlier unit's row took its key: it fails as found, whatever came
                        sink.failed(source_error(checked), [])
                        continue
                    record["embedding"] = _matrix(embeddings[index], width)
                    self._hand_on(source, record, sink)

    def finish(self, positions: dict[str, int], note: Callable[[str], None]) -> Location | None:
        return None

    def info(self) -> RunInfo:
        """The actors' engines (peaks, back-offs, thread counts) stay on the cluster: their chunking is the actors'
        count and batch size."""
        batch = self.config.batch_size or "auto (per actor)"
        return RunInfo(self.planned, taken=self.taken, chunking={"ray": {"actors": self.actors, "batch_size": batch}})

    @staticmethod
    def _hand_on(source: Source, record: dict, sink: Sink) -> None:
        """One row back from the cluster, to the pipeline's sink as if it had run here."""
        import numpy as np
        import torch

        warnings = list(record.get("warnings") or [])
        if record.get("reused_from") is not None:
            facts = json.loads(record["meta"])
            sink.reused(Prepared(source, reuse=json.loads(record["reused_from"]), facts=facts))
            return
        if record.get("error") is not None:
            failure = json.loads(record["error"])
            error = ItemError(source.key, failure["stage"], failure["message"], failure["error"], failure["traceback"])
            error.warnings = warnings
            error.count = failure.get("count", 1)
            sink.failed(error, warnings)
            return
        rows = torch.from_numpy(np.array(record["embedding"], dtype=np.float32))  # a copy it owns
        sink.done(Prepared(source, item=PreparedItem([], json.loads(record["meta"])), warnings=warnings), rows)


def _batches(out: Any) -> Generator:
    """The job's output batches; the job's own failure as this package's error (what the sink raises passes)."""
    batches = iter(out.iter_batches(batch_format="pyarrow", batch_size=None))
    try:
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (GemmaEmbedError, Interrupted):
                raise
            except Exception as exc:  # noqa: BLE001 - what Ray raises when the job itself fails
                cause = getattr(exc, "cause", None)
                if isinstance(cause, GemmaEmbedError):
                    raise cause from None
                raise ClusterError(f"the Ray job failed: {' '.join(str(exc).split())[:500]}") from exc
            yield batch
    finally:
        close = getattr(batches, "close", None)
        if close is not None:  # Ray's iterator: its executor shuts down now, not when it is collected
            close()


def _matrix(cell, width: int):
    """An `embedding` cell (the rows, or one vector) as a float32 [rows, width] array, its values as sent."""
    values = cell.values
    if values is None:
        return None
    if hasattr(values, "flatten"):  # list<list<float32>>: the rows
        values = values.flatten()
    return values.to_numpy(zero_copy_only=False).reshape(-1, width)
