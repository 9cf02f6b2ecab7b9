"""Every option of every command, defined once: type, default, help text, command-line names, help panel,
the commands that take it, the check its value must pass, and the part of a run it changes.

`RunConfig` is what the library reads; `InspectionOptions` holds the options only the commands that read outputs
(and `models`) take. `cli.py` builds each command's parameters from these fields, so a new option is one field
here plus the code that uses it; an option's `stage` decides whether it is part of the key of a command's stages
(`stage_options()`, `embedder.STAGE_OPTIONS`). Enums and defaults live here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from gemma_embed.locations import Location, location
from gemma_embed.locations.written import output_location
from gemma_embed.memory.planner import BudgetSpec, parse_budget

DEFAULT_MODEL = "google/gemma-4-e2b-it"  # the media commands' default checkpoint
DEFAULT_TEXT_MODEL = "google/embeddinggemma-300m"  # text's: an embedding checkpoint
# Each embedding command's default (tests check that its family, found by the families' example hub ids, serves the
# command, without downloading anything).
DEFAULT_MODELS = {"images": DEFAULT_MODEL, "video": DEFAULT_MODEL, "audio": DEFAULT_MODEL, "text": DEFAULT_TEXT_MODEL}
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
    """The embedding commands, and the one spelling of each kind of item (`singular`: what sentence-transformers
    and the processors call it)."""

    images = "images"
    video = "video"
    audio = "audio"
    text = "text"  # retrieval checkpoints: one item per line of text (or per file)

    @property
    def singular(self) -> str:
        return "image" if self is Modality.images else self.value

    @property
    def is_media(self) -> bool:
        return self is not Modality.text


# The commands whose items are media files (and can sit in collections: tar shards, parquet files, datasets).
MEDIA_MODALITIES = frozenset(m.value for m in Modality if m.is_media)


class Dtype(Choice):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


# The one table of dtype names: torch's name (torch.<name>) -> safetensors' code in a file header.
DTYPE_CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64"}


class OutputDtype(Choice):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class Pool(Choice):
    none = "none"
    mean = "mean"
    frame = "frame"  # video only: one row per sampled frame


class Space(Choice):
    auto = "auto"  # the family's first space: retrieval where it gives retrieval vectors, else language
    language = "language"  # the towers' soft tokens after the embed_* projection
    tower = "tower"  # the encoder's own output
    retrieval = "retrieval"  # one normalised vector per item


class OnError(Choice):
    skip = "skip"
    stop = "stop"


class LongText(Choice):
    """What the text command does with a text longer than --max-text-bytes."""

    cut = "cut"  # embed its first --max-text-bytes (at a character boundary)
    skip = "skip"  # pass it over, named


class KeepRule(Choice):
    """Which item of a near-duplicate group `dedup` keeps: the first in the output, the largest or smallest
    (pixels where the metadata has width and height, else bytes), the newest or oldest (mtime)."""

    first = "first"
    largest = "largest"
    smallest = "smallest"
    newest = "newest"
    oldest = "oldest"


class DedupMethod(Choice):
    """How `dedup` finds the pairs: every pair (exact), through a faiss IVF index (index), or by the size."""

    auto = "auto"
    exact = "exact"
    through_index = "index"  # (not `index`: str.index)


# dedup's and map's defaults (collection/dedup.py and collection/layout.py say why).
DEFAULT_THRESHOLD = 0.95
EXACT_BELOW = 150_000  # items: dedup's auto method scans every pair below this many
DEFAULT_SEED = 0
FIT_SAMPLE = 20_000  # items: map fits on this many, places the rest


class ExportFormat(Choice):
    parquet = "parquet"
    npy = "npy"
    jsonl = "jsonl"  # one JSON object per item: streams to standard output (-o -)


# ------------------------------------------------------------------------------------------ parsers


def parse_extensions(text: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """ "jpg,PNG, .webp" -> (".jpg", ".png", ".webp"); None stays None (the modality's own set)."""
    if text is None:
        return None
    parts = text.split(",") if isinstance(text, str) else list(text)
    found = []
    for part in parts:
        ext = str(part).strip().lower()
        if not ext:
            continue
        ext = "." + ext.lstrip(".")
        if ext == "." or "/" in ext or os.sep in ext:
            raise ValueError(f"not a file extension: {part!r}")
        if ext not in found:
            found.append(ext)
    if not found:
        raise ValueError("give at least one extension, e.g. jpg,png")
    return tuple(found)


# Metadata fields the tool writes for a table's items (file facts, row and name, what the decoders and preparers
# record): a kept column of one of these names would overwrite one or be overwritten, so it is refused. (A tar
# member's `caption` and `json` never meet kept columns: a caption column keeps its name.)
RESERVED = frozenset(
    {"path", "bytes", "mtime", "sha256", "rows", "row", "name", "warnings"}
    | {"image_format", "mode", "frames_in_file", "width", "height", "max_soft_tokens", "patches"}
    | {"resized_width", "resized_height", "frames", "frame_indices", "timestamps", "fps", "duration_s"}
    | {"total_frames", "rotation", "codec", "rows_per_frame", "sample_rate", "channels", "decoder"}
    | {"window_s", "windows", "cut_from_bytes"}
)


def parse_columns(text: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """ "a, b" -> ("a", "b"); names a kept column may not have are refused (ValueError, for --keep-columns)."""
    if text is None:
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in (text.split(",") if isinstance(text, str) else text)))
    names = tuple(n for n in names if n)
    clash = [n for n in names if n in RESERVED]
    if clash:
        raise ValueError(
            f"{', '.join(clash)}: the tool writes {'this field' if len(clash) == 1 else 'these fields'} itself; "
            f"rename the column (or key by it with --key-column)"
        )
    return names


# The text command's default --max-text-bytes. A checkpoint reads at most its max_seq_length tokens of a text
# (EmbeddingGemma: 2048, some 8 KB of prose; a token covers a few bytes, rarely dozens), so 256 KiB holds more than
# any checkpoint reads: a text cut there gives the vector the whole text gives (tests/cli/test_text_limits.py checks
# it against sentence-transformers). Tokenising is what a long text costs: about 100 bytes a token in the
# tokenizer's encoding (measured: a 1 MiB text of the sample tokenizer's 893 000 tokens raised the run's peak RSS
# by 100 MB; 256 KiB by 2 MB over a run of one short line, 933 MB), and a 500 MB text took the tool past 5 GB.
TEXT_BYTES_DEFAULT = 256 << 10


@dataclass(frozen=True)
class Collection:
    """How the rows of a table (.parquet and JSON-lines files, a Hugging Face dataset) become items: `column` holds
    the media (bytes, a file path, or datasets' struct of both) or, with `column_holds_text` (the text command),
    the texts; `key_column` names items instead of FILE:ROW, `keep_columns` go to each item's metadata; `dataset`
    (hub id or folder) and its `split` add that dataset's rows to the input."""

    column: str | None = None
    key_column: str | None = None
    keep_columns: tuple[str, ...] = ()
    dataset: str | None = None
    split: str | None = None
    # The largest tar member or table cell read into memory (bytes); None: `default_item_bytes` of the host's
    # memory and `memory_budget` (--memory-budget, read against host memory: items are held there).
    max_item_bytes: int | None = None
    memory_budget: BudgetSpec = BudgetSpec()
    # Path cells may name files outside their table's folder (absolute paths, `..`, links leading out).
    allow_outside_paths: bool = False
    column_holds_text: bool = False  # the column's cells are the items' texts, not media or paths
    # The text command's texts (lines, cells, --per-file files): read at most this many bytes of one, and cut a
    # longer one there or pass it over (`long_text`); sources/bounded.py reads them so.
    max_text_bytes: int = TEXT_BYTES_DEFAULT
    long_text: str = "cut"
    column_holds_urls: bool = False  # the column's cells are http(s) URLs of the items (--url-column)
    # Collections are left whole: a tar shard, a parquet row group, a JSON-lines or text file is one Source whose
    # `unit` gives its items where it is read (a Ray worker), so that nothing of them is read here.
    deferred: bool = False

    def with_item_limit(self) -> Collection:
        """This collection with `max_item_bytes` decided (the default measured now, once per run)."""
        if self.max_item_bytes is not None:
            return self
        import psutil

        from gemma_embed.memory import readings

        host = psutil.virtual_memory()
        free, total = readings.host_memory(host.available, host.total, *readings.cgroup_memory())
        return dataclasses.replace(self, max_item_bytes=default_item_bytes(free, total, self.memory_budget))


# An item of a collection (a tar member, a parquet cell) is read whole into memory, where it stays while its
# decode window waits, and the decoder's file object copies it once more while it decodes; the decode stage keeps
# at least 2 x --workers items in flight. A quarter of the budget per item keeps the common case (2 workers) of a
# few such items within the budget; the floor keeps ordinary large media (a 200 MB video member) readable on a
# small host, where the default budget (total/10) would be below it.
ITEM_BUDGET_SHARE = 4
ITEM_BYTES_FLOOR = 256 << 20


def default_item_bytes(free: int, total: int, spec: BudgetSpec = BudgetSpec()) -> int:
    """The largest item read by default: a quarter of the memory budget applied to host memory (`planner.budget`:
    min(free/2, total/10), or --memory-budget capped at what is free), at least ITEM_BYTES_FLOOR."""
    from gemma_embed.memory import planner

    return max(ITEM_BYTES_FLOOR, planner.budget(free, total, spec) // ITEM_BUDGET_SHARE)


def parse_text_bytes(value: str | int | None) -> int:
    """--max-text-bytes: a size as --max-item-bytes takes it; None -> the default."""
    parsed = parse_item_bytes(value)
    return TEXT_BYTES_DEFAULT if parsed is None else parsed


def parse_item_bytes(value: str | int | None) -> int | None:
    """--max-item-bytes: '2GiB', '512MiB', '1.5GB' (planner.parse_budget's units) or a number of bytes -> bytes;
    None or 'auto' -> None (the default from memory)."""
    if value is None or isinstance(value, int):
        if value is not None and value <= 0:
            raise ValueError(f"must be a positive size, got {value}")
        return value
    try:
        spec = parse_budget(value)
    except ValueError:
        raise ValueError(f"cannot read {value!r}: use a size like 2GiB or 512MiB") from None
    if spec.fraction_of_total is not None:
        raise ValueError(f"{value!r}: give a size like 2GiB or 512MiB, not a share")
    return spec.bytes


# ------------------------------------------------------------------------------------------ option specs

MEDIA = ("images", "video", "audio")  # the commands that embed media files
EMBED = (*MEDIA, "text")  # the commands that embed and write an output
PLAN = ("plan",)
# The commands that read an output (and `models`): their own options are `InspectionOptions`' fields; the ones
# they share with the embed commands (--model, --device, -o, --quiet...) are RunConfig's, declared once there.
SEARCH, INDEX, INSPECT, EXPORT, MODELS, SERVE = "search", "index", "inspect", "export", "models", "serve"
DEDUP, MAP = "dedup", "map"  # the commands that act on a collection's vectors (gemma_embed/collection)

# Help panels, in the order `--help` shows them.
INPUT, MODEL, OUTPUT, PERFORMANCE, ROBUSTNESS = "Input", "Model", "Output", "Performance", "Robustness"
RETRIEVAL = "Retrieval"
SERVER = "Server"  # the server's own options
PANELS = (INPUT, MODEL, RETRIEVAL, OUTPUT, PERFORMANCE, ROBUSTNESS, SERVER)

# The part of a run each RunConfig option changes (`Option.stage`), in the order an item meets them: which command
# runs (`--modality`: every part), which items are found, the model an Embedder loads once (checkpoint, device,
# dtype), a command's decode, prepare, encode and pool stages, what is written, and how the run goes and tells
# (threads, a cluster, failures, stdout and stderr).
STAGES = ("command", "find", "load", "decode", "prepare", "encode", "pool", "write", "run")
COMMAND, FIND, LOAD, DECODE, PREPARE, ENCODE, POOL, WRITE, RUN = STAGES
# The parts `Embedder.command` builds for a command (its decoder, preparer, chain of towers with their engines, the
# pools it allows): an option of one of them gives the command other stages, so they are kept per its value.
ROUTE_STAGES = (DECODE, PREPARE, ENCODE, POOL)


@dataclass(frozen=True)
class Option:
    """How one RunConfig field appears on the command line."""

    help: str
    commands: tuple[str, ...] = EMBED
    panel: str = INPUT
    flags: tuple[str, ...] = ()  # extra names, e.g. "-o"
    aliases: tuple[str, ...] = ()  # old names still accepted, not shown in --help
    long: str | None = None  # the long name when it is not the field's name with dashes
    check: Callable[[Any], None] | None = None  # raises ValueError with a short reason
    # A default that depends on the command (shown in its --help and passed when the option is not given).
    command_defaults: dict[str, Any] | None = None
    # When the command line spells the value differently (--batch-size auto|N): its type, default and parser.
    cli_type: type | None = None
    cli_default: Any = None
    parse: Callable[[Any], Any] | None = None
    # (command, parser) where one command reads the value otherwise (export's -o names no embedding output).
    parse_by_command: tuple[tuple[str, Callable[[Any], Any]], ...] = ()
    metavar: str | None = None
    # (command, help) where one command's help differs (--pool: only video has frames).
    help_by_command: tuple[tuple[str, str], ...] = ()
    # An option whose value may be left out (--ray [ADDRESS]): the value it takes then.
    flag_value: str | None = None
    # The part of a run it changes (STAGES; every RunConfig option says, `InspectionOptions`' need not).
    stage: str | None = None
    required: bool = False  # the command cannot run without it (export --to)

    def help_for(self, command: str) -> str:
        return dict(self.help_by_command).get(command, self.help)

    def parse_for(self, command: str) -> Callable[[Any], Any] | None:
        return dict(self.parse_by_command).get(command, self.parse)


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


def cosine(value: Any) -> None:
    if value is not None and not -1.0 <= float(value) <= 1.0:  # NaN fails too
        raise ValueError(f"a cosine is between -1 and 1, got {value}")


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


# A hub id: "name" or "namespace/name" (letters, digits, '-', '_', '.'; no '--' or '..').
HUB_ID = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def looks_like_path(model: str) -> bool:
    """Whether `--model` names a folder rather than a hub id: it starts with ./, / or ~, is no hub-id shape,
    or its first part is a folder that exists here (`samples/nope`)."""
    if model.startswith((".", "/", "~")) or not HUB_ID.match(model):
        return True
    return "/" in model and Path(model.split("/")[0]).is_dir()


def model_argument(model: str | None) -> None:
    """A folder that does not exist fails here, at once, instead of being tried as a hub id."""
    if model is not None and looks_like_path(model) and not Path(model).expanduser().exists():
        raise ValueError(f"{model}: no such folder (and not a hub id)")


DEVICE_FORM = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def device_name(value: str) -> None:
    if not DEVICE_FORM.match(value):
        raise ValueError(f"{value!r}: use auto, cpu, cuda, cuda:N or mps")


# How `--ray` alone is stored: ray.init() with no address (RAY_ADDRESS, the cluster `ray start` began here, else a new
# local one).
RAY_DEFAULT = "default"
RAY_ADDRESS = re.compile(r"^(auto|local|default|(ray|https?)://\S+|[\w.-]+:\d+)$")


def ray_address(value: str | None) -> None:
    """--ray's value: auto, local, HOST:PORT or ray://HOST:PORT (a bare --ray is `default`: ray.init() chooses)."""
    if value is not None and not RAY_ADDRESS.match(value):
        raise ValueError(f"{value!r} is no Ray address (auto, local, HOST:PORT, ray://HOST:PORT)")


def parse_auto_count(text: str | int | None) -> int | None:
    """`auto` (None: the tool decides) or a positive integer (--batch-size, --cpu-threads)."""
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
    modality: Modality = option(
        Modality.images,
        "What the paths hold: images, video, audio or text.",
        commands=PLAN,
        metavar="KIND",
        stage=COMMAND,
    )
    inputs: tuple[str, ...] = ()  # files, folders or "-": the commands' PATH argument
    ext: tuple[str, ...] | None = option(
        None,
        "Walk folders for these extensions only.",
        commands=EMBED + PLAN,
        cli_type=str,
        parse=parse_extensions,
        metavar="EXT,...",
        stage=FIND,
    )
    null_separated: bool = option(
        False,
        "NUL-separated stdin (find -print0).",
        commands=MEDIA + PLAN,
        long="--null",
        flags=("-0",),
        stage=FIND,
    )
    max_soft_tokens: int | None = option(
        None,
        "70, 140, 280, 560 or 1120 per image or frame (default: the checkpoint's processor's).",
        commands=("images", "video", "plan", SERVE),
        help_by_command=(
            ("images", "70/140/280/560/1120 per image (default: the checkpoint's)."),
            ("video", "70/140/280/560/1120 per frame (default: the checkpoint's)."),
        ),
        check=soft_token_budget,
        metavar="N",
        stage=PREPARE,
    )
    pan_and_scan: bool = option(
        False,
        "Add the processor's crops of wide or tall images.",
        commands=("images", "plan"),
        stage=PREPARE,
    )
    fps: float | None = option(
        None,
        "Frames a second (default: the model's).",
        commands=("video", "plan"),
        check=positive,
        metavar="F",
        stage=DECODE,
    )
    max_frames: int | None = option(
        None,
        "Frames per video, or the cap with --fps.",
        commands=("video", "plan"),
        check=at_least(1),
        metavar="N",
        stage=DECODE,
    )
    per_file: bool = option(False, "One item per file, not per line.", commands=("text",), stage=FIND)
    window_s: float = option(
        MAX_WINDOW_S,
        "Window length for longer audio, at most 30 s.",
        commands=("audio", "plan"),
        check=audio_window,
        metavar="S",
        stage=PREPARE,
    )
    column: str | None = option(
        None,
        "Table column holding the media.",
        help_by_command=(("text", "Table column holding the texts."),),
        commands=EMBED + PLAN,
        metavar="NAME",
        stage=FIND,
    )
    key_column: str | None = option(
        None,
        "Column of item keys (default: FILE:ROW).",
        commands=EMBED + PLAN,
        metavar="NAME",
        stage=FIND,
    )
    keep_columns: tuple[str, ...] = option(
        (),
        "Columns kept in item metadata.",
        commands=EMBED + PLAN,
        cli_type=str,
        parse=parse_columns,
        metavar="A,B",
        stage=FIND,
    )
    dataset: str | None = option(
        None, "Hugging Face dataset: hub id or folder.", commands=EMBED + PLAN, metavar="NAME", stage=FIND
    )
    split: str | None = option(
        None, "The dataset's split (default: train).", commands=EMBED + PLAN, metavar="SPLIT", stage=FIND
    )
    max_item_bytes: int | None = option(
        None,
        "Item size cap (default: budget/4).",
        commands=MEDIA + PLAN + (SERVE,),
        panel=ROBUSTNESS,
        cli_type=str,
        parse=parse_item_bytes,
        metavar="SIZE",
        stage=FIND,
    )
    max_text_bytes: int = option(
        TEXT_BYTES_DEFAULT,
        "Text size cap (default 256KiB): a longer text is cut or skipped (serve: refused, 413).",
        commands=("text", "plan", SERVE),
        panel=ROBUSTNESS,
        cli_type=str,
        cli_default="256KiB",
        parse=parse_text_bytes,
        metavar="SIZE",
        stage=FIND,
    )
    long_text: LongText = option(
        LongText.cut,
        "A text over --max-text-bytes: cut there, or skip it (named).",
        commands=("text", "plan"),
        panel=ROBUSTNESS,
        metavar="cut|skip",
        stage=FIND,
    )
    allow_outside_paths: bool = option(
        False,
        "Table paths may leave its folder.",
        commands=MEDIA + PLAN,
        panel=ROBUSTNESS,
        stage=FIND,
    )
    url_column: str | None = option(
        None,
        "Table column of http(s) URLs to fetch.",
        commands=MEDIA + PLAN,
        metavar="NAME",
        stage=FIND,
    )
    url_timeout: float = option(
        30.0,
        "Seconds to wait on a URL (each read).",
        commands=MEDIA + PLAN,
        panel=ROBUSTNESS,
        check=positive,
        metavar="S",
        stage=RUN,
    )
    url_retries: int = option(
        2,
        "Retries on a timeout, 429 or 5xx.",
        commands=MEDIA + PLAN,
        panel=ROBUSTNESS,
        check=at_least(0),
        metavar="N",
        stage=RUN,
    )
    per_host: int = option(
        16,
        "Fetches at once from one host or bucket.",
        commands=MEDIA + PLAN,
        panel=PERFORMANCE,
        check=at_least(1),
        metavar="N",
        stage=RUN,
    )
    # Model -----------------------------------------------------------------------------------------------
    # None: the command's default (DEFAULT_MODELS; `plan` takes its --modality's, `search` the index's).
    model: str | None = option(
        None,
        "Hub id or local checkpoint folder.",
        commands=EMBED + PLAN + (SEARCH, SERVE),
        help_by_command=(
            (SEARCH, "Default: the index's model (another is refused)."),
            (SERVE, "Default: the first --output's model."),
        ),
        panel=MODEL,
        check=model_argument,
        metavar="ID|DIR",
        command_defaults=DEFAULT_MODELS,
        stage=LOAD,
    )
    revision: str | None = option(
        None,
        "Hub revision: branch, tag or commit.",
        commands=EMBED + PLAN + (SERVE,),
        panel=MODEL,
        metavar="REV",
        stage=LOAD,
    )
    device: str = option(
        "auto",
        "auto, cpu, cuda, cuda:N or mps.",
        commands=EMBED + PLAN + (SEARCH, SERVE),
        panel=MODEL,
        check=device_name,
        metavar="DEV",
        stage=LOAD,
    )
    dtype: Dtype = option(
        Dtype.auto,
        "auto, float32, bfloat16 or float16 (auto: the checkpoint's where fast).",
        commands=EMBED + PLAN + (SEARCH, SERVE),
        panel=MODEL,
        metavar="DTYPE",
        stage=LOAD,
    )
    space: Space = option(
        Space.auto,
        "auto, retrieval, language or tower.",
        commands=MEDIA + PLAN,
        panel=MODEL,
        metavar="SPACE",
        stage=ENCODE,
    )
    prompt_name: str | None = option(
        None,
        "A named prompt of the checkpoint's.",
        commands=EMBED + PLAN + (SEARCH, SERVE),
        help_by_command=(
            (SEARCH, "The query's named prompt (default: its family's query prompt, see gemma-embed models)."),
        ),
        panel=RETRIEVAL,
        metavar="NAME",
        stage=PREPARE,
    )
    prompt: str | None = option(
        None,
        "This prompt before each item.",
        commands=EMBED + PLAN + (SEARCH, SERVE),
        help_by_command=((SEARCH, "This prompt before each query instead."),),
        panel=RETRIEVAL,
        metavar="TEXT",
        stage=PREPARE,
    )
    dim: int | None = option(
        None,
        "Keep N dimensions, renormalised.",
        commands=EMBED + PLAN + (SERVE,),
        panel=RETRIEVAL,
        check=at_least(1),
        metavar="N",
        stage=ENCODE,
    )
    # Output ----------------------------------------------------------------------------------------------
    output: Location = option(  # a location of the seam (gemma_embed/locations), as the command line spells it
        location("embeddings.safetensors"),
        "Output .safetensors file, or DIR/.",
        commands=EMBED + (EXPORT, DEDUP, MAP),
        help_by_command=(
            (EXPORT, "Default: OUT.FORMAT beside it; - (parquet, jsonl): stdout."),
            (DEDUP, "The groups' table (.parquet); default: OUT.duplicates.parquet beside it."),
            (MAP, "The map's table (.parquet); default: OUT.map.parquet beside it."),
        ),
        command_defaults={EXPORT: None, DEDUP: None, MAP: None},
        panel=OUTPUT,
        flags=("-o",),
        metavar="FILE",
        cli_type=str,
        cli_default="embeddings.safetensors",
        parse=output_location,
        parse_by_command=((EXPORT, location), (DEDUP, location), (MAP, location)),
        stage=WRITE,
    )
    overwrite: bool = option(
        False,
        "Replace an existing output.",
        commands=EMBED + (EXPORT, SEARCH, DEDUP, MAP),
        help_by_command=(
            (EXPORT, "Replace existing files."),
            (SEARCH, "Replace an existing --html page."),
            (DEDUP, "Replace an existing -o or --drop-list file (the table beside OUT is always renewed)."),
            (MAP, "Replace an existing -o file (the table beside OUT is always renewed)."),
        ),
        panel=OUTPUT,
        stage=WRITE,
    )
    resume: bool = option(False, "Finish or add to an output, reusing items.", panel=OUTPUT, stage=WRITE)
    prune: bool = option(False, "With --resume: drop items not in the input.", panel=OUTPUT, stage=WRITE)
    output_dtype: OutputDtype = option(
        OutputDtype.float32,
        "float32, float16 or bfloat16.",
        panel=OUTPUT,
        metavar="DTYPE",
        stage=WRITE,
    )
    pool: Pool = option(
        Pool.none,
        "none (every row) or mean (one row).",
        commands=MEDIA,
        help_by_command=(("video", "none, mean or frame (a row per frame)."),),
        panel=OUTPUT,
        metavar="POOL",
        stage=POOL,
    )
    shard_size: int | None = option(
        None,
        "Write shards of N items and OUT.index.json.",
        panel=OUTPUT,
        check=at_least(1),
        metavar="N",
        stage=WRITE,
    )
    flush_every: int = option(
        500,
        "Save finished items every N (and 60 s).",
        panel=OUTPUT,
        check=at_least(1),
        metavar="N",
        stage=WRITE,
    )
    jsonl: bool = option(
        False,
        "One JSON record per item on stdout.",
        commands=EMBED + (SEARCH,),
        help_by_command=((SEARCH, "One JSON record per hit."),),
        panel=OUTPUT,
        stage=RUN,
    )
    quiet: bool = option(
        False,
        "Nothing on stderr.",
        commands=EMBED + PLAN + (INDEX, SERVE, DEDUP, MAP),
        help_by_command=((INDEX, "No progress notes."), (DEDUP, "No notes."), (MAP, "No notes.")),
        panel=OUTPUT,
        flags=("-q",),
        stage=RUN,
    )
    # Performance -----------------------------------------------------------------------------------------
    batch_size: int | None = option(
        None,
        "Units per device batch; auto: the fastest.",
        commands=EMBED + PLAN + (SERVE,),
        panel=PERFORMANCE,
        cli_type=str,
        cli_default="auto",
        parse=parse_auto_count,
        metavar="auto|N",
        stage=ENCODE,
    )
    memory_budget: BudgetSpec = option(
        BudgetSpec(),
        "2GiB, 512MiB or 30% of the device (default: min(free/2, total/10)).",
        commands=EMBED + PLAN + (SERVE,),
        panel=PERFORMANCE,
        cli_type=str,
        cli_default=None,
        parse=parse_budget,
        metavar="SIZE",
        stage=ENCODE,
    )
    cpu_threads: int | None = option(
        None,
        "CPU model threads; auto: free cores.",
        commands=EMBED + (SERVE,),
        panel=PERFORMANCE,
        cli_type=str,
        cli_default="auto",
        parse=parse_auto_count,
        metavar="auto|N",
        stage=ENCODE,
    )
    tuning_cache: str = option(
        "auto",
        "Keep tuned batch sizes (or off, FILE).",
        commands=EMBED + (SERVE,),
        panel=PERFORMANCE,
        metavar="auto",
        stage=ENCODE,
    )
    workers: int = option(
        2,
        "Decode and preprocessing threads.",
        commands=EMBED + PLAN + (SERVE,),
        panel=PERFORMANCE,
        check=at_least(1),
        metavar="N",
        stage=RUN,
    )
    num_slices: int | None = option(
        None,
        "Split the input over N processes.",
        panel=PERFORMANCE,
        aliases=("--num-shards",),
        check=at_least(1),
        metavar="N",
        stage=FIND,
    )
    slice_index: int | None = option(
        None,
        "This process's slice, 0 to N-1.",
        panel=PERFORMANCE,
        aliases=("--shard-index",),
        check=at_least(0),
        metavar="I",
        stage=FIND,
    )
    ray: str | None = option(
        None,
        "Run on a Ray cluster (bare: found or new).",
        commands=EMBED,
        panel=PERFORMANCE,
        check=ray_address,
        flag_value=RAY_DEFAULT,
        metavar="[ADDRESS]",
        stage=RUN,
    )
    # Robustness ------------------------------------------------------------------------------------------
    on_error: OnError = option(
        OnError.skip, "Skip a bad item (named) or stop.", panel=ROBUSTNESS, metavar="skip|stop", stage=RUN
    )
    debug: bool = option(False, "Tracebacks of failed items.", commands=EMBED + PLAN, panel=ROBUSTNESS, stage=RUN)

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
        # Values in the command line's form ("jpg,png", "2GiB", "auto") are parsed here, once, by the option's own
        # parser (the command line's callbacks have already done it: parsers take their own output back unchanged).
        for f in dataclasses.fields(self):
            spec, value = option_of(f), getattr(self, f.name)
            if spec is None or spec.parse is None or isinstance(value, BudgetSpec):
                continue
            try:
                object.__setattr__(self, f.name, spec.parse(value))
            except ValueError as exc:
                raise ValueError(f"{f.name}: {exc}") from None
        if self.model is None:
            object.__setattr__(self, "model", DEFAULT_MODELS[self.modality.value])
        if isinstance(self.inputs, (str, Path)):
            object.__setattr__(self, "inputs", (str(self.inputs),))
        else:
            object.__setattr__(self, "inputs", tuple(str(i) for i in self.inputs))

    @property
    def collection(self) -> Collection:
        """How parquet rows and a --dataset's rows become items (`sources.Collection`)."""
        return Collection(
            self.url_column or self.column,
            self.key_column,
            self.keep_columns,
            self.dataset,
            self.split,
            max_item_bytes=self.max_item_bytes,
            memory_budget=self.memory_budget,
            allow_outside_paths=self.allow_outside_paths,
            column_holds_text=self.modality == Modality.text,
            max_text_bytes=self.max_text_bytes,
            long_text=self.long_text.value,
            column_holds_urls=self.url_column is not None,
        )

    def check(self) -> None:
        """Every field's own check; ValueError naming the field (as a Python caller spells it: `batch_size`; the
        command line's callbacks run the same checks first, naming the flag)."""
        for f in dataclasses.fields(self):
            spec = option_of(f)
            if spec is not None and spec.check is not None:
                try:
                    spec.check(getattr(self, f.name))
                except ValueError as exc:
                    raise ValueError(f"{f.name}: {exc}") from None


@functools.cache
def _enum_fields() -> dict[str, type[Choice]]:
    """Fields whose annotation is one of the enums above (read from the annotations, not listed again)."""
    hints = typing.get_type_hints(RunConfig)
    return {name: kind for name, kind in hints.items() if isinstance(kind, type) and issubclass(kind, Choice)}


@dataclass(frozen=True)
class InspectionOptions:
    """The options of the commands that read an output (`search`, `index`, `inspect`, `export`) and of `models`
    that no embed command takes: declared here once, beside RunConfig's, and read by the command line the same
    way. The options these commands share with the embed commands (`--model`, `--device`, `--dtype`,
    `--prompt-name`, `--prompt`, `--jsonl`, `-q`, `-o`, `--overwrite`) are RunConfig's fields, with the commands'
    own help in `help_by_command`."""

    # search --------------------------------------------------------------------------------------------
    queries: str | None = option(None, "Many texts, one a line (- for stdin).", commands=(SEARCH,), metavar="FILE")
    image: list[str] | None = option(
        None, "Look for this image (repeat, or a folder).", commands=(SEARCH,), metavar="FILE"
    )
    video: list[str] | None = option(
        None, "Look for this video (repeat, or a folder).", commands=(SEARCH,), metavar="FILE"
    )
    audio: list[str] | None = option(
        None, "Look for this audio file (repeat, or a folder).", commands=(SEARCH,), metavar="FILE"
    )
    top: int = option(
        10,
        "Hits to show (at least 1).",
        commands=(SEARCH,),
        panel=OUTPUT,
        flags=("-k",),
        check=at_least(1),
        metavar="K",
    )
    html: str | None = option(
        None, "Also write a page with thumbnails and players.", commands=(SEARCH,), panel=OUTPUT, metavar="FILE"
    )
    exact: bool = option(
        False, "Exact search even where the output has an index.", commands=(SEARCH,), panel=PERFORMANCE
    )
    # index ---------------------------------------------------------------------------------------------
    kind: str = option(
        "auto",
        "auto, flat, ivf or hnsw (auto: flat below 100k rows).",
        commands=(INDEX,),
        panel=OUTPUT,
        metavar="KIND",
    )
    metric: str = option("cosine", "The similarity (cosine).", commands=(INDEX,), panel=OUTPUT, metavar="METRIC")
    # dedup, map ----------------------------------------------------------------------------------------
    threshold: float = option(
        DEFAULT_THRESHOLD,
        "Near duplicates: cosine at or above this (-1 to 1).",
        commands=(DEDUP,),
        check=cosine,
        metavar="T",
    )
    keep: KeepRule = option(
        KeepRule.first,
        "The item a group keeps: first (in OUT), largest, smallest (pixels, else bytes), newest, oldest.",
        commands=(DEDUP,),
        metavar="RULE",
    )
    drop_list: str | None = option(
        None,
        "Also write the keys to drop, one a line (- : stdout).",
        commands=(DEDUP,),
        panel=OUTPUT,
        metavar="FILE",
    )
    method: DedupMethod = option(
        DedupMethod.auto,
        f"exact (every pair), index (faiss IVF, recall measured) or auto (exact below {EXACT_BELOW:,} items).",
        commands=(DEDUP,),
        panel=PERFORMANCE,
        metavar="METHOD",
    )
    seed: int = option(
        DEFAULT_SEED, "The layout's seed: the same seed, the same map.", commands=(MAP,), check=at_least(0), metavar="N"
    )
    sample: int = option(
        FIT_SAMPLE,
        "Fit the layout on this many items, place the rest.",
        commands=(MAP,),
        panel=PERFORMANCE,
        check=at_least(3),
        metavar="N",
    )
    # inspect, export, models ---------------------------------------------------------------------------
    limit: int = option(
        20, "Items to list (0 = all).", commands=(INSPECT,), panel=OUTPUT, check=at_least(0), metavar="N"
    )
    to: ExportFormat | None = option(
        None, "parquet, npy (+ .keys.txt) or jsonl.", commands=(EXPORT,), panel=OUTPUT, metavar="FORMAT", required=True
    )
    as_json: bool = option(
        False,
        "The header, keys and items as one JSON object.",
        commands=(INSPECT, MODELS),
        help_by_command=((MODELS, "The table as one JSON list."),),
        long="--json",
        panel=OUTPUT,
    )


# Every option of every command, in the order `--help` lists them within a panel (a command's own first).
# ------------------------------------------------------------------------------------------ the server's

# `gemma-embed serve`'s own options (how it listens, whom it answers, how much it holds); the model it serves is
# described by the RunConfig fields whose commands include SERVE. Pure: no fastapi, no torch.
API_KEY_VARIABLE = "GEMMA_EMBED_API_KEY"  # the key when --api-key is not given (kept out of `ps` and shell history)
MIB = 1 << 20


def parse_outputs(value: Iterable[str | os.PathLike | Location] | None) -> tuple[Location, ...]:
    """--output, repeated: the outputs to search and show, in the order given (locations of the seam; a folder,
    with the trailing slash, names the output in it: `locations.written.output_location`)."""
    return tuple(output_location(v) for v in (value or ()))


def port_number(value: int) -> None:
    if not 0 <= int(value) <= 65535:
        raise ValueError(f"must be 0 (any free port) to 65535, got {value}")


def request_size(value: str | int | None) -> int:
    parsed = parse_item_bytes(value)
    if parsed is None:
        raise ValueError("give a size like 64MiB")
    return parsed


def parse_hosts(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """--allowed-media-domains HOST[,HOST...]: host names or IP literals as a URL writes them (lowercased, an IPv6
    literal without its brackets), in the order given."""
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else [p for v in value for p in str(v).split(",")]
    hosts = []
    for part in parts:
        host = part.strip().lower().removeprefix("[").removesuffix("]")
        if not host or any(c in host for c in "/@ ?#"):
            raise ValueError(f"give host names or addresses, got {part.strip()!r}")
        hosts.append(host)
    return tuple(hosts)


@dataclass(frozen=True)
class ServeConfig:
    """How the server listens, whom it answers and how much it holds; the model is a RunConfig's."""

    outputs: tuple[Location, ...] = option(
        (),
        "An output to search and show in the gallery (repeat).",
        commands=(SERVE,),
        panel=SERVER,
        long="--output",
        flags=("-o",),
        cli_type=list[str] | None,
        parse=parse_outputs,
        metavar="FILE",
    )
    host: str = option(
        "127.0.0.1", "Address to listen on (0.0.0.0: every interface).", commands=(SERVE,), panel=SERVER, metavar="ADDR"
    )
    port: int = option(
        8000, "Port (0: any free port, announced).", commands=(SERVE,), panel=SERVER, check=port_number, metavar="PORT"
    )
    api_key: str | None = option(
        None,
        f"Require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_VARIABLE}).",
        commands=(SERVE,),
        panel=SERVER,
        metavar="KEY",
    )
    queue_size: int = option(
        1024,
        "Items waiting or encoding at most; a request beyond gets 429.",
        commands=(SERVE,),
        panel=SERVER,
        check=at_least(1),
        metavar="N",
    )
    max_request_bytes: int = option(
        64 * MIB,
        "Largest request body (data: URLs included).",
        commands=(SERVE,),
        panel=SERVER,
        cli_type=str,
        cli_default="64MiB",
        parse=request_size,
        metavar="SIZE",
    )
    grace: float = option(
        30.0,
        "Seconds in-flight requests get to finish after SIGTERM or Ctrl-C.",
        commands=(SERVE,),
        panel=SERVER,
        check=at_least(0),
        metavar="S",
    )
    max_client_batch_size: int = option(
        256,
        "Inputs in one request at most; more gets 413 (text-embeddings-inference's name).",
        commands=(SERVE,),
        panel=SERVER,
        check=at_least(1),
        metavar="N",
    )
    max_request_tokens: int = option(
        16384,
        "Token ids given in one request at most (all its inputs together); more gets 413.",
        commands=(SERVE,),
        panel=SERVER,
        check=at_least(1),
        metavar="N",
    )
    allowed_media_domains: tuple[str, ...] = option(
        (),
        "Fetch media URLs of these hosts only, whatever address they have (default: any host whose addresses are "
        "all public).",
        commands=(SERVE,),
        panel=SERVER,
        cli_type=str | None,
        parse=parse_hosts,
        metavar="HOST[,HOST...]",
    )
    max_fetch_bytes: int = option(
        64 * MIB,
        "Bytes of media URLs one request may fetch, counted as they arrive.",
        commands=(SERVE,),
        panel=SERVER,
        cli_type=str,
        cli_default="64MiB",
        parse=request_size,
        metavar="SIZE",
    )
    fetch_budget: int = option(
        256 * MIB,
        "Bytes of media URLs the whole server holds at once; a fetch past it gets 429.",
        commands=(SERVE,),
        panel=SERVER,
        cli_type=str,
        cli_default="256MiB",
        parse=request_size,
        metavar="SIZE",
    )
    fetch_timeout: float = option(
        30.0,
        "Seconds a media URL's whole fetch may take, redirects included.",
        commands=(SERVE,),
        panel=SERVER,
        check=at_least(0.001),
        metavar="S",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", parse_outputs(self.outputs))
        for name in ("max_request_bytes", "max_fetch_bytes", "fetch_budget"):
            object.__setattr__(self, name, request_size(getattr(self, name)))
        object.__setattr__(self, "allowed_media_domains", parse_hosts(self.allowed_media_domains))
        for name, check in (
            ("port", port_number),
            ("queue_size", at_least(1)),
            ("grace", at_least(0)),
            ("max_client_batch_size", at_least(1)),
            ("max_request_tokens", at_least(1)),
            ("fetch_timeout", at_least(0.001)),
        ):
            try:
                check(getattr(self, name))
            except ValueError as exc:
                raise ValueError(f"--{name.replace('_', '-')}: {exc}") from None

    def key(self) -> str | None:
        """The API key: --api-key, else the environment's; None (or empty): no key asked for."""
        return self.api_key or os.environ.get(API_KEY_VARIABLE) or None


OPTION_TABLES = (InspectionOptions, RunConfig, ServeConfig)


def declared_options(command: str, tables: tuple = OPTION_TABLES) -> list[tuple[dataclasses.Field, Any, Option]]:
    """(field, its type, its Option) of every option `command` takes, from the tables (the two here, or a
    command's own: the server's ServeConfig), in their order."""
    found = []
    for table in tables:
        hints = typing.get_type_hints(table)
        for f in dataclasses.fields(table):
            spec = option_of(f)
            if spec is not None and command in spec.commands:
                found.append((f, hints[f.name], spec))
    return found


def stage_options() -> tuple[str, ...]:
    """The RunConfig fields that change a command's stages (their `Option.stage` is one `Embedder.command` builds):
    the key of a command's stages (`Embedder.command`) besides the command."""
    return tuple(
        f.name
        for f in dataclasses.fields(RunConfig)
        if (spec := option_of(f)) is not None and spec.stage in ROUTE_STAGES
    )


# ------------------------------------------------------------------------------------------ spellings

_FLAG = re.compile(r"--([a-z][a-z0-9-]*)")


def python_spelling(message: str) -> str:
    """A message worded for the command line, reworded for a Python caller: each option is named as the
    RunConfig field (and Embedder keyword) it is, `--overwrite` -> `overwrite=True`, `--dim` -> `dim`."""
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    names = {}
    for name, f in fields.items():
        spec = option_of(f)
        if spec is not None:
            for flag in (spec.long or "--" + name.replace("_", "-"), *spec.aliases):
                names[flag.removeprefix("--")] = name

    def reword(match: re.Match) -> str:
        name = names.get(match.group(1))
        if name is None:
            return match.group(0)
        return f"{name}=True" if isinstance(fields[name].default, bool) else name

    return _FLAG.sub(reword, message)
