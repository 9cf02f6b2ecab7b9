"""SIGINT/SIGTERM: ask the run to stop at the next safe point, so finished items are flushed, not lost.

While nothing can be lost yet (loading the model), `immediate` makes the signal raise at once instead.
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
    def __init__(self, immediate: bool = False):
        self.signum: int | None = None
        self.immediate = immediate  # raise from the handler itself: there is nothing to save yet

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)


@contextmanager
def stop_on_signals(immediate: bool = False):
    """Install the handlers (main thread only: Python delivers signals there) and restore them after."""
    flag = StopFlag(immediate)
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        flag.signum = signum
        for sig, old in previous.items():
            signal.signal(sig, old)
        if flag.immediate:
            raise Interrupted(signum)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
