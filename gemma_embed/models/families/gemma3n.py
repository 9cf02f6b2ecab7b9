"""Gemma 3n (`gemma3n`): the MobileNetV5 vision tower (models/gemma3n_vision.py) and the audio tower
(models/gemma3n.py)."""

from __future__ import annotations

from gemma_embed.config import Modality, Pool, Space
from gemma_embed.models.family import Deferred, Family, Support

MODEL_TYPE = "gemma3n"
VISION_MODEL_TYPE = "gemma3n_vision"
AUDIO_MODEL_TYPE = "gemma3n_audio"
TOWERS = (Space.language, Space.tower)

FAMILY = Family(
    name="Gemma 3n",
    model_types=(MODEL_TYPE,),
    examples=("google/gemma-3n-e2b-it", "google/gemma-3n-e4b-it"),
    help=(
        "the MobileNetV5 vision tower at the processor's fixed size (768 px: 256 soft tokens an image; it needs "
        "timm: pip install 'gemma-embed[gemma3n]'). The audio tower's soft tokens, a window of at most "
        "--window-s at a time."
    ),
    commands={
        Modality.images: Support(
            Deferred("gemma_embed.models.gemma3n_vision", "build_images"), TOWERS, tower=("vision", VISION_MODEL_TYPE)
        ),
        Modality.video: Support(
            Deferred("gemma_embed.models.gemma3n_vision", "build_video"),
            TOWERS,
            pools=(Pool.none, Pool.mean, Pool.frame),
            tower=("vision", VISION_MODEL_TYPE),
        ),
        Modality.audio: Support(
            Deferred("gemma_embed.models.gemma3n", "build_audio"), TOWERS, tower=("audio", AUDIO_MODEL_TYPE)
        ),
    },
)
