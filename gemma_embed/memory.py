"""Memory planning: pure functions of plain numbers, plus one probe of the current device.

The planner turns (free, total) device memory and a cost model of the tower's dominant transient into a chunk
size. It never admits a chunk whose modelled transient exceeds the budget (except the unavoidable chunk of 1,
which the engine's out-of-memory back-off then guards).
"""

from __future__ import annotations

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
    or a share of the total) is the user's call but never more than is free. Never negative."""
    free, total = max(0, int(free)), max(0, int(total))
    if spec.bytes is not None:
        return max(0, min(spec.bytes, free))
    if spec.fraction_of_total is not None:
        return max(0, min(int(total * spec.fraction_of_total), free))
    return max(0, int(min(free * DEFAULT_FREE_FRACTION, total * DEFAULT_TOTAL_FRACTION)))


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


def vision_item_cost(
    patches: int,
    hidden: int,
    intermediate: int,
    heads: int,
    bytes_per_element: int,
    pooling_kernel: int = 3,
    patch_dim: int = 768,
    materialises_scores: bool = False,
) -> int:
    """Peak transient bytes one image of `patches` patches adds to a Gemma 4 vision-tower forward.

    The forward passes through phases whose transients do not coexist, so the peak is the largest phase
    (bench/MEMORY.md compares this with profiler measurements):
    - encoder MLP: gate, act(gate), up and their product live together, 4 * N * I elements, beside the
      residual stream and the norms' float32 copies (3 * N * D float32; they matter in bf16);
    - attention, only where the kernel materialises scores (eager): 2 * H * N^2 elements beside q/k/v/o and
      the residual (8 * N * D);
    - pooler: an int64 one-hot (N x M), its float copy and a bool mask, 13 * N * M bytes whatever the dtype,
      beside the float32 hidden states;
    - patch embedder: the 2*(px-0.5) float32 copy of the input and its projection.
    """
    n = max(0, int(patches))
    if n == 0:
        return 0
    s = max(1, int(bytes_per_element))
    tokens = max(1, n // (pooling_kernel * pooling_kernel))
    mlp = n * (4 * intermediate * s + 3 * hidden * 4)
    pooler = 13 * n * tokens + 2 * n * hidden * 4
    embedder = 2 * n * patch_dim * 4 + n * hidden * s
    attention = (2 * heads * n * n + 8 * n * hidden) * s if materialises_scores else 0
    return int(max(mlp, pooler, embedder, attention))


def audio_item_cost(mel_frames: int, bytes_per_element: int) -> int:
    """Gemma 4 audio tower: about 52 KB per mel frame in float32 (SSCP conv output, ~3 live copies).

    Profiled (bench/bench_audio.py): 145.2 MiB for one 30 s clip (2999 frames), 50.8 KB per frame; the research
    notes' 49 KB was 3% under that, and the planner must not be under."""
    return int(max(0, int(mel_frames)) * 52_000 * max(1, int(bytes_per_element)) / 4)


def text_sequence_cost(
    tokens: int,
    hidden: int,
    intermediate: int,
    layers: int,
    per_layer_dim: int,
    bytes_per_element: int,
    sliding_window: int | None = None,
    padded: bool = True,
) -> int:
    """Peak transient bytes one sequence of `tokens` adds to an EmbeddingGemma 2 text-model forward (SDPA).

    The forward passes through phases whose transients do not coexist; the peak is the largest (bench/MEMORY.md
    compares this with profiler measurements):
    - per-layer embeddings: a (tokens, layers x per_layer_dim) projection in the model dtype and two float32
      copies inside its RMSNorm (s + 8 bytes an element; measured exactly in float32 and bfloat16). The result
      stays alive through every layer. With the real config (24 x 512) this is the largest phase up to a few
      thousand tokens: 144 KiB a token in float32.
    - a layer: the per-layer embeddings, the MLP (gate, act(gate), up and their product: 4 x intermediate), and
      about 7 float32 copies of the hidden state (norms, residual, attention in/out); SDPA materialises no scores.
    - attention masks: transformers builds the sliding-window mask as a dense tokens x tokens bool mask through
      an int64 index difference and its abs (16 bytes per pair), whenever a sequence is longer than the window.
      That is the quadratic term; it is per batch in fact, counted per sequence here (never below the truth).
      With padding the full-attention layers get a dense bool mask too (1 byte per pair).
    Full-attention layers cost nothing quadratic here: without padding transformers passes SDPA no mask, and
    SDPA on the CPU (and CUDA's flash/memory-efficient kernels) materialises no scores.
    """
    n = max(0, int(tokens))
    if n == 0:
        return 0
    s = max(1, int(bytes_per_element))
    ple = layers * per_layer_dim
    ple_alive = n * ple * s
    ple_phase = n * ple * (s + 8)
    quadratic = sliding_window is not None and n > sliding_window
    masks = (n * n if quadratic else 0) + (n * n if padded else 0)
    layer_phase = ple_alive + masks + n * (4 * intermediate * s + 7 * hidden * 4)
    mask_phase = ple_alive + (16 * n * n + n * n if quadratic else 0)
    # Beside every phase: small float32 copies (measured 0.2 MiB over the phase at 1024 tokens in bfloat16) and
    # the sequence's input embeddings once the stage-1 rows are scattered in; one float32 hidden state covers them.
    return int(max(ple_phase, layer_phase, mask_phase) + n * hidden * 4)


def gemma3n_audio_item_cost(
    mel_frames: int, channels: int = 128, mel_bins: int = 128, bytes_per_element: int = 4
) -> int:
    """Gemma 3n audio tower: per mel frame, the first subsampling convolution's output (channels x mel_bins/2
    values per two frames) and the copies its cumulative group norm makes, which it computes in float32 whatever
    the model dtype. Profiled in float32 (bench/bench_audio.py): 284 MiB for one 30 s clip at channels 128, about
    six live copies of that output; five of them are float32 whatever the dtype."""
    per_frame = channels * ((int(mel_bins) + 1) // 2) / 2
    copies_fp32, copies_model = 5, 1
    per_frame_bytes = per_frame * (copies_fp32 * 4 + copies_model * max(1, int(bytes_per_element)))
    per_frame_bytes += 3 * int(mel_bins) * 4  # the padded mel batch and its copies inside the first block
    return int(max(0, int(mel_frames)) * per_frame_bytes)


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
