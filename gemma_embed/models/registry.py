"""The model families gemma-embed runs, and the one place that decides what a checkpoint can do.

A family is one declaration module in `models/families/` exposing `FAMILY` (a `models.family.Family`, which names
the functions that build its stages as `Deferred` references, so reading it imports no torch); adding one to the
package is that module, the code it names, and its line in `FAMILY_MODULES`, and code outside the package (a test, a
notebook, another package) adds one with `register(family)`. Everything here answers from the checkpoint's config
alone: `resolve` checks the command, space, --pool, --dim and prompts before any tensor is read, and the error for
an unsupported checkpoint, `gemma-embed models` and the README's table of supported models come from the same table.
"""

from __future__ import annotations

import functools
import importlib
import textwrap
from dataclasses import dataclass

from gemma_embed.config import Modality, RunConfig, Space
from gemma_embed.errors import CheckpointError, UsageError
from gemma_embed.models.family import Family, Support

FAMILY_MODULES = (
    "gemma_embed.models.families.gemma4",
    "gemma_embed.models.families.gemma3",
    "gemma_embed.models.families.gemma3n",
    "gemma_embed.models.families.embeddinggemma",
    "gemma_embed.models.families.embeddinggemma2",
)
HELP_WIDTH = 100  # the families' words below `gemma-embed models`' table, wrapped for a terminal
# Families added by `register`, in the order they came: after the package's own, so a checkpoint a package family
# recognises stays that family's.
_registered: list[Family] = []


@functools.cache
def _package_families() -> tuple[Family, ...]:
    """The package's own families (their declarations imported once, on first use; no torch)."""
    return tuple(importlib.import_module(name).FAMILY for name in FAMILY_MODULES)


def families() -> tuple[Family, ...]:
    """Every family, the package's then the registered ones: each lookup sees a family as soon as it is
    registered."""
    return (*_package_families(), *_registered)


def register(family: Family) -> Family:
    """Add a family from outside the package; `gemma-embed models`, every command, `search` and the errors that name
    what would run take it from then on. Its model types must be ones transformers' AutoConfig knows
    (`AutoConfig.register` for a new one): the checkpoint's config is read through it, and the loading checks
    refuse a model type transformers does not have. Registering the same family again does nothing; another family
    of a name already taken is refused (the table and the errors name families by name)."""
    if not isinstance(family, Family):
        raise TypeError(f"register() takes a gemma_embed.models.family.Family, not {type(family).__name__}")
    present = families()
    if family in present:
        return family
    if any(other.name == family.name for other in present):
        raise ValueError(f"a family named {family.name!r} is registered already")
    _registered.append(family)
    return family


def unregister(family: Family) -> None:
    """Remove a family `register` added (a test's, when it ends); the package's own stay."""
    if family not in _registered:
        raise ValueError(f"{family.name!r} was not added by register()")
    _registered.remove(family)


def serving(modality: Modality, space: Space) -> list[Family]:
    """The families whose `modality` command gives rows in `space`."""
    return [f for f in families() if space in getattr(f.commands.get(modality), "spaces", ())]


def _names(found: list[Family], joiner: str = " and ") -> str:
    return joiner.join(f.name for f in found)


def find_family(config) -> Family | None:
    """The family that recognises this checkpoint config, or None."""
    return next((family for family in families() if family.recognises(config)), None)


@dataclass(frozen=True)
class ResolvedCommand:
    """What a run of one command on one checkpoint will be, decided before anything loads."""

    family: Family
    support: Support
    space: Space

    def build(self, config: RunConfig, checkpoint, device, dtype):
        """The command's stages, towers built but not loaded (only configs and processor files are read)."""
        return self.support.build(config, checkpoint, device, dtype, self.space)


def resolve(config: RunConfig, checkpoint) -> ResolvedCommand:
    """The family, its support for `config.modality` and the space the run gives; UsageError (or CheckpointError)
    in one line for anything the checkpoint cannot do with these options."""
    modality = Modality(config.modality)
    family = find_family(checkpoint.config)
    support = family.commands.get(modality) if family is not None else None
    space = _space(config, modality, support)
    if support is None or space not in support.spaces or not _has_tower(checkpoint, support):
        raise _unsupported(checkpoint, modality, space)
    if space != Space.retrieval and (config.dim is not None or config.prompt is not None or config.prompt_name):
        able = serving(modality, Space.retrieval)
        raise UsageError(
            "--dim, --prompt and --prompt-name apply to retrieval vectors only"
            + (f" ({_names(able)} checkpoints)" if able else f" (no family gives them for {modality})")
        )
    pools = support.pools_for(space)
    if config.pool not in pools:
        raise UsageError(f"--pool {config.pool} does not apply to {modality} (choose {', '.join(map(str, pools))})")
    if family.check is not None:
        family.check(config, space)
    return ResolvedCommand(family, support, space)


def _space(config: RunConfig, modality: Modality, support: Support | None) -> Space:
    space = Space(config.space)
    if modality == Modality.text and space not in (Space.auto, Space.retrieval):
        able = _names(serving(modality, Space.retrieval))
        raise UsageError(f"text has no tower rows: --space retrieval ({able} checkpoints) is the only one")
    if space != Space.auto:
        return space
    if support is not None:
        return support.spaces[0]
    return Space.retrieval if modality == Modality.text else Space.language


def _has_tower(checkpoint, support: Support) -> bool:
    """Whether the checkpoint's tower of the command's kind is the type the family runs (a Gemma 3n config with
    another vision tower would otherwise fail later, while loading)."""
    if support.tower is None:
        return True
    kind, model_type = support.tower
    return getattr(getattr(checkpoint.config, f"{kind}_config", None), "model_type", None) == model_type


def _unsupported(checkpoint, modality: Modality, space: Space) -> CheckpointError:
    """Why this checkpoint cannot give `space` for `modality`, naming what can, from the families' table."""
    model_type = getattr(checkpoint.config, "model_type", "?")
    if space == Space.retrieval:
        able = serving(modality, space)
        names = _names(able, " or ")
        types = "; ".join(f.model_type_words() for f in able)
        return CheckpointError(
            f"{checkpoint.source}: {modality} to retrieval vectors need an {names} checkpoint "
            f"(model type {types}); this one is {_described(checkpoint.config)}"
        )
    kind = next(s.tower[0] for f in families() if (s := f.commands.get(modality)) and s.tower)
    wanted: dict[str, list[str]] = {}
    for family in families():
        support = family.commands.get(modality)
        if support is not None and support.tower is not None and space in support.spaces:
            wanted.setdefault(support.tower[1], []).append(family.name)
    described = "; ".join(f"{tower} ({' and '.join(names)} checkpoints)" for tower, names in wanted.items())
    found = getattr(getattr(checkpoint.config, f"{kind}_config", None), "model_type", None)
    if found is None:
        return CheckpointError(
            f"{checkpoint.source}: this {model_type} checkpoint has no {kind} tower; {modality} need one of "
            f"type {described}"
        )
    return CheckpointError(
        f"{checkpoint.source}: {modality} need a {kind} tower of type {described}; this {model_type} checkpoint's "
        f"is {found}, which is not supported"
    )


def models_table() -> list[dict]:
    """One row per family: its name, example hub ids, commands and spaces (for `gemma-embed models` and the
    README)."""
    return [
        {
            "family": family.name,
            "model_types": list(family.model_types),
            "model_type": family.model_type_words(),
            "examples": list(family.examples),
            "commands": [str(m) for m in family.commands],
            "spaces": [str(s) for s in family.spaces()],
            "help": family_help(family),
        }
        for family in families()
    ]


def family_help(family: Family) -> str:
    """The family's own words, and which prompt `search` gives a query where it makes retrieval vectors."""
    words = family.help
    if Space.retrieval in family.spaces() and family.queries.prompt_name:
        words += f" Search queries get the checkpoint's {family.queries.prompt_name!r} prompt where it has one."
    return words.strip()


def models_markdown() -> str:
    """The README's table of supported models."""
    lines = ["| family | model type | example hub ids | commands | spaces |", "|---|---|---|---|---|"]
    for row in models_table():
        lines.append(
            f"| {row['family']} | {row['model_type']} | {', '.join(f'`{e}`' for e in row['examples'])} "
            f"| {', '.join(row['commands'])} | {', '.join(row['spaces'])} |"
        )
    return "\n".join(lines) + "\n"


def models_text() -> str:
    """`gemma-embed models`: the table as aligned plain text."""
    header = ["family", "model type", "example hub ids", "commands", "spaces"]
    rows = [
        [
            r["family"],
            r["model_type"],
            ", ".join(r["examples"]),
            ", ".join(r["commands"]),
            ", ".join(r["spaces"]),
        ]
        for r in models_table()
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    # Below the table, each family's own words (what it gives, the options that matter for it).
    notes = [
        textwrap.fill(f"{r['family']}: {r['help']}", HELP_WIDTH, subsequent_indent="  ", break_on_hyphens=False)
        for r in models_table()
        if r["help"]
    ]
    return "\n".join([*lines, *([""] + notes if notes else [])]) + "\n"


def _described(config) -> str:
    """A checkpoint's model type, and what a family of that model type needs where it lacks it (a causal
    gemma3_text is a language model, not EmbeddingGemma)."""
    model_type = getattr(config, "model_type", "?")
    near = [f for f in families() if model_type in f.model_types and not f.recognises(config)]
    return f"{model_type}, not {near[0].model_type_words()}" if near else str(model_type)
