"""The fetch stage: an item that is a whole remote file (an object under a bucket's prefix, a URL from a
`--url-column` table or a path list) is read into memory once, ahead of the decoders, and goes on as an item
carrying its own bytes, as a tar member does. Its content hash, its --resume facts and its decode then read those
bytes, never the network again, and the decoders get exactly what they would get from the same file on disk.

    sources -> fetch_ahead (FETCH_THREADS threads, in input order) -> decode and prepare -> encode

- Ahead: up to `ahead` items and `ahead_bytes` of fetched bytes wait for the decoders, so the network works while
  the device (or the CPU) encodes; measured in bench/bench_remote.py against the same images on disk.
- Per host: at most `per_host` fetches at once from one host (a URL's) or bucket, whatever the thread count, as
  img2dataset and crawlers keep to; the rest wait their turn.
- Retries: a fetch that timed out, lost its connection, was cut short or got 408/429/5xx is tried again up to
  `retries` times, after BACKOFF_S, doubling (with jitter); a 404, 403 or a body over the size limit is not.
- Size: the item limit of collections (`--max-item-bytes`): an object or URL that declares more fails unread,
  a body that declared nothing is cut off past the limit.
- A failure is the item's: a named skip in the errors file (`fetch` stage, the status or reason), and the run goes
  on. Its message names the location without its query string (redact.py).

Local files are not fetched: the decoders open them by name, which streams from disk.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from gemma_embed.locations import FetchFailed, Location, TooLarge, UnsupportedLocation, location
from gemma_embed.media import MediaBytes
from gemma_embed.redact import redact
from gemma_embed.sources.base import Source, item_too_large

FETCH_THREADS = 16  # fetches in flight in one process (each waits on the network, not the CPU)
AHEAD_ITEMS = 64  # fetched items waiting for the decoders, at most
AHEAD_BYTES = 256 << 20  # ... and their bytes, at most (one larger item is still fetched alone)
BACKOFF_S = 0.5
FETCH_STAGE = "fetch"


@dataclass(frozen=True)
class FetchPolicy:
    """How the fetch stage reads remote items (the command line's --url-timeout, --url-retries, --per-host and
    --max-item-bytes)."""

    timeout_s: float = 30.0
    retries: int = 2
    per_host: int = 16
    max_bytes: int | None = None
    threads: int = FETCH_THREADS
    ahead: int = AHEAD_ITEMS
    ahead_bytes: int = AHEAD_BYTES
    backoff_s: float = BACKOFF_S

    @classmethod
    def of(cls, config) -> FetchPolicy:
        """A run's policy (`config`: a RunConfig); the item limit decided as collections decide it."""
        limit = config.collection.with_item_limit().max_item_bytes
        return cls(config.url_timeout, config.url_retries, config.per_host, limit)


def needs_fetch(source: Source) -> bool:
    """Whether the item is a whole file on another machine, not read yet."""
    if source.error is not None or source.data is not None or source.value is not None:
        return False
    return not location(source.path).is_local


# ------------------------------------------------------------------------------------------ per host

_hosts: dict[tuple[str, str], threading.BoundedSemaphore] = {}
_hosts_guard = threading.Lock()


def host_of(where: Location) -> str:
    """Whom a fetch asks: a URL's host (and port), an object's bucket."""
    return where.path.split("/", 1)[0]


@contextlib.contextmanager
def host_slot(where: Location, limit: int) -> Iterator[None]:
    """One of the `limit` fetches from `where`'s host (or bucket) allowed at once in this process."""
    key = (f"{where.protocol}://{host_of(where)}", str(limit))
    with _hosts_guard:
        slots = _hosts.setdefault(key, threading.BoundedSemaphore(limit))  # type: ignore[arg-type]
    with slots:
        yield


# ------------------------------------------------------------------------------------------ one item


def fetched(source: Source, policy: FetchPolicy) -> Source:
    """The item with its bytes read (named as the file is, for the decoders' routing by extension), or with the
    reason it could not be read as its error (stage `fetch`)."""
    where = location(source.path)
    tries = 0
    while True:
        tries += 1
        try:
            with host_slot(where, policy.per_host):
                data = where.fetch(policy.max_bytes, policy.timeout_s)
            return replace(source, data=MediaBytes(data, where.name))
        except TooLarge as exc:
            what = "it" if exc.known else "its body (no size declared)"
            return _failed(source, f"{redact(str(where))}: {item_too_large(exc.size, exc.limit, what)}", "too-large")
        except FetchFailed as exc:
            if exc.transient and tries <= policy.retries:
                time.sleep(policy.backoff_s * 2 ** (tries - 1) * (0.5 + random.random()))
                continue
            after = f" (tried {tries} times)" if tries > 1 else ""
            kind = "missing" if exc.status in (404, 410) else "fetch-failed"
            return _failed(source, f"cannot fetch {redact(str(where))}: {exc.reason}{after}", kind)
        except UnsupportedLocation as exc:
            return _failed(source, exc.reason, "unreadable")
        except OSError as exc:  # what a client raised that is none of the above: its words, redacted
            reason = f"cannot fetch {redact(str(where))}: {exc.strerror or type(exc).__name__}"
            return _failed(source, reason, "fetch-failed")


def _failed(source: Source, reason: str, kind: str) -> Source:
    """`source` failed at the fetch stage: `reason` its error, `kind` what happened (errors.RECORD_KINDS)."""
    return replace(source, error=reason, failed_at=FETCH_STAGE, kind=kind)


# ------------------------------------------------------------------------------------------ the stage


def _ready(waiting: Future | Source) -> bool:
    return not isinstance(waiting, Future) or waiting.done()


def fetch_ahead(sources: Iterable[Source], policy: FetchPolicy) -> Iterator[Source]:
    """The sources in input order, each remote whole file among them fetched (`fetched`) by `policy.threads`
    threads up to `policy.ahead` items and `policy.ahead_bytes` ahead of the consumer; other sources pass through
    untouched. Threads are started only when the first remote item comes.

    More sources are taken only while the first one waiting is still being fetched: taking one may block (a list
    of paths on a pipe whose writer pauses), and an item that is ready is passed on first, so `producer | gemma-embed
    images -` embeds each path as it comes, as it did before this stage."""
    it = iter(sources)
    waiting: deque[Future | Source] = deque()
    pool: ThreadPoolExecutor | None = None

    def held() -> int:
        return sum(len(f.result().data or b"") for f in waiting if isinstance(f, Future) and f.done())

    try:
        while True:
            while len(waiting) < policy.ahead and (
                not waiting or not _ready(waiting[0]) and held() < policy.ahead_bytes
            ):
                source = next(it, None)
                if source is None:
                    break
                if needs_fetch(source):
                    if pool is None:
                        pool = ThreadPoolExecutor(max_workers=policy.threads, thread_name_prefix="fetch")
                    waiting.append(pool.submit(fetched, source, policy))
                else:
                    waiting.append(source)
            if not waiting:
                return
            head = waiting.popleft()
            yield head.result() if isinstance(head, Future) else head
    finally:
        for pending in waiting:
            if isinstance(pending, Future):
                pending.cancel()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
