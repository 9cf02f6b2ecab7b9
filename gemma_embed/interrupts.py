"""SIGINT/SIGTERM: ask the run to stop at the next safe point, so finished items are flushed, not lost.

A second signal falls back to the default behaviour (immediate exit), for a user who really means it.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class Interrupted(Exception):
    """Raised at a safe point after a stop signal; carries the signal number for the exit code."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class StopFlag:
    def __init__(self):
        self.signum: int | None = None

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)


@contextmanager
def stop_on_signals():
    """Install the handlers (main thread only: Python delivers signals there) and restore them after."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        flag.signum = signum
        for sig, old in previous.items():
            signal.signal(sig, old)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
