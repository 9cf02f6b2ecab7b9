"""Text batches on the engine: a window of equal-length texts runs with no padding token, and padded batches of
mixed lengths stay within 1e-5 of each text encoded alone (the sample EmbeddingGemma 2 checkpoint)."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import ROOT, rel_error
from transformers.models.embedding_gemma2.modeling_embedding_gemma2 import EmbeddingGemma2TextModel

import gemma_embed
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


def token_length(embedder, text: str) -> int:
    return EmbeddingGemma2Preparer(embedder.checkpoint, "text").prepare(text).units[0].length


def test_a_window_of_equal_length_texts_runs_with_no_padding_token(embedder, masks):
    words = ["red", "car", "sea", "cat", "dog", "fox"]
    by_length: dict[int, list[str]] = {}
    for order in itertools.permutations(words, 4):
        text = " ".join(order)
        by_length.setdefault(token_length(embedder, text), []).append(text)
    texts = max(by_length.values(), key=len)[:40]  # distinct texts, all of one token length
    assert len(texts) >= 20
    together = embedder.encode(texts)
    assert masks and max(len(m) for m in masks) > 1  # batched, not one by one
    assert all(bool(m.bool().all()) for m in masks)  # not one padding token
    masks.clear()
    alone = [embedder.encode([t])[0] for t in texts[:5]]
    assert max(rel_error(torch.from_numpy(together[i]), torch.from_numpy(a)) for i, a in enumerate(alone)) < 1e-6


def test_mixed_lengths_share_padded_batches_within_1e5_of_each_text_alone(embedder, masks):
    texts = [" ".join(["the quick brown fox"] * n) for n in (1, 2, 3, 5, 8)] + ["a cat", "a red car by the sea"]
    assert len({token_length(embedder, t) for t in texts}) == len(texts)
    together = embedder.encode(texts)
    assert any(not bool(m.bool().all()) for m in masks)  # some batch did pad
    for i, text in enumerate(texts):
        alone = embedder.encode([text])[0]
        assert rel_error(torch.from_numpy(together[i]), torch.from_numpy(alone)) < 1e-5, text
