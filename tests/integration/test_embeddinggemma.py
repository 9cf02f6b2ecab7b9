"""EmbeddingGemma (v1): gemma-embed's preparer and text tower on the shared engine equal
`SentenceTransformer(ckpt).encode(...)`, on a tiny random checkpoint written by transformers and
sentence-transformers themselves (samples/make_tiny_checkpoint.py: build_embeddinggemma)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from helpers import record_batches, record_outputs, spy_tensor_reads

from gemma_embed import numerics
from gemma_embed.embedder import Embedder
from gemma_embed.errors import CheckpointError, UsageError
from gemma_embed.models.embeddinggemma import (
    EmbeddingGemmaPreparer,
    EmbeddingGemmaTextTower,
    is_embeddinggemma,
    refuse_float16,
)
from gemma_embed.models.loading import resolve_checkpoint
from gemma_embed.models.st_head import token_batch
from gemma_embed.models.st_inputs import read_sentence_transformers
from gemma_embed.pooling import mean_pool

LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "A photograph of a red car parked by the sea at sunset.",
    "Sound of rain falling on a tin roof.",
    "a dog",
    "x",
]
TOLERANCE = 1e-5


def rel(ours: torch.Tensor, ref) -> float:
    ref = torch.as_tensor(np.asarray(ref), dtype=torch.float32).reshape(-1)
    return float((ours.float().reshape(-1) - ref).norm() / ref.norm())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from make_tiny_checkpoint import build_embeddinggemma

    return build_embeddinggemma(tmp_path_factory.mktemp("eg") / "eg", seed=2)


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    loaded: dict = {}

    def get(path, **kwargs):
        key = (str(path), tuple(sorted(kwargs.items())))
        if key not in loaded:
            loaded[key] = SentenceTransformer(str(path), device="cpu", **kwargs)
        return loaded[key]

    return get


class Run:
    """One checkpoint as a user runs it from Python (`Embedder`: the registry, the family's stages, the engine at
    a fixed cap), with its preparer and text tower beside it for the tests that look inside."""

    def __init__(self, path, dim: int | None = None, dtype=torch.float32):
        self.checkpoint = resolve_checkpoint(str(path))
        self.setup = read_sentence_transformers(self.checkpoint)
        EmbeddingGemmaTextTower(self.checkpoint, "cpu", dtype, self.setup, dim=dim, load=False)  # its checks
        self.dim = dim
        self.embedder = Embedder(str(path), device="cpu", dtype=str(dtype).removeprefix("torch."), batch_size=8)
        self.tower = self.embedder.load("text", dim=dim).engines[0].tower  # the one the Embedder runs

    def embed(self, lines: list[str], **prompt) -> tuple[list, list]:
        """The Embedder's vectors, and the preparer's items (their metadata: tokens, truncated_tokens)."""
        vectors = self.embedder.embed(lines, modality="text", dim=self.dim, **prompt)
        preparer = EmbeddingGemmaPreparer(self.checkpoint, self.setup, **prompt)
        return vectors, [preparer.prepare(line) for line in lines]


@pytest.fixture(scope="module")
def run(folder):
    return Run(folder)


def assert_equal_to_reference(ours: list, ref, width: int = 256) -> None:
    assert len(ours) == len(ref)
    for vector, expected in zip(ours, ref, strict=True):
        assert vector.shape == (1, width)
        assert abs(float(vector.norm()) - 1.0) < 1e-5
        assert rel(vector, expected) < TOLERANCE


@pytest.mark.parametrize("prompt", [{"prompt_name": "query"}, {"prompt_name": "document"}, {"prompt": "topic: "}])
def test_lines_equal_sentence_transformers_with_lines_of_different_lengths_in_one_batch(
    prompt, run, folder, reference, monkeypatch
):
    batches = record_batches(monkeypatch, EmbeddingGemmaTextTower)
    ours, _ = run.embed(LINES, **prompt)
    assert_equal_to_reference(ours, reference(folder).encode(LINES, **prompt))
    assert any(len(batch) > 1 and len({u.length for u in batch}) > 1 for batch in batches)


def test_prompts_are_the_checkpoints_and_change_the_vectors(run):
    assert run.setup.prompts["query"] == "task: search result | query: "
    assert run.setup.prompts["document"] == "title: none | text: "
    assert {"STS", "Clustering", "Retrieval-document"} <= run.setup.prompts.keys()
    query, _ = run.embed(LINES[:1], prompt_name="query")
    document, _ = run.embed(LINES[:1], prompt_name="document")
    plain, _ = run.embed(LINES[:1])
    assert rel(query[0], document[0].numpy()) > 1e-3 and rel(query[0], plain[0].numpy()) > 1e-3
    with pytest.raises(UsageError, match="no prompt named 'nope'"):
        EmbeddingGemmaPreparer(run.checkpoint, run.setup, prompt_name="nope")


def test_dim_128_equals_sentence_transformers_truncate_dim_renormalised(folder, reference):
    ours, _ = Run(folder, dim=128).embed(LINES, prompt_name="query")
    ref = reference(folder, truncate_dim=128).encode(LINES, prompt_name="query", normalize_embeddings=True)
    assert ref.shape == (len(LINES), 128)
    assert_equal_to_reference(ours, ref, width=128)
    with pytest.raises(UsageError, match="--dim 512: the model's vectors have 256 dimensions"):
        Run(folder, dim=512)


def test_a_line_longer_than_max_seq_length_equals_sentence_transformers_truncated(run, folder, reference):
    st = reference(folder)
    assert st.max_seq_length == 32
    long_line = " ".join(LINES * 3)
    lines = [long_line, "short"]
    ours, items = run.embed(lines, prompt_name="document")
    assert_equal_to_reference(ours, st.encode(lines, prompt_name="document"))
    # The count of cut tokens, against the tokenizer's own untruncated encoding of prompt + line.
    full = len(st.tokenizer(run.setup.prompts["document"] + long_line)["input_ids"])
    assert full > 32
    assert items[0].meta["tokens"] == 32 and items[0].meta["truncated_tokens"] == full - 32
    assert items[1].meta["truncated_tokens"] == 0


def test_texts_around_the_limit_are_cut_as_the_tokenizers_own_truncation_cuts_them(folder, reference):
    """The preparer cuts the untruncated ids (one tokenisation, not two) where a probe showed the rule holds: for
    every length from under the limit to far over it, its ids equal the tokenizer's own truncated call (as
    sentence-transformers makes it), and the cut count equals the untruncated length less the limit."""
    st = reference(folder)
    preparer = EmbeddingGemmaPreparer(resolve_checkpoint(folder), prompt_name="document")
    prompt = preparer.prompt
    assert preparer._suffix_length is not None  # the one-call path is the one under test
    words = "sea car rain, dog. fox 12 roof".split()
    for n in [*range(1, 40), 100, 1000]:
        text = " ".join(words[i % len(words)] for i in range(n))
        expected = st.tokenizer([prompt + text], truncation="longest_first", max_length=32)["input_ids"][0]
        full = len(st.tokenizer([prompt + text])["input_ids"][0])
        item = preparer.prepare(text)
        assert item.units[0].inputs["input_ids"].tolist() == expected, n
        assert item.meta["truncated_tokens"] == max(0, full - 32), n


def test_max_seq_length_from_sentence_bert_config_is_obeyed(tmp_path, folder, reference):
    """The hub repository states max_seq_length in sentence_bert_config.json (its tokenizer says 2048 too); a
    smaller value there wins over the tokenizer's, as sentence-transformers reads it."""
    short = tmp_path / "short"
    shutil.copytree(folder, short)
    config_path = short / "sentence_bert_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "max_seq_length": 12}))
    st = reference(short)
    assert st.max_seq_length == 12
    ours, items = Run(short).embed(LINES, prompt_name="query")
    assert_equal_to_reference(ours, st.encode(LINES, prompt_name="query"))
    assert all(item.meta["tokens"] == 12 for item in items)


def test_ragged_batches_equal_each_line_alone(run):
    preparer = EmbeddingGemmaPreparer(run.checkpoint, run.setup, prompt_name="query")
    units = [preparer.prepare(line).units[0] for line in LINES]
    assert len({u.length for u in units}) > 2
    with torch.inference_mode():
        batched = run.tower.encode(units)
        alone = [run.tower.encode([u])[0] for u in units]
    assert max(rel(b, a) for b, a in zip(batched, alone, strict=True)) < TOLERANCE


def test_float16_is_refused_in_one_line_before_loading(folder, monkeypatch):
    with pytest.raises(UsageError, match="does not run in float16") as caught:
        refuse_float16(torch.float16)
    assert "\n" not in str(caught.value)
    refuse_float16(torch.bfloat16)
    refuse_float16(torch.float32)
    read_keys = spy_tensor_reads(monkeypatch)
    checkpoint = resolve_checkpoint(str(folder))
    with pytest.raises(UsageError, match="float16"):
        EmbeddingGemmaTextTower(checkpoint, "cpu", torch.float16)
    assert read_keys == []


def test_loads_the_text_model_strictly_and_only_its_tensors(folder, monkeypatch):
    from safetensors import safe_open
    from transformers import Gemma3TextModel

    read_keys = spy_tensor_reads(monkeypatch)
    checkpoint = resolve_checkpoint(str(folder))
    assert is_embeddinggemma(checkpoint)
    tower = EmbeddingGemmaTextTower(checkpoint, "cpu", torch.float32)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as fh:
        stored = set(fh.keys())
    assert stored <= set(read_keys) and {"linear.weight"} <= set(read_keys)
    reference = Gemma3TextModel.from_pretrained(folder, dtype=torch.float32).state_dict()
    assert tower.model.state_dict().keys() == reference.keys()
    for name, value in tower.model.state_dict().items():
        assert torch.equal(value, reference[name]), name


def test_a_causal_gemma3_text_model_is_not_taken_for_embeddinggemma(tmp_path, folder):
    causal = tmp_path / "causal"
    shutil.copytree(folder, causal)
    config_path = causal / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "use_bidirectional_attention": False}))
    checkpoint = resolve_checkpoint(str(causal))
    assert not is_embeddinggemma(checkpoint)
    with pytest.raises(CheckpointError, match="not an EmbeddingGemma checkpoint"):
        EmbeddingGemmaTextTower(checkpoint, "cpu", torch.float32)


def test_bf16_device_batch_is_bit_equal_to_transformers_bf16_model(folder, monkeypatch):
    """The tool's bf16 batch, padded as the tool padded it, through transformers' own
    `Gemma3TextModel.from_pretrained(dtype=bfloat16)`: the same hidden states bit for bit, and the tool's
    vectors are exactly those pooled and passed through the checkpoint's Dense/Normalize modules."""
    from transformers import Gemma3TextModel

    bf16 = Run(folder, dtype=torch.bfloat16)
    calls = record_outputs(monkeypatch, EmbeddingGemmaTextTower)
    hidden_seen: list = []
    bf16.tower.model.register_forward_hook(lambda _m, _a, out: hidden_seen.append(out.last_hidden_state))
    bf16.embed(LINES, prompt_name="query")
    assert any(len({u.length for u in units}) > 1 for units, _ in calls)
    model = Gemma3TextModel.from_pretrained(folder, dtype=torch.bfloat16).eval()
    for (units, rows), ours_hidden in zip(calls, hidden_seen, strict=True):
        ids, mask, pool = token_batch(units, bf16.tower.pad_id)
        with torch.inference_mode():
            theirs = model(input_ids=ids, attention_mask=mask).last_hidden_state
        assert theirs.dtype == torch.bfloat16 and torch.equal(theirs, ours_hidden)
        # The head's float32 GEMM of fewer than 4 pooled rows would take MKL's small-row kernels, whose bytes
        # differ from the same rows of a larger product: the tool pads such rows to 4 (numerics.py), as here.
        with numerics.aligned(torch.device("cpu")):
            assert torch.equal(bf16.tower.head(mean_pool(theirs, pool)), rows)


def test_the_text_command_equals_sentence_transformers_and_search_uses_the_query_prompt(tmp_path, folder, reference):
    """`gemma-embed text` on a lines file (the registry's EmbeddingGemma family, the writer), then `search`."""
    from helpers import run_images

    import gemma_embed
    from gemma_embed.search import Query, query_index

    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(LINES) + "\n")
    out = tmp_path / "eg.safetensors"
    code, records, err = run_images([lines], folder, out, modality="text", prompt_name="document")
    assert code == 0, err
    ours = gemma_embed.load(out)
    keys = gemma_embed.read_metadata(out)["keys"]
    expected = reference(folder).encode(LINES, prompt_name="document")
    assert_equal_to_reference([ours[k] for k in keys], expected)
    (hit,) = query_index(out, Query(text=LINES[1]), k=1, device="cpu")
    assert hit.key == keys[1]
    query = reference(folder).encode([LINES[1]], prompt_name="query")[0]
    assert hit.score == pytest.approx(float(np.dot(query, expected[1])), abs=1e-5)


def test_float16_on_the_command_line_is_one_error_line_exit_2(tmp_path, folder):
    from typer.testing import CliRunner

    from gemma_embed.cli import app

    lines = tmp_path / "lines.txt"
    lines.write_text("a line\n")
    result = CliRunner().invoke(
        app, ["text", str(lines), "--model", str(folder), "--dtype", "float16", "-o", str(tmp_path / "o.safetensors")]
    )
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: EmbeddingGemma does not run in float16: its activations overflow float16 (NaN vectors); "
        "use --dtype bfloat16 or float32"
    ]
    assert not (tmp_path / "o.safetensors").exists()
