"""The memory planner: pure functions of plain numbers; it reads nothing from the system itself.

It turns (free, total) memory, as `memory.readings` reads it, and a cost model of the tower's dominant transient
into a chunk size. It never admits a chunk whose modelled transient exceeds the budget (except the unavoidable chunk
of 1, which the engine's out-of-memory back-off then guards); on a CPU it shares the one host budget out between the
model, the decode side and the encode (`host_plan`).

The cost models are the towers' own (`Tower.unit_cost`), each beside its tower in the family module that runs it
(`models/gemma4.py`, ...; the two EmbeddingGemma text models share `models/text_cost.py`): planning here knows
only the bytes a unit costs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gemma_embed.sizes import human_bytes

DEFAULT_FREE_FRACTION = 0.5
DEFAULT_TOTAL_FRACTION = 0.1

# Units --memory-budget takes: decimal (kB = 1000 B) and binary (KiB = 1024 B) multiples of bytes.
_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


@dataclass(frozen=True)
class BudgetSpec:
    """What `--memory-budget` asked for: bytes, a share of the device's total memory, or the default rule."""

    bytes: int | None = None
    fraction_of_total: float | None = None
    # Never more than this (on a CPU: the encode's share of the one host budget, `host_plan`); not the user's.
    cap: int | None = None

    @property
    def explicit(self) -> bool:
        return self.bytes is not None or self.fraction_of_total is not None


def parse_budget(text: str | None) -> BudgetSpec:
    """'2GiB', '512MiB', '1.5GB' -> bytes; '30%' -> that share of the device's total memory; None or 'auto' ->
    the default rule. A bare number is refused: '2' was 2 bytes and '1.5' one byte, never what was meant."""
    if text is None or str(text).strip() in ("", "auto"):
        return BudgetSpec()
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%|[a-zA-Z]*)\s*", str(text))
    if not match:
        raise ValueError(f"cannot read memory budget {text!r}: use an amount like 2GiB or 512MiB, or a share like 30%")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit == "":
        raise ValueError(f"memory budget {text!r} has no unit: write 2GiB, 512MiB, ... or a share like 30%")
    if unit == "%":
        if not 0 < number <= 100:
            raise ValueError(f"memory budget {text!r}: a share must be above 0% and at most 100%")
        return BudgetSpec(fraction_of_total=number / 100)
    if unit not in _UNITS:
        raise ValueError(
            f"unknown unit {match.group(2)!r} in memory budget {text!r} (use B, KB, MB, GB, KiB, MiB, GiB)"
        )
    value = int(number * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"memory budget {text!r} must be at least one byte")
    return BudgetSpec(bytes=value)


def budget(free: int, total: int, spec: BudgetSpec = BudgetSpec()) -> int:
    """Bytes a chunk's transient may use now. Default: min(free * 0.5, total * 0.1); an explicit budget (bytes
    or a share of the total) is the user's call but never more than is free; never more than `spec.cap`. Never
    negative."""
    free, total = max(0, int(free)), max(0, int(total))
    if spec.bytes is not None:
        allowed = min(spec.bytes, free)
    elif spec.fraction_of_total is not None:
        allowed = min(int(total * spec.fraction_of_total), free)
    else:
        allowed = int(min(free * DEFAULT_FREE_FRACTION, total * DEFAULT_TOTAL_FRACTION))
    if spec.cap is not None:
        allowed = min(allowed, int(spec.cap))
    return max(0, allowed)


def chunk_size(cost_per_item: float, budget_bytes: float, cap: int | None = None) -> int:
    """Largest n with n * cost_per_item <= budget_bytes; at least 1, at most cap. Never divides by zero."""
    if cost_per_item is None or not math.isfinite(cost_per_item) or cost_per_item <= 0:
        # Nothing to model (empty item): the budget does not constrain, only the cap does.
        n = cap if cap and cap > 0 else 1
    else:
        n = int(max(0.0, float(budget_bytes)) // float(cost_per_item))
        if cap is not None and cap > 0:
            n = min(n, cap)
    return max(1, int(n))


# ------------------------------------------------------------------------------------------ host memory

# On a CPU the host is the device, so one budget (--memory-budget, or the default rule read from host memory once
# the model is loaded) covers all the run's memory beyond the process's own baseline (Python, torch and the other
# libraries, about 0.9 GiB with the tiny test checkpoint):
# - the model's weights, resident for the whole run: they come off the top;
# - the decode side: the estimated decode peaks of the items decoding now, plus the prepared tensors of the items
#   decoded and not yet encoded (the window being built and the one being encoded); `decoding.prepared_stream`
#   admits an item only while these fit, so workers wait for room;
# - the encode side: one chunk's modelled transient (the engines plan chunks within it).
# The decode and encode sides share what the model leaves by a fixed split, not by what is free at the moment:
# they coexist (the window being encoded is held during its forward, and workers may decode the next items beside
# it), and a split decided once can never count the same bytes twice. Half each: on a CPU the chunk size barely
# changes the speed (bench/README.md: chunks of 1, 2 and 4 images within 2% of each other, 8 10% slower), so the
# encode side needs little more than one unit's transient, while the decode side needs room for a few large decodes
# at once to keep its workers busy (a 24-megapixel photo peaks at 0.3-0.5 GiB, below).
# On an accelerator --memory-budget is the device's; the decode side then gets the default rule's share of host
# memory (nothing else of the run's is large on the host there).
HOST_DECODE_SHARE = 0.5


@dataclass(frozen=True)
class HostPlan:
    """How a run's host memory is shared out; what `plan` shows (bytes)."""

    budget: int  # the run's host memory beyond the process's baseline
    model: int  # the towers' weights held on the host (0 on an accelerator)
    decode: int  # decodes in flight (estimated peaks) + prepared items held
    encode: int | None  # one chunk's transient on the CPU; None: the accelerator's own budget plans chunks

    def as_dict(self) -> dict:
        return {"budget": self.budget, "model": self.model, "decode": self.decode, "encode": self.encode}

    def chunk_spec(self, spec: BudgetSpec) -> BudgetSpec:
        """What the engines plan chunks with: the user's budget, held to the encode's share on a CPU."""
        return spec if self.encode is None else BudgetSpec(spec.bytes, spec.fraction_of_total, cap=self.encode)

    def describe(self) -> str:
        """One line for people: how the host budget is shared out."""
        if self.encode is None:
            return f"host: decode {human_bytes(self.decode)} (the default rule on host memory)"
        return (
            f"host budget {human_bytes(self.budget)} = model {human_bytes(self.model)} + decode "
            f"{human_bytes(self.decode)} + encode {human_bytes(self.encode)}"
        )


def host_plan(free: int, total: int, spec: BudgetSpec, model_bytes: int, host_is_device: bool) -> HostPlan:
    """Share out host memory: (free, total) host bytes read after loading, the user's budget, the model's weights
    on the host, and whether the encode runs on the host (a CPU) too. The reasoning is in the comment above."""
    if not host_is_device:
        return HostPlan(budget(free, total), 0, budget(free, total), None)
    whole = budget(free, total, spec)
    rest = max(0, whole - max(0, int(model_bytes)))
    decode = int(rest * HOST_DECODE_SHARE)
    return HostPlan(whole, max(0, int(model_bytes)), decode, rest - decode)
