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


# ---------------------------------------------------------------------------- issue 48: the rest of the face
SAMPLE_FILES = [
    ROOT / "samples" / "media" / "images" / "tall.png",
    ROOT / "samples" / "media" / "images" / "square.webp",
    ROOT / "samples" / "media" / "audio" / "chirp-16k.wav",
    ROOT / "samples" / "media" / "audio" / "stereo-48k.m4a",  # not one of sentence-transformers' audio suffixes
    ROOT / "samples" / "media" / "video" / "clip-h264.mp4",
    ROOT / "samples" / "media" / "video" / "short-vp9.webm",  # nor of its video suffixes
]
ST_NAMES = {"image": "images", "video": "video", "audio": "audio", "text": "text"}


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.name)
def test_a_path_string_is_what_sentence_transformers_takes_it_for(both, path):
    """A str that is an existing file with one of sentence-transformers' media suffixes is that file (where the
    checkpoint embeds its modality); else it is text. The kind is sentence-transformers' own `infer_modality`'s;
    the vector equals sentence-transformers' where it decodes the file here (images: audio and video need soxr and
    torchcodec, which this environment lacks, so there the vector is checked against `modality=` named)."""
    from sentence_transformers.base.modality import infer_modality

    st, embedder = both
    given = str(path)
    kind = ST_NAMES[infer_modality(given, st.modalities)]
    ours = embedder.encode(given)
    assert ours.shape == (embedder.get_sentence_embedding_dimension(),) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, embedder.encode([given], modality=kind)[0], atol=TOLERANCE)
    if kind == "text" or kind == "images":
        same(st.encode(given), ours)
    if kind != "text":  # a media file, not the text of its name
        assert np.abs(ours - embedder.encode([given], modality="text")[0]).max() > 1e-3


def test_strings_that_are_no_files_are_text(both, tmp_path):
    st, embedder = both
    for given in ("missing.png", "a photo.jpg of a cat", str(tmp_path)):
        same(st.encode(given), embedder.encode(given))
    mixed = [TEXTS[0], str(SAMPLE_FILES[0]), TEXTS[1]]  # a list of both kinds: each input its own kind
    ours = embedder.encode(mixed)
    for n, given in enumerate(mixed):
        np.testing.assert_allclose(ours[n], embedder.encode(given), atol=TOLERANCE)


def test_encode_of_nothing_is_what_sentence_transformers_gives(both):
    st, embedder = both
    for options in ({}, {"convert_to_tensor": True}, {"convert_to_numpy": False}):
        theirs, ours = st.encode([], **options), embedder.encode([], **options)
        assert type(ours) is type(theirs)
        if isinstance(theirs, list):
            assert ours == theirs == []
        else:
            assert tuple(ours.shape) == tuple(theirs.shape) == (0,) and ours.dtype == theirs.dtype


@pytest.mark.parametrize("name", [None, "cosine", "dot", "euclidean", "manhattan"])
def test_similarity_scores_as_sentence_transformers_scores(both, name):
    st, embedder = both
    assert embedder.similarity_fn_name == st.similarity_fn_name  # the checkpoint's (cosine here)
    if name is not None:
        st.similarity_fn_name = embedder.similarity_fn_name = name
    try:
        a, b = st.encode(TEXTS), st.encode(TEXTS[:2])
        for x, y in ((a, b), (a[0], b), (torch.from_numpy(a), list(torch.from_numpy(b))), (a.astype(np.float16), b)):
            same(st.similarity(x, y), embedder.similarity(x, y))
        same(st.similarity_pairwise(a[:2], b), embedder.similarity_pairwise(a[:2], b))
    finally:
        st.similarity_fn_name = embedder.similarity_fn_name = "cosine"


def test_the_checkpoints_similarity_function_is_the_default(tmp_path):
    """A checkpoint whose sentence-transformers config names `dot`: both score with dot products."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    folder = tmp_path / "dot"
    shutil.copytree(FOLDERS["embeddinggemma"], folder)
    config = folder / "config_sentence_transformers.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "similarity_fn_name": "dot"}))
    st, embedder = SentenceTransformer(str(folder), device="cpu"), Embedder(folder, device="cpu")
    assert embedder.similarity_fn_name == st.similarity_fn_name == "dot"
    a = embedder.encode(TEXTS)
    same(st.similarity(a * 2, a), embedder.similarity(a * 2, a))
    with pytest.raises(UsageError, match=r"^similarity_fn_name='maxsim': choose one of cosine, dot"):
        embedder.similarity_fn_name = "maxsim"


@pytest.mark.parametrize("truncate_dim", [None, 64])
def test_the_embedding_dimension_is_sentence_transformers(truncate_dim):
    from sentence_transformers import SentenceTransformer

    for folder in FOLDERS.values():
        st = SentenceTransformer(str(folder), device="cpu", truncate_dim=truncate_dim)
        embedder = Embedder(folder, device="cpu", truncate_dim=truncate_dim)
        with pytest.warns(FutureWarning):  # sentence-transformers' old name, still called by ported code
            expected = st.get_sentence_embedding_dimension()
        assert embedder.get_sentence_embedding_dimension() == embedder.get_embedding_dimension() == expected
        assert embedder.truncate_dim == st.truncate_dim
        assert embedder.encode(TEXTS).shape == st.encode(TEXTS).shape == (len(TEXTS), expected)


def test_repr_shows_the_model_and_its_module_stack(both):
    st, embedder = both
    shown = repr(embedder)
    assert shown.startswith("Embedder(\n") and "object at 0x" not in shown
    theirs = repr(st)
    for module in ("Transformer", "Pooling", "Dense", "Normalize"):  # the same stack, in the same order
        assert (module in shown) == (module in theirs)
    assert [line.split(":")[0].strip() for line in shown.splitlines() if line.strip().startswith("(")] == [
        line.split(":")[0].strip() for line in theirs.splitlines() if line.strip().startswith("(")
    ]


def test_a_data_uri_is_an_image_where_the_checkpoint_embeds_images(both):
    import base64

    st, embedder = both
    uri = "data:image/png;base64," + base64.b64encode(SAMPLE_FILES[0].read_bytes()).decode("ascii")
    same(st.encode(uri), embedder.encode(uri))


def test_a_checkpoint_of_towers_answers_the_same_calls():
    """Gemma 4's towers (no sentence-transformers files): the width `encode` gives, cosine, and a repr that says
    what each command gives."""
    embedder = Embedder(ROOT / "samples" / "tiny-gemma4", device="cpu")
    vector = embedder.encode(str(SAMPLE_FILES[0]))  # no text here: a path string is the file
    assert vector.shape == (embedder.get_sentence_embedding_dimension(),)
    assert embedder.similarity_fn_name == "cosine"
    assert float(embedder.similarity(vector, vector)[0, 0]) == pytest.approx(1.0, abs=1e-6)
    assert "commands: images (language), video (language), audio (language)" in repr(embedder)


def test_max_seq_length_is_sentence_transformers(both):
    st, embedder = both
    assert embedder.max_seq_length == embedder.get_max_seq_length() == st.max_seq_length == st.get_max_seq_length()
    assert str(embedder.device) == str(st.device)
