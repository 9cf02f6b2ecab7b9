"""The family registry answers from a checkpoint's config alone: what it can do, and why not, in one line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gemma_embed.config import RunConfig
from gemma_embed.errors import CheckpointError, UsageError
from gemma_embed.models import registry

ROOT = Path(__file__).resolve().parents[2]


def checkpoint(model_type: str, **sub_configs) -> SimpleNamespace:
    configs = {f"{kind}_config": SimpleNamespace(model_type=t) for kind, t in sub_configs.items()}
    return SimpleNamespace(source="ckpt/", config=SimpleNamespace(model_type=model_type, **configs))


def resolve(modality: str, ckpt, **options):
    return registry.resolve(RunConfig(modality=modality, **options), ckpt)


def test_each_family_is_found_by_its_model_type():
    for family in registry.families():
        for model_type in family.model_types:
            assert registry.find_family(SimpleNamespace(model_type=model_type)) is family
    assert registry.find_family(SimpleNamespace(model_type="llama")) is None


def test_auto_space_is_the_familys_first():
    assert str(resolve("images", checkpoint("gemma4")).space) == "language"
    assert str(resolve("images", checkpoint("embedding_gemma2")).space) == "retrieval"
    assert str(resolve("text", checkpoint("embedding_gemma2")).space) == "retrieval"


def test_an_unsupported_tower_names_what_would_run():
    ckpt = checkpoint("gemma3n", vision="gemma3n_vision", audio="gemma3n_audio")
    with pytest.raises(CheckpointError) as caught:
        resolve("images", ckpt)
    assert str(caught.value) == (
        "ckpt/: images need a vision tower of type gemma4_vision (Gemma 4 and EmbeddingGemma 2 checkpoints); "
        "this gemma3n checkpoint's is gemma3n_vision, which is not supported"
    )
    with pytest.raises(CheckpointError, match="this llama checkpoint has no audio tower"):
        resolve("audio", checkpoint("llama"))


def test_retrieval_needs_a_retrieval_family():
    with pytest.raises(CheckpointError, match="text to retrieval vectors need an EmbeddingGemma 2 checkpoint"):
        resolve("text", checkpoint("gemma3_text"))
    with pytest.raises(UsageError, match="text has no tower rows"):
        resolve("text", checkpoint("embedding_gemma2"), space="language")


def test_pools_and_retrieval_options_are_checked_by_the_family():
    with pytest.raises(UsageError, match="--pool frame does not apply to images"):
        resolve("images", checkpoint("gemma4"), pool="frame")
    assert resolve("video", checkpoint("gemma4"), pool="frame")
    with pytest.raises(UsageError, match="--pool frame does not apply to video"):  # one vector per video
        resolve("video", checkpoint("embedding_gemma2"), pool="frame")
    assert resolve("video", checkpoint("embedding_gemma2"), pool="frame", space="language")
    with pytest.raises(UsageError, match="--dim, --prompt and --prompt-name apply"):
        resolve("images", checkpoint("gemma4"), prompt_name="query")


def test_the_readme_table_is_the_registrys():
    assert registry.models_markdown() in (ROOT / "README.md").read_text()
