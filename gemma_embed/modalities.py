"""What differs between images, video and audio: how a file is decoded, and which preparer and tower run.

The pipeline asks `build_modality` for one of these and never branches on the modality itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gemma_embed.config import RunConfig
from gemma_embed.errors import UsageError
from gemma_embed.models.base import Preparer, Tower


@dataclass
class Modality:
    name: str
    decode: Callable[[str], Any]  # path -> decoded media; raises with a one-line reason
    preparer: Preparer
    tower: Tower


def _images(config: RunConfig, checkpoint, device, dtype) -> Modality:
    from gemma_embed.media.image import decode_image
    from gemma_embed.models.gemma4 import Gemma4ImagePreparer, Gemma4VisionTower

    preparer = Gemma4ImagePreparer(checkpoint, config.max_soft_tokens)
    return Modality("images", decode_image, preparer, Gemma4VisionTower(checkpoint, device, dtype))


BUILDERS: dict[str, Callable[..., Modality]] = {
    "images": _images,
}


def build_modality(config: RunConfig, checkpoint, device, dtype) -> Modality:
    try:
        builder = BUILDERS[config.modality]
    except KeyError:
        raise UsageError(f"modality {config.modality!r} is not supported") from None
    return builder(config, checkpoint, device, dtype)
