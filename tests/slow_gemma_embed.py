"""A test double of the `gemma-embed` command: the real CLI with its towers (or its model loading) slowed down.

    python tests/slow_gemma_embed.py [--encode SECONDS [--encode-after FILE]] [--gate DIR]
        [--load SECONDS --loading-marker FILE [--release FILE]] images DIR ...

`--encode` sleeps before every device batch; with `--encode-after`, a batch first waits until FILE appears (such
as another rank's manifest), so the sleep surely comes after that event. `--gate` holds device batch N (counted
from 0 in this process) until the file DIR/N appears or a stop signal (SIGINT, SIGTERM) has come, so a test
decides how far the run gets and that it is still running when signalled. `--load` sleeps while the model loads,
after touching the marker file (so a test knows the process is loading); with `--release`, only until that file
appears (so a test decides when the process goes on). Lets a test interrupt a real process at a chosen stage,
deterministically, without test hooks in the package.
Under torchrun two environment variables shape a slow, uneven run:
- SLOW_RANK=R: only rank R sleeps (the others run at full speed);
- SHORT_PG_TIMEOUT_S=T: any torch.distributed process group this process creates gets a T-second default
  timeout instead of 30 minutes, so a test can show in seconds that no rank waits on such a group.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from gemma_embed.models.base import EncoderTower

# A gate never opened (or a file that never appears) lets its batch go after this long: a test that died must
# not leave its run behind.
GATE_HANG_GUARD_S = 300.0


def slow_down(seconds: float, after: Path | None = None) -> None:
    for tower in EncoderTower.__subclasses__():
        original = tower.encode

        def slow(self, units, space, original=original):
            deadline = time.monotonic() + GATE_HANG_GUARD_S
            while after is not None and not after.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(seconds)
            return original(self, units, space)

        tower.encode = slow


def gate_batches(gate: Path) -> None:
    """Hold device batch N until gate/N exists or a stop signal came (the run then stops after that batch)."""
    from gemma_embed import interrupts

    signalled: list[int] = []  # a plain list: the handler that sets the flag runs between the gate's sleeps

    class SignalledFlag(interrupts.StopFlag):  # the run's stop flag, telling the gate when a signal has set it
        @property
        def signum(self):
            return self._signum

        @signum.setter
        def signum(self, value):
            self._signum = value
            if value is not None:
                signalled.append(value)

    interrupts.StopFlag = SignalledFlag  # stop_on_signals makes its flags from the module's name
    batches = itertools.count()
    for tower in EncoderTower.__subclasses__():
        original = tower.encode

        def gated(self, units, space, original=original):
            opened = gate / str(next(batches))
            deadline = time.monotonic() + GATE_HANG_GUARD_S
            while not opened.exists() and not signalled and time.monotonic() < deadline:
                time.sleep(0.01)
            return original(self, units, space)

        tower.encode = gated


def slow_loading(seconds: float, marker: Path, release: Path | None = None) -> None:
    from gemma_embed.embedder import Embedder

    original = Embedder.load

    def slow(*args, **kwargs):
        marker.touch()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (release is not None and release.exists()):
            time.sleep(0.02)
        return original(*args, **kwargs)

    Embedder.load = slow


def shorten_process_group_timeout(seconds: float) -> None:
    import torch.distributed.distributed_c10d as c10d

    c10d._get_default_timeout = lambda backend: timedelta(seconds=seconds)


if __name__ == "__main__":
    import gemma_embed.models.gemma3n  # noqa: F401 - register every tower class before patching
    import gemma_embed.models.gemma4  # noqa: F401
    import gemma_embed.models.gemma4_audio  # noqa: F401
    from gemma_embed.cli import main

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--encode", type=float, default=0.0)
    parser.add_argument("--encode-after", type=Path)
    parser.add_argument("--gate", type=Path)
    parser.add_argument("--load", type=float, default=0.0)
    parser.add_argument("--loading-marker", type=Path)
    parser.add_argument("--release", type=Path)
    ours, rest = parser.parse_known_args()
    rank = os.environ.get("RANK", "0")
    if ours.encode and os.environ.get("SLOW_RANK", rank) == rank:
        slow_down(ours.encode, ours.encode_after)
    if ours.gate is not None:
        gate_batches(ours.gate)
    if ours.load:
        slow_loading(ours.load, ours.loading_marker, ours.release)
    if "SHORT_PG_TIMEOUT_S" in os.environ:
        shorten_process_group_timeout(float(os.environ["SHORT_PG_TIMEOUT_S"]))
    sys.argv = ["gemma-embed", *rest]
    main()
