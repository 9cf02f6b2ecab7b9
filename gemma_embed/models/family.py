"""What a model family declares: the checkpoints it recognises, the commands and spaces it supports, how it
builds each command's stages (its preparers and towers, each tower with its own cost model), the words
`gemma-embed models` says about it, and how `search` embeds a query for its outputs. One `Family` per module in
`models/`; `models/registry.py` lists them, and `registry.register` adds one from anywhere else (a test, a notebook).

Everything a family answers before building comes from the checkpoint's config alone, so every usage error
(an unsupported command, space, --pool or --dim) is raised before any tensor is read.

A declaration names the functions that build and check as `Deferred("module", "name")`: the module (torch,
transformers and the processing it needs) is imported when the function is first called, so `gemma-embed models`,
`--help` and the routing of a run read the families without importing torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gemma_embed.config import Modality, Pool, RunConfig, Space

# (config, checkpoint, device, dtype, space) -> modalities.ModalityStages, its towers built but not loaded.
Build = Callable[[RunConfig, Any, Any, Any, Space], Any]


@dataclass(frozen=True)
class Deferred:
    """The function `name` of module `module`, imported on its first call. A family's declaration names its
    builders this way: importing the module that implements them costs torch and transformers' modelling and
    processing code (seconds), which listing the families, or a command that never builds them, does not pay."""

    module: str
    name: str

    def resolve(self) -> Callable[..., Any]:
        return getattr(importlib.import_module(self.module), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


@dataclass(frozen=True)
class Support:
    """How a family serves one command."""

    build: Build
    spaces: tuple[Space, ...]  # the spaces it can give; the first is what --space auto means
    pools: tuple[Pool, ...] = (Pool.none, Pool.mean)
    # The tower sub-config the command runs ("vision", its model_type): named in the error for a checkpoint whose
    # tower of that kind is of another type.
    tower: tuple[str, str] | None = None
    # Pools that apply only to some spaces: (space, pools) overrides `pools` there (retrieval vectors are one row).
    pools_by_space: dict[Space, tuple[Pool, ...]] = field(default_factory=dict)

    def pools_for(self, space: Space) -> tuple[Pool, ...]:
        return self.pools_by_space.get(space, self.pools)


@dataclass(frozen=True)
class Queries:
    """How `gemma-embed search` embeds a query of an output in the family's retrieval space."""

    # The named prompt a query gets unless --prompt-name or --prompt says otherwise, where the checkpoint has it.
    prompt_name: str | None = None
    # The checkpoint's named prompts: checkpoint -> {name: prompt text}; None: it has none.
    prompts: Callable[[Any], dict[str, str]] | None = None

    def prompts_of(self, checkpoint: Any) -> dict[str, str]:
        return dict(self.prompts(checkpoint)) if self.prompts is not None else {}

    def default_prompt(self, prompts: dict[str, str]) -> str | None:
        """The prompt name a query gets when none is asked for: the family's, if the checkpoint has it."""
        return self.prompt_name if self.prompt_name in prompts else None


@dataclass(frozen=True)
class Family:
    name: str  # as people call it: "Gemma 4"
    model_types: tuple[str, ...]  # the checkpoint config's `model_type` values it recognises
    examples: tuple[str, ...]  # hub ids, for `gemma-embed models` and the README
    commands: dict[Modality, Support]
    # Checks that refuse an option combination for this family before anything loads (e.g. a dtype it cannot
    # compute): (config, space) -> None, or UsageError.
    check: Callable[[RunConfig, Space], None] | None = None
    # A finer test than the model type, where one model type holds other models too (EmbeddingGemma is a
    # bidirectional `gemma3_text`; a causal one is a language model): config -> bool.
    matches: Callable[[Any], bool] | None = None
    # How its model types read where `matches` narrows them ("gemma3_text (bidirectional)"); the model types else.
    described_as: str | None = None
    # What it gives and the options that matter for it, in a sentence or two: `gemma-embed models` prints it.
    help: str = ""
    queries: Queries = Queries()

    def recognises(self, config: Any) -> bool:
        if getattr(config, "model_type", None) not in self.model_types:
            return False
        return self.matches is None or bool(self.matches(config))

    def model_type_words(self) -> str:
        return self.described_as or ", ".join(self.model_types)

    def spaces(self) -> tuple[Space, ...]:
        return tuple(dict.fromkeys(space for support in self.commands.values() for space in support.spaces))
