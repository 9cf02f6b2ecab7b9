"""Decode and prepare stage: sources -> prepared items, in worker threads, in bounded windows, in input order."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gemma_embed import capture
from gemma_embed.errors import ItemError
from gemma_embed.memory import decode_room
from gemma_embed.models.base import PreparedItem
from gemma_embed.sources import Source
from gemma_embed.sources.base import row_place
from gemma_embed.sources.fetch import FetchPolicy, fetch_ahead, fetched, needs_fetch

WINDOW_ITEMS = 256
WINDOW_BYTES = 1 << 30  # prepared tensors held per window (pixels of 1120-token images are ~31 MB each)

# --resume: given an item's key and content hash, the key whose saved rows it can reuse (None: compute it).
Lookup = Callable[[str, str], "str | None"]


@dataclass
class Prepared:
    source: Source
    item: PreparedItem | None = None
    error: ItemError | None = None
    reuse: str | None = None  # --resume: the saved key whose rows this item takes (same content)
    facts: dict | None = None  # size, mtime, content hash of the file
    warnings: list[str] = field(default_factory=list)  # what libraries said while it was decoded and prepared

    @property
    def work(self) -> int:
        """The encode work this item brings: its units' summed length (patches, frames)."""
        return sum(u.length for u in self.item.units) if self.item is not None else 0


def decode_and_prepare(
    modality, source: Source, lookup: Lookup | None = None, fetch: FetchPolicy | None = None
) -> Prepared:
    """One source through `modality.decode` and its preparer; any failure becomes the item's error record.
    What libraries say meanwhile (warnings, logging, fd 2) is captured for this item (capture.py). With `fetch`, a
    remote whole file not fetched yet (a Ray worker's item) is fetched first, here (sources/fetch.py)."""
    if fetch is not None and needs_fetch(source):
        source = fetched(source, fetch)
    with capture.item(source.key) as messages:
        prepared = _decode_and_prepare(modality, source, lookup)
    prepared.warnings = messages.texts()
    if prepared.error is not None:
        prepared.error.warnings = prepared.warnings
    return prepared


def source_error(source: Source) -> ItemError:
    """The failure record of a source that failed before decoding (found, or fetched, with its `error`)."""
    assert source.error is not None
    kind = source.kind or ("unreadable" if source.failed_at == "find" else "fetch-failed")
    error = ItemError(source.key, source.failed_at, source.error, kind)
    error.count = source.meta.get("lines", 1)  # a run of blank lines: passed over as that many
    return error


def _decode_and_prepare(modality, source: Source, lookup: Lookup | None) -> Prepared:
    if source.error:
        return Prepared(source, error=source_error(source))
    stage = "decode"
    try:
        facts = source.facts()
        reuse = lookup(source.key, facts["sha256"]) if lookup is not None else None
        if reuse is not None:
            return Prepared(source, reuse=reuse, facts=facts)
        with capture.native():  # the C libraries run here: what they print on fd 2 is this item's
            decoded = modality.decode(source.content)
        stage = "prepare"
        item = modality.preparer.prepare(decoded)
    except Exception as exc:  # noqa: BLE001 - a bad file is a record, never the end of the run
        if isinstance(exc, PermissionError):
            exc = PermissionError(f"permission denied: {exc.strerror or exc}")
        return Prepared(source, error=_named(source, ItemError.wrap(source.key, stage, exc)))
    item.meta = {**facts, **source.meta, **item.meta}
    return Prepared(source, item=item, facts=facts)


def _named(source: Source, error: ItemError) -> ItemError:
    """The failure of a table's row keyed by its --key-column value: its line says where the row is."""
    place = row_place(source)
    if place is None:
        return error
    return ItemError(error.key, error.stage, f"{place}: {error.message}", error.error_type, error.traceback_text)


def prepared_nbytes(prepared: Prepared) -> int:
    """Host memory the item holds in a window: its prepared tensors, and its own bytes when it is not a whole
    file (a tar member or a parquet cell, held by its Source until the window is done)."""
    held = len(prepared.source.data) if prepared.source.data is not None else 0
    if prepared.item is None:
        return held
    return held + sum(t.nbytes for u in prepared.item.units for t in u.inputs.values() if hasattr(t, "nbytes"))


def one_intra_op_thread() -> None:
    """A decode thread's setup: torch ops it runs (the processor's resizing) use one intra-op thread.

    A thread that enters torch's OpenMP parallel regions gets its own team of OpenMP threads, and those teams
    slow the encode's CPU forwards even while their decode thread is idle. Measured on 2 cores (release-size
    tower, bf16, 8 images at 70 tokens): 2.3-2.5 s of forwards after preparing in the main thread, 3.2-3.5 s after
    preparing in two worker threads, 2.5-2.7 s with this setting. The workers already decode in parallel.
    torch keeps the count per thread once a thread has used it, but `set_num_threads` also changes the default that
    threads starting later take: `prepared_stream` puts it back when it ends.
    """
    import torch

    torch.set_num_threads(1)


def prepared_stream(
    modality,
    sources: Iterable[Source],
    workers: int,
    window_items: int = WINDOW_ITEMS,
    window_bytes: int = WINDOW_BYTES,
    lookup: Lookup | None = None,
    overlap: bool = True,
    enough_work: Callable[[int, int], bool] | None = None,
    host_budget: int | None = None,
    fetch: FetchPolicy | None = None,
) -> Iterator[list[Prepared]]:
    """Windows of prepared items, in input order, each at most `window_items` items or `window_bytes` of
    prepared tensors, and closed early once `enough_work(units, work)` says the window's units and their
    summed length (patches, frames) are enough for the device for now, so the first items leave early.

    With `host_budget` (bytes: the decode side's share, `planner.host_plan`), the items decoding and the prepared
    items not yet done with fit in it: each decoder says its item's estimated peak once it has read the header
    (`decode_room.admit`), and the worker waits until that fits (`decode_room.DecodeRoom`, in input order). When the
    next item waits for room that only this window holds, the window is handed on early; an item larger than the
    whole budget decodes alone. A window is done with when its consumer asks for the next one.

    With `fetch`, remote whole files are fetched ahead by the fetch stage (sources/fetch.py), in its own threads,
    whether or not decoding overlaps the encode: waiting on the network takes no core from the encode.

    Sources are pulled lazily. With `overlap`, worker threads keep decoding ahead while the caller encodes a
    window (the device works while the CPU decodes); how far ahead adapts to the items' size so that the work in
    flight also stays near one window's bytes. Without it (encoding on the CPU itself), the workers decode only
    the window being built: decoding beside a CPU encode steals the cores the encode's threads spin on
    (measured on 2 cores: encode 72 ms/image beside a decode thread against 35 ms alone). Memory stays flat
    however many files there are.
    """
    import torch

    threads = torch.get_num_threads()  # the caller's (the encoder's) own count, fixed for it from now on
    if fetch is not None:
        sources = fetch_ahead(sources, fetch)
    try:
        yield from _windows(
            modality, sources, workers, window_items, window_bytes, lookup, overlap, enough_work, host_budget
        )
    finally:
        torch.set_num_threads(threads)  # the default for later threads, which a decode thread's setup changed


def _decode_in_room(room: decode_room.DecodeRoom, ticket: int, modality, source: Source, lookup) -> Prepared:
    """`decode_and_prepare` as item `ticket` of the room: what its decoder asks for (`decode_room.admit`) is held
    while it decodes, then its prepared bytes until its window is done with."""
    prepared = None
    with decode_room.decode_slot(room, ticket) as slot:
        try:
            prepared = decode_and_prepare(modality, source, lookup)
        finally:
            room.finish(ticket, slot.reserved, prepared_nbytes(prepared) if prepared is not None else 0)
    return prepared


def _windows(modality, sources, workers, window_items, window_bytes, lookup, overlap, enough_work, host_budget):
    it = iter(sources)
    inflight: deque = deque()
    seen_items, seen_bytes = 0, 0
    window: list[Prepared] = []
    room = decode_room.DecodeRoom(host_budget) if host_budget is not None else None
    tickets = itertools.count()
    with ThreadPoolExecutor(
        max_workers=max(1, workers), thread_name_prefix="decode", initializer=one_intra_op_thread
    ) as pool:

        def submit(source: Source):
            if room is None:
                return pool.submit(decode_and_prepare, modality, source, lookup)
            future = pool.submit(_decode_in_room, room, next(tickets), modality, source, lookup)
            future.add_done_callback(room.wake)
            return future

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
                inflight.append(submit(source))

        def hand_on(window: list[Prepared], size: int):
            if room is None:
                yield window
                return
            if not overlap:
                # Encoding on the CPU: no decode runs beside it. It would take the cores the encode's threads spin
                # on, and inside the encode's heap_only() forwards (memory/allocator.py) its large blocks would come
                # from the heap and stay there: measured, four 4000x4000 PNGs peaked at two images' worth above the
                # loaded process instead of one.
                room.pause()
            yield window
            room.release(size)
            room.resume()

        try:
            top_up()
            size = units = work = 0
            while inflight:
                if room is not None and not room.wait(inflight[0], can_release=bool(window)):
                    # The next item waits for room while nothing decodes: this window holds what it needs.
                    yield from hand_on(window, size)
                    window, size, units, work = [], 0, 0, 0
                    continue
                prepared = inflight.popleft().result()
                nbytes = prepared_nbytes(prepared)
                seen_items, seen_bytes = seen_items + 1, seen_bytes + nbytes
                window.append(prepared)
                size += nbytes
                units += len(prepared.item.units) if prepared.item is not None else 0
                work += prepared.work
                full = len(window) >= window_items or size >= window_bytes
                if full or (enough_work is not None and units > 0 and enough_work(units, work)):
                    yield from hand_on(window, size)
                    window, size, units, work = [], 0, 0, 0
                top_up()
            if window:
                yield from hand_on(window, size)
        finally:
            if room is not None:
                room.close()  # decodes still waiting give up, so the pool's shutdown does not wait on them
            for future in inflight:
                future.cancel()  # not started: never decoded
