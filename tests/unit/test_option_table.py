"""Every command's options from the one table (issue 30, item 6): what each command parses is what config.py
declares for it, each option is declared once, and an option the inspection commands share with the embed
commands is the same option (the same check, the same words) wherever it appears."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
from typer.main import get_command

from gemma_embed import cli, config
from gemma_embed.config import InspectionOptions, RunConfig, declared_options

# Options that are no field of a table: help, the embed commands' --list-extensions (prints and exits).
NOT_DECLARED = {"--help", "--list-extensions"}
COMMANDS = get_command(cli.app).commands


def long_name(f: dataclasses.Field, spec: config.Option) -> str:
    return spec.long or "--" + f.name.replace("_", "-")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_parses_exactly_the_options_declared_for_it(command):
    parsed = {
        name
        for param in COMMANDS[command].params
        if param.param_type_name == "option" and not param.hidden
        for name in param.opts
        if name.startswith("--")
    }
    declared = {long_name(f, spec) for f, _, spec in declared_options(command)}
    assert parsed - NOT_DECLARED == declared


# A name two declarations share, each for commands the other has not: `serve --output` is repeated (the outputs
# it searches), an embed command's or export's `--output` the one file it writes.
SHARED_NAMES = {
    ("--output", "RunConfig.output", "ServeConfig.outputs"),
    ("-o", "RunConfig.output", "ServeConfig.outputs"),
}


def test_each_option_is_declared_once():
    names: dict[str, tuple[str, tuple[str, ...]]] = {}
    for table in config.OPTION_TABLES:
        for f in dataclasses.fields(table):
            spec = config.option_of(f)
            if spec is None:
                continue
            here = f"{table.__name__}.{f.name}"
            for name in (long_name(f, spec), *spec.flags, *spec.aliases):
                # -k (search's --top) and -q (--quiet) are each one option's, -o --output's, -0 --null's
                if name in names:
                    first, commands = names[name]
                    assert (name, first, here) in SHARED_NAMES, f"{name}: declared by {first} and {here}"
                    assert not set(commands) & set(spec.commands), f"{name}: one command takes {first} and {here}"
                    continue
                names[name] = (here, spec.commands)


def test_the_shared_options_are_runconfig_fields_not_inspection_ones():
    shared = {"model", "device", "dtype", "prompt_name", "prompt", "jsonl", "quiet", "output", "overwrite"}
    inspection = {f.name for f in dataclasses.fields(InspectionOptions)}
    assert not shared & inspection
    uses = {f.name: config.option_of(f).commands for f in dataclasses.fields(RunConfig) if f.name in shared}
    readers = {config.SEARCH, config.INDEX, config.EXPORT}
    assert all(set(commands) & readers for commands in uses.values()), uses


def test_cli_declares_no_option_of_its_own_but_two():
    """Every other option comes from the tables: cli.py writes no option name but these."""
    source = inspect.getsource(cli)
    assert sorted(re.findall(r"typer\.Option\(\s*\"(-[\w-]+)\"", source)) == ["--list-extensions", "--version"]


def _error_line(capsys, monkeypatch, args) -> tuple[int, str]:
    monkeypatch.setattr("sys.argv", ["gemma-embed", *args])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    (line,) = capsys.readouterr().err.splitlines()
    return exited.value.code, re.sub(r" \(see '.*--help'\)$", "", line)


@pytest.mark.parametrize(
    "option, value, reader",
    [
        ("--device", "gpu", ["search", "x.safetensors", "q"]),
        ("--dtype", "f8", ["search", "x.safetensors", "q"]),
        ("--model", "./nope", ["search", "x.safetensors", "q"]),
    ],
)
def test_a_shared_option_refuses_a_bad_value_alike_everywhere(capsys, monkeypatch, option, value, reader):
    """search checks --device, --dtype and --model with the embed commands' own checks (it checked only --dtype)."""
    embed = _error_line(capsys, monkeypatch, ["images", "x.png", option, value])
    assert embed[0] == 2 and embed[1].startswith(f"error: Invalid value for '{option}'")
    assert _error_line(capsys, monkeypatch, [*reader, option, value]) == embed


def test_export_needs_to_and_says_so(capsys, monkeypatch):
    code, line = _error_line(capsys, monkeypatch, ["export", "x.safetensors"])
    assert code == 2 and line == "error: Missing option '--to'."


@pytest.mark.parametrize("command", ["search", "index", "inspect", "export", "models"])
def test_an_inspection_command_shows_its_own_help_for_a_shared_option(command):
    from typer.testing import CliRunner

    text = CliRunner().invoke(cli.app, [command, "--help"], env={"COLUMNS": "200"}).output
    for f, _, spec in declared_options(command):
        if command in dict(spec.help_by_command):
            assert spec.help_for(command) in " ".join(text.split()), (command, f.name)
