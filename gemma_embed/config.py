"""Every option of every command, defined once: type, default, help text, command-line names, help panel,
the commands that take it, and the check its value must pass.

`RunConfig` is what the library reads. `cli.py` builds each command's parameters from these fields, so a new
option is one field here plus the code that uses it. Enums and defaults live here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from gemma_embed.memory import parse_budget
from gemma_embed.sources import parse_extensions

DEFAULT_MODEL = "google/gemma-4-e2b-it"
IMAGE_SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)
# The audio feature extractors' own `max_length` (480 000 samples at 16 kHz): anything longer is cut silently.
MAX_WINDOW_S = 30.0


class Choice(str, Enum):
    """A fixed set of string values that compares equal to, and prints as, its value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Modality(Choice):
    images = "images"
    video = "video"
    audio = "audio"


class Dtype(Choice):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class OutputDtype(Choice):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class Pool(Choice):
    none = "none"
    mean = "mean"
    frame = "frame"  # video only: one row per sampled frame


class Space(Choice):
    language = "language"
    tower = "tower"


class OnError(Choice):
    skip = "skip"
    stop = "stop"


# ------------------------------------------------------------------------------------------ option specs

EMBED = ("images", "video", "audio")  # the commands that embed and write an output
PLAN = ("plan",)

# Help panels, in the order `--help` shows them.
INPUT, MODEL, OUTPUT, PERFORMANCE, ROBUSTNESS = "Input", "Model", "Output", "Performance", "Robustness"


@dataclass(frozen=True)
class Option:
    """How one RunConfig field appears on the command line."""

    help: str
    commands: tuple[str, ...] = EMBED
    panel: str = INPUT
    flags: tuple[str, ...] = ()  # extra names, e.g. "-o"
    long: str | None = None  # the long name when it is not the field's name with dashes
    check: Callable[[Any], None] | None = None  # raises ValueError with a short reason
    # When the command line spells the value differently (--batch-size auto|N): its type, default and parser.
    cli_type: type | None = None
    cli_default: Any = None
    parse: Callable[[Any], Any] | None = None
    metavar: str | None = None


def option(default: Any, help: str, **spec: Any) -> Any:
    return field(default=default, metadata={"option": Option(help=help, **spec)})


def option_of(f: dataclasses.Field) -> Option | None:
    return f.metadata.get("option")


# --------------------------------------------------------------------------------------------- checks


def at_least(low: float) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value is not None and not value >= low:
            raise ValueError(f"must be at least {low:g}, got {value}")

    return check


def positive(value: Any) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"must be a positive number, got {value}")


def soft_token_budget(value: int | None) -> None:
    if value is not None and value not in IMAGE_SOFT_TOKEN_BUDGETS:
        raise ValueError(f"must be one of {', '.join(map(str, IMAGE_SOFT_TOKEN_BUDGETS))}, got {value}")


def audio_window(value: float) -> None:
    if not 0 < float(value) <= MAX_WINDOW_S:
        raise ValueError(
            f"must be above 0 and at most {MAX_WINDOW_S:g} s (the feature extractor silently truncates "
            f"anything longer), got {value:g}"
        )


def parse_batch_size(text: str | int | None) -> int | None:
    if text is None or text == "auto":
        return None
    if isinstance(text, int) or (isinstance(text, str) and text.isdigit()):
        if int(text) > 0:
            return int(text)
    raise ValueError(f"use 'auto' or a positive integer, got {text!r}")


# ------------------------------------------------------------------------------------------ the config


@dataclass(frozen=True)
class RunConfig:
    """One run of `gemma-embed`, as the command line or a Python caller describes it.

    Enum-valued fields accept their plain string values too (`pool="mean"`); `check()` validates every field
    with the same rules the command line applies.
    """

    # Input -----------------------------------------------------------------------------------------------
    modality: Modality = option(Modality.images, "What the paths hold.", commands=PLAN)
    inputs: tuple[str, ...] = ()  # files, folders or "-": the commands' PATHS argument
    ext: tuple[str, ...] | None = option(
        None,
        "Walk folders for these extensions only, e.g. jpg,png (default: every extension the modality's "
        "decoders read here; the README lists them). Files named explicitly are always taken.",
        commands=EMBED + PLAN,
        cli_type=str,
        parse=parse_extensions,
        metavar="EXT,...",
    )
    null_separated: bool = option(
        False, "Paths on stdin are NUL-separated (find -print0).", commands=EMBED + PLAN, long="--null", flags=("-0",)
    )
    max_soft_tokens: int | None = option(
        None,
        "Soft tokens per image or video frame: 70, 140, 280, 560 or 1120 (default: the checkpoint "
        "processor's; Gemma 4: 280 per image, 70 per frame).",
        commands=("images", "video", "plan"),
        check=soft_token_budget,
    )
    fps: float | None = option(
        None,
        "Sample this many frames per second of video, at most --max-frames (default: the processor's "
        "policy, 32 evenly spaced frames).",
        commands=("video", "plan"),
        check=positive,
    )
    max_frames: int | None = option(
        None,
        "Frames per video: the count sampled evenly, or the cap with --fps (default 32). Shorter clips "
        "give all their frames.",
        commands=("video", "plan"),
        check=at_least(1),
    )
    window_s: float = option(
        MAX_WINDOW_S,
        "Split longer audio into windows of at most this many seconds (the extractor cuts at 30 s); "
        "every window is encoded and the rows concatenated.",
        commands=("audio", "plan"),
        check=audio_window,
    )
    # Model -----------------------------------------------------------------------------------------------
    model: str = option(DEFAULT_MODEL, "Hub id or local checkpoint folder.", commands=EMBED + PLAN, panel=MODEL)
    revision: str | None = option(None, "Hub revision (branch, tag or commit).", commands=EMBED + PLAN, panel=MODEL)
    device: str = option("auto", "auto, cpu, cuda, cuda:N or mps.", commands=EMBED + PLAN, panel=MODEL)
    dtype: Dtype = option(
        Dtype.auto, "Compute dtype; auto: bfloat16 on CUDA, else float32.", commands=EMBED + PLAN, panel=MODEL
    )
    space: Space = option(
        Space.language,
        "language: after the embed_* projection (soft tokens); tower: the encoder output.",
        commands=EMBED + PLAN,
        panel=MODEL,
    )
    # Output ----------------------------------------------------------------------------------------------
    output: Path = option(Path("embeddings.safetensors"), "Output .safetensors file.", panel=OUTPUT, flags=("-o",))
    overwrite: bool = option(False, "Replace an existing output (and an unfinished run's parts).", panel=OUTPUT)
    resume: bool = option(
        False,
        "Finish an interrupted run or add to an existing output; items saved with the same content hash "
        "are not recomputed.",
        panel=OUTPUT,
    )
    output_dtype: OutputDtype = option(OutputDtype.float32, "dtype of the stored rows.", panel=OUTPUT)
    pool: Pool = option(
        Pool.none,
        "none: every row; mean: one row per item; frame (video): one row per frame.",
        panel=OUTPUT,
    )
    shard_size: int | None = option(
        None,
        "Write OUT-00000.safetensors, ... of this many items each, plus OUT.index.json.",
        panel=OUTPUT,
        check=at_least(1),
    )
    flush_every: int = option(
        500,
        "Save finished items to part files every this many items (and every 60 s).",
        panel=OUTPUT,
        check=at_least(1),
    )
    jsonl: bool = option(False, "One JSON record per item on stdout.", panel=OUTPUT)
    quiet: bool = option(False, "Nothing on stderr.", commands=EMBED + PLAN, panel=OUTPUT, flags=("-q",))
    # Performance -----------------------------------------------------------------------------------------
    batch_size: int | None = option(
        None,
        "Cap on units per device batch; auto: tuned for speed within the memory budget.",
        commands=EMBED + PLAN,
        panel=PERFORMANCE,
        cli_type=str,
        cli_default="auto",
        parse=parse_batch_size,
        metavar="auto|N",
    )
    memory_budget: str | None = option(
        None,
        "Bytes (2GiB) or a fraction of free memory (0.3); default min(free/2, total/10).",
        commands=EMBED + PLAN,
        panel=PERFORMANCE,
        check=parse_budget,
    )
    workers: int = option(
        2, "Decode and preprocessing threads.", commands=EMBED + PLAN, panel=PERFORMANCE, check=at_least(1)
    )
    num_slices: int | None = option(
        None,
        "Split the input over this many processes (a scheduler array); with --slice-index.",
        panel=PERFORMANCE,
        flags=("--num-shards",),
        check=at_least(1),
    )
    slice_index: int | None = option(
        None,
        "This process's slice, 0 <= I < --num-slices (torchrun sets it from RANK).",
        panel=PERFORMANCE,
        flags=("--shard-index",),
        check=at_least(0),
    )
    # Robustness ------------------------------------------------------------------------------------------
    on_error: OnError = option(
        OnError.skip, "skip: report a bad item and go on; stop: end the run at the first.", panel=ROBUSTNESS
    )
    debug: bool = option(False, "Show tracebacks of failed items.", commands=EMBED + PLAN, panel=ROBUSTNESS)

    def __post_init__(self) -> None:
        # Plain strings from Python callers become the fields' enums; a wrong value fails here, by name.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind = _enum_fields().get(f.name)
            if kind is not None and not isinstance(value, kind):
                try:
                    object.__setattr__(self, f.name, kind(value))
                except ValueError:
                    choices = ", ".join(m.value for m in kind)
                    raise ValueError(f"{f.name}={value!r}: choose one of {choices}") from None
        if self.ext is not None and not (isinstance(self.ext, tuple) and all(e.startswith(".") for e in self.ext)):
            object.__setattr__(self, "ext", parse_extensions(self.ext))
        if isinstance(self.inputs, (str, Path)):
            object.__setattr__(self, "inputs", (str(self.inputs),))
        else:
            object.__setattr__(self, "inputs", tuple(str(i) for i in self.inputs))
        object.__setattr__(self, "output", Path(self.output))

    def check(self) -> None:
        """Every field's own check; ValueError naming the option (as the command line spells it)."""
        for f in dataclasses.fields(self):
            spec = option_of(f)
            if spec is not None and spec.check is not None:
                try:
                    spec.check(getattr(self, f.name))
                except ValueError as exc:
                    raise ValueError(f"--{f.name.replace('_', '-')}: {exc}") from None


@functools.cache
def _enum_fields() -> dict[str, type[Choice]]:
    """Fields whose annotation is one of the enums above (read from the annotations, not listed again)."""
    hints = typing.get_type_hints(RunConfig)
    return {name: kind for name, kind in hints.items() if isinstance(kind, type) and issubclass(kind, Choice)}
