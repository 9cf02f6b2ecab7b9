"""Gemma 3n vision (`gemma3n_vision`): timm's MobileNetV5 encoder as transformers wraps it (`TimmWrapperModel`),
then `embed_vision`.

The tower sees every image at the image processor's fixed size (768 px for the real model), and its multi-scale
fusion always yields `vision_soft_tokens_per_image` positions (16 x 16 = 256) of 2048 channels: one bucket,
batches full and never padded. `Gemma3nModel.get_image_features` flattens those positions into soft tokens,
scales them by sqrt(2048) (in place, so its returned `last_hidden_state` holds the scaled values too) and embeds
them (`embed_vision`: RMSNorm, projection into the language model's width, RMSNorm without scale). Two spaces:
- `language`: after `embed_vision` (`pooler_output`);
- `tower`: the scaled soft tokens `embed_vision` receives, 2048 wide.

timm is optional (the `gemma3n` extra); the tower refuses in one line without it. Only `model.vision_tower.` and
`model.embed_vision.` tensors are read. Gemma 3n's audio tower is models/gemma3n.py.
"""

from __future__ import annotations

import importlib.util

import torch

from gemma_embed.errors import CheckpointError
from gemma_embed.models.base import EncoderTower, Unit
from gemma_embed.models.families.gemma3n import VISION_MODEL_TYPE
from gemma_embed.models.fixed_resolution import FixedResolutionImagePreparer, FixedResolutionVideoPreparer
from gemma_embed.models.loading import Checkpoint, tower_configs


def is_gemma3n_vision(checkpoint: Checkpoint) -> bool:
    vision = getattr(checkpoint.config, "vision_config", None)
    return getattr(vision, "model_type", None) == VISION_MODEL_TYPE


def require_timm(checkpoint: Checkpoint) -> None:
    """transformers builds this tower with timm, an optional dependency of gemma-embed: one line without it."""
    if importlib.util.find_spec("timm") is None:
        raise CheckpointError(
            f"{checkpoint.source}: Gemma 3n's vision tower needs timm: pip install 'gemma-embed[gemma3n]'"
        )


def input_pixels(processor) -> int:
    """Pixels of one tower input (height x width the image processor resizes to): the cost model's length."""
    return int(processor.size["height"]) * int(processor.size["width"])


class Gemma3nVisionTower(EncoderTower):
    """MobileNetV5 + embed_vision. Every unit has the processor's fixed size: one bucket, no padding."""

    grouping = "exact"
    parts = (("vision_tower", ("model.vision_tower.",)), ("embed_vision", ("model.embed_vision.",)))

    def __init__(self, checkpoint: Checkpoint, device, dtype, load: bool = True):
        require_timm(checkpoint)
        from transformers import TimmWrapperModel
        from transformers.models.gemma3n.modeling_gemma3n import Gemma3nMultimodalEmbedder

        vision_config, text_config = tower_configs(checkpoint, "vision")
        if getattr(vision_config, "model_type", None) != VISION_MODEL_TYPE:
            raise CheckpointError(
                f"{checkpoint.source}: not a Gemma 3n vision tower ({getattr(vision_config, 'model_type', '?')})"
            )
        super().__init__(
            checkpoint,
            device,
            dtype,
            vision_config,
            lambda: TimmWrapperModel(vision_config),  # what Gemma3nModel's AutoModel.from_config builds
            lambda: Gemma3nMultimodalEmbedder(vision_config, text_config),
            {"tower": vision_config.hidden_size, "language": text_config.hidden_size},
            load=load,
        )
        self.tokens = int(checkpoint.config.vision_soft_tokens_per_image)

    def unit_cost(self, length: int) -> int:
        return mobilenetv5_item_cost(length, self.element_size)

    def encode(self, units: list[Unit], space: str) -> torch.Tensor:
        lengths = {u.length for u in units}
        if len(lengths) != 1:
            raise ValueError(f"Gemma 3n vision batch mixes input sizes {sorted(lengths)}")
        # Pixels stay float32, as the processor made them: TimmWrapperModel casts them to its own dtype, as
        # transformers' own call does.
        pixels = self.to_device(self.host_stack([u.inputs["pixel_values"] for u in units]))
        features = self.tower(pixel_values=pixels, do_pooling=False, return_dict=True).last_hidden_state
        width = self.config.hidden_size
        # As get_image_features: (B, C, h, w) -> (B, h*w, C), scaled by sqrt(C) before embed_vision.
        soft = features.reshape(features.shape[0], width, self.tokens).permute(0, 2, 1) * width**0.5
        rows = self.project(soft, space)
        return rows.reshape(-1, rows.shape[-1])


class Gemma3nImagePreparer(FixedResolutionImagePreparer):
    """A decoded image -> one unit at the image processor's fixed size."""

    def __init__(self, checkpoint: Checkpoint):
        super().__init__(checkpoint, 0, int(checkpoint.config.vision_soft_tokens_per_image))
        self.length = input_pixels(self.processor)


class Gemma3nVideoPreparer(FixedResolutionVideoPreparer):
    """A decoded video's sampled frames -> one unit per frame, each through the image processor as an image."""

    def __init__(self, checkpoint: Checkpoint):
        super().__init__(checkpoint, 0, int(checkpoint.config.vision_soft_tokens_per_image))
        self.length = input_pixels(self.processor)


# ------------------------------------------------------------------------------------------- the cost model


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


# ------------------------------------------------------------------------------------------- the family's vision


def build_images(config, checkpoint: Checkpoint, device, dtype, space):
    from gemma_embed.modalities import Stage, image_stages

    tower = Gemma3nVisionTower(checkpoint, device, dtype, load=False)
    return image_stages(Gemma3nImagePreparer(checkpoint), [Stage(tower, space)])


def build_video(config, checkpoint: Checkpoint, device, dtype, space):
    from gemma_embed.modalities import Stage, video_stages

    preparer = Gemma3nVideoPreparer(checkpoint)
    chain = [Stage(Gemma3nVisionTower(checkpoint, device, dtype, load=False), space)]
    return video_stages(config, preparer, chain, preparer.num_frames, preparer.fps)
