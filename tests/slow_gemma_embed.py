"""A test double of the `gemma-embed` command whose towers sleep before every device batch.

    python tests/slow_gemma_embed.py SECONDS images DIR ...    # the real CLI, each encode delayed

Lets a test interrupt a real process midway, deterministically, without a test hook in the engine.
Under torchrun two environment variables shape a slow, uneven run:
- SLOW_RANK=R: only rank R sleeps (the others run at full speed);
- SHORT_PG_TIMEOUT_S=T: any torch.distributed process group this process creates gets a T-second default
  timeout instead of 30 minutes, so a test can show in seconds that no rank waits on such a group.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

from gemma_embed.models.base import EncoderTower


def slow_down(seconds: float) -> None:
    for tower in EncoderTower.__subclasses__():
        original = tower.encode

        def slow(self, units, space, original=original):
            time.sleep(seconds)
            return original(self, units, space)

        tower.encode = slow


def shorten_process_group_timeout(seconds: float) -> None:
    import torch.distributed.distributed_c10d as c10d

    c10d._get_default_timeout = lambda backend: timedelta(seconds=seconds)


if __name__ == "__main__":
    import gemma_embed.models.gemma3n  # noqa: F401 - register every tower class before patching
    import gemma_embed.models.gemma4  # noqa: F401
    import gemma_embed.models.gemma4_audio  # noqa: F401
    from gemma_embed.cli import main

    delay = float(sys.argv.pop(1))
    if os.environ.get("SLOW_RANK", os.environ.get("RANK", "0")) == os.environ.get("RANK", "0"):
        slow_down(delay)
    if "SHORT_PG_TIMEOUT_S" in os.environ:
        shorten_process_group_timeout(float(os.environ["SHORT_PG_TIMEOUT_S"]))
    sys.argv[0] = "gemma-embed"
    main()
