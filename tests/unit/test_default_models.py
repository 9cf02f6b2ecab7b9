"""Every command's default model is one the command accepts: the registry's family for the default's model type
serves the command and names the default among its examples (nothing is downloaded)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gemma_embed.config import DEFAULT_MODELS, EMBED, Modality, RunConfig
from gemma_embed.models.registry import find_family

# The default checkpoints' config model types, as their config.json on the hub says.
HUB_MODEL_TYPES = {"google/gemma-4-e2b-it": "gemma4", "google/embeddinggemma-300m": "gemma3_text"}


def _family_of(model: str):
    # The default checkpoints' configs as far as the registry reads them: google/embeddinggemma-300m's is a
    # gemma3_text with use_bidirectional_attention (a causal gemma3_text is a language model, not served).
    return find_family(SimpleNamespace(model_type=HUB_MODEL_TYPES[model], use_bidirectional_attention=True))


@pytest.mark.parametrize("command", EMBED)
def test_every_commands_default_model_is_one_the_command_accepts(command):
    model = RunConfig(modality=command).model  # what a run without --model uses
    assert model == DEFAULT_MODELS[command]
    family = _family_of(model)
    assert family is not None, f"{model}: no family is registered for model type {HUB_MODEL_TYPES[model]}"
    assert Modality(command) in family.commands, f"{model} ({family.name}) does not serve {command}"
    assert model in family.examples, f"{family.name} does not list {model} among its checkpoints"


def test_text_defaults_to_an_embedding_checkpoint_and_media_to_gemma4():
    assert RunConfig(modality="text").model == "google/embeddinggemma-300m"
    assert RunConfig(modality="images").model == "google/gemma-4-e2b-it"
    assert RunConfig(modality="audio", model="x/y").model == "x/y"  # a model given is kept
