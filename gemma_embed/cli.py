"""Command line: parse arguments into a RunConfig and call the library. Nothing else happens here.

torch and transformers are imported only inside commands, so `gemma-embed --help` is instant.
"""

from __future__ import annotations

import inspect
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from gemma_embed import __version__
from gemma_embed.config import DEFAULT_MODEL, IMAGE_SOFT_TOKEN_BUDGETS, RunConfig
from gemma_embed.errors import GemmaEmbedError

app = typer.Typer(
    name="gemma-embed",
    help="Turn piles of images, video and audio into Gemma encoder-tower embeddings (.safetensors).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class Dtype(str, Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class OutputDtype(str, Enum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class Pool(str, Enum):
    none = "none"
    mean = "mean"


class VideoPool(str, Enum):
    none = "none"
    mean = "mean"
    frame = "frame"


class Space(str, Enum):
    language = "language"
    tower = "tower"


class OnError(str, Enum):
    skip = "skip"
    stop = "stop"


class Modality(str, Enum):
    images = "images"
    audio = "audio"
    video = "video"


def _param(name: str, annotation, default=inspect.Parameter.empty) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _batch_size(value: str) -> str:
    if value != "auto" and not (value.isdigit() and int(value) > 0):
        raise typer.BadParameter("use 'auto' or a positive integer")
    return value


def _soft_tokens(value: int | None) -> int | None:
    if value is not None and value not in IMAGE_SOFT_TOKEN_BUDGETS:
        raise typer.BadParameter(f"must be one of {', '.join(map(str, IMAGE_SOFT_TOKEN_BUDGETS))}")
    return value


def _positive(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter("must be a positive number")
    return value


PATHS = _param(
    "paths",
    Annotated[
        list[str],
        typer.Argument(
            help="Files, folders (searched recursively) or - to read a list of paths from stdin.", show_default=False
        ),
    ],
)
MODEL_OPTIONS = [
    _param("model", Annotated[str, typer.Option(help="Hub id or local checkpoint folder.")], DEFAULT_MODEL),
    _param("revision", Annotated[str | None, typer.Option(help="Hub revision (branch, tag or commit).")], None),
    _param("device", Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.")], "auto"),
    _param(
        "dtype", Annotated[Dtype, typer.Option(help="Compute dtype; auto is bf16 on CUDA, else float32.")], Dtype.auto
    ),
    _param(
        "space",
        Annotated[
            Space, typer.Option(help="language: after the embed_* projection (soft tokens); tower: the encoder output.")
        ],
        Space.language,
    ),
    _param(
        "batch_size",
        Annotated[
            str, typer.Option(help="Cap on units per device batch; auto plans from free memory.", callback=_batch_size)
        ],
        "auto",
    ),
    _param(
        "memory_budget",
        Annotated[
            str | None,
            typer.Option(help="Bytes (2GiB) or a fraction of free memory (0.3); default min(free/2, total/10)."),
        ],
        None,
    ),
    _param("workers", Annotated[int, typer.Option(min=1, help="Decode and preprocessing threads.")], 2),
    _param("null", Annotated[bool, typer.Option("-0", "--null", help="Paths on stdin are NUL-separated.")], False),
    _param("quiet", Annotated[bool, typer.Option("-q", "--quiet", help="Nothing on stderr.")], False),
    _param(
        "max_soft_tokens",
        Annotated[
            int | None,
            typer.Option(
                help="Soft tokens per image or video frame (70, 140, 280, 560 or 1120); default: the checkpoint "
                "processor's (Gemma 4: 280 per image, 70 per frame).",
                callback=_soft_tokens,
            ),
        ],
        None,
    ),
]
OUTPUT_OPTIONS = [
    _param(
        "output",
        Annotated[Path, typer.Option("-o", "--output", help="Output .safetensors file.")],
        Path("embeddings.safetensors"),
    ),
    _param(
        "overwrite",
        Annotated[bool, typer.Option(help="Replace an existing output (and discard an unfinished run's parts).")],
        False,
    ),
    _param(
        "resume",
        Annotated[
            bool,
            typer.Option(
                help="Finish an interrupted run (or add to an existing output): items already saved with the same "
                "content hash are skipped."
            ),
        ],
        False,
    ),
    _param(
        "flush_every",
        Annotated[
            int,
            typer.Option(
                min=1, help="Save finished items to part files at least every this many items (and every 60 s)."
            ),
        ],
        500,
    ),
    _param(
        "shard_size",
        Annotated[
            int | None,
            typer.Option(min=1, help="Write OUT-00000.safetensors... of this many items each, plus OUT.index.json."),
        ],
        None,
    ),
    _param(
        "num_shards",
        Annotated[
            int | None,
            typer.Option(
                min=1, help="Split the input over this many processes (e.g. a SLURM array); with --shard-index."
            ),
        ],
        None,
    ),
    _param(
        "shard_index",
        Annotated[
            int | None,
            typer.Option(min=0, help="This process's slice, 0 <= I < --num-shards (torchrun sets it from RANK)."),
        ],
        None,
    ),
    _param("debug", Annotated[bool, typer.Option(help="Show tracebacks of failed items.")], False),
    _param("output_dtype", Annotated[OutputDtype, typer.Option(help="dtype of the stored rows.")], OutputDtype.float32),
    _param("pool", Annotated[Pool, typer.Option(help="none: every row; mean: one row per item.")], Pool.none),
    _param(
        "on_error",
        Annotated[OnError, typer.Option(help="skip: report a bad item and go on; stop: end the run at the first one.")],
        OnError.skip,
    ),
    _param("jsonl", Annotated[bool, typer.Option(help="One JSON record per item on stdout.")], False),
]


# Video: frame sampling (the checkpoint processor's policy unless overridden) and per-frame pooling.
VIDEO_SAMPLING_OPTIONS = [
    _param(
        "fps",
        Annotated[
            float | None,
            typer.Option(
                callback=_positive,
                show_default=False,
                help="Sample this many frames per second of video (by timestamps), at most --max-frames. "
                "Default: the processor's policy (Gemma 4: 32 frames evenly spaced).",
            ),
        ],
        None,
    ),
    _param(
        "max_frames",
        Annotated[
            int | None,
            typer.Option(
                min=1,
                show_default=False,
                help="Frames per video: the count sampled evenly, or the cap with --fps (default: the processor's, "
                "32). Shorter clips give all their frames.",
            ),
        ],
        None,
    ),
]
VIDEO_OPTIONS = [
    *VIDEO_SAMPLING_OPTIONS,
    _param(
        "pool",
        Annotated[
            VideoPool,
            typer.Option(
                help="none: every row; mean: one row per video; frame: one row per frame (mean of its tokens)."
            ),
        ],
        VideoPool.none,
    ),
]

COMMON_NAMES = {p.name for p in [PATHS, *MODEL_OPTIONS, *OUTPUT_OPTIONS]} | {"jsonl", "quiet"}


def _config(modality: str, opts: dict) -> RunConfig:
    value = lambda v: v.value if isinstance(v, Enum) else v  # noqa: E731
    opts = {k: value(v) for k, v in opts.items()}
    return RunConfig(
        modality=modality,
        inputs=tuple(opts["paths"]),
        output=opts.get("output", Path("embeddings.safetensors")),
        model=opts["model"],
        revision=opts["revision"],
        device=opts["device"],
        dtype=opts["dtype"],
        output_dtype=opts.get("output_dtype", "float32"),
        pool=opts.get("pool", "none"),
        space=opts["space"],
        batch_size=None if opts["batch_size"] == "auto" else int(opts["batch_size"]),
        memory_budget=opts["memory_budget"],
        workers=opts["workers"],
        overwrite=opts.get("overwrite", False),
        resume=opts.get("resume", False),
        flush_every=opts.get("flush_every", 500),
        shard_size=opts.get("shard_size"),
        num_shards=opts.get("num_shards"),
        shard_index=opts.get("shard_index"),
        debug=opts.get("debug", False),
        on_error=opts.get("on_error", "skip"),
        null_separated=opts["null"],
        max_soft_tokens=opts["max_soft_tokens"],
        # Options of one modality alone (video's --fps, audio's --window-s, ...) travel as `extra`.
        extra={k: v for k, v in opts.items() if k not in COMMON_NAMES},
    )


def _fail(message: str, code: int) -> typer.Exit:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return typer.Exit(code)


def _embed(modality: str, opts: dict) -> None:
    from gemma_embed.errors import UsageError
    from gemma_embed.hostmem import pin_mmap_threshold
    from gemma_embed.pipeline import run
    from gemma_embed.progress import Reporter

    pin_mmap_threshold()  # keeps peak memory flat over long runs (see hostmem.py)
    reporter = Reporter(quiet=opts["quiet"], jsonl=opts["jsonl"], debug=opts["debug"])
    try:
        code = run(_config(modality, opts), reporter)
    except UsageError as exc:
        raise _fail(str(exc), 2) from None
    except GemmaEmbedError as exc:
        raise _fail(str(exc), 1) from None
    raise typer.Exit(code)


def _command(modality: str, summary: str, extra_options: list[inspect.Parameter] = ()):
    """One embedding command: the shared options plus those of its modality."""

    def command(**opts) -> None:
        _embed(modality, opts)

    # A modality's option replaces a shared one of the same name (video's --pool adds "frame").
    options = {p.name: p for p in [PATHS, *OUTPUT_OPTIONS, *MODEL_OPTIONS, *extra_options]}
    command.__signature__ = inspect.Signature(list(options.values()))
    command.__doc__ = summary
    return command


AUDIO_OPTIONS = [
    _param(
        "window_s",
        Annotated[
            float,
            typer.Option(
                "--window-s",
                min=0.1,
                max=30.0,
                help="Audio: split longer clips into windows of at most this many seconds (the feature extractor "
                "truncates at 30 s); every window is encoded and its rows concatenated.",
            ),
        ],
        30.0,
    ),
]

app.command("images")(_command("images", "Embed images: one item per image, rows = its soft tokens."))
app.command("audio")(
    _command(
        "audio",
        "Embed audio: one item per file (decoded to mono at the model's rate), rows = its soft tokens.",
        AUDIO_OPTIONS,
    )
)
app.command("video")(
    _command("video", "Embed videos: one item per video, rows = sampled frames x soft tokens per frame.", VIDEO_OPTIONS)
)


def plan(**opts) -> None:
    """Dry run: device, free memory, buckets and chunk sizes; nothing is encoded."""
    from gemma_embed.errors import UsageError
    from gemma_embed.pipeline import plan as make_plan
    from gemma_embed.progress import Reporter

    modality = opts.pop("modality").value
    try:
        make_plan(_config(modality, opts), Reporter(quiet=opts["quiet"]))
    except UsageError as exc:
        raise _fail(str(exc), 2) from None


plan.__signature__ = inspect.Signature(
    [
        PATHS,
        _param("modality", Annotated[Modality, typer.Option(help="What the paths hold.")], Modality.images),
        *MODEL_OPTIONS,
        *AUDIO_OPTIONS,
        *VIDEO_SAMPLING_OPTIONS,
    ]
)
app.command("plan")(plan)


@app.command("inspect")
def inspect_output(
    path: Annotated[Path, typer.Argument(help="A gemma-embed output (.safetensors or .index.json).")],
    limit: Annotated[int, typer.Option(help="Items to list (0 = all).")] = 20,
    json_out: Annotated[bool, typer.Option("--json", help="Print the metadata as JSON on stdout.")] = False,
) -> None:
    """Show an output file: model, metadata and a table of items with their shapes."""
    from gemma_embed.show import show

    try:
        show(path, limit=limit, as_json=json_out)
    except (OSError, ValueError) as exc:
        raise _fail(f"{path}: {exc}", 2) from None


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
    app()


if __name__ == "__main__":
    main()
