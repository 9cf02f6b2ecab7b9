"""The batch sizes the tuner decided, kept across runs per machine and tower (`--tuning-cache`).

One run often ends before the tuner can decide: a comparison needs at least `tuning.MIN_PAIRS` pairs of batches
after the first, and a short run has few batches that a size shaped (the summary said "still exploring ... 0 pairs
so far" on every such run). So the tuner's state (the size in use, the sizes that lost, the comparison under way
with its pairs) is kept in one small JSON file and the next run on the same machine and tower continues from it:
pairs add up across runs until a comparison is decided, and a decided size is where later runs start.

The key names the machine (the CPU's model name and its logical CPUs, or the accelerator's name) and the tower (its
class, dtype, weight bytes and the cost model's bytes for a 1024-long unit: two towers of one class but another
shape differ there). Batch sizes never change an item's numbers (tests/integration/test_thread_count_bytes.py), so a
stored size changes how fast a run is, not what it writes.

The file is a cache: one that cannot be read (missing, damaged, another program's, too large) is started afresh,
and one that cannot be written is left as it is; neither stops a run. It is written whole or not at all (the seam's
atomic write), and two runs saving at once keep one of their states.
"""

from __future__ import annotations

import json
import os
import platform
from typing import Any

from gemma_embed.cpu_threads import cpu_model
from gemma_embed.locations import Location, location

FORMAT = "gemma-embed batch sizes 1"
MAX_BYTES = 1 << 20  # a file larger than this is no cache of ours
AUTO = "auto"
OFF = "off"


def default_location() -> Location:
    """The user's cache folder, as the XDG base directory specification names it (`~/.cache` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return location(os.path.join(base, "gemma-embed", "batch-sizes.json"))


def machine_key(device) -> str:
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {cpu_model() or platform.processor() or platform.machine()} x {os.cpu_count()}"


def tower_key(tower) -> str:
    return (
        f"{type(tower).__name__} {str(tower.dtype).removeprefix('torch.')} weights={tower.weight_bytes()} "
        f"cost1024={tower.unit_cost(1024)}"
    )


class TunedSizes:
    """The stored states, by key, in the file at `where`."""

    def __init__(self, where: Location) -> None:
        self.where = where

    @classmethod
    def from_setting(cls, setting: str | None) -> TunedSizes | None:
        """`--tuning-cache`: auto (the user cache folder), off (nothing kept), or a file."""
        if setting is None or setting == OFF:
            return None
        return cls(default_location() if setting == AUTO else location(setting))

    def _read(self) -> dict[str, Any]:
        try:
            if not self.where.isfile() or self.where.size() > MAX_BYTES:
                return {}
            data = json.loads(self.where.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("states"), dict):
            return {}
        return data["states"]

    def load(self, key: str) -> dict | None:
        state = self._read().get(key)
        return state if isinstance(state, dict) else None

    def save(self, key: str, state: dict) -> bool:
        """Keep `state` under `key` (the other keys as they are now); False when the file could not be written."""
        states = self._read()
        states[key] = state
        text = json.dumps({"format": FORMAT, "states": states}, indent=1, sort_keys=True)
        try:
            self.where.parent.makedirs(exist_ok=True)
            with self.where.atomic_write() as fh:
                fh.write(text.encode("utf-8"))
        except OSError:
            return False
        return True
