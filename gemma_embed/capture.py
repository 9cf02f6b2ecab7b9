"""Foreign messages during a run: captured per item and attached to that item's record, never printed raw.

Decoders and processors speak on three channels, and each is routed for the length of a run (`Capture`):

1. Python warnings (Pillow's UserWarnings about EXIF, palettes, TIFF metadata, ...). `warnings.showwarning` is
   replaced by one function that looks up the *calling thread's* current item: decode and prepare run in worker
   threads, and a warning is raised in the thread whose code warns, so the attribution is exact. A catch-all
   "always" filter is appended after the existing filters (categories they ignore stay ignored): without it
   Python shows a warning once per code location, and the second file with the same problem would get nothing.
2. Logging (transformers' `logger.warning`, "The channel dimension is ambiguous..."; PyAV's `libav` logger when
   enabled). One handler on the root logger, and on transformers' library logger (which does not propagate and
   prints to stderr itself: its handlers are set aside for the run), dispatches on the logging thread the same
   way: exact too.
3. File descriptor 2: C libraries (libtiff's error handler, libsndfile/mpg123, FFmpeg when its log is on) and
   any Python code printing to `sys.stderr`. This channel is process-wide and carries no thread identity. For
   the run fd 2 is pointed at a pipe; the tool's own lines go to a duplicate of the original fd 2 (the reporter
   is handed that stream, a live rich bar included). A reader thread splits the pipe into lines and gives each
   line to every item whose *native* section is running when the line is read: `native()` wraps the decoder
   call, where the C libraries run, and not the processor, which speaks through warnings and logging; the
   narrower window makes two items' windows overlap less. Reading lags writing, so when a native section ends
   its thread writes a unique marker into the pipe and waits until the reader reaches it: every byte any thread
   wrote before then has been attributed while the section still counted as running. A line is attributed when
   its newline arrives (libtiff writes one message in three writes; a marker from another thread in between is
   cut out, not a line break), to the sections running then. With several workers a line printed while two
   items decode is attached to both and says so ("while 2 items were decoding").

A message outside any item (the encode, writing) belongs to no record: it goes to `on_message` with key None
(the reporter shows it with --debug) and is counted in `Capture.outside`. With --debug every message is also
shown live (`on_message` with the item's key). Messages are strings: "UserWarning: text" (warnings),
"transformers: text" (logging, by logger name), "stderr: text" (fd 2); an item's repeats are folded into one
entry ending in "(N times)".
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterator

OnMessage = Callable[[str | None, str], None]  # (item key or None, message)

_local = threading.local()  # .scope: the calling thread's current item
_lock = threading.RLock()
_installed: Capture | None = None
_markers = itertools.count()
_MARKER = b"\x00gemma-embed-sync:"
SYNC_TIMEOUT_S = 5.0  # a reader that stopped must never hang a decode thread
MAX_DISTINCT = 100  # distinct messages kept per item: a file that warns per frame must not bloat its record
SHARED = re.compile(r" \(while \d+ items were decoding\)$")  # marks an fd 2 line two items may have caused


class ItemMessages:
    """The messages of one item, in order; repeats folded into a count, at most MAX_DISTINCT kept."""

    def __init__(self, key: str):
        self.key = key
        self._counts: dict[str, int] = {}
        self._dropped = 0
        self._lock = threading.Lock()

    def add(self, text: str) -> None:
        from gemma_embed.redact import redact  # an item's warnings are written into the output: no secret in them

        text = " ".join(redact(text).split())
        if not text:
            return
        with self._lock:
            if text in self._counts or len(self._counts) < MAX_DISTINCT:
                self._counts[text] = self._counts.get(text, 0) + 1
            else:
                self._dropped += 1

    def texts(self) -> list[str]:
        with self._lock:
            kept = [text if n == 1 else f"{text} ({n} times)" for text, n in self._counts.items()]
            return kept + ([f"... and {self._dropped} more messages, not kept"] if self._dropped else [])

    def raw(self) -> list[str]:
        """Distinct messages as captured, without repeat counts."""
        with self._lock:
            return list(self._counts)


def _current() -> ItemMessages | None:
    return getattr(_local, "scope", None)


@contextlib.contextmanager
def item(key: str) -> Iterator[ItemMessages]:
    """Attribute what the calling thread's libraries say (warnings, logging), until the block ends, to the item
    `key`; fd 2 output too, inside `native()` sections.

    Without an installed `Capture` the scope still exists (and `current_messages` works) but nothing is
    rerouted: warnings and stderr behave as they normally do.
    """
    scope = ItemMessages(key)
    previous = _current()
    _local.scope = scope
    try:
        yield scope
    finally:
        _local.scope = previous


@contextlib.contextmanager
def native() -> Iterator[None]:
    """Within the calling thread's item, a section whose C libraries may write to fd 2 (the decoder call)."""
    scope, capture = _current(), _installed
    if scope is None or capture is None:
        yield
        return
    capture._enter(scope)
    try:
        yield
    finally:
        capture._leave(scope)


def current_messages() -> list[str]:
    """The calling thread's item's messages so far, fd 2 output included (the pipe is read up to now first)."""
    scope = _current()
    if scope is None:
        return []
    capture = _installed
    if capture is not None:
        capture.sync()
    return scope.raw()


class _ItemLogHandler(logging.Handler):
    def __init__(self, capture: Capture):
        super().__init__(level=logging.WARNING)
        self.capture = capture

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.name}: {record.getMessage()}"
        except Exception:  # noqa: BLE001 - a malformed record must not break the decode that logged it
            text = f"{record.name}: {record.msg}"
        self.capture._dispatch(_current(), text)


class Capture:
    """Route warnings, logging and fd 2 to the items that cause them, for the duration of a `with` block.

    `reporter` (optional) gets the original stderr as its stream while fd 2 is captured (only when it was
    writing to fd 2) and receives every message through `on_message`. `fd=False` leaves fd 2 alone.
    Nested use in one process shares the capture already installed.
    """

    def __init__(self, reporter=None, on_message: OnMessage | None = None, fd: bool = True):
        self.reporter = reporter
        self.on_message = on_message or (getattr(reporter, "library_message", None) if reporter else None)
        self.use_fd = fd
        self.outside = 0  # messages that belonged to no item
        self.active = False
        self._scopes: list[ItemMessages] = []
        self._waiting: dict[int, threading.Event] = {}
        self._reader: threading.Thread | None = None
        self._saved_fd: int | None = None
        self._read_fd: int | None = None
        self.real_stderr = None
        self._restore: list[Callable[[], None]] = []

    # ------------------------------------------------------------------------------------------ install
    def __enter__(self) -> Capture:
        global _installed
        with _lock:
            if _installed is not None:
                return self  # an outer run's capture already routes everything
            _installed = self
        self.active = True
        try:
            self._install_warnings()
            self._install_logging()
            if self.use_fd:
                self._install_fd()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        global _installed
        if not self.active:
            return
        for undo in reversed(self._restore):
            with contextlib.suppress(Exception):
                undo()
        self._restore.clear()
        self.active = False
        with _lock:
            _installed = None

    def _install_warnings(self) -> None:
        original_show = warnings.showwarning
        original_filters = list(warnings.filters)

        def show(message, category, filename, lineno, file=None, line=None):
            self._dispatch(_current(), f"{category.__name__}: {message}")

        warnings.showwarning = show
        warnings.filterwarnings("always", append=True)

        def undo() -> None:
            warnings.showwarning = original_show
            warnings.filters[:] = original_filters
            warnings._filters_mutated()  # drop the registries' memory of what "always" showed

        self._restore.append(undo)

    def _install_logging(self) -> None:
        handler = _ItemLogHandler(self)
        root = logging.getLogger()
        root.addHandler(handler)
        self._restore.append(lambda: root.removeHandler(handler))
        library = logging.getLogger("transformers")
        saved_handlers, saved_propagate = list(library.handlers), library.propagate
        library.handlers = [handler]
        library.propagate = False

        def undo() -> None:
            library.handlers = saved_handlers
            library.propagate = saved_propagate

        self._restore.append(undo)

    def _install_fd(self) -> None:
        try:
            saved = os.dup(2)
        except OSError:
            return  # no fd 2 to capture
        read_fd, write_fd = os.pipe()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._saved_fd, self._read_fd = saved, read_fd
        encoding = getattr(sys.__stderr__, "encoding", None) or "utf-8"
        self.real_stderr = os.fdopen(os.dup(saved), "w", buffering=1, encoding=encoding, errors="backslashreplace")
        self._reader = threading.Thread(target=self._read_loop, name="capture-stderr", daemon=True)
        self._reader.start()
        reporter_stream = None
        if self.reporter is not None and _writes_to_fd2(self.reporter.stderr):
            reporter_stream = self.reporter.stderr
            self.reporter.send_stderr_to(self.real_stderr)

        def undo() -> None:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)  # closes the pipe's last write end: the reader sees the end
            if self._reader is not None:
                self._reader.join(timeout=SYNC_TIMEOUT_S)
            if reporter_stream is not None:
                self.reporter.send_stderr_to(reporter_stream)
            self.real_stderr.flush()
            self.real_stderr.close()
            os.close(saved)
            os.close(read_fd)

        self._restore.append(undo)

    # ------------------------------------------------------------------------------------------ scopes
    def _enter(self, scope: ItemMessages) -> None:
        with _lock:
            self._scopes.append(scope)

    def _leave(self, scope: ItemMessages) -> None:
        try:
            self.sync()
        finally:
            with _lock:
                with contextlib.suppress(ValueError):
                    self._scopes.remove(scope)

    def sync(self) -> None:
        """Return once the reader has attributed every byte written to fd 2 before this call."""
        if self._reader is None or not self._reader.is_alive():
            return
        token = next(_markers)
        event = threading.Event()
        with _lock:
            self._waiting[token] = event
        with contextlib.suppress(Exception):
            sys.stderr.flush()  # Python-level text still in the stream's buffer goes first
        try:
            os.write(2, _MARKER + str(token).encode() + b"\x00")
            event.wait(SYNC_TIMEOUT_S)
        finally:
            with _lock:
                self._waiting.pop(token, None)

    # ------------------------------------------------------------------------------------------ routing
    def _dispatch(self, scope: ItemMessages | None, text: str) -> None:
        if scope is not None:
            scope.add(text)
        else:
            with _lock:
                self.outside += 1
        if self.on_message is not None:
            with contextlib.suppress(Exception):
                self.on_message(scope.key if scope is not None else None, " ".join(text.split()))

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "backslashreplace").strip()
        if not text:
            return
        with _lock:
            owners = list(self._scopes)
        if not owners:
            self._dispatch(None, f"stderr: {text}")
            return
        suffix = f" (while {len(owners)} items were decoding)" if len(owners) > 1 else ""  # see SHARED
        for scope in owners:
            self._dispatch(scope, f"stderr: {text}{suffix}")

    def _read_loop(self) -> None:
        line, unread = b"", b""  # the line being assembled; bytes not yet parsed (a marker cut in two)
        while True:
            try:
                chunk = os.read(self._read_fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            line, unread = self._consume(line, unread + chunk)
        if line + unread:
            self._line(line + unread)
        with _lock:
            for event in self._waiting.values():
                event.set()

    def _consume(self, line: bytes, data: bytes) -> tuple[bytes, bytes]:
        """Attribute complete lines and honour markers, in stream order. Returns (the line so far, the bytes
        that may start a marker and must wait for more)."""
        while data:
            marker = data.find(_MARKER)
            newline = data.find(b"\n")
            if marker != -1 and (newline == -1 or marker < newline):
                end = data.find(b"\x00", marker + len(_MARKER))
                if end == -1:
                    return line + data[:marker], data[marker:]  # the marker's own bytes are still arriving
                line += data[:marker]  # another thread's line may go on after the marker
                token = int(data[marker + len(_MARKER) : end])
                with _lock:
                    event = self._waiting.get(token)
                if event is not None:
                    event.set()
                data = data[end + 1 :]
            elif newline != -1:
                self._line(line + data[:newline])
                line, data = b"", data[newline + 1 :]
            else:
                # Hold back a tail that could be the start of a marker split across two reads.
                keep = next((k for k in range(min(len(data), len(_MARKER)), 0, -1) if _MARKER.startswith(data[-k:])), 0)
                return line + data[: len(data) - keep], data[len(data) - keep :]
        return line, b""


def _writes_to_fd2(stream) -> bool:
    try:
        return stream is not None and stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False  # a StringIO, a test runner's buffer: not the process's stderr
