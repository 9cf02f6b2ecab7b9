"""Memory planning: pure functions of plain numbers, plus one probe of the current device.

The planner turns (free, total) device memory and a cost model of the tower's dominant transient into a chunk
size. It never admits a chunk whose modelled transient exceeds the budget (except the unavoidable chunk of 1,
which the engine's out-of-memory back-off then guards).

The cost models are the towers' own (`Tower.unit_cost`), each beside its tower in the family module that runs it
(`models/gemma4.py`, ...; the two EmbeddingGemma text models share `models/text_cost.py`): planning here knows
only the bytes a unit costs.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

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


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'; None -> '-'."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


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


# Peak host memory of one image through `media.image.decode_image` and the Gemma 4 image preparer, per pixel of
# the file (width x height), measured with VmHWM in a fresh process (mmap threshold pinned, as the CLI runs), Pillow
# 13.0, transformers 5.24 (`python -m bench.bench_memory --decode`; bench/MEMORY.md has the table):
# - files transformers' conversion leaves as they are (RGB without transparency): 14.0 B/px for PNG, JPEG and TIFF
#   at 2000x2000, 3000x3000 and 9400x9400 (the decoded image, 4 B/px in Pillow, held while the processor makes its
#   own RGB copy, 4 B/px, and turns that into a numpy array through a bytes copy, 3 + 3); 16.0-16.2 for WebP
#   (libwebp's own buffer);
# - files it composites onto white (an alpha band or a transparency entry): 22.0 B/px for RGBA and LA PNGs and RGB
#   PNGs with tRNS (the RGBA copy, the white background, the composite and their numpy copies), 19.0 for P with
#   tRNS, 16.0 for RGBA WebP.
# Other conversions (L, 1, P, I;16, CMYK) peak at 14.0, in the processor, as RGB files do. The constants are the
# worst of each kind plus about 5% (page rounding, the small allocations around), and a test holds them there.
IMAGE_PEAK_BYTES_PER_PIXEL = 17
IMAGE_COMPOSITED_PEAK_BYTES_PER_PIXEL = 23


def image_decode_peak(width: int, height: int, composited: bool) -> int:
    """Estimated peak host bytes of decoding and preparing one image, from its header: its size, and whether it
    has alpha or a transparency entry (composited onto white)."""
    per_pixel = IMAGE_COMPOSITED_PEAK_BYTES_PER_PIXEL if composited else IMAGE_PEAK_BYTES_PER_PIXEL
    return max(0, int(width)) * max(0, int(height)) * per_pixel


# The same for a video through `media.video.decode_video` and the Gemma 4 video preparer, per pixel of the sampled
# frames (frames x width x height): 8.8 B/px for 32 frames of 1920x1080 H.264 (the decoded frames, 3 B/px, their
# stacked copy and the processor's), 12.2 for 32 frames of a rotated 1280x720 MPEG-4 clip (the rotation's copy).
VIDEO_PEAK_BYTES_PER_PIXEL = 13
# And for audio through `media.audio.decode_audio` and the audio preparer, per sample at the target rate (mono):
# 11.4 B for 600 s of 44.1 kHz stereo WAV or FLAC resampled to 16 kHz, 12.7 for the same as MP3 (the resampled
# parts and their concatenation, 4 + 4, then the mel features).
AUDIO_PEAK_BYTES_PER_SAMPLE = 14
# An audio stream whose header gives no duration is estimated as this long.
AUDIO_UNKNOWN_DURATION_S = 600


def video_decode_peak(frames: int, width: int, height: int) -> int:
    """Estimated peak host bytes of decoding and preparing the sampled frames of one video."""
    return max(0, int(frames)) * max(0, int(width)) * max(0, int(height)) * VIDEO_PEAK_BYTES_PER_PIXEL


def audio_decode_peak(duration_s: float | None, sample_rate: int) -> int:
    """Estimated peak host bytes of decoding and preparing one audio clip of this many seconds (None: unknown) at
    the preparer's sample rate."""
    seconds = AUDIO_UNKNOWN_DURATION_S if duration_s is None or not math.isfinite(duration_s) else duration_s
    return int(max(0.0, float(seconds)) * max(0, int(sample_rate)) * AUDIO_PEAK_BYTES_PER_SAMPLE)


# ---------------------------------------------------------------------------------------------- the probe


def host_memory(available: int, total: int, cgroup_limit: int | None, cgroup_usage: int | None) -> tuple[int, int]:
    """Free/total host memory, honouring a cgroup limit (the kernel kills past it rather than raising)."""
    free, cap = int(available), int(total)
    if cgroup_limit is not None and 0 < cgroup_limit < cap:
        cap = int(cgroup_limit)
        used = int(cgroup_usage or 0)
        free = min(free, max(0, cap - used))
    return max(0, free), max(0, cap)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def cgroup_memory(root: Path = Path("/sys/fs/cgroup")) -> tuple[int | None, int | None]:
    """(limit, usage) of this process's cgroup, v2 or v1; (None, None) where there is none."""
    if (root / "memory.max").exists():
        return _read_int(root / "memory.max"), _read_int(root / "memory.current")
    v1 = root / "memory"
    limit = _read_int(v1 / "memory.limit_in_bytes")
    if limit is not None and limit >= 1 << 60:  # v1 spells "no limit" as a huge number
        limit = None
    return limit, _read_int(v1 / "memory.usage_in_bytes")


def resident_bytes(*towers: object) -> int:
    """Bytes of the tensors (parameters and buffers) of the torch modules these towers hold as attributes (or in
    lists), each tensor counted once: the model's own memory on its device. None towers are skipped."""
    import torch

    seen: set[tuple[int, int]] = set()
    total = 0
    for tower in towers:
        if tower is None:
            continue
        for value in vars(tower).values():
            for module in value if isinstance(value, (list, tuple)) else (value,):
                if not isinstance(module, torch.nn.Module):
                    continue
                for tensor in itertools.chain(module.parameters(), module.buffers()):
                    key = (tensor.data_ptr(), tensor.nbytes)
                    if key not in seen:
                        seen.add(key)
                        total += tensor.nbytes
    return total


def cuda_free(driver_free: int, reserved: int, allocated: int) -> int:
    """Bytes a chunk can use on a CUDA device: what the driver reports free plus what PyTorch's caching allocator
    holds reserved but no tensor uses. `mem_get_info` counts that cache as used, so after one large chunk (or an
    out-of-memory error) planning from it alone would leave every later chunk near 1."""
    return max(0, int(driver_free)) + max(0, int(reserved) - int(allocated))


def device_memory(device: str | torch.device) -> tuple[int, int]:
    """(free, total) bytes of the device a chunk will run on, read now."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        reserved, allocated = torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)
        return cuda_free(free, reserved, allocated), int(total)
    if device.type == "mps":
        total = int(torch.mps.recommended_max_memory())
        return max(0, total - int(torch.mps.driver_allocated_memory())), total
    import psutil

    vm = psutil.virtual_memory()
    limit, usage = cgroup_memory()
    return host_memory(vm.available, vm.total, limit, usage)
