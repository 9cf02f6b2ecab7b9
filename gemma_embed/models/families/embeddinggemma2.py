"""EmbeddingGemma 2 (`embedding_gemma2`): images, video, audio and text to one retrieval vector each, in one space,
or the Gemma 4 towers' own rows (models/embeddinggemma2.py)."""

from __future__ import annotations

from gemma_embed.config import Modality, Pool, Space
from gemma_embed.models.families.embeddinggemma import ST_QUERIES
from gemma_embed.models.families.gemma4 import AUDIO_MODEL_TYPE, VISION_MODEL_TYPE
from gemma_embed.models.family import Deferred, Family, Support

MODEL_TYPE = "embedding_gemma2"
SPACES = (Space.retrieval, Space.language, Space.tower)
IMPLEMENTED_IN = "gemma_embed.models.embeddinggemma2"

FAMILY = Family(
    name="EmbeddingGemma 2",
    model_types=(MODEL_TYPE,),
    examples=("google/embeddinggemma-2",),
    help=(
        "images, video, audio and text to one normalised vector each, in one space (the Gemma 4 towers, then "
        "the text model), as sentence-transformers computes them: --prompt-name or --prompt, --dim to keep "
        "fewer dimensions. --space language or tower gives the Gemma 4 towers' own rows instead."
    ),
    commands={
        Modality.images: Support(Deferred(IMPLEMENTED_IN, "build_images"), SPACES, tower=("vision", VISION_MODEL_TYPE)),
        Modality.video: Support(
            Deferred(IMPLEMENTED_IN, "build_video"),
            SPACES,
            (Pool.none, Pool.mean, Pool.frame),
            ("vision", VISION_MODEL_TYPE),
            pools_by_space={Space.retrieval: (Pool.none, Pool.mean)},
        ),
        Modality.audio: Support(Deferred(IMPLEMENTED_IN, "build_audio"), SPACES, tower=("audio", AUDIO_MODEL_TYPE)),
        Modality.text: Support(Deferred(IMPLEMENTED_IN, "build_text"), (Space.retrieval,)),
    },
    queries=ST_QUERIES,
)
