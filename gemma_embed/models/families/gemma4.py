"""Gemma 4 (`gemma4`): the vision tower's soft tokens (images, video frames) and the audio tower's
(models/gemma4.py, models/gemma4_audio.py)."""

from __future__ import annotations

from gemma_embed.config import Modality, Pool, Space
from gemma_embed.models.family import Deferred, Family, Support

MODEL_TYPE = "gemma4"
VISION_MODEL_TYPE = "gemma4_vision"
AUDIO_MODEL_TYPE = "gemma4_audio"
TOWERS = (Space.language, Space.tower)

FAMILY = Family(
    name="Gemma 4",
    model_types=(MODEL_TYPE,),
    examples=("google/gemma-4-e2b-it",),
    help=(
        "soft tokens of the vision tower (images, sampled video frames) at the processor's soft-token budget, "
        "--max-soft-tokens 70, 140, 280, 560 or 1120 (the released checkpoints': 280 an image, 70 a frame, up to "
        "32 frames a video); images of one patch count share a batch, never padded. The audio tower's soft "
        "tokens, a window of at most --window-s at a time."
    ),
    commands={
        Modality.images: Support(
            Deferred("gemma_embed.models.gemma4", "build_images"), TOWERS, tower=("vision", VISION_MODEL_TYPE)
        ),
        Modality.video: Support(
            Deferred("gemma_embed.models.gemma4", "build_video"),
            TOWERS,
            pools=(Pool.none, Pool.mean, Pool.frame),
            tower=("vision", VISION_MODEL_TYPE),
        ),
        Modality.audio: Support(
            Deferred("gemma_embed.models.gemma4_audio", "build_audio"), TOWERS, tower=("audio", AUDIO_MODEL_TYPE)
        ),
    },
)
