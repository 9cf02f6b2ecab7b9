"""Memory planning: pure functions of plain numbers, plus one probe of the current device.

The planner turns (free, total) device memory and a cost model of the tower's dominant transient into a chunk
size. It never admits a chunk whose modelled transient exceeds the budget (except the unavoidable chunk of 1,
which the engine's out-of-memory back-off then guards).
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


def siglip_item_cost(
    patches: int,
    hidden: int,
    intermediate: int,
    heads: int,
    bytes_per_element: int,
    patch_dim: int = 3 * 14 * 14,
    materialises_scores: bool = False,
) -> int:
    """Peak transient bytes one image adds to a Gemma 3 SigLIP vision-tower forward (+ multi_modal_projector),
    the largest of its phases (bench/MEMORY.md compares this with profiler measurements):
    - encoder MLP: fc1's output, its tanh-approximated GELU and that GELU's temporary live together, 3 * N * I
      elements (measured exactly 3.0 at hidden 256; 3.07 at 1152), beside the residual stream and fc2's output;
    - attention, only where the kernel materialises scores (eager): 2 * H * N^2 elements beside q/k/v/o;
      SDPA without a mask (every batch is one fixed-size bucket) materialises none;
    - patch embedding: the float32 pixels cast to the model dtype (3 x patch^2 per patch; no copy in float32)
      and the embeddings.
    The projector (4 x 4 average pooling, RMSNorm, one matmul) works on 16x fewer rows and never peaks.
    """
    n = max(0, int(patches))
    if n == 0:
        return 0
    s = max(1, int(bytes_per_element))
    mlp = n * (3 * intermediate + 2 * hidden) * s
    embedder = (n * patch_dim * s if s != 4 else 0) + 2 * n * hidden * s
    attention = (2 * heads * n * n + 8 * n * hidden) * s if materialises_scores else 0
    return int(max(mlp, embedder, attention))


def mobilenetv5_item_cost(pixels: int, bytes_per_element: int) -> int:
    """Peak transient bytes one image of `pixels` input pixels adds to a forward of Gemma 3n's MobileNetV5 encoder
    (timm's `mobilenetv5_300m_enc`, the released architecture) and `embed_vision`.

    A convolutional network's activations scale with the input's area: measured linear in pixels (512 and 768 px:
    674 and 668 bytes a pixel in float32) and in the batch (bench/MEMORY.md). Its RMS norms compute in float32
    whatever the model dtype, so bfloat16 saves only part (528 bytes a pixel): fitted as 74 bytes a pixel per byte
    of the model dtype plus 96 float32 bytes, each raised 11% so the model stays above the measurement.
    `embed_vision` works on the 256 soft tokens and never peaks. Other timm channel multipliers (the test
    checkpoint's) are not modelled: their fixed costs dominate at small inputs.
    """
    n = max(0, int(pixels))
    s = max(1, int(bytes_per_element))
    return int(n * (82 * s + 105 * 4))


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
    rotary_dims: int = 0,
    dense_full_mask: bool = False,
) -> int:
    """Peak transient bytes one sequence of `tokens` adds to an EmbeddingGemma 2 (or, with `per_layer_dim=0`,
    EmbeddingGemma) text-model forward (SDPA).

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
    EmbeddingGemma (Gemma 3 with bidirectional attention) differs in two ways, measured at 4096 tokens:
    - `dense_full_mask`: its full-attention layers get a dense bool mask even without padding (the bidirectional
      `or_mask_function` makes transformers build one), so the mask phase holds two bool masks (18 bytes a pair);
    - `rotary_dims`: the rotary tables, computed after the masks and alive through every layer: one cos and one
      sin table per layer type in the model dtype (the head widths summed over the layer types: 2 x 256).
    """
    n = max(0, int(tokens))
    if n == 0:
        return 0
    s = max(1, int(bytes_per_element))
    ple = layers * per_layer_dim
    ple_alive = n * ple * s
    rotary_alive = n * 2 * int(rotary_dims) * s
    ple_phase = n * ple * (s + 8)
    quadratic = sliding_window is not None and n > sliding_window
    full_mask = n * n if (padded or dense_full_mask) else 0
    masks = (n * n if quadratic else 0) + full_mask
    layer_phase = ple_alive + rotary_alive + masks + n * (4 * intermediate * s + 7 * hidden * 4)
    # (+ 64 bytes a token: the small position and index vectors the mask functions build; 28 measured)
    sliding_build = 16 * n * n + n * n + (n * n if dense_full_mask else 0) + 64 * n
    mask_phase = ple_alive + (sliding_build if quadratic else 0)
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
