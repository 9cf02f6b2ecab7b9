"""The route key (`embedder.STAGE_OPTIONS`, derived from each option's declared stage) against what building a route
really reads (issue 30, item 6): every RunConfig field that `Embedder.command` reads while it resolves, builds and sets
up a command's stages, on every sample checkpoint and command, must be in the key, and every field in the key must
be read somewhere. An option that changes stages but was declared at another stage (so two calls with different
values would share one route) fails the first check; one declared at a route stage that no route reads, the
second."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import ROOT

from gemma_embed import config
from gemma_embed.config import RunConfig, Space
from gemma_embed.embedder import STAGE_OPTIONS, Embedder
from gemma_embed.models import registry

FIELDS = frozenset(f.name for f in dataclasses.fields(RunConfig))
SAMPLES = sorted(p for p in (ROOT / "samples").glob("tiny-*") if (p / "config.json").exists())


class RecordingConfig(RunConfig):
    """A RunConfig that notes which of its fields are read once `recording` is on (per instance: a route works on
    the copy `dataclasses.replace` makes of the Embedder's config)."""

    def __getattribute__(self, name):
        if name in FIELDS:
            read = object.__getattribute__(self, "__dict__").get("_read")
            if read is not None:
                read.add(name)
        return object.__getattribute__(self, name)


def route_reads(sample, command, monkeypatch, **options) -> set[str]:
    """The fields a new Embedder's `command(modality, **options)` reads from the moment it resolves the command's
    family (the key it computed before reads every key field anyway): resolving, building, engines, host plan."""
    embedder = Embedder.from_config(RecordingConfig(model=str(sample), device="cpu"))
    seen: set[str] = set()
    resolve = registry.resolve

    def recording_resolve(run_config, checkpoint):
        object.__setattr__(run_config, "_read", seen)
        return resolve(run_config, checkpoint)

    monkeypatch.setattr(registry, "resolve", recording_resolve)
    embedder.command(command, **options)
    monkeypatch.setattr(registry, "resolve", resolve)
    return seen


def _cases():
    """(sample, command, options) for every command each sample supports, in every space it offers: the branches
    that read the retrieval options and the towers' own ones."""
    from gemma_embed.models.loading import resolve_checkpoint

    for sample in SAMPLES:
        family = registry.find_family(resolve_checkpoint(str(sample)).config)
        for command, support in family.commands.items():
            for space in support.spaces:
                yield pytest.param(sample, command, {"space": space}, id=f"{sample.name}-{command}-{space}")


CASES = list(_cases())


def test_every_route_stage_option_is_declared_at_a_route_stage():
    assert STAGE_OPTIONS, "no option changes a command's stages?"
    for name in STAGE_OPTIONS:
        spec = config.option_of(next(f for f in dataclasses.fields(RunConfig) if f.name == name))
        assert spec.stage in config.ROUTE_STAGES
    undeclared = [
        f.name
        for f in dataclasses.fields(RunConfig)
        if config.option_of(f) is not None and config.option_of(f).stage not in config.STAGES
    ]
    assert undeclared == [], "every RunConfig option declares the stage it changes"


def fields_at(*stages: str) -> set[str]:
    return {f.name for f in dataclasses.fields(RunConfig) if getattr(config.option_of(f), "stage", None) in stages}


# Read by a route but no part of its key: the command (the key's first element) and the Embedder's own model,
# device and dtype, fixed when it is made (a family refuses float16 from the dtype asked for).
BESIDE_THE_KEY = fields_at(config.COMMAND, config.LOAD)


@pytest.mark.parametrize("sample, command, options", CASES)
def test_a_route_reads_only_its_key(monkeypatch, sample, command, options):
    read = route_reads(sample, command, monkeypatch, **options)
    assert read, "nothing recorded: the route was not built through registry.resolve"
    outside = sorted(read - set(STAGE_OPTIONS) - BESIDE_THE_KEY)
    assert outside == [], f"route reads {outside}: declare their stage as one of {config.ROUTE_STAGES}"


def test_every_key_field_is_read_by_some_route(monkeypatch):
    read: set[str] = set()
    for case in CASES:
        sample, command, options = case.values
        read |= route_reads(sample, command, monkeypatch, **options)
    assert sorted(set(STAGE_OPTIONS) - read) == [], "in the route key, but no route reads them"


def test_a_stage_option_given_to_route_builds_another_route():
    """The key at work: another value of a stage option is another route (here --batch-size, which the engines
    read; before the key was derived, the first route's batch size stayed), the same value the same route."""
    embedder = Embedder(ROOT / "samples" / "tiny-gemma4", device="cpu")
    first = embedder.command("images", space=Space.language, batch_size=4)
    assert embedder.command("images", space=Space.language, batch_size=4) is first
    other = embedder.command("images", space=Space.language, batch_size=2)
    assert other is not first and other.engines[0].batch_cap == 2 and first.engines[0].batch_cap == 4
