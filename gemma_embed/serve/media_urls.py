"""Media given by URL: the bytes of a `data:` URL or of an http(s) URL fetched under the server's limits.

A `data:` URL is decoded in the request (never more than the item limit, `--max-item-bytes`: 413 past it, unread).
Only `data:`, `http:` and `https:` are taken: never a file path or `file:` URL, so a client cannot make the server
read its own disk.

An http(s) URL is fetched by a `Fetcher`, the server's one, because its clients are not trusted (OWASP's SSRF
guidance, vLLM's `--allowed-media-domains`):

- every hop (the URL, then each redirect, at most `MAX_REDIRECTS`) is http or https; its host name is resolved here
  (`socket.getaddrinfo`) and every address it has is checked with `ipaddress` before anything connects: an address
  that is not globally routable (loopback, private, link-local such as 169.254.169.254, shared, multicast, reserved,
  unspecified; an IPv4-mapped IPv6 address as its IPv4 one) is refused. With `--allowed-media-domains`, only the
  hosts listed are fetched, whatever their addresses (the operator vouches for them);
- the connection goes to the address that was checked (pinned: no second lookup a DNS answer could change), with the
  URL's name in `Host` and, for https, in SNI and the certificate check;
- every refused or failed fetch gets one text (`FETCH_FAILED`), so an answer never tells a refused address from a
  closed port, a timeout, a TLS failure or a 404: a client cannot map what listens near the server;
- bytes are counted as they arrive against the request's budget (`--max-fetch-bytes`), the server's
  (`--fetch-budget`, shared by every request in flight) and the item limit; a declared `Content-Length` over any of
  them is refused before the body is read (413, or 429 for the server's budget, which frees as requests end);
- the whole fetch, redirects included, ends by its deadline (`--fetch-timeout`): a timer shuts the socket down, so a
  server that sends a byte a second cannot hold it longer;
- fetches run in the Fetcher's own daemon threads (`FETCH_THREADS`), never in asyncio's default pool that
  thumbnails, `/v1/outputs` and `/v1/search` use; `close()` (the server's first SIGTERM) shuts down every socket in
  flight and refuses new fetches (a queued one fails at once), so the process ends within `--grace`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import http.client
import ipaddress
import queue
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

from gemma_embed.serve.openai_shapes import ApiError, invalid
from gemma_embed.sizes import human_bytes
from gemma_embed.sources.base import item_too_large

CHUNK_BYTES = 1 << 16
USER_AGENT = "gemma-embed-serve"
MAX_REDIRECTS = 3
FETCH_THREADS = 16  # fetches in flight at once, server-wide (more wait for a thread; other routes never do)
REDIRECTS = frozenset({301, 302, 303, 307, 308})
SCHEMES = {"http": 80, "https": 443}
# The one answer to every refused or failed fetch (the address, the connection, TLS, the status, the deadline).
FETCH_FAILED = (
    "the URL could not be fetched (only http(s) URLs of public hosts, or of --allowed-media-domains, that answer "
    "200 within --fetch-timeout are)"
)

Resolver = Callable[..., list]


def too_large(size: int, limit: int, param: str) -> ApiError:
    return ApiError(413, f"{param}: {item_too_large(size, limit)}", param, "item_too_large")


def data_url_bytes(url: str, limit: int, param: str) -> bytes:
    """The bytes of `data:[<type>][;base64],<data>` (RFC 2397)."""
    head, comma, payload = url.partition(",")
    if not comma:
        raise invalid(f"{param}: a data: URL needs a comma before its data", param)
    if head.endswith(";base64"):
        estimate = len(payload) * 3 // 4
        if estimate > limit + 2:
            raise too_large(estimate, limit, param)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"{param}: the data: URL's base64 is not valid", param) from None
    else:
        data = urllib.parse.unquote_to_bytes(payload)
    if len(data) > limit:
        raise too_large(len(data), limit, param)
    return data


def url_scheme(url: str) -> str:
    return url.split(":", 1)[0].lower() if ":" in url else ""


def check_scheme(url: str, param: str) -> str:
    """The scheme of a media input's URL: data, http or https (400 for anything else, a path or file: included)."""
    scheme = url_scheme(url)
    if scheme not in ("data", "http", "https"):
        raise invalid(f"{param}: give media as a data: URL or an http(s) URL", param, "unsupported_url")
    return scheme


# ------------------------------------------------------------------------------------------ addresses


def public_address(address: str) -> bool:
    """Whether an address is one the internet routes to (`ipaddress`' is_global), and no multicast or reserved one;
    an IPv4-mapped IPv6 address is judged as its IPv4 address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)


class Refused(Exception):
    """A fetch that may not or could not happen (its reason is for the server's log, never the client)."""


@dataclass(frozen=True)
class Hop:
    scheme: str
    host: str
    port: int
    target: str  # path and query


def parse_hop(url: str) -> Hop:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise Refused(f"scheme {scheme!r}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise Refused(f"bad port: {exc}") from None
    if not host or parts.username is not None or parts.password is not None:
        raise Refused("no host, or credentials in the URL")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return Hop(scheme, host.lower(), port or SCHEMES[scheme], target)


def checked_addresses(hop: Hop, allowed: tuple[str, ...], resolve: Resolver) -> list[str]:
    """The addresses to connect to for a hop (tried in turn), after the checks (Refused otherwise): with an
    allow-list, the host must be in it; without, every address the name resolves to must be public."""
    if allowed and hop.host not in allowed:
        raise Refused(f"{hop.host} is not in --allowed-media-domains")
    try:
        found = resolve(hop.host, hop.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise Refused(f"{hop.host} does not resolve: {exc}") from None
    addresses = [info[4][0] for info in found if info[0] in (socket.AF_INET, socket.AF_INET6)]
    if not addresses:
        raise Refused(f"{hop.host} has no address")
    if not allowed:
        private = [a for a in addresses if not public_address(a)]
        if private:
            raise Refused(f"{hop.host} resolves to {private[0]}, which is not a public address")
    return list(dict.fromkeys(addresses))


# ------------------------------------------------------------------------------------------ budgets


class Budget:
    """Bytes shared by every request in flight (--fetch-budget)."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.used = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        with self._lock:
            if self.used + size > self.limit:
                return False
            self.used += size
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self.used -= size


@dataclass
class Ledger:
    """One request's fetched bytes: counted against its own limit and the server's budget, given back at its end.
    Once given back it takes nothing more: a fetch of the request still running (another input failed first) ends
    at its next chunk instead of counting bytes nobody will give back."""

    limit: int
    budget: Budget
    used: int = 0
    released: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self) -> None:
        """Refused once the request has ended: a fetch stops at its next chunk, whatever it declared."""
        if self.released:
            raise Refused("its request has ended")

    def take(self, size: int, param: str) -> None:
        with self._lock:
            self.check()
            if self.used + size > self.limit:
                raise ApiError(
                    413,
                    f"{param}: the request's media URLs are over the {human_bytes(self.limit)} one request may fetch "
                    "(--max-fetch-bytes)",
                    param,
                    "fetch_too_large",
                )
            if not self.budget.take(size):
                raise ApiError(
                    429,
                    f"{param}: the server is holding all the media bytes it may (--fetch-budget); retry shortly",
                    param,
                    "fetch_budget_full",
                    headers={"Retry-After": "1"},
                )
            self.used += size

    def release(self) -> None:
        with self._lock:
            self.released = True
            self.budget.give(self.used)
            self.used = 0


# ------------------------------------------------------------------------------------------ connections


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to the checked addresses (the first that answers); `host` stays the URL's name (the Host
    header)."""

    def __init__(
        self, host: str, port: int, addresses: list[str], timeout: float, opened: Callable[[socket.socket], None]
    ):
        super().__init__(host, port, timeout=timeout)
        self.addresses, self.opened = addresses, opened
        self.raw: socket.socket | None = None  # the TCP socket (under TLS, the one the TLS socket wraps)

    def _socket(self) -> socket.socket:
        failure: OSError = OSError("no address")
        for address in self.addresses:
            try:
                sock = socket.create_connection((address, self.port), self.timeout)
            except OSError as exc:
                failure = exc
                continue
            self.raw = sock
            self.opened(sock)
            return sock
        raise failure

    def connect(self) -> None:
        self.sock = self._socket()


class _PinnedHTTPS(_PinnedHTTP):
    """The same over TLS: SNI and the certificate checked against the URL's name (ssl's default context)."""

    default_port = 443

    def __init__(self, *args, context: ssl.SSLContext, **kwargs):
        super().__init__(*args, **kwargs)
        self.context = context

    def connect(self) -> None:
        raw = self._socket()
        try:
            self.sock = self.context.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise


class Fetcher:
    """The server's fetches of http(s) media: checks, limits, its own threads, and shutdown (module docstring)."""

    def __init__(
        self,
        allowed: tuple[str, ...] = (),
        request_limit: int = 64 << 20,
        budget: int = 256 << 20,
        deadline_s: float = 30.0,
        resolve: Resolver = socket.getaddrinfo,
        log: Callable[[str], None] | None = None,
    ):
        self.allowed = tuple(allowed)
        self.request_limit = request_limit
        self.budget = Budget(budget)
        self.deadline_s = deadline_s
        self.resolve = resolve
        self.log = log
        self.connections = 0  # sockets opened so far (what a test may ask)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._context = ssl.create_default_context()

    def ledger(self) -> Ledger:
        return Ledger(self.request_limit, self.budget)

    async def fetch(self, url: str, item_limit: int, ledger: Ledger, param: str) -> bytes:
        """The body of an http(s) URL, in the Fetcher's threads; ApiError (FETCH_FAILED, 413, 429) otherwise."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if len(self._threads) < FETCH_THREADS:
                thread = threading.Thread(target=self._worker, name="gemma-embed-fetch", daemon=True)
                self._threads.append(thread)
                thread.start()
        self._work.put((done, (url, item_limit, ledger, param)))
        return await asyncio.wrap_future(done)

    def _worker(self) -> None:
        """One of the Fetcher's threads: daemon threads, so a name that takes its DNS server a minute to resolve
        cannot keep the process past --grace (a ThreadPoolExecutor's threads are joined at exit)."""
        while True:
            done, args = self._work.get()
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(self._fetch(*args))
            except BaseException as exc:  # noqa: BLE001 - the request's task raises it
                done.set_exception(exc)

    def close(self) -> None:
        """Refuse new fetches and end those in flight now (their sockets shut down)."""
        with self._lock:
            self._closed = True
            sockets = list(self._open)
        for sock in sockets:
            _shut(sock)

    # --------------------------------------------------------------------------- in a fetch thread
    def _opened(self, sock: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            self._open.add(sock)
            closed = self._closed
        if closed:
            _shut(sock)

    def _fetch(self, url: str, item_limit: int, ledger: Ledger, param: str) -> bytes:
        deadline = time.monotonic() + self.deadline_s
        try:
            for _ in range(MAX_REDIRECTS + 1):
                if self._closed:
                    raise Refused("the server is stopping")
                hop = parse_hop(url)
                addresses = checked_addresses(hop, self.allowed, self.resolve)
                body, location = self._one_hop(hop, addresses, deadline, item_limit, ledger, param)
                if location is None:
                    return body
                url = urllib.parse.urljoin(url, location)
            raise Refused(f"more than {MAX_REDIRECTS} redirects")
        except ApiError:
            raise
        except (Refused, OSError, http.client.HTTPException, ValueError) as exc:
            if self.log is not None:
                self.log(f"note: {param}: fetch refused or failed: {' '.join(str(exc).split()) or type(exc).__name__}")
            raise ApiError(400, f"{param}: {FETCH_FAILED}", param, "fetch_failed") from None

    def _one_hop(
        self, hop: Hop, addresses: list[str], deadline: float, item_limit: int, ledger: Ledger, param: str
    ) -> tuple[bytes, str | None]:
        """One request: (body, None), or (b"", Location) for a redirect."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise Refused("past --fetch-timeout")
        if hop.scheme == "https":
            connection: _PinnedHTTP = _PinnedHTTPS(
                hop.host, hop.port, addresses, left, self._opened, context=self._context
            )
        else:
            connection = _PinnedHTTP(hop.host, hop.port, addresses, left, self._opened)
        timer = threading.Timer(left, self._expire, (connection,))
        timer.daemon = True
        timer.start()
        try:
            connection.request("GET", hop.target, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
            response = connection.getresponse()
            if response.status in REDIRECTS:
                location = response.getheader("Location")
                if not location:
                    raise Refused(f"{response.status} without a Location")
                return b"", location
            if response.status != 200:
                raise Refused(f"answered {response.status}")
            return self._body(response, item_limit, ledger, param, deadline), None
        finally:
            timer.cancel()
            connection.close()
            if connection.raw is not None:
                connection.raw.close()
                with self._lock:
                    self._open.discard(connection.raw)

    def _body(self, response, item_limit: int, ledger: Ledger, param: str, deadline: float) -> bytes:
        declared = response.getheader("Content-Length")
        chunks: list[bytes] = []
        if declared is not None and declared.strip().isdigit():
            size = int(declared)
            if size > item_limit:
                raise too_large(size, item_limit, param)
            ledger.take(size, param)  # refused before a byte of the body is read
            counted = size
        else:
            counted = 0
        got = 0
        while chunk := response.read1(CHUNK_BYTES):
            got += len(chunk)
            if got > item_limit:
                raise too_large(got, item_limit, param)
            if got > counted:
                ledger.take(got - counted, param)
                counted = got
            else:  # counted when its size was declared: its request may have ended since
                ledger.check()
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise Refused("past --fetch-timeout")
        if self._closed or time.monotonic() > deadline:  # the socket was shut down: the body is cut
            raise Refused("past --fetch-timeout, or the server is stopping")
        if declared is not None and declared.strip().isdigit() and got != int(declared):
            raise Refused(f"{got} bytes of the {declared} declared")
        return b"".join(chunks)

    def _expire(self, connection: _PinnedHTTP) -> None:
        """The deadline passed: shut the socket so a read blocked on it returns now."""
        if connection.raw is not None:
            _shut(connection.raw)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
