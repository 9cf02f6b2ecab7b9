"""The batching queue: concurrent requests' items merged into the windows of the batch tool's own engine.

Every request becomes one `Job` per route (modality and stage options: the key of `Embedder.command`'s stages). One
worker thread owns the `Embedder` (torch runs there and nowhere else). It takes every waiting job of the first job's
route, in arrival order, and sends all their items through one `Embedder.embed_stream` call: they are decoded,
prepared and encoded together, in the same windows, token-budget batches and resolution buckets as a
`gemma-embed text` or `images` run, and each item's pooled rows come back through the `Sink` by its key. Keys are
made here (job number / position), so an item's rows can only reach the job and the slot that sent it. Jobs of
another route wait for the next window. A window takes at most one job of each request (the jobs admitted together
by one `submit_many`): the server cuts a large request into jobs of a few items (service.py: CHUNK_ITEMS), so the
requests that arrive after it share every window with it instead of waiting for all of it.

Admission is bounded in items (`capacity`): a job that would take the items admitted and not yet answered over it is
refused (`QueueFull`, the server's 429 with a Retry-After from the measured rate); a job larger than the whole
capacity could never be admitted (`TooLarge`, 413). A job cancelled while it waits (its client went away) leaves the
queue at once and frees its items; one cancelled while its window encodes frees them when the window ends, and its
rows are dropped.

No fastapi here: the HTTP side (app.py) awaits a job's `future` from asyncio.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gemma_embed.errors import ItemError
from gemma_embed.sources.base import Source

# How far the rate behind Retry-After follows the latest window (an exponential average's weight).
RATE_WEIGHT = 0.3
RETRY_AFTER_MAX_S = 60


class QueueFull(Exception):
    """The queue holds too many items to admit this job now; `retry_after`: seconds until it likely has room."""

    def __init__(self, retry_after: int):
        self.retry_after = retry_after
        super().__init__(f"the server's queue is full; retry after {retry_after} s")


class TooLarge(Exception):
    """A job of more items than the queue can ever hold."""


class Closed(Exception):
    """The server is stopping: no new job is taken."""


@dataclass(frozen=True)
class RouteKey:
    """Which stages a job's items go through: the command (`modality`) and `Embedder.command`'s options."""

    modality: str
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, modality: str, **options: Any) -> RouteKey:
        return cls(str(modality), tuple(sorted((name, value) for name, value in options.items())))


@dataclass
class Embedded:
    """One item's answer: its vector (float32, 1-D) and the tokens the model read for it."""

    vector: Any
    tokens: int


@dataclass
class Job:
    number: int
    route: RouteKey
    sources: list[Source]
    results: list = field(default_factory=list)  # per item: Embedded or ItemError, filled by the worker
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    cancelled: bool = False
    started: float = 0.0  # when its window began (monotonic)
    request: int = -1  # the jobs admitted together (one request) share it; a window takes one of them

    @property
    def size(self) -> int:
        return len(self.sources)


class Observer(Protocol):
    """What the batcher reports (metrics.py records it)."""

    def window(self, items: int, jobs: int, seconds: float) -> None: ...

    def queued(self, items: int) -> None: ...


class _NoObserver:
    def window(self, items: int, jobs: int, seconds: float) -> None:
        pass

    def queued(self, items: int) -> None:
        pass


class _JobSink:
    """The Sink of one window: each finished item to its job's slot, found by the key the batcher gave it."""

    def __init__(self, jobs: list[Job]):
        self.slots: dict[str, tuple[Job, int]] = {}
        for job in jobs:
            job.results = [None] * job.size
            for index, source in enumerate(job.sources):
                self.slots[source.key] = (job, index)

    def reused(self, prepared) -> None:  # pragma: no cover - the server looks nothing up
        raise AssertionError("the server reuses nothing")

    def failed(self, error: ItemError, warnings: list[str] | None = None) -> None:
        job, index = self.slots[error.key]
        job.results[index] = error

    def done(self, prepared, rows) -> None:
        job, index = self.slots[prepared.source.key]
        meta = prepared.item.meta if prepared.item is not None else {}
        tokens = meta.get("tokens")
        if tokens is None:  # a soft-token tower: the rows it made are what the item cost
            tokens = sum(u.rows for u in prepared.item.units) if prepared.item is not None else 0
        job.results[index] = Embedded(rows.float().reshape(-1).numpy(), int(tokens))


def item_key(job_number: int, index: int) -> str:
    """The key of a job's item inside the engine (never shown to a client: errors name the request's input)."""
    return f"{job_number}/{index}"


class Batcher:
    """The queue and its worker thread. `setup()` runs first in the worker and returns the `Embedder` (loading the
    model there); `ready` is set once it returned, `failure` holds what it raised instead; then `on_ready(failure)`
    is called."""

    def __init__(
        self,
        setup: Callable[[], Any],
        capacity: int,
        observer: Observer | None = None,
        on_ready: Callable[[BaseException | None], None] | None = None,
    ):
        self.capacity = int(capacity)
        self._on_ready = on_ready  # told once `ready` is set: None, or what setup raised
        self.observer = observer or _NoObserver()
        self.ready = threading.Event()
        self.failure: BaseException | None = None
        self.embedder: Any = None
        self._setup = setup
        self._lock = threading.Condition()
        self._pending: deque[Job] = deque()
        self._admitted = 0  # items of jobs taken and not yet answered (waiting or encoding)
        self._closing = False
        self._numbers = itertools.count()
        self._requests = itertools.count()
        self._rate = 0.0  # items a second, from the windows so far
        self._thread = threading.Thread(target=self._work, name="gemma-embed-model", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ---------------------------------------------------------------------------------------- the HTTP side
    @property
    def admitted(self) -> int:
        with self._lock:
            return self._admitted

    def submit(self, route: RouteKey, sources: list[Source]) -> Job:
        """Admit one job (its sources keyed anew here); raises TooLarge, QueueFull or Closed."""
        return self.submit_many([(route, sources)])[0]

    def submit_many(self, parts: list[tuple[RouteKey, list[Source]]]) -> list[Job]:
        """Several jobs admitted together or not at all (one request's items of several modalities)."""
        total = sum(len(sources) for _, sources in parts)
        if total > self.capacity:
            raise TooLarge(f"{total} inputs, over the {self.capacity} the server's queue holds")
        with self._lock:
            if self._closing:
                raise Closed("the server is stopping")
            if self._admitted + total > self.capacity:
                raise QueueFull(self._retry_after())
            jobs = []
            request = next(self._requests)
            for route, sources in parts:
                number = next(self._numbers)
                keyed = [_rekeyed(source, item_key(number, i)) for i, source in enumerate(sources)]
                jobs.append(Job(number, route, keyed, request=request))
            self._pending.extend(jobs)
            self._admitted += total
            self.observer.queued(self._admitted)
            self._lock.notify_all()
        return jobs

    def cancel(self, job: Job) -> None:
        """The job's client went away: a waiting job leaves the queue now; an encoding one is dropped when its
        window ends."""
        with self._lock:
            job.cancelled = True
            if job in self._pending:
                self._pending.remove(job)
                self._admitted -= job.size
                self.observer.queued(self._admitted)
                job.future.cancel()

    def close(self, timeout: float | None = None) -> bool:
        """Take no new job; jobs still waiting are refused (Closed); the window encoding now finishes. True when
        the worker ended within `timeout`."""
        self._refuse_waiting()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _refuse_waiting(self) -> None:
        with self._lock:
            self._closing = True
            while self._pending:
                job = self._pending.popleft()
                self._admitted -= job.size
                job.future.set_exception(Closed("the server stopped before this request was encoded"))
            self._lock.notify_all()

    def _retry_after(self) -> int:
        """Seconds until the items admitted now are likely answered, at the measured rate (1 before any)."""
        if self._rate <= 0:
            return 1
        return max(1, min(RETRY_AFTER_MAX_S, math.ceil(self._admitted / self._rate)))

    # ---------------------------------------------------------------------------------------- the worker
    def _work(self) -> None:
        try:
            self.embedder = self._setup()
        except BaseException as exc:  # noqa: BLE001 - reported by the server, which then stops
            self.failure = exc
        self.ready.set()
        if self._on_ready is not None:
            self._on_ready(self.failure)
        if self.failure is not None:
            self._refuse_waiting()
            return
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._lock.wait()
                if not self._pending:
                    return
                route = self._pending[0].route
                jobs, requests = [], set()
                for job in self._pending:  # one job of each request: a large request's next one waits its turn
                    if job.route == route and job.request not in requests:
                        jobs.append(job)
                        requests.add(job.request)
                for job in jobs:
                    self._pending.remove(job)
            self._encode(route, jobs)

    def _encode(self, route: RouteKey, jobs: list[Job]) -> None:
        started = time.monotonic()
        sink = _JobSink(jobs)
        sources = [source for job in jobs for source in job.sources]
        for job in jobs:
            job.started = started
        failure: BaseException | None = None
        try:
            self.embedder.embed_stream(sources, route.modality, sink, **dict(route.options))
        except Exception as exc:  # noqa: BLE001 - a route that cannot run (a usage error) or a device that failed
            failure = exc
        seconds = time.monotonic() - started
        with self._lock:
            self._admitted -= len(sources)
            if failure is None and seconds > 0:
                rate = len(sources) / seconds
                self._rate = rate if self._rate <= 0 else (1 - RATE_WEIGHT) * self._rate + RATE_WEIGHT * rate
            self.observer.queued(self._admitted)
        self.observer.window(len(sources), len(jobs), seconds)
        for job in jobs:
            if job.cancelled:  # its client went away while the window encoded: the rows are dropped
                job.future.cancel()
            elif failure is not None:
                job.future.set_exception(failure)
            else:
                job.future.set_result(job.results)


def _rekeyed(source: Source, key: str) -> Source:
    from dataclasses import replace

    return replace(source, key=key)
