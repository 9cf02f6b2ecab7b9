"""EmbeddingGemma (a bidirectional `gemma3_text`): one retrieval vector per text (models/embeddinggemma.py)."""

from __future__ import annotations

from gemma_embed.config import Modality, Space
from gemma_embed.models.family import Deferred, Family, Queries, Support

MODEL_TYPE = "gemma3_text"

# How `search` embeds a query of a sentence-transformers checkpoint's output: with its "query" prompt, as
# `SentenceTransformer.encode_query` does (both EmbeddingGemma families).
ST_QUERIES = Queries(prompt_name="query", prompts=Deferred("gemma_embed.models.st_inputs", "st_prompts"))


def bidirectional(config) -> bool:
    """EmbeddingGemma's config: a causal `gemma3_text` is a language model."""
    return bool(getattr(config, "use_bidirectional_attention", False))


FAMILY = Family(
    name="EmbeddingGemma",
    model_types=(MODEL_TYPE,),
    examples=("google/embeddinggemma-300m",),
    help=(
        "text to one normalised vector, as sentence-transformers computes it: --prompt-name (the checkpoint's "
        "prompts: query, document, ...) or --prompt, --dim to keep fewer dimensions (Matryoshka: 512, 256, "
        "128); lines over its max_seq_length are cut as sentence-transformers cuts them. Not in float16 (its "
        "activations overflow it)."
    ),
    commands={Modality.text: Support(Deferred("gemma_embed.models.embeddinggemma", "build_text"), (Space.retrieval,))},
    check=Deferred("gemma_embed.models.embeddinggemma", "check_options"),
    matches=bidirectional,
    described_as=f"{MODEL_TYPE} with use_bidirectional_attention",
    queries=ST_QUERIES,
)
