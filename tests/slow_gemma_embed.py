"""A test double of the `gemma-embed` command whose towers sleep before every device batch.

    python tests/slow_gemma_embed.py SECONDS images DIR ...    # the real CLI, each encode delayed

Lets a test interrupt a real process midway, deterministically, without a test hook in the engine.
"""

from __future__ import annotations

import sys
import time

from gemma_embed.models.base import EncoderTower


def slow_down(seconds: float) -> None:
    for tower in EncoderTower.__subclasses__():
        original = tower.encode

        def slow(self, units, space, original=original):
            time.sleep(seconds)
            return original(self, units, space)

        tower.encode = slow


if __name__ == "__main__":
    import gemma_embed.models.gemma3n  # noqa: F401 - register every tower class before patching
    import gemma_embed.models.gemma4  # noqa: F401
    import gemma_embed.models.gemma4_audio  # noqa: F401
    from gemma_embed.cli import main

    delay = float(sys.argv.pop(1))
    slow_down(delay)
    sys.argv[0] = "gemma-embed"
    main()
