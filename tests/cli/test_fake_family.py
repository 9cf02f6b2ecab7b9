"""A model family defined in this file alone runs end to end through the command line (issue 30): its own model type
(a transformers config class registered with AutoConfig here), preparer, tower and cost model, help words and query
default, added with `registry.register` and nothing else. No module of the package is edited or patched; the
checkpoint passes the loading checks as any checkpoint must (a model type transformers knows, no auto_map).

The family, "bag of bytes": a text is the UTF-8 bytes of its prompt and itself; its vector is the mean of a
(256, WIDTH) table's rows at those bytes, L2-normalised. The test computes every expected vector and score itself,
with numpy, from the table it wrote."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import AutoConfig, PretrainedConfig
from typer.testing import CliRunner

from gemma_embed.cli import app
from gemma_embed.config import Modality, Space
from gemma_embed.errors import UsageError
from gemma_embed.modalities import Stage, text_stages
from gemma_embed.models import registry
from gemma_embed.models.base import PreparedItem, Unit
from gemma_embed.models.family import Family, Queries, Support
from gemma_embed.models.loading import read_tensors

MODEL_TYPE = "gemma_embed_test_bag_of_bytes"
WIDTH = 16
PROMPTS = {"query": "find: ", "document": "text: "}
LINES = ["a tall building at night", "two red squares", "a quiet blue lake", "a tall tower by day"]


# ------------------------------------------------------------------------------------------- the family


class BagOfBytesConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, width: int = WIDTH, prompts: dict | None = None, **kwargs):
        self.width = width
        self.prompts = dict(prompts if prompts is not None else PROMPTS)
        super().__init__(**kwargs)


def bag_of_bytes_cost(tokens: int, width: int, bytes_per_element: int) -> int:
    """The family's cost model: the gathered rows (tokens x width) and their mean, in the compute dtype."""
    return (max(0, tokens) * width + width) * bytes_per_element


def prompt_of(checkpoint, config) -> str | None:
    """As the retrieval families resolve it: --prompt, else the named prompt, else none."""
    prompts = checkpoint.config.prompts
    if config.prompt is not None:
        return config.prompt
    if config.prompt_name is not None:
        if config.prompt_name not in prompts:
            raise UsageError(f"no prompt named {config.prompt_name!r} (its prompts: {', '.join(prompts)})")
        return prompts[config.prompt_name]
    return None


class BagOfBytesPreparer:
    def __init__(self, prompt: str | None):
        self.prompt = prompt

    def describe(self) -> dict:
        return {"prompt": self.prompt}

    def prepare(self, text: str) -> PreparedItem:
        ids = torch.tensor(list(((self.prompt or "") + text).encode("utf-8")), dtype=torch.long)
        unit = Unit(inputs={"ids": ids}, length=int(ids.shape[0]), rows=1)
        return PreparedItem(units=[unit], meta={"chars": len(text), "tokens": unit.length})


class BagOfBytesTower:
    grouping = "exact"  # only texts of one length share a batch: no padding
    length_unit = "tokens"

    def __init__(self, checkpoint, device, dtype):
        self.checkpoint = checkpoint
        self.device = torch.device(device)
        self.dtype = dtype
        self.width = int(checkpoint.config.width)
        self.output_dims = {"retrieval": self.width}
        self.table = None

    def load(self) -> None:
        if self.table is None:
            self.table = read_tensors(self.checkpoint, "embedding.")["weight"].to(self.device, self.dtype)

    def weight_bytes(self) -> int:
        return 256 * self.width * torch.empty((), dtype=self.dtype).element_size()

    def unit_cost(self, length: int) -> int:
        return bag_of_bytes_cost(length, self.width, torch.empty((), dtype=self.dtype).element_size())

    def encode(self, units: list[Unit], space: str) -> torch.Tensor:
        ids = torch.stack([u.inputs["ids"] for u in units]).to(self.device)
        return torch.nn.functional.normalize(self.table[ids].mean(dim=1), dim=-1)


def build_text(config, checkpoint, device, dtype, space):
    preparer = BagOfBytesPreparer(prompt_of(checkpoint, config))
    return text_stages(preparer, [Stage(BagOfBytesTower(checkpoint, device, dtype), space)])


FAMILY = Family(
    name="Bag of bytes",
    model_types=(MODEL_TYPE,),
    examples=("tests/bag-of-bytes",),
    commands={Modality.text: Support(build_text, (Space.retrieval,))},
    help="text to the mean of a byte table's rows, normalised; a test's family.",
    queries=Queries(prompt_name="query", prompts=lambda checkpoint: dict(checkpoint.config.prompts)),
)


# ------------------------------------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The family registered (its model type with transformers, the family with gemma-embed) and a checkpoint of
    it: config.json and one safetensors table. The family leaves the registry when the module's tests end."""
    AutoConfig.register(MODEL_TYPE, BagOfBytesConfig, exist_ok=True)
    registry.register(FAMILY)
    folder = tmp_path_factory.mktemp("bag-of-bytes")
    BagOfBytesConfig().save_pretrained(folder)
    table = np.random.default_rng(30).standard_normal((256, WIDTH)).astype(np.float32)
    save_file({"embedding.weight": table}, str(folder / "model.safetensors"))
    yield folder, table
    registry.unregister(FAMILY)


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def vector(table: np.ndarray, text: str) -> np.ndarray:
    mean = table[list(text.encode("utf-8"))].astype(np.float64).mean(axis=0)
    return mean / np.linalg.norm(mean)


def test_a_family_registered_from_a_test_runs_end_to_end_through_the_cli(checkpoint, tmp_path):
    folder, table = checkpoint
    listed = cli("models")
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.stdout.splitlines() if line.startswith("Bag of bytes "))
    assert row.split()[3:] == [MODEL_TYPE, "tests/bag-of-bytes", "text", "retrieval"]
    words = " ".join(listed.stdout.split()).split("Bag of bytes: ")[-1]  # its help words, below the table
    assert words == (
        "text to the mean of a byte table's rows, normalised; a test's family. "
        "Search queries get the checkpoint's 'query' prompt where it has one."
    )

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n")
    out = tmp_path / "out.safetensors"
    made = cli("text", corpus, "--model", folder, "-o", out, "--device", "cpu", "--prompt-name", "document", "-q")
    assert made.exit_code == 0, made.stderr
    assert json.loads(made.stdout.splitlines()[-1])["ok"] == len(LINES)

    stored = load_file(str(out))
    assert stored["offsets"].tolist() == list(range(len(LINES) + 1))  # one vector per line
    expected = np.stack([vector(table, PROMPTS["document"] + line) for line in LINES])
    np.testing.assert_allclose(stored["embeddings"], expected, rtol=0, atol=1e-6)

    shown = cli("inspect", out, "--json")
    assert shown.exit_code == 0, shown.stderr
    header = json.loads(shown.stdout)
    assert (header["model_type"], header["space"], header["dim"]) == (MODEL_TYPE, "retrieval", str(WIDTH))
    assert json.loads(header["preprocessing"]) == {"prompt": PROMPTS["document"]}
    keys = [f"{corpus}:{number}" for number in range(len(LINES))]
    assert header["keys"] == keys and [item["rows"] for item in header["items"]] == [1] * len(LINES)

    # A text query gets the family's query prompt (its Queries default); the scores are plain cosines.
    found = cli("search", out, "a tall building", "--jsonl", "-k", "4", "--device", "cpu")
    assert found.exit_code == 0, found.stderr
    hits = [json.loads(line) for line in found.stdout.splitlines()]
    scores = expected @ vector(table, PROMPTS["query"] + "a tall building")
    order = np.argsort(-scores)
    assert [h["key"] for h in hits] == [keys[i] for i in order]
    np.testing.assert_allclose([h["score"] for h in hits], scores[order], rtol=0, atol=1e-5)
    table_form = cli("search", out, "a tall building", "--device", "cpu")
    assert table_form.stdout.splitlines()[0].startswith(
        "queries embedded with the query prompt, items with the document prompt"
    )


def test_plan_costs_each_bucket_with_the_familys_cost_model(checkpoint, tmp_path):
    folder, _ = checkpoint
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n")
    planned = cli("plan", corpus, "--modality", "text", "--model", folder, "--device", "cpu", "-q")
    assert planned.exit_code == 0, planned.stderr
    plan = json.loads(planned.stdout)
    lengths = sorted(len(line.encode("utf-8")) for line in LINES)  # no prompt: none was asked for
    assert sorted(b["length"] for b in plan["buckets"]) == sorted(set(lengths))
    for bucket in plan["buckets"]:
        assert bucket["cost_per_unit"] == bag_of_bytes_cost(bucket["length"], WIDTH, 4)  # float32 on the CPU
