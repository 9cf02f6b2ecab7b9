"""EmbeddingGemma 2's pooling, in plain tensors: the mean over real tokens, and truncation to a shorter dim."""

from __future__ import annotations

import pytest
import torch

from gemma_embed.pooling import l2_normalize, mean_pool, truncate_dim

# ----------------------------------------------------------------------------------------- pure functions


def test_mean_pool_counts_real_tokens_only():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert torch.equal(mean_pool(hidden, torch.tensor([[1, 1, 0]])), torch.tensor([[2.0, 3.0]]))
    assert torch.equal(mean_pool(hidden, torch.zeros(1, 3)), torch.zeros(1, 2))  # no division by zero


def test_truncate_dim_keeps_the_first_components_renormalised():
    vector = l2_normalize(torch.tensor([[3.0, 4.0, 12.0]]))
    assert torch.allclose(truncate_dim(vector, 2), torch.tensor([[0.6, 0.8]]))
    assert torch.equal(truncate_dim(vector, None), vector)
    assert torch.equal(truncate_dim(vector, 3), vector)
    with pytest.raises(ValueError):
        truncate_dim(vector, 0)
