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
from gemma_embed.config import Choice, Dtype, ExportFormat, RunConfig, option_of
from gemma_embed.errors import GemmaEmbedError, UsageError
from gemma_embed.serve.settings import ServeConfig


class _Group(typer.core.TyperGroup):
    """The top-level help: flags without a `<bool>` beside them."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


app = typer.Typer(
    name="gemma-embed",
    cls=_Group,
    help="Turn piles of images, video and audio into Gemma encoder-tower embeddings (.safetensors).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


ALIAS = "__alias"  # parameter-name marker of a hidden old option name


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
                name = f"{param.metavar or param.name.upper()}{'...' if param.nargs != 1 else ''}"
                pieces.append(name if param.required else f"[{name}]")
        return pieces


PATHS_HELP = {
    "text": "Text files (an item per line), folders (.txt .text .md), - (lines on stdin), .parquet or .jsonl.",
}
NO_INPUT = "give PATH... (files, folders, tar shards, parquet files, - for a list on stdin) or --dataset NAME"


def _paths(command: str) -> inspect.Parameter:
    """The PATH argument: optional, since --dataset can be the input instead."""
    help_text = PATHS_HELP.get(command, "Files, folders, .tar shards, .parquet, .jsonl or - (list on stdin).")
    argument = typer.Argument(help=help_text, show_default=False, metavar="PATH")
    return inspect.Parameter(
        "paths", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[list[str] | None, argument]
    )


def _callback(spec=None, choices: type[Choice] | None = None):
    """Typer callback: the option's value parsed (once, here) and checked, a ValueError becoming a usage error.
    A fixed set of values (`choices`) is read here too, so a wrong one is one plain line naming the choices."""

    def callback(value):
        try:
            if choices is not None and value is not None:
                value = _choose(choices, value)
            parsed = spec.parse(value) if spec is not None and spec.parse else value
            if spec is not None and spec.check:
                spec.check(parsed)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        return parsed

    return callback


def _choose(choices: type[Choice], value) -> Choice:
    try:
        return choices(value)
    except ValueError:
        names = [str(c) for c in choices]
        raise ValueError(f"{value!r}: choose {', '.join(names[:-1])} or {names[-1]}") from None


def _is_choice(kind) -> bool:
    return isinstance(kind, type) and issubclass(kind, Choice)


def _parameters(command: str, options=RunConfig) -> list[inspect.Parameter]:
    """PATH plus one Typer option per RunConfig field that `command` takes, in the fields' order (another dataclass
    of options, `options`: its fields alone)."""
    hints = typing.get_type_hints(options)
    parameters = [_paths(command)] if options is RunConfig else []
    for f in dataclasses.fields(options):
        spec = option_of(f)
        if spec is None or command not in spec.commands:
            continue
        long_name = spec.long or "--" + f.name.replace("_", "-")
        kind = spec.cli_type or hints[f.name]
        default = spec.cli_default if spec.cli_type else f.default
        default = (spec.command_defaults or {}).get(command, default)
        choices = kind if _is_choice(kind) else None
        if choices is not None:  # parsed by the callback: Typer's own enum check words its error oddly
            kind, default = str, str(default)
        declared = typer.Option(
            long_name,
            *spec.flags,
            help=spec.help_for(command),
            rich_help_panel=spec.panel,
            callback=_callback(spec, choices) if (spec.check or spec.parse or choices) else None,
            metavar="" if kind is bool else spec.metavar,  # a flag takes no value: no type column
            show_default=default is not None and default is not False,
        )
        parameters.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, declared]
            )
        )
        for n, alias in enumerate(spec.aliases):  # an old name: still parsed, not shown in --help
            hidden = typer.Option(alias, hidden=True, callback=declared.callback)
            parameters.append(
                inspect.Parameter(
                    f"{f.name}{ALIAS}{n}",
                    inspect.Parameter.KEYWORD_ONLY,
                    default=None,
                    annotation=Annotated[kind | None, hidden],
                )
            )
    return parameters


def config_from(modality: str, options: dict) -> RunConfig:
    """The RunConfig for a command's options, as their callbacks parsed them."""
    values = {"modality": modality, "inputs": tuple(options.pop("paths") or ())}
    for name in [n for n in options if ALIAS in n]:  # an old option name given: it sets its field
        value = options.pop(name)
        if value is not None:
            options[name.split(ALIAS)[0]] = value
    return RunConfig(**values, **options)


def _print_error(message: str) -> None:
    """One `error:` line on stderr; a newline or escape sequence in the message (a name) is shown as an escape."""
    from gemma_embed.terminal import printable

    try:
        print(f"error: {printable(message.strip())}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass  # nobody reads stderr any more; the exit code still says it


def _print_note(message: str) -> None:
    """One `note:` line on stderr (where a command wrote its file), its names escaped as in every line."""
    from gemma_embed.terminal import printable

    try:
        print(f"note: {printable(message.strip())}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass


def _fail(message: str, code: int) -> typer.Exit:
    _print_error(message)
    return typer.Exit(code)


def exit_code(result) -> int:
    """0: every item written; 1: some items failed; 128+signal: interrupted (resumable)."""
    if result.interrupted is not None:
        return 128 + result.signum
    return 1 if result.failed else 0


def _require_input(config: RunConfig) -> None:
    """Some input, and every path given exists: checked before torch is imported (a typo fails in well under a
    second, writing nothing)."""
    from gemma_embed.sources import check_given_paths

    if not config.inputs and config.dataset is None:
        raise _fail(NO_INPUT, 2)
    try:
        check_given_paths(config.inputs)
    except UsageError as exc:
        raise _fail(str(exc), 2) from None


def _embed(config: RunConfig) -> None:
    from gemma_embed.distributed import writer_lock
    from gemma_embed.hostmem import configure_for_long_runs
    from gemma_embed.progress import Reporter

    _require_input(config)
    configure_for_long_runs()  # flat peak memory over long runs, CPU forwards without page faults (hostmem.py)
    reporter = Reporter(quiet=config.quiet, jsonl=config.jsonl, debug=config.debug)
    try:
        # The output's lock before the pipeline imports torch (seconds on a busy machine): a second run into a
        # busy output fails at once. `run` takes it again (re-entrant) for library callers.
        with writer_lock(config.output, config.num_slices, config.slice_index):
            from gemma_embed.pipeline import run

            result = run(config, reporter, own_process=True)  # the command line owns its process: signals, fd 2
    except UsageError as exc:
        raise _fail(str(exc), 2) from None
    except GemmaEmbedError as exc:
        raise _fail(str(exc), 1) from None
    raise typer.Exit(exit_code(result))


def _list_extensions(modality: str) -> inspect.Parameter:
    """`--list-extensions`: the extensions a folder walk takes for this command on this machine (what its decoders
    register here), printed, and nothing run."""

    def callback(value: bool) -> None:
        if value:
            from gemma_embed.sources.files import extensions

            print(" ".join(sorted(e.removeprefix(".") for e in extensions(modality))))
            raise typer.Exit()

    declared = typer.Option(
        "--list-extensions",
        help="Print the walked extensions, and exit.",
        rich_help_panel="Input",
        is_eager=True,
        callback=callback,
        metavar="",
    )
    return inspect.Parameter(
        "list_extensions", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, declared]
    )


def _embed_command(modality: str, summary: str):
    def command(**options) -> None:
        options.pop("list_extensions", None)
        _embed(config_from(modality, options))

    command.__signature__ = inspect.Signature([*_parameters(modality), _list_extensions(modality)])
    command.__doc__ = summary
    return command


app.command("images", cls=_Command)(
    _embed_command("images", "Embed images: one item per image, rows = its soft tokens.")
)
app.command("video", cls=_Command)(
    _embed_command("video", "Embed videos: one item per video, rows = sampled frames x soft tokens per frame.")
)
app.command("text", cls=_Command)(
    _embed_command("text", "Embed text (EmbeddingGemma 2): one retrieval vector per line, or per file with --per-file.")
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
        make_plan(config, Reporter(quiet=config.quiet), own_process=True)
    except UsageError as exc:
        raise _fail(str(exc), 2) from None


plan.__signature__ = inspect.Signature(_parameters("plan"))
app.command("plan", cls=_Command)(plan)


# The run options a server takes (their RunConfig declarations, as `images` shows them), before its own (ServeConfig).
SERVE_RUN_OPTIONS = (
    "model", "revision", "device", "dtype", "prompt_name", "prompt", "dim", "max_soft_tokens", "max_item_bytes",
    "batch_size", "memory_budget", "cpu_threads", "workers", "quiet",
)  # fmt: skip


def serve(**options) -> None:
    """Serve a model over HTTP: OpenAI's /v1/embeddings (batched across requests), /v1/search over outputs, and a
    gallery page at /."""
    import json

    from gemma_embed.serve import serve as run_server

    settings = ServeConfig(**{f.name: options.pop(f.name) for f in dataclasses.fields(ServeConfig)})
    quiet = options["quiet"]
    try:
        code = run_server(
            settings,
            options,
            announce=lambda event: print(json.dumps(event, ensure_ascii=True), flush=True),
            log=None if quiet else _print_line,
        )
    except UsageError as exc:
        raise _fail(str(exc), 2) from None
    except GemmaEmbedError as exc:
        raise _fail(str(exc), 1) from None
    raise typer.Exit(code)


def _print_line(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass


def _serve_parameters() -> list[inspect.Parameter]:
    shared = {p.name: p for p in _parameters("images") + _parameters("text")}
    run_options = [shared[name] for name in SERVE_RUN_OPTIONS]
    run_options[0] = run_options[0].replace(default=None)  # the model: --model, else the first --output's
    return [*run_options, *_parameters("serve", ServeConfig)]


serve.__signature__ = inspect.Signature(_serve_parameters())
app.command("serve", cls=_Command)(serve)


def _at_least_one(value: int) -> int:
    if value < 1:
        raise typer.BadParameter(f"must be at least 1, got {value}")
    return value


@app.command("search", cls=_Command)
def search_index(
    index: Annotated[Path, typer.Argument(help="An output to search (.safetensors or .index.json).")],
    query: Annotated[str | None, typer.Argument(help="Text to look for (EmbeddingGemma 2 indexes).")] = None,
    queries: Annotated[
        Path | None, typer.Option("--queries", help="Many texts, one a line (- for stdin).", metavar="FILE")
    ] = None,
    image: Annotated[
        list[Path] | None, typer.Option(help="Look for this image (repeat, or a folder).", metavar="FILE")
    ] = None,
    video: Annotated[
        list[Path] | None, typer.Option(help="Look for this video (repeat, or a folder).", metavar="FILE")
    ] = None,
    audio: Annotated[
        list[Path] | None, typer.Option(help="Look for this audio file (repeat, or a folder).", metavar="FILE")
    ] = None,
    top: Annotated[
        int, typer.Option("-k", "--top", help="Hits to show (at least 1).", metavar="K", callback=_at_least_one)
    ] = 10,
    exact: Annotated[
        bool, typer.Option("--exact", help="Exact search even where the output has an index.", metavar="")
    ] = False,
    jsonl: Annotated[bool, typer.Option("--jsonl", help="One JSON record per hit.", metavar="")] = False,
    html_file: Annotated[
        Path | None, typer.Option("--html", help="Also write a page with thumbnails and players.", metavar="FILE")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Default: the index's model (another is refused).", metavar="ID|DIR")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.", metavar="DEV")] = "auto",
    dtype: Annotated[
        str, typer.Option(help="As for the embedding commands.", metavar="DTYPE", callback=_callback(choices=Dtype))
    ] = "auto",
    prompt_name: Annotated[
        str | None,
        typer.Option(
            help="The query's prompt (default: the checkpoint's query; document: find an indexed item itself).",
            metavar="NAME",
        ),
    ] = None,
    prompt: Annotated[str | None, typer.Option(help="This prompt text instead.", metavar="TEXT")] = None,
) -> None:
    """Search an output: embed the queries with the index's model and settings, cosine top-k (through the
    output's index when it has one, see `gemma-embed index`; else exact)."""
    from gemma_embed.search import collect_queries, query_many, render_html_many, render_results
    from gemma_embed.store import check_output_folder

    media = {kind: files for kind, files in (("images", image), ("video", video), ("audio", audio)) if files}
    try:
        if html_file is not None:
            check_output_folder(html_file)  # before the model loads
        wanted = collect_queries([query] if query is not None else [], queries, media)
        if not wanted:
            raise _fail("give a query: a text, --queries FILE, or --image, --video, --audio", 2)
        results = query_many(index, wanted, top, model, device, str(dtype), prompt_name, prompt, exact)
    except UsageError as exc:
        raise _fail(str(exc), 2) from None
    except GemmaEmbedError as exc:
        raise _fail(str(exc), 1) from None
    except (OSError, ValueError) as exc:  # the reader's messages name the file
        raise _fail(str(exc), 2) from None
    for result in results:
        if result.error is not None:
            _print_error(f"{result.query.describe()}: cannot embed the query: {result.error}")
    print(render_results(results, jsonl), end="")
    if html_file is not None:
        from gemma_embed.store import atomic_write_text

        groups = [(r.query.describe(), r.hits) for r in results if r.error is None]
        atomic_write_text(html_file, render_html_many(groups, index=str(index)))
        _print_note(f"wrote {html_file}")
    if any(r.error is not None for r in results):
        raise typer.Exit(1)


@app.command("index", cls=_Command)
def index_output(
    path: Annotated[Path, typer.Argument(help="A gemma-embed output (.safetensors or .index.json).")],
    kind: Annotated[
        str, typer.Option("--kind", help="auto, flat, ivf or hnsw (auto: flat below 100k rows).", metavar="KIND")
    ] = "auto",
    metric: Annotated[str, typer.Option("--metric", help="The similarity (cosine).", metavar="METRIC")] = "cosine",
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No progress notes.", metavar="")] = False,
) -> None:
    """Build an approximate-search index beside an output (OUT.search-index, OUT.faiss), which search then uses."""
    import json

    from gemma_embed.index import build_index
    from gemma_embed.progress import Reporter

    try:
        record = build_index(path, kind, metric, Reporter(quiet=quiet))
    except UsageError as exc:
        raise _fail(str(exc), 2) from None
    except (OSError, ValueError) as exc:
        raise _fail(str(exc), 1) from None
    fields = ("kind", "requested", "metric", "settings", "recall_at_10", "reason", "seconds")
    summary = {"type": "index", "output": str(path), **{name: record[name] for name in fields if name in record}}
    print(json.dumps(summary, ensure_ascii=True))


@app.command("models", cls=_Command)
def list_models(
    json_out: Annotated[bool, typer.Option("--json", help="The table as one JSON list.", metavar="")] = False,
) -> None:
    """The model families gemma-embed runs: model types, example hub ids, commands and spaces."""
    import json

    from gemma_embed.models.registry import models_table, models_text

    print(json.dumps(models_table(), ensure_ascii=True) if json_out else models_text(), end="\n" if json_out else "")


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
    to: Annotated[
        str,
        typer.Option(
            "--to", help="parquet or npy (+ .keys.txt).", metavar="FORMAT", callback=_callback(choices=ExportFormat)
        ),
    ],
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
    _print_note(f"wrote {', '.join(written['files'])}")
    print(json.dumps({"type": "export", "to": str(to), **written}, ensure_ascii=True))


def _version(value: bool) -> None:
    if value:
        print(f"gemma-embed {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.", metavar="")
    ] = False,
) -> None:
    """gemma-embed: Gemma encoder-tower embeddings for large piles of media."""


def optional_values(args: list[str]) -> list[str]:
    """An option whose value may be left out (`--ray [ADDRESS]`, `Option.flag_value`), given bare, is spelled
    `--ray=default` for the parser (Typer's click has no optional values). It is bare when nothing follows it or
    what follows is no value it takes (a path, another option): `gemma-embed images --ray photos/` works."""
    specs = {}
    for f in dataclasses.fields(RunConfig):
        spec = option_of(f)
        if spec is not None and spec.flag_value is not None:
            specs[spec.long or "--" + f.name.replace("_", "-")] = spec
    out = list(args)
    for i, arg in enumerate(out):
        if arg == "--":
            break
        spec = specs.get(arg)
        if spec is None:
            continue
        following = out[i + 1] if i + 1 < len(out) else None
        if following is None or following.startswith("-") or not _takes(spec, following):
            out[i] = f"{arg}={spec.flag_value}"
    return out


def _takes(spec, value: str) -> bool:
    try:
        if spec.check is not None:
            spec.check(value)
    except ValueError:
        return False
    return True


def main() -> None:
    """The console script: usage errors are one `error:` line and exit 2, like every other error here."""
    try:  # Typer >= 0.24 carries its own copy of click
        from typer._click import exceptions
    except ImportError:
        from click import exceptions

    try:
        code = app(args=optional_values(sys.argv[1:]), standalone_mode=False)
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
