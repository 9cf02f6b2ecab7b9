"""Command line: parse arguments into a RunConfig, call the library, map its result to an exit code.

Every option comes from a `RunConfig` field (`config.py`): `_parameters(command)` turns the fields a command
takes into Typer parameters, so this file names no option but the PATHS argument and `inspect`'s own.
torch and transformers are imported only inside commands, so `gemma-embed --help` is instant.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from pathlib import Path
from typing import Annotated

import typer

from gemma_embed import __version__
from gemma_embed.config import ExportFormat, RunConfig, option_of
from gemma_embed.errors import GemmaEmbedError, UsageError

app = typer.Typer(
    name="gemma-embed",
    help="Turn piles of images, video and audio into Gemma encoder-tower embeddings (.safetensors).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class _Command(typer.core.TyperCommand):
    """Help as people read it: `Usage: gemma-embed images [OPTIONS] PATH...` (Typer writes `{PATH}...`), and no
    Python type next to the argument (`<list[str]>`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, typer.core.TyperArgument):
                param.display_type_rich = lambda ctx: None

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""  # a flag: no `<bool>` beside it
        return option

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.params:
            if isinstance(param, typer.core.TyperArgument):
                pieces.append(f"{param.metavar or param.name.upper()}{'...' if param.nargs != 1 else ''}")
        return pieces


PATHS = inspect.Parameter(
    "paths",
    inspect.Parameter.KEYWORD_ONLY,
    default=None,  # none with --dataset
    annotation=Annotated[
        list[str] | None,
        typer.Argument(
            help="Files, folders, .tar shards, .parquet or - (list on stdin).",
            show_default=False,
            metavar="PATH",
        ),
    ],
)
NO_INPUT = "give PATH... (files, folders, tar shards, parquet files, - for a list on stdin) or --dataset NAME"


def _callback(spec):
    """Typer callback: run the option's parser and check, turning their ValueError into a usage error."""

    def callback(value):
        try:
            parsed = spec.parse(value) if spec.parse else value
            if spec.check:
                spec.check(parsed)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        return value

    return callback


def _parameters(command: str) -> list[inspect.Parameter]:
    """PATHS plus one Typer option per RunConfig field that `command` takes, in the fields' order."""
    hints = typing.get_type_hints(RunConfig)
    parameters = [PATHS]
    for f in dataclasses.fields(RunConfig):
        spec = option_of(f)
        if spec is None or command not in spec.commands:
            continue
        long_name = spec.long or "--" + f.name.replace("_", "-")
        kind = spec.cli_type or hints[f.name]
        default = spec.cli_default if spec.cli_type else f.default
        declared = typer.Option(
            long_name,
            *spec.flags,
            help=spec.help,
            rich_help_panel=spec.panel,
            callback=_callback(spec) if (spec.check or spec.parse) else None,
            metavar="" if kind is bool else spec.metavar,  # a flag takes no value: no type column
            show_default=default is not None and default is not False,
        )
        parameters.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, declared]
            )
        )
    return parameters


def config_from(modality: str, options: dict) -> RunConfig:
    """The RunConfig for a command's parsed options (each option's parser applied)."""
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    values = {"modality": modality, "inputs": tuple(options.pop("paths") or ())}
    for name, value in options.items():
        spec = option_of(fields[name])
        values[name] = spec.parse(value) if spec.parse else value
    return RunConfig(**values)


def _print_error(message: str) -> None:
    try:
        print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass  # nobody reads stderr any more; the exit code still says it


def _fail(message: str, code: int) -> typer.Exit:
    _print_error(message)
    return typer.Exit(code)


def exit_code(result) -> int:
    """0: every item written; 1: some items failed; 128+signal: interrupted (resumable)."""
    if result.interrupted is not None:
        return 128 + result.signum
    return 1 if result.failed else 0


def _require_input(config: RunConfig) -> None:
    if not config.inputs and config.dataset is None:
        raise _fail(NO_INPUT, 2)


def _embed(config: RunConfig) -> None:
    from gemma_embed.hostmem import pin_mmap_threshold
    from gemma_embed.pipeline import run
    from gemma_embed.progress import Reporter

    _require_input(config)
    pin_mmap_threshold()  # keeps peak memory flat over long runs (see hostmem.py)
    reporter = Reporter(quiet=config.quiet, jsonl=config.jsonl, debug=config.debug)
    try:
        result = run(config, reporter)
    except UsageError as exc:
        raise _fail(str(exc), 2) from None
    except GemmaEmbedError as exc:
        raise _fail(str(exc), 1) from None
    raise typer.Exit(exit_code(result))


def _embed_command(modality: str, summary: str):
    def command(**options) -> None:
        _embed(config_from(modality, options))

    command.__signature__ = inspect.Signature(_parameters(modality))
    command.__doc__ = summary
    return command


app.command("images", cls=_Command)(
    _embed_command("images", "Embed images: one item per image, rows = its soft tokens.")
)
app.command("video", cls=_Command)(
    _embed_command("video", "Embed videos: one item per video, rows = sampled frames x soft tokens per frame.")
)
app.command("audio", cls=_Command)(
    _embed_command(
        "audio", "Embed audio: one item per file (decoded to mono at the model's rate), rows = its soft tokens."
    )
)


def plan(**options) -> None:
    """Dry run: device, free memory, buckets and chunk sizes; nothing is encoded."""
    from gemma_embed.pipeline import plan as make_plan
    from gemma_embed.progress import Reporter

    modality = options.pop("modality")
    config = config_from(modality, options)
    _require_input(config)
    try:
        make_plan(config, Reporter(quiet=config.quiet))
    except UsageError as exc:
        raise _fail(str(exc), 2) from None


plan.__signature__ = inspect.Signature(_parameters("plan"))
app.command("plan", cls=_Command)(plan)


@app.command("inspect", cls=_Command)
def inspect_output(
    path: Annotated[Path, typer.Argument(help="A gemma-embed output (.safetensors or .index.json).")],
    limit: Annotated[int, typer.Option(help="Items to list (0 = all).", metavar="N")] = 20,
    json_out: Annotated[
        bool, typer.Option("--json", help="The header, keys and items as one JSON object.", metavar="")
    ] = False,
) -> None:
    """Show an output file: model, metadata and a table of items with their shapes."""
    from gemma_embed.show import show

    try:
        show(path, limit=limit, as_json=json_out)
    except (OSError, ValueError) as exc:  # the reader's messages name the file
        raise _fail(str(exc), 2) from None


@app.command("export", cls=_Command)
def export_output(
    path: Annotated[Path, typer.Argument(help="A gemma-embed output (.safetensors or .index.json).")],
    to: Annotated[ExportFormat, typer.Option("--to", help="parquet or npy (+ .keys.txt).", metavar="FORMAT")],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Default: OUT.parquet / OUT.npy beside it.", metavar="FILE")
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace existing files.", metavar="")] = False,
) -> None:
    """Write an output as parquet (key, metadata columns, embedding) or .npy, streamed."""
    import json

    from gemma_embed.export import export

    try:
        written = export(path, to, output, overwrite)
    except UsageError as exc:
        raise _fail(str(exc), 2) from None
    except (OSError, ValueError) as exc:
        raise _fail(str(exc), 1) from None
    print(json.dumps({"type": "export", "to": str(to), **written}, ensure_ascii=True))


def _version(value: bool) -> None:
    if value:
        print(f"gemma-embed {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """gemma-embed: Gemma encoder-tower embeddings for large piles of media."""


def main() -> None:
    """The console script: usage errors are one `error:` line and exit 2, like every other error here."""
    try:  # Typer >= 0.24 carries its own copy of click
        from typer._click import exceptions
    except ImportError:
        from click import exceptions

    try:
        code = app(standalone_mode=False)
    except exceptions.NoArgsIsHelpError as exc:
        print(exc.ctx.get_help())
        code = 0
    except exceptions.UsageError as exc:
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        _print_error(f"{exc.format_message()}{where}")
        code = 2
    except typer.Abort:
        code = 130
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
