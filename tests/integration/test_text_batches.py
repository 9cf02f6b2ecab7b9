"""Text batches on the engine: a window of equal-length texts runs with no padding token, and padded batches of
mixed lengths stay within 1e-5 of each text encoded alone by sentence-transformers (batch size 1: no padding), on
the sample EmbeddingGemma 2 checkpoint."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import ROOT, rel_error
from transformers.models.embedding_gemma2.modeling_embedding_gemma2 import EmbeddingGemma2TextModel

import gemma_embed
from gemma_embed.batching import padded_length
from gemma_embed.models.embeddinggemma2 import EmbeddingGemma2Preparer

SAMPLE_EG2 = ROOT / "samples" / "tiny-embeddinggemma2"


@pytest.fixture
def masks(monkeypatch) -> list[torch.Tensor]:
    """The attention mask of every forward the text model runs."""
    seen: list[torch.Tensor] = []
    original = EmbeddingGemma2TextModel.forward

    def spy(self, *args, attention_mask=None, **kwargs):
        seen.append(attention_mask.clone())
        return original(self, *args, attention_mask=attention_mask, **kwargs)

    monkeypatch.setattr(EmbeddingGemma2TextModel, "forward", spy)
    return seen


@pytest.fixture(scope="module")
def embedder():
    return gemma_embed.Embedder(SAMPLE_EG2, device="cpu")


@pytest.fixture(scope="module")
def alone():
    """Each text encoded alone by sentence-transformers (the reference: no batch, no padding)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(SAMPLE_EG2), device="cpu")
    return lambda texts: [torch.from_numpy(model.encode([t], batch_size=1)[0]) for t in texts]


def token_length(embedder, text: str) -> int:
    return EmbeddingGemma2Preparer(embedder.checkpoint, "text").prepare(text).units[0].length


def test_texts_of_one_length_share_batches_padded_to_their_rung(embedder, masks, alone):
    words = ["red", "car", "sea", "cat", "dog", "fox"]
    by_length: dict[int, list[str]] = {}
    for order in itertools.permutations(words, 4):
        text = " ".join(order)
        by_length.setdefault(token_length(embedder, text), []).append(text)
    length, texts = max(by_length.items(), key=lambda item: len(item[1]))
    texts = texts[:40]  # distinct texts, all of one token length
    assert len(texts) >= 20
    together = embedder.encode(texts)
    ours = list(masks)
    assert ours and max(len(m) for m in ours) > 1  # batched, not one by one
    # Each padded to its rung of the ladder and no further, whatever the batch: the same bytes in any batch.
    assert all(m.shape[1] == padded_length(length) and m.sum(dim=1).eq(length).all() for m in ours)
    reference = alone(texts[:5])
    assert max(rel_error(torch.from_numpy(together[i]), r) for i, r in enumerate(reference)) < 1e-5


def test_mixed_lengths_share_padded_batches_within_1e5_of_each_text_alone(embedder, masks, alone):
    texts = [" ".join(["the quick brown fox"] * n) for n in (1, 2, 3, 5, 8)] + ["a cat", "a red car by the sea"]
    assert len({token_length(embedder, t) for t in texts}) == len(texts)
    together = embedder.encode(texts)
    assert any(not bool(m.bool().all()) for m in masks)  # some batch did pad
    for i, reference in enumerate(alone(texts)):
        assert rel_error(torch.from_numpy(together[i]), reference) < 1e-5, texts[i]
