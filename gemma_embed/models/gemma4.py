"""Gemma 4 (and EmbeddingGemma 2, which reuses its towers): vision tower + `embed_vision`, image preparer."""

from __future__ import annotations

import torch

from gemma_embed.models.base import EncoderTower, PreparedItem, Unit
from gemma_embed.models.loading import Checkpoint, load_processor, tower_configs


class Gemma4VisionTower(EncoderTower):
    """Gemma 4 vision encoder + projection. Units of one batch must share a patch count (no padding)."""

    grouping = "exact"
    # EmbeddingGemma 2 stores the same tower without the "model." prefix.
    parts = (
        ("vision_tower", ("model.vision_tower.", "vision_tower.")),
        ("embed_vision", ("model.embed_vision.", "embed_vision.")),
    )

    def __init__(self, checkpoint: Checkpoint, device, dtype, load: bool = True):
        from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder, Gemma4VisionModel

        vision_config, text_config = tower_configs(checkpoint, "vision")
        # SDPA without a mask: buckets hold no padding, so the kernel never needs the N x N mask.
        vision_config._attn_implementation = "sdpa"
        super().__init__(
            checkpoint,
            device,
            dtype,
            vision_config,
            lambda: Gemma4VisionModel(vision_config),
            lambda: Gemma4MultimodalEmbedder(vision_config, text_config),
            {"tower": vision_config.hidden_size, "language": text_config.hidden_size},
            load=load,
        )
        self.pool_area = vision_config.pooling_kernel_size**2

    def unit_cost(self, length: int) -> int:
        cfg = self.config
        return vision_item_cost(
            patches=length,
            hidden=cfg.hidden_size,
            intermediate=cfg.intermediate_size,
            heads=cfg.num_attention_heads,
            bytes_per_element=self.element_size,
            pooling_kernel=cfg.pooling_kernel_size,
            materialises_scores=cfg._attn_implementation == "eager",
        )

    def encode(self, units: list[Unit], space: str) -> torch.Tensor:
        lengths = {u.length for u in units}
        if len(lengths) != 1:
            raise ValueError(f"vision batch mixes patch counts {sorted(lengths)}")
        # Pixels stay float32, as the processor made them: the patch embedder computes 2 * (px - 0.5) in their
        # dtype and only then casts to the tower's, so casting them first would round differently from
        # transformers' own path.
        pixels = self.to_device(self.host_stack([u.inputs["pixel_values"] for u in units]))
        positions = self.to_device(self.host_stack([u.inputs["position_ids"] for u in units]))
        hidden = self.tower(pixel_values=pixels, pixel_position_ids=positions).last_hidden_state
        return self.project(hidden, space)  # already (sum of unit rows, width): the tower drops no padding here


def trim_vision_inputs(pixel_values: torch.Tensor, position_ids: torch.Tensor, pool_area: int) -> list[Unit]:
    """Processor output (B, max_patches, ...) -> one unit per image with its padding patches removed."""
    units = []
    for pixels, positions in zip(pixel_values, position_ids, strict=True):
        valid = (positions != -1).all(dim=-1)
        n = int(valid.sum())
        # The processor puts real patches first; verify rather than assume, since slicing relies on it.
        if not bool(valid[:n].all()):
            raise ValueError("processor output has padding patches before real ones")
        units.append(
            Unit(
                inputs={"pixel_values": pixels[:n].contiguous(), "position_ids": positions[:n].contiguous()},
                length=n,
                rows=n // pool_area,
            )
        )
    return units


class _VisionPreparer:
    """What the image and video preparers share: the checkpoint's processor, its soft-token budget (unless
    --max-soft-tokens overrides it) and the patch geometry."""

    auto_class = ""
    what = ""
    default_budget = 280

    def __init__(self, checkpoint: Checkpoint, max_soft_tokens: int | None = None):
        self.processor = load_processor(checkpoint, self.auto_class, self.what)
        self.max_soft_tokens = int(max_soft_tokens or getattr(self.processor, "max_soft_tokens", self.default_budget))
        vision_config = getattr(checkpoint.config, "vision_config", None)
        self.pool_area = (vision_config.pooling_kernel_size if vision_config else 3) ** 2
        self.patch_size = getattr(self.processor, "patch_size", 16)


class Gemma4ImagePreparer(_VisionPreparer):
    """transformers' image processor from the checkpoint, applied to one image at a time."""

    auto_class, what, default_budget = "AutoImageProcessor", "image processor", 280

    def describe(self) -> dict:
        return {"processor": type(self.processor).__name__, "max_soft_tokens": self.max_soft_tokens}

    def prepare(self, decoded) -> PreparedItem:
        """decoded: a `media.image.DecodedImage` (its RGB image and what the file was: mode, frames)."""
        image = decoded.image
        out = self.processor([image], return_tensors="pt", max_soft_tokens=self.max_soft_tokens)
        (unit,) = trim_vision_inputs(out["pixel_values"], out["image_position_ids"], self.pool_area)
        meta = {
            "width": image.width,
            "height": image.height,
            **decoded.meta,
            "max_soft_tokens": self.max_soft_tokens,
            **resized_size(unit, self.patch_size),
            "patches": unit.length,
        }
        return PreparedItem(units=[unit], meta=meta)


def resized_size(unit: Unit, patch_size: int) -> dict:
    """The size the processor resized to, read back from the unit's patch grid."""
    positions = unit.inputs["position_ids"]
    return {
        "resized_width": (int(positions[:, 0].max()) + 1) * patch_size,
        "resized_height": (int(positions[:, 1].max()) + 1) * patch_size,
    }


class Gemma4VideoPreparer(_VisionPreparer):
    """transformers' video processor from the checkpoint, on one video's decoded frames at a time.

    Frames arrive already sampled (media/video.py follows the processor's own policy), so the processor runs
    with do_sample_frames=False and never sees a file path (that path needs torchcodec). Each frame becomes one
    unit: to the vision tower a frame is an image, so frames of every video share its buckets.
    """

    auto_class, what, default_budget = "AutoVideoProcessor", "video processor", 70

    def __init__(self, checkpoint: Checkpoint, max_soft_tokens: int | None = None):
        super().__init__(checkpoint, max_soft_tokens)
        self.num_frames = getattr(self.processor, "num_frames", None)  # the processor's sampling policy
        self.fps = getattr(self.processor, "fps", None)

    def describe(self) -> dict:
        return {
            "processor": type(self.processor).__name__,
            "max_soft_tokens": self.max_soft_tokens,
            "num_frames": self.num_frames,
            "fps": self.fps,
        }

    def prepare(self, video) -> PreparedItem:
        # The frames are (T, H, W, 3): say so. Left to guess, the processor reads a 1x1 or 3-pixel-wide frame as
        # channels-first (a 1x1 frame became a 1x3 strip, resized to 672x192) and logs "channel dimension is
        # ambiguous". The metadata is what transformers fills in itself when given none, with the frame size it
        # would otherwise guess from the array's shape (the same guess, and the same log line).
        frames = video.frames
        metadata = {
            "total_num_frames": len(frames),
            "fps": None,
            "duration": None,
            "frames_indices": list(range(len(frames))),
            "height": int(frames.shape[1]),
            "width": int(frames.shape[2]),
        }
        out = self.processor(
            videos=[frames],
            video_metadata=[metadata],
            do_sample_frames=False,
            return_tensors="pt",
            max_soft_tokens=self.max_soft_tokens,
            input_data_format="channels_last",
        )
        units = trim_vision_inputs(out["pixel_values_videos"], out["video_position_ids"], self.pool_area)
        rows_per_frame = units[0].rows  # one resize per video: every frame has the same grid
        meta = {
            **video.facts(),
            "rows_per_frame": rows_per_frame,
            "max_soft_tokens": self.max_soft_tokens,
            **resized_size(units[0], self.patch_size),
            "patches": units[0].length,
        }
        return PreparedItem(units=units, meta=meta, rows_per_unit=rows_per_frame)


# ------------------------------------------------------------------------------------------- the cost model


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


# ------------------------------------------------------------- the family's builders (models/families/ declares it)


def vision_chain(checkpoint: Checkpoint, device, dtype, space) -> list:
    """The vision tower alone (soft tokens, or the encoder's own rows), built without reading its weights."""
    from gemma_embed.modalities import Stage

    return [Stage(Gemma4VisionTower(checkpoint, device, dtype, load=False), space)]


def build_images(config, checkpoint: Checkpoint, device, dtype, space):
    from gemma_embed.modalities import image_stages

    preparer = Gemma4ImagePreparer(checkpoint, config.max_soft_tokens)
    return image_stages(preparer, vision_chain(checkpoint, device, dtype, space))


def build_video(config, checkpoint: Checkpoint, device, dtype, space):
    """Frames are images to the vision tower: the same tower class, so frames share the image path's buckets."""
    from gemma_embed.modalities import video_stages

    preparer = Gemma4VideoPreparer(checkpoint, config.max_soft_tokens)
    chain = vision_chain(checkpoint, device, dtype, space)
    return video_stages(config, preparer, chain, preparer.num_frames, preparer.fps)
