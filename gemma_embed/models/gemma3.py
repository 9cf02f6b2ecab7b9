"""Gemma 3 vision (`gemma3`, e.g. google/gemma-3-4b-it): the SigLIP tower + `multi_modal_projector`.

The tower sees every image at one fixed resolution (896 px in 14 px patches: 4096 patches for the real model),
so every unit has the same length: one bucket, batches always full and never padded, and SDPA never needs a
mask. Two spaces:
- `language`: what `Gemma3ForConditionalGeneration.get_image_features` returns (`pooler_output`): the projector
  averages 4 x 4 patches, RMS-normalises them and projects them into the language model's width (256 soft
  tokens per image for the real model);
- `tower`: SigLIP's own output before the projector (`last_hidden_state`), one row per patch.

Pan-and-scan (`--pan-and-scan`): the checkpoint's image processor adds crops of a wide or tall image; they are
further units of the same item, in the processor's order (the whole image first, then its crops left to right or
top to bottom), as `Gemma3Processor` lays them out. Video: Gemma 3 has no video processor; sampled frames go
through the image processor one by one, each a unit (as the Gemma 4 video path treats frames).

Only `vision_tower` and `multi_modal_projector` tensors are read, under any of the prefixes transformers has saved
them with (the hub repositories: `vision_tower.vision_model.`; transformers 5: `vision_tower.`).
"""

from __future__ import annotations

import torch

from gemma_embed.models.base import EncoderTower, PreparedItem, Unit
from gemma_embed.models.families.gemma3 import MODEL_TYPE, VISION_MODEL_TYPE
from gemma_embed.models.fixed_resolution import FixedResolutionPreparer, FixedResolutionVideoPreparer
from gemma_embed.models.loading import Checkpoint, tower_configs

# Pan-and-scan settings the image processor leaves unset (null in the hub's preprocessor_config.json) come from
# Gemma3Processor's own defaults, as its __call__ merges them; these are the image processor's keyword names.
PAN_AND_SCAN_KEYS = (
    "pan_and_scan_min_crop_size",
    "pan_and_scan_max_num_crops",
    "pan_and_scan_min_ratio_to_activate",
)


def is_gemma3(checkpoint: Checkpoint) -> bool:
    config = checkpoint.config
    vision = getattr(config, "vision_config", None)
    return getattr(config, "model_type", None) == MODEL_TYPE and getattr(vision, "model_type", None) == (
        VISION_MODEL_TYPE
    )


def patches_per_image(vision_config) -> int:
    side = int(vision_config.image_size) // int(vision_config.patch_size)
    return side * side


def rows_per_image(config, space: str) -> int:
    """Rows one image (or crop, or frame) gives: soft tokens after the projector, patches before it."""
    return patches_per_image(config.vision_config) if space == "tower" else int(config.mm_tokens_per_image)


class Gemma3VisionTower(EncoderTower):
    """SigLIP + multi_modal_projector. Every unit has the tower's fixed patch count: one bucket, no padding."""

    grouping = "exact"
    parts = (
        # The hub repositories store vision_tower.vision_model. (and transformers 4.5x saved
        # model.vision_tower.vision_model.); transformers 5 saves vision_tower. (its module is
        # model.vision_tower., which its key renaming maps all of these onto). The longer prefixes come first:
        # find_prefix takes the first that has tensors.
        (
            "vision_tower",
            ("model.vision_tower.vision_model.", "vision_tower.vision_model.", "model.vision_tower.", "vision_tower."),
        ),
        ("multi_modal_projector", ("model.multi_modal_projector.", "multi_modal_projector.")),
    )

    def __init__(self, checkpoint: Checkpoint, device, dtype, load: bool = True):
        from transformers import SiglipVisionModel
        from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector

        vision_config, text_config = tower_configs(checkpoint, "vision")
        vision_config._attn_implementation = "sdpa"  # as from_pretrained picks it; no padding, so no mask
        config = checkpoint.config
        super().__init__(
            checkpoint,
            device,
            dtype,
            vision_config,
            lambda: SiglipVisionModel(vision_config),
            lambda: Gemma3MultiModalProjector(config),
            {"tower": vision_config.hidden_size, "language": text_config.hidden_size},
            load=load,
        )
        self.patches = patches_per_image(vision_config)
        self.tokens = int(config.mm_tokens_per_image)

    def unit_cost(self, length: int) -> int:
        cfg = self.config
        return siglip_item_cost(
            patches=length,
            hidden=cfg.hidden_size,
            intermediate=cfg.intermediate_size,
            heads=cfg.num_attention_heads,
            bytes_per_element=self.element_size,
            patch_dim=3 * cfg.patch_size**2,
            materialises_scores=cfg._attn_implementation == "eager",
        )

    def encode(self, units: list[Unit], space: str) -> torch.Tensor:
        lengths = {u.length for u in units}
        if lengths != {self.patches}:
            raise ValueError(f"Gemma 3 vision units have {self.patches} patches, this batch {sorted(lengths)}")
        # Pixels stay float32, as the processor made them: SigLIP's patch embedding casts them to its own dtype,
        # as transformers' own call does.
        pixels = self.to_device(self.host_stack([u.inputs["pixel_values"] for u in units]))
        hidden = self.tower(pixel_values=pixels).last_hidden_state  # (B, patches, vision width)
        rows = hidden if space == "tower" else self.embed(hidden)  # projector: (B, soft tokens, text width)
        return rows.reshape(-1, rows.shape[-1])


class Gemma3ImagePreparer(FixedResolutionPreparer):
    """A decoded image -> one unit (the whole image at the tower's resolution), plus its pan-and-scan crops as
    further units when `pan_and_scan` is set (as `Gemma3Processor(..., do_pan_and_scan=True)` makes them)."""

    def __init__(self, checkpoint: Checkpoint, space: str = "language", pan_and_scan: bool = False):
        config = checkpoint.config
        super().__init__(checkpoint, patches_per_image(config.vision_config), rows_per_image(config, space))
        self.pan_and_scan = bool(pan_and_scan)
        # Said either way, as Gemma3Processor says it (its default is False whatever the image processor's says).
        self.kwargs: dict = {"do_pan_and_scan": self.pan_and_scan}
        if self.pan_and_scan:
            from transformers import Gemma3Processor

            defaults = Gemma3Processor.images_kwargs
            self.kwargs = {"do_pan_and_scan": True}
            for key in PAN_AND_SCAN_KEYS:
                configured = getattr(self.processor, key, None)
                self.kwargs[key] = configured if configured is not None else defaults[key]

    def describe(self) -> dict:
        return {**super().describe(), "pan_and_scan": self.pan_and_scan}

    def prepare(self, decoded) -> PreparedItem:
        """decoded: a `media.image.DecodedImage` (its RGB image and what the file was: mode, frames)."""
        image = decoded.image
        out = self.processor([image], return_tensors="pt", **self.kwargs)
        units = self.units(out["pixel_values"])
        crops = int(out["num_crops"][0]) if "num_crops" in out else 0
        if len(units) != 1 + crops:
            raise ValueError(f"the image processor gave {len(units)} images for 1 image and {crops} crops")
        meta = {"width": image.width, "height": image.height, **decoded.meta, **self.resized_size()}
        if self.pan_and_scan:
            meta["crops"] = crops
        return PreparedItem(units=units, meta=meta, rows_per_unit=self.rows)


class Gemma3VideoPreparer(FixedResolutionVideoPreparer):
    """A decoded video's sampled frames -> one unit per frame, each through the image processor as an image."""

    def __init__(self, checkpoint: Checkpoint, space: str = "language"):
        config = checkpoint.config
        super().__init__(checkpoint, patches_per_image(config.vision_config), rows_per_image(config, space))


# ------------------------------------------------------------------------------------------- the cost model


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


# ------------------------------------------------------------- the family's builders (models/families/ declares it)


def build_images(config, checkpoint: Checkpoint, device, dtype, space):
    from gemma_embed.modalities import Stage, image_stages

    preparer = Gemma3ImagePreparer(checkpoint, str(space), pan_and_scan=config.pan_and_scan)
    return image_stages(preparer, [Stage(Gemma3VisionTower(checkpoint, device, dtype, load=False), space)])


def build_video(config, checkpoint: Checkpoint, device, dtype, space):
    from gemma_embed.modalities import Stage, video_stages

    preparer = Gemma3VideoPreparer(checkpoint, str(space))
    chain = [Stage(Gemma3VisionTower(checkpoint, device, dtype, load=False), space)]
    return video_stages(config, preparer, chain, preparer.num_frames, preparer.fps)
