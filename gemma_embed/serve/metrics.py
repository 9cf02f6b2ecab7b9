"""`/metrics` in Prometheus' text format, through prometheus-client, on a registry of the server's own (a library
caller's global registry is left alone).

- `gemma_embed_requests_total{route, status}`: answered requests, by route template (never a raw path: a client
  cannot grow the label set) and status code;
- `gemma_embed_request_seconds{route}`: latency histogram, from the request's first byte to its answer's last;
- `gemma_embed_batch_items` and `gemma_embed_batch_requests`: items and requests each window of the engine took
  together (what cross-request batching merged);
- `gemma_embed_queue_items`: items admitted and not yet answered (the queue's depth);
- `gemma_embed_items_total` and `gemma_embed_items_per_second`: items embedded, and the rate of the last window.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class Metrics:
    """The server's counters; also the batching queue's observer (`window`, `queued`)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        kw = {"registry": self.registry}
        self.requests = Counter("gemma_embed_requests", "HTTP requests answered.", ["route", "status"], **kw)
        self.latency = Histogram(
            "gemma_embed_request_seconds", "Seconds to answer a request.", ["route"], buckets=LATENCY_BUCKETS, **kw
        )
        self.batch_items = Histogram(
            "gemma_embed_batch_items", "Items one window of the engine encoded together.", buckets=SIZE_BUCKETS, **kw
        )
        self.batch_requests = Histogram(
            "gemma_embed_batch_requests", "Requests merged into one window of the engine.", buckets=SIZE_BUCKETS, **kw
        )
        self.queue = Gauge("gemma_embed_queue_items", "Items admitted and not yet answered.", **kw)
        self.items = Counter("gemma_embed_items", "Items embedded.", **kw)
        self.rate = Gauge("gemma_embed_items_per_second", "Items a second in the last window.", **kw)

    def request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def window(self, items: int, jobs: int, seconds: float) -> None:
        self.batch_items.observe(items)
        self.batch_requests.observe(jobs)
        self.items.inc(items)
        if seconds > 0:
            self.rate.set(items / seconds)

    def queued(self, items: int) -> None:
        self.queue.set(items)

    def render(self) -> bytes:
        return generate_latest(self.registry)
