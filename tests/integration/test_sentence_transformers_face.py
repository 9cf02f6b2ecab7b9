"""`Embedder.encode` as sentence-transformers users call `SentenceTransformer.encode`: the same calls, run through
both on the same checkpoint (the tiny EmbeddingGemma and EmbeddingGemma 2 samples, written by transformers and
sentence-transformers themselves), give the same shapes, the same types and the same values; a string alone is one
vector, not one per character."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from helpers import ROOT

from gemma_embed import Embedder
from gemma_embed.errors import UsageError
from gemma_embed.quantize import quantize

FOLDERS = {"embeddinggemma": ROOT / "samples" / "tiny-embeddinggemma", "eg2": ROOT / "samples" / "tiny-embeddinggemma2"}
TEXTS = ["cat", "a tall building at night", "the quick brown fox jumps over the lazy dog", "dog"]
TOLERANCE = 1e-5  # float32, against the reference's own per-batch result (both pad within a batch)


@pytest.fixture(scope="module", params=sorted(FOLDERS))
def both(request):
    from sentence_transformers import SentenceTransformer  # here: 0.9 core-s less to collect for a worker without it

    folder = str(FOLDERS[request.param])
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)  # its int8 calibration warning
    return SentenceTransformer(folder, device="cpu"), Embedder(folder, device="cpu")


def same(theirs, ours) -> None:
    """Same container type, shape and dtype, and values within TOLERANCE."""
    assert type(ours) is type(theirs)
    if isinstance(theirs, list):
        assert len(ours) == len(theirs)
        for a, b in zip(theirs, ours, strict=True):
            same(a, b)
        return
    assert tuple(ours.shape) == tuple(theirs.shape) and ours.dtype == theirs.dtype
    assert np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64)).max() < TOLERANCE


@pytest.mark.parametrize(
    "call, options",
    [
        ("encode", {}),
        ("encode_query", {}),
        ("encode_document", {}),
        ("encode", {"prompt_name": "query", "batch_size": 2}),
        ("encode", {"convert_to_tensor": True}),
        ("encode", {"convert_to_numpy": False}),
        ("encode", {"normalize_embeddings": True, "truncate_dim": 64}),
        ("encode", {"device": "cpu", "batch_size": 1}),
    ],
)
def test_the_same_calls_give_the_same_shapes_types_and_values(both, call, options):
    st, embedder = both
    for inputs in (TEXTS, TEXTS[0]):  # a list gives a matrix, a string alone one vector
        theirs = getattr(st, call)(inputs, **options)
        ours = getattr(embedder, call)(inputs, **options)
        same(theirs, ours)
    assert getattr(embedder, call)(TEXTS[0], **options).shape[0] != len(TEXTS[0])  # never one row a character


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_precision_quantizes_as_sentence_transformers_does(both, precision):
    st, embedder = both
    floats = embedder.encode(TEXTS)
    from sentence_transformers.quantization import quantize_embeddings

    assert np.array_equal(quantize(floats, precision), quantize_embeddings(floats, precision))  # the same rule
    theirs, ours = st.encode(TEXTS, precision=precision), embedder.encode(TEXTS, precision=precision)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    # The float vectors differ by rounding (< TOLERANCE): a value on a step's edge may land one step over.
    assert np.abs(ours.astype(np.int32) - theirs.astype(np.int32)).max() <= (1 if precision.endswith("int8") else 0)


def test_embed_takes_a_string_alone_and_gives_its_one_result(both):
    _, embedder = both
    alone = embedder.embed(TEXTS[0])
    listed = embedder.embed([TEXTS[0]])
    assert isinstance(alone, torch.Tensor) and torch.equal(alone, listed[0])
    assert embedder.encode_query(TEXTS[0]).shape == (embedder.encode_query(TEXTS).shape[1],)


def test_show_progress_bar_draws_only_when_asked(both, capfd):
    _, embedder = both
    embedder.encode(TEXTS)
    assert capfd.readouterr().err == ""  # the library prints nothing unless asked
    embedder.encode(TEXTS, show_progress_bar=True)
    drawn = capfd.readouterr().err
    assert "encode" in drawn and f"{len(TEXTS)}/{len(TEXTS)}" in drawn


def test_keywords_that_mean_nothing_here_are_refused_by_their_python_name(both):
    _, embedder = both
    with pytest.raises(UsageError, match=r"^output_value='token_embeddings': "):
        embedder.encode(TEXTS, output_value="token_embeddings")
    with pytest.raises(UsageError, match=r"^precision='int4': choose one of float32, int8"):
        embedder.encode(TEXTS, precision="int4")
    with pytest.raises(UsageError, match=r"^pool and chunk_size"):
        embedder.encode(TEXTS, pool={"processes": []})
    with pytest.raises(UsageError, match=r"batch_size"):
        embedder.encode(TEXTS, batch_size=-3)
