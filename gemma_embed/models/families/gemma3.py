"""Gemma 3 (`gemma3`): the SigLIP vision tower at its one fixed size (models/gemma3.py)."""

from __future__ import annotations

from gemma_embed.config import Modality, Pool, Space
from gemma_embed.models.family import Deferred, Family, Support

MODEL_TYPE = "gemma3"
VISION_MODEL_TYPE = "siglip_vision_model"
TOWERS = (Space.language, Space.tower)

FAMILY = Family(
    name="Gemma 3",
    model_types=(MODEL_TYPE,),
    examples=("google/gemma-3-4b-it", "google/gemma-3-27b-it"),
    help=(
        "SigLIP at one fixed size (896 px: 256 soft tokens an image, 4096 rows in the tower space), so every "
        "batch is full and never padded. --pan-and-scan adds the image processor's crops of a wide or tall "
        "image as further rows of the item; video frames go through the image processor one by one."
    ),
    commands={
        Modality.images: Support(
            Deferred("gemma_embed.models.gemma3", "build_images"), TOWERS, tower=("vision", VISION_MODEL_TYPE)
        ),
        Modality.video: Support(
            Deferred("gemma_embed.models.gemma3", "build_video"),
            TOWERS,
            pools=(Pool.none, Pool.mean, Pool.frame),
            tower=("vision", VISION_MODEL_TYPE),
        ),
    },
)
