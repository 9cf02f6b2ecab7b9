"""The family registry answers from a checkpoint's config alone: what it can do, and why not, in one line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gemma_embed.config import Modality, RunConfig, Space
from gemma_embed.errors import CheckpointError, UsageError
from gemma_embed.models import registry
from gemma_embed.models.family import Family, Support

ROOT = Path(__file__).resolve().parents[2]


def checkpoint(model_type: str, **sub_configs) -> SimpleNamespace:
    configs = {f"{kind}_config": SimpleNamespace(model_type=t) for kind, t in sub_configs.items()}
    return SimpleNamespace(source="ckpt/", config=SimpleNamespace(model_type=model_type, **configs))


GEMMA4 = checkpoint("gemma4", vision="gemma4_vision", audio="gemma4_audio")
EMBEDDINGGEMMA2 = checkpoint("embedding_gemma2", vision="gemma4_vision", audio="gemma4_audio")


def resolve(modality: str, ckpt, **options):
    return registry.resolve(RunConfig(modality=modality, **options), ckpt)


def test_each_family_is_found_by_its_model_type():
    for family in registry.families():
        for model_type in family.model_types:
            config = SimpleNamespace(model_type=model_type, use_bidirectional_attention=True)
            assert registry.find_family(config) is family
    assert registry.find_family(SimpleNamespace(model_type="llama")) is None
    # EmbeddingGemma is a bidirectional gemma3_text; a causal one (Gemma 3 1B) is a language model.
    assert registry.find_family(SimpleNamespace(model_type="gemma3_text")) is None


def test_auto_space_is_the_familys_first():
    assert str(resolve("images", GEMMA4).space) == "language"
    assert str(resolve("images", EMBEDDINGGEMMA2).space) == "retrieval"
    assert str(resolve("text", EMBEDDINGGEMMA2).space) == "retrieval"


def test_an_unsupported_tower_names_what_would_run():
    assert resolve("images", checkpoint("gemma3n", vision="gemma3n_vision", audio="gemma3n_audio"))
    assert resolve("video", checkpoint("gemma3", vision="siglip_vision_model"))
    ckpt = checkpoint("gemma3n", vision="mystery_vision", audio="gemma3n_audio")
    with pytest.raises(CheckpointError) as caught:
        resolve("images", ckpt)
    assert str(caught.value) == (
        "ckpt/: images need a vision tower of type gemma4_vision (Gemma 4 and EmbeddingGemma 2 checkpoints); "
        "siglip_vision_model (Gemma 3 checkpoints); gemma3n_vision (Gemma 3n checkpoints); "
        "this gemma3n checkpoint's is mystery_vision, which is not supported"
    )
    assert resolve("audio", ckpt)  # its audio tower is still the one Gemma 3n runs
    with pytest.raises(CheckpointError, match="this llama checkpoint has no audio tower"):
        resolve("audio", checkpoint("llama"))


def test_retrieval_needs_a_retrieval_family():
    with pytest.raises(CheckpointError) as caught:
        resolve("text", checkpoint("gemma3_text"))
    assert str(caught.value) == (
        "ckpt/: text to retrieval vectors need an EmbeddingGemma or EmbeddingGemma 2 checkpoint (model type "
        "gemma3_text with use_bidirectional_attention; embedding_gemma2); this one is gemma3_text, not "
        "gemma3_text with use_bidirectional_attention"
    )
    with pytest.raises(CheckpointError, match="text to retrieval vectors need an EmbeddingGemma or"):
        resolve("text", GEMMA4)
    with pytest.raises(UsageError, match="text has no tower rows"):
        resolve("text", EMBEDDINGGEMMA2, space="language")


def test_pools_and_retrieval_options_are_checked_by_the_family():
    with pytest.raises(UsageError, match="--pool frame does not apply to images"):
        resolve("images", GEMMA4, pool="frame")
    assert resolve("video", GEMMA4, pool="frame")
    with pytest.raises(UsageError, match="--pool frame does not apply to video"):  # one vector per video
        resolve("video", EMBEDDINGGEMMA2, pool="frame")
    assert resolve("video", EMBEDDINGGEMMA2, pool="frame", space="language")
    with pytest.raises(UsageError, match="--dim, --prompt and --prompt-name apply"):
        resolve("images", GEMMA4, prompt_name="query")


def test_the_readme_table_is_the_registrys():
    assert registry.models_markdown() in (ROOT / "README.md").read_text()


def toy_family(name: str = "Toy", model_type: str = "toy_model") -> Family:
    never_built = Support(lambda *args: pytest.fail("resolve never builds"), (Space.retrieval,))
    return Family(name, (model_type,), ("toy/model",), {Modality.text: never_built}, help="a toy.")


def test_a_registered_family_is_found_listed_and_named_until_it_is_unregistered():
    toy = toy_family()
    assert registry.register(toy) is toy
    try:
        assert registry.find_family(SimpleNamespace(model_type="toy_model")) is toy
        assert str(resolve("text", checkpoint("toy_model")).space) == "retrieval"
        registry.register(toy)  # again: nothing changes
        assert [f.name for f in registry.families()].count("Toy") == 1
        assert registry.models_table()[-1]["family"] == "Toy" and "\nToy: a toy.\n" in registry.models_text()
        with pytest.raises(CheckpointError, match="need an EmbeddingGemma or EmbeddingGemma 2 or Toy checkpoint"):
            resolve("text", GEMMA4)
        with pytest.raises(UsageError) as caught:
            resolve("text", checkpoint("toy_model"), space="tower")
        assert str(caught.value) == (
            "text has no tower rows: --space retrieval (EmbeddingGemma and EmbeddingGemma 2 and Toy checkpoints) is "
            "the only one"
        )
        with pytest.raises(ValueError, match="a family named 'Toy' is registered already"):
            registry.register(toy_family(model_type="another_model"))
        with pytest.raises(ValueError, match="a family named 'Gemma 4' is registered already"):
            registry.register(toy_family("Gemma 4"))
    finally:
        registry.unregister(toy)
    assert registry.find_family(SimpleNamespace(model_type="toy_model")) is None
    assert "Toy" not in registry.models_text()
    with pytest.raises(ValueError, match="was not added by register"):
        registry.unregister(registry.families()[0])  # the package's own stay


def test_a_registered_family_never_takes_a_checkpoint_a_package_family_recognises():
    shadow = toy_family("Shadow", "gemma4")
    registry.register(shadow)
    try:
        assert registry.find_family(SimpleNamespace(model_type="gemma4")).name == "Gemma 4"
    finally:
        registry.unregister(shadow)
