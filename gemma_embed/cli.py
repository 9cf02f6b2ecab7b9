"""Command line: parse arguments into a RunConfig (or an inspection command's values), call the library, map its
result or its fault to an exit code.

Every option comes from a field of `config.py`'s tables (RunConfig, InspectionOptions): `_parameters(command)`
turns the fields a command takes into Typer parameters, so this file names no option but `--list-extensions` and
`--version`, and the commands' positional arguments. Every fault goes through one map (`_exits`, `errors.kind_of`).
torch and transformers are imported only inside commands, so `gemma-embed --help` is instant. Files and folders
are taken as text and parsed as locations of the seam (gemma_embed/locations), never as `pathlib.Path`s, which
would collapse a protocol (`s3://` to `s3:/`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import signal
import sys
import typing
from collections.abc import Callable, Iterator
from typing import Annotated

import typer

from gemma_embed import __version__, errors
from gemma_embed.config import OPTION_TABLES, PANELS, Choice, RunConfig, declared_options, option_of
from gemma_embed.locations import location
from gemma_embed.locations.written import output_location
from gemma_embed.unused_packages import keep_out_unused_packages


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
    help="Turn piles of images, video, audio and text into Gemma embeddings (.safetensors): encoder-tower soft "
    "tokens, or retrieval vectors to search.",
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


def _callback(spec=None, choices: type[Choice] | None = None, command: str = ""):
    """Typer callback: the option's value parsed (once, here, as `command` reads it) and checked, a ValueError
    becoming a usage error. A fixed set of values (`choices`) is read here too, so a wrong one is one plain line
    naming the choices."""
    parse = spec.parse_for(command) if spec is not None else None

    def callback(value):
        try:
            if choices is not None and value is not None:
                value = _choose(choices, value)
            parsed = parse(value) if parse is not None and value is not None else value
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


def _choice_of(kind) -> type[Choice] | None:
    """The fixed set of values a type is (`Dtype`) or holds (`ExportFormat | None`), if any."""
    for k in (kind, *typing.get_args(kind)):
        if isinstance(k, type) and issubclass(k, Choice):
            return k
    return None


def _panel_order(panel: str) -> int:
    """A panel's place in the help: config.PANELS' order, a command's own panel (the server's) after them."""
    return PANELS.index(panel) if panel in PANELS else len(PANELS)


def _parameters(command: str, tables: tuple | None = None) -> list[inspect.Parameter]:
    """One Typer option per declared option `command` takes (RunConfig's and InspectionOptions' fields, or those of
    `tables`: the server's ServeConfig), in the help's panel order (config.PANELS; a panel of its own last), each
    panel in the fields' order."""
    parameters = []
    declared = declared_options(command, tables or OPTION_TABLES)
    for f, hint, spec in sorted(declared, key=lambda d: _panel_order(d[2].panel)):
        long_name = spec.long or "--" + f.name.replace("_", "-")
        kind = spec.cli_type or hint
        default = spec.cli_default if spec.cli_type else f.default
        default = (spec.command_defaults or {}).get(command, default)
        choices = _choice_of(kind)
        if choices is not None:  # parsed by the callback: Typer's own enum check words its error oddly
            kind, default = str, (None if default is None else str(default))
        declared = typer.Option(
            long_name,
            *spec.flags,
            help=spec.help_for(command),
            rich_help_panel=spec.panel,
            callback=_callback(spec, choices, command) if (spec.check or spec.parse_for(command) or choices) else None,
            metavar="" if kind is bool else spec.metavar,  # a flag takes no value: no type column
            show_default=default is not None and default is not False,
        )
        parameters.append(
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=inspect.Parameter.empty if spec.required else default,
                annotation=Annotated[kind, declared],
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


def _argument(name: str, annotation, help_text: str, default=inspect.Parameter.empty) -> inspect.Parameter:
    """A positional argument of an inspection command (INDEX, QUERY, PATH)."""
    declared = typer.Argument(help=help_text, show_default=False)
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[annotation, declared]
    )


def _command(name: str, summary: str, run: Callable[..., None], arguments=(), extra=()) -> None:
    """Register command `name`: its arguments, then its declared options (`_parameters`) and any `extra` ones;
    `run(**values)` does the work, and every fault it raises reaches the one map (`_exits`)."""

    def command(**values) -> None:
        with _exits():
            run(**values)

    command.__signature__ = inspect.Signature([*arguments, *_parameters(name), *extra])
    command.__doc__ = summary
    app.command(name, cls=_Command)(command)


def config_from(modality: str, options: dict) -> RunConfig:
    """The RunConfig for a command's options, as their callbacks parsed them."""
    values = {"modality": modality, "inputs": tuple(options.pop("paths") or ())}
    for name in [n for n in options if ALIAS in n]:  # an old option name given: it sets its field
        value = options.pop(name)
        if value is not None:
            options[name.split(ALIAS)[0]] = value
    return RunConfig(**values, **options)


# ------------------------------------------------------------------------------------------ faults


def _print_line(prefix: str, message: str) -> None:
    """One `error:` or `note:` line on stderr; a newline or escape sequence in the message (a name) is shown as
    an escape."""
    from gemma_embed.terminal import printable

    try:
        print(f"{prefix}: {printable(message.strip())}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass  # nobody reads stderr any more; the exit code still says it


def _print_error(message: str) -> None:
    _print_line("error", message)


def _print_note(message: str) -> None:
    """Where a command wrote its file, or that it was interrupted."""
    _print_line("note", message)


@contextlib.contextmanager
def _exits() -> Iterator[None]:
    """Every command's faults through the one map (`errors.kind_of`): one line on stderr (`error:`, or `note:`
    for a stop signal) and the kind's exit code. A fault of no kind the map knows is a bug: its traceback shows."""
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except BrokenPipeError:
        if not _reader_gone(sys.stdout):
            raise
        # `gemma-embed inspect OUT | head -1`: the reader took what it wanted; the command did its work (exit 0).
        from gemma_embed.progress import silence

        silence(sys.stdout)
        raise typer.Exit(errors.OK.code) from None
    except BaseException as exc:
        kind = errors.kind_of(exc)
        if kind is None:
            raise
        (_print_note if kind is errors.INTERRUPTED else _print_error)(errors.one_line(exc))
        raise typer.Exit(kind.exit_code(errors.signal_of(exc) if kind.adds_signal else None)) from None


def _reader_gone(stream) -> bool:
    """Whether `stream` is a pipe whose reader has closed it (a BrokenPipeError from elsewhere, a socket, is a
    fault like any other)."""
    import select

    try:
        poller = select.poll()
        poller.register(stream.fileno(), 0)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def exit_code(result) -> int:
    """A run's exit code: every item written, some failed, or interrupted (resumable)."""
    if result.interrupted is not None:
        return errors.INTERRUPTED.exit_code(result.signum)
    return errors.ITEMS_FAILED.code if result.failed else errors.OK.code


# ------------------------------------------------------------------------------------------ embed commands


def _require_input(config: RunConfig, plan: bool = False) -> None:
    """Some input, every path given exists and no file given is another command's: checked before torch is
    imported (a typo fails in well under a second, writing nothing)."""
    from gemma_embed.sources import check_given_paths

    if not config.inputs and config.dataset is None:
        raise errors.UsageError(NO_INPUT)
    check_given_paths(config.inputs, config.modality, config.ext, plan)


def _embed(config: RunConfig) -> None:
    from gemma_embed.distributed import writer_lock
    from gemma_embed.memory.allocator import configure_for_long_runs
    from gemma_embed.progress import Reporter

    _require_input(config)
    configure_for_long_runs()  # flat peak memory over long runs, CPU forwards without page faults (memory/allocator.py)
    reporter = Reporter(quiet=config.quiet, jsonl=config.jsonl, debug=config.debug)
    # The output's lock before the pipeline imports torch (seconds on a busy machine): a second run into a busy
    # output fails at once. `run` takes it again (re-entrant) for library callers. Importing the pipeline imports
    # no torch: its checks of the output and the inputs come at once, and then its `loading MODEL ...` line.
    with writer_lock(config.output, config.num_slices, config.slice_index):
        from gemma_embed.pipeline import run

        result = run(config, reporter, own_process=True)  # the command line owns its process: signals, fd 2
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


def _embed_command(modality: str, summary: str) -> None:
    def run(list_extensions: bool = False, **options) -> None:
        _embed(config_from(modality, options))

    _command(modality, summary, run, [_paths(modality)], [_list_extensions(modality)])


_embed_command("images", "Embed images: one item per image, rows = its soft tokens.")
_embed_command("video", "Embed videos: one item per video, rows = sampled frames x soft tokens per frame.")
_embed_command("text", "Embed text: one retrieval vector per line, or per file with --per-file.")
_embed_command("audio", "Embed audio: one item per file (decoded to mono at the model's rate), rows = its soft tokens.")


def _plan(modality: str, **options) -> None:
    from gemma_embed.progress import Reporter

    config = config_from(modality, options)
    _require_input(config, plan=True)
    reporter = Reporter(quiet=config.quiet)
    reporter.loading(config.model)
    from gemma_embed.pipeline import plan

    plan(config, reporter, own_process=True)


_command("plan", "Dry run: device, free memory, buckets and chunk sizes; nothing is encoded.", _plan, [_paths("plan")])


# ------------------------------------------------------------------------------------------ serve


def _serve(**options) -> None:
    import json

    from gemma_embed.config import ServeConfig
    from gemma_embed.memory.allocator import configure_for_long_runs
    from gemma_embed.serve import serve as run_server

    configure_for_long_runs()  # a server is the longest run: flat memory from request to request (memory/allocator.py)

    settings = ServeConfig(**{f.name: options.pop(f.name) for f in dataclasses.fields(ServeConfig)})
    code = run_server(
        settings,
        options,
        announce=lambda event: print(json.dumps(event, ensure_ascii=True), flush=True),
        log=None if options["quiet"] else _print_access_line,
    )
    raise typer.Exit(code)


def _print_access_line(line: str) -> None:
    from gemma_embed.terminal import printable

    try:
        print(printable(line), file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass


def serve(**options) -> None:
    """Serve a model over HTTP: OpenAI's /v1/embeddings (batched across requests), /v1/search over outputs, and a
    gallery page at /."""
    with _exits():
        _serve(**options)


serve.__signature__ = inspect.Signature(_parameters("serve"))
app.command("serve", cls=_Command)(serve)


# ------------------------------------------------------------------------------------------ reading outputs

OUTPUT_ARGUMENT = "A gemma-embed output (.safetensors or .index.json; DIR/: DIR/embeddings.safetensors)."


def _search(
    index: str, query: str | None, queries, image, video, audio, top, html, exact, overwrite, **embedding
) -> None:
    from gemma_embed.index import output_model
    from gemma_embed.locations.written import PAGE
    from gemma_embed.progress import Reporter

    reporter = Reporter(emit_json=False)
    output = output_location(index)
    if reporter.live:  # a terminal: say what loads before importing torch (the output's header: no torch)
        reporter.loading(embedding["model"] or output_model(output) or index)
    from gemma_embed.search import collect_queries, query_many, render_html_many, render_results
    from gemma_embed.store import check_destination

    jsonl = embedding.pop("jsonl")
    media = {
        kind: [location(f) for f in files]
        for kind, files in (("images", image), ("video", video), ("audio", audio))
        if files
    }
    page = check_destination(html, PAGE, overwrite) if html is not None else None  # before the model loads
    asked = location(queries) if queries is not None else None
    wanted = collect_queries([query] if query is not None else [], asked, media)
    if not wanted:
        raise errors.UsageError("give a query: a text, --queries FILE, or --image, --video, --audio")
    embedding["dtype"] = str(embedding["dtype"])
    results = query_many(output, wanted, top, exact=exact, **embedding)
    for result in results:
        if result.error is not None:
            _print_error(f"{result.query.describe()}: cannot embed the query: {result.error}")
    import shutil

    # Texts cut to the terminal's width ($COLUMNS, else the terminal's, else 80 columns): --jsonl has them whole.
    print(render_results(results, jsonl, width=shutil.get_terminal_size().columns), end="")
    if page is not None:
        from gemma_embed.store import atomic_write_text

        groups = [(r.query.describe(), r.hits) for r in results if r.error is None]
        atomic_write_text(page, render_html_many(groups, index=str(output)))
        _print_note(f"wrote {page}")
    if any(r.error is not None for r in results):
        raise typer.Exit(errors.ITEMS_FAILED.code)


_command(
    "search",
    "Search an output: embed the queries with the index's model and settings, cosine top-k (through the output's "
    "index when it has one, see `gemma-embed index`; else exact).",
    _search,
    [
        _argument("index", str, "An output to search (.safetensors or .index.json; DIR/: DIR/embeddings.safetensors)."),
        _argument("query", str | None, "Text to look for (retrieval indexes).", default=None),
    ],
)


def _index(path: str, kind: str, metric: str, quiet: bool) -> None:
    import json

    from gemma_embed.index import build_index
    from gemma_embed.progress import Reporter
    from gemma_embed.terminal import shows_summary

    output = output_location(path)
    record = build_index(output, kind, metric, Reporter(quiet=quiet))
    fields = ("kind", "requested", "metric", "settings", "recall_at_10", "reason", "seconds")
    summary = {"type": "index", "output": str(output), **{name: record[name] for name in fields if name in record}}
    if shows_summary(sys.stdout):
        print(json.dumps(summary, ensure_ascii=True))


_command(
    "index",
    "Build an approximate-search index beside an output (OUT.search-index, OUT.faiss), which search then uses.",
    _index,
    [_argument("path", str, OUTPUT_ARGUMENT)],
)


def _models(as_json: bool) -> None:
    import json

    from gemma_embed.models.registry import models_table, models_text

    print(json.dumps(models_table(), ensure_ascii=True) if as_json else models_text(), end="\n" if as_json else "")


_command("models", "The model families gemma-embed runs: model types, example hub ids, commands and spaces.", _models)


def _inspect(path: str, limit: int, as_json: bool) -> None:
    from gemma_embed.show import show

    show(output_location(path), limit=limit, as_json=as_json)


_command(
    "inspect",
    "Show an output file: model, metadata and a table of items with their shapes.",
    _inspect,
    [_argument("path", str, OUTPUT_ARGUMENT)],
)


def _export(path: str, to, output, overwrite: bool) -> None:
    import json

    from gemma_embed.export import export
    from gemma_embed.locations.written import is_stdout

    try:
        written = export(output_location(path), to, output, overwrite, stdout=sys.stdout.buffer, command_line=True)
    except BrokenPipeError:  # the reader of standard output went away (| head): not a failure of the export
        from gemma_embed.progress import silence

        silence(sys.stdout)
        return
    if is_stdout(output):  # stdout carries the export itself: the record of it stays off it
        _print_note(f"wrote {written['items']} items to standard output")
        return
    _print_note(f"wrote {', '.join(written['files'])}")
    print(json.dumps({"type": "export", "to": str(to), **written}, ensure_ascii=True))


_command(
    "export",
    "Write an output as parquet (key, metadata columns, embedding), .npy or JSON lines, streamed (- : stdout).",
    _export,
    [_argument("path", str, OUTPUT_ARGUMENT)],
)


# ------------------------------------------------------------------------------------------ acting on a collection


def _write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (| head): not a failure of the command
        from gemma_embed.progress import silence

        silence(sys.stdout)


def _collection_summary(summary: dict, quiet: bool, to_stderr: bool) -> None:
    """The closing record: on stdout, or as a note when stdout carries the drop list."""
    import json

    from gemma_embed.terminal import shows_summary

    if not quiet:
        _print_note(f"wrote {summary['table']}")
    if to_stderr:
        if not quiet:
            _print_note(f"{summary['groups']} groups, {summary['drop']} items to drop")
    elif shows_summary(quiet, sys.stdout):
        print(json.dumps(summary, ensure_ascii=True))


def _dedup(path: str, threshold, keep, method, output, drop_list, overwrite: bool, quiet: bool) -> None:
    from gemma_embed.collection.commands import run_dedup
    from gemma_embed.locations.written import is_stdout
    from gemma_embed.unused_packages import let_in_unused_packages

    let_in_unused_packages()
    summary = run_dedup(path, threshold, keep, method, output, drop_list, overwrite, _write_stdout)
    _collection_summary(summary, quiet, to_stderr=is_stdout(drop_list))


_command(
    "dedup",
    "Near-duplicate groups of an output: cosine >= --threshold, connected; same content always grouped. Writes "
    "OUT.duplicates.parquet (key, group, keep, similarity, path) and, with --drop-list, the keys to drop.",
    _dedup,
    [_argument("path", str, OUTPUT_ARGUMENT)],
)


def _map(path: str, seed: int, sample: int, output, overwrite: bool, quiet: bool) -> None:
    from gemma_embed.collection.commands import run_map
    from gemma_embed.unused_packages import let_in_unused_packages

    let_in_unused_packages()
    _collection_summary(run_map(path, seed, sample, output, overwrite), quiet, to_stderr=False)


_command(
    "map",
    "A 2D map of an output (UMAP, seeded) with clusters (HDBSCAN) named by their most central items. Writes "
    "OUT.map.parquet (key, x, y, cluster, cluster_name, path).",
    _map,
    [_argument("path", str, OUTPUT_ARGUMENT)],
)


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
    """gemma-embed: Gemma embeddings for large piles of images, video, audio and text."""


def optional_values(args: list[str]) -> list[str]:
    """An option whose value may be left out (`--ray [ADDRESS]`, `Option.flag_value`), given bare, is spelled
    `--ray=default` for the parser (Typer's click has no optional values). It is bare when nothing follows it or
    what follows is no value it takes (a path, another option): `gemma-embed images --ray photos/` works."""
    specs = {}
    for table in OPTION_TABLES:
        for f in dataclasses.fields(table):
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
    """The console script: a usage error the parser finds is one `error:` line and the map's usage code, like every
    other fault here (`_exits`)."""
    keep_out_unused_packages()
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
        code = errors.USAGE.code
    except typer.Abort:  # Ctrl-C while the parser reads (click turns KeyboardInterrupt into Abort)
        code = errors.INTERRUPTED.exit_code(signal.SIGINT)
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
