"""Error types shared by every stage, and the one map from a kind of error to an exit code and the shape of its
line (`EXIT_STATUS`, `kind_of`), which every command goes through (`cli.py`) and docs/exit-codes.md lists.

`UsageError` is a problem with the whole run (bad option, missing checkpoint): exit code 2, before any work.
`ItemError` is a problem with one input item: the pipeline records it and goes on with the others (exit code 1).
`RunError` (and `DeviceError`, a device that cannot go on) ends the run, keeping finished work: exit code 1.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorKind:
    """One kind of fault as every command reports it: the exit code (`adds_signal`: 128 plus the signal's
    number, as a shell reports a process a signal ended), what it means, and the shapes its stderr line takes."""

    name: str
    code: int
    meaning: str
    lines: tuple[str, ...] = ()  # the line's shapes, as docs/exit-codes.md shows them
    adds_signal: bool = False

    def exit_code(self, signum: int | None = None) -> int:
        return self.code + (signum or 0) if self.adds_signal else self.code


# The codes are the ones a shell user knows: 0 done, 1 a failure along the way (EXIT_FAILURE, also what the GNU
# tools exit with on "memory exhausted"), 2 trouble before any work (as grep, ls and diff exit on a file they
# cannot read or a bad option), 128+N a signal. Every fault of one kind exits with its code from every command;
# which of a code's kinds it was, the line says. Missing files, files not ours and a busy output are 2 because the
# README, docs/inputs.md and docs/reliability.md document them so (the embed commands' missing PATH, a damaged
# output, a second run into an output); `index` and `export` alone exited 1 for them, against those docs.
OK = ErrorKind(
    "success",
    0,
    "The command did its work: every item written (also when stdout closed early), every query answered.",
)
ITEMS_FAILED = ErrorKind(
    "some items failed",
    1,
    "Some items (or search queries) failed, each named in its own line; the rest are written (or answered).",
    ("error: KEY: REASON", "error: QUERY: cannot embed the query: REASON"),
)
RUN_STOPPED = ErrorKind(
    "run stopped",
    1,
    "The run could not go on (a full disk, an output it cannot write, a device that failed); items already "
    "saved are kept, and --resume finishes the run.",
    (
        "error: WHERE: cannot write: REASON; finished parts are kept, free space and run again with --resume",
        "error: DEVICE: REASON (a device error that persists: the run stops; ...)",
    ),
)
OUT_OF_MEMORY = ErrorKind(
    "out of memory",
    1,
    "The host or the device ran out of memory outside what a run backs off from (loading the model's weights, "
    "a search); try a smaller --memory-budget, another --device, or a machine with more memory.",
    ("error: out of memory: DETAIL",),
)
USAGE = ErrorKind(
    "usage",
    2,
    "A bad option or value, no input, a checkpoint that cannot run the command: nothing was done.",
    ("error: Invalid value for '--OPTION': REASON (see 'gemma-embed COMMAND --help')", "error: REASON"),
)
MISSING = ErrorKind(
    "missing file",
    2,
    "A file or folder named on the command line does not exist: nothing was done.",
    ("error: PATH: no such file or directory", "error: OUT: no such output (neither the file nor its .index.json)"),
)
NOT_OURS = ErrorKind(
    "unreadable or not ours",
    2,
    "A file cannot be read, or is not what the command reads (another tool's file, a damaged output or part, "
    "random bytes): nothing was done.",
    ("error: FILE: not a KIND (REASON); FIX", "error: FILE: Permission denied"),
)
STALE_INDEX = ErrorKind(
    "search index not current",
    2,
    "The output's search index (OUT.search-index and OUT.faiss, written by gemma-embed index) is not the one built "
    "from the output as it is now: made for another output or before the output changed, from other vectors, "
    "damaged, or not a regular file. Nothing was searched; rebuild it with gemma-embed index OUT, or search with "
    "--exact.",
    ("error: FILE: REASON; run gemma-embed index OUT again, or search with --exact",),
)
BUSY = ErrorKind(
    "output busy",
    2,
    "Another gemma-embed run is writing the output: nothing was done; wait for it or choose another output.",
    (
        "error: OUT: another gemma-embed run (PID N) is writing this output; wait for it to finish or choose another "
        "--output",
    ),
)
INTERRUPTED = ErrorKind(
    "interrupted",
    128,
    "Stopped by signal N (130: SIGINT, Ctrl-C; 143: SIGTERM); a run saves what is done and --resume finishes it.",
    (
        "note: interrupted by SIGNAL: N items are saved in OUT.parts; run the same command with --resume to finish",
        "note: interrupted by SIGNAL",
    ),
    adds_signal=True,
)
# Every kind, in the order docs/exit-codes.md lists them.
EXIT_STATUS = (OK, ITEMS_FAILED, RUN_STOPPED, OUT_OF_MEMORY, USAGE, MISSING, NOT_OURS, STALE_INDEX, BUSY, INTERRUPTED)


class GemmaEmbedError(Exception):
    """Base class of the errors this package raises on purpose."""

    error_kind = RUN_STOPPED

    def reworded(self, message: str) -> GemmaEmbedError:
        """The same error (type, kind, fields) with another message: a Python caller's spelling of the options it
        names (`config.python_spelling`). Not `type(self)(message)` (nor copy.copy, which calls it): a DamagedFile
        is built from its parts."""
        again = type(self).__new__(type(self))
        again.__dict__.update(self.__dict__)
        again.args = (message,)
        return again


class UsageError(GemmaEmbedError):
    """The run cannot start or go on: a bad option, a missing checkpoint, an unwritable output."""

    error_kind = USAGE


class MissingFile(UsageError, FileNotFoundError):
    """A file or folder the command was given does not exist (also a FileNotFoundError, as readers raised)."""

    error_kind = MISSING


class NotOurs(UsageError):
    """A file that cannot be read, or is not one the command reads (`store.damage.DamagedFile`: an output's)."""

    error_kind = NOT_OURS


class IndexNotCurrent(UsageError):
    """The output's search index cannot be trusted for it (index.py): `FILE: REASON; run gemma-embed index OUT
    again, or search with --exact`."""

    error_kind = STALE_INDEX

    def __init__(self, file: object, reason: str, output: object) -> None:
        self.file, self.reason, self.output = file, " ".join(str(reason).split()), output
        super().__init__(f"{file}: {self.reason}; run gemma-embed index {output} again, or search with --exact")


class OutputBusy(UsageError):
    """Another run holds the output's lock (`store.lock`)."""

    error_kind = BUSY


class CheckpointError(UsageError):
    """The checkpoint lacks what the command needs, or its tensors do not match the tower."""


class RunError(GemmaEmbedError):
    """The run had to stop (disk full, output unwritable); finished work is kept where it could be."""


class DeviceError(RunError):
    """The device failed in a way that persists (a CUDA illegal address, a device-side assert): every later
    chunk would fail too, so the run stops at once, keeping the items already saved."""


# What happened to an item that was not embedded, as its record says it (`error` in OUT.errors.jsonl, --jsonl and
# the summary): what a user can act on, not the exception class some library raised. docs/exit-codes.md lists
# them (`record_kinds_section`). The kinds in SKIPS are passed over by default (named in a note, the exit code
# untouched: there is nothing to embed, or the user asked so); with --on-error stop they fail the run like the rest.
RECORD_KINDS = {
    "missing": "The file (or the file a list or a table's path cell names) does not exist, or a link to it dangles.",
    "unreadable": (
        "It cannot be read: permission denied, no regular file (a FIFO, a device, a folder), a protocol the tool "
        "cannot open, a damaged or cut container (a tar shard, a parquet row group, a gzip stream)."
    ),
    "too-large": (
        "Over a size limit: --max-item-bytes (a tar member, a table cell), an image over Pillow's "
        "decompression-bomb limit, a JSON-lines record too large to read, or a .gz input that inflates past 200 "
        "times its size (a gzip bomb: the rest of that file)."
    ),
    "too-long": "A text over --max-text-bytes with --long-text skip.",
    "fetch-failed": (
        "A URL (--url-column) or an object in storage that could not be fetched: an HTTP error status, a timeout, "
        "a refused or dropped connection, a body cut short (after --url-retries tries)."
    ),
    "blank": "No text: a blank line, a null, missing or blank text cell, an empty --per-file file.",
    "undecodable": (
        "Its bytes are not what they should be: text that is not UTF-8 or holds a lone surrogate escape "
        "(\\ud800), a JSON-lines line that is no JSON object, media a decoder cannot read."
    ),
    "too-deep": "A JSON-lines record nested deeper than 128 levels.",
    "bad-key": "No usable --key-column value: empty, repeated, or a JSON list or object.",
    "bad-cell": "The --column cell cannot be an item: a field of another type (a number, a list), a table without it.",
    "outside": "A path cell that leads out of its table's folder (--allow-outside-paths opens it).",
    "duplicate": "A second tar member of a name an earlier member has.",
    "unusable": "The model's preparer cannot take it (prepare stage: too short, too many tokens...).",
    "out-of-memory": "The host or the device ran out of memory for this item alone.",
    "encode-failed": "The model failed on it (encode stage).",
}
SKIPS = frozenset({"blank", "too-long"})


def record_kind(exc: BaseException, stage: str) -> str:
    """The RECORD_KINDS name of an exception an item's stage raised: one it says itself (`kind`), else by what it
    is (a missing file, a file that cannot be read, memory), else by the stage it broke."""
    kind = getattr(exc, "kind", None)
    if kind in RECORD_KINDS:
        return kind
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, MemoryError) or _is_out_of_memory(exc):
        return "out-of-memory"
    if "DecompressionBomb" in type(exc).__name__:  # Pillow's, by name: Pillow is not imported here
        return "too-large"
    if isinstance(exc, OSError) and not isinstance(exc, GemmaEmbedError):
        return "unreadable"
    return {"find": "unreadable", "decode": "undecodable", "prepare": "unusable"}.get(stage, "encode-failed")


class ItemProblem(ValueError):
    """An item's content cannot be embedded, for a reason of RECORD_KINDS (`kind`); the message is its line."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


class ItemError(GemmaEmbedError):
    """One item failed at one stage (or, of a kind in SKIPS, was passed over). The message is one line and names
    the file; `error_type` is its kind (RECORD_KINDS)."""

    error_kind = ITEMS_FAILED

    def __init__(
        self, key: str, stage: str, message: str, error_type: str | None = None, traceback_text: str | None = None
    ):
        from gemma_embed.redact import redact  # no URL's query string or credential in any record (redact.py)

        self.key = redact(key)
        self.stage = stage
        self.error_type = error_type or type(self).__name__
        self.message = " ".join(redact(message).split())  # always one line
        self.traceback_text = redact(traceback_text) if traceback_text is not None else None  # --debug only
        self.warnings: list[str] = []  # what libraries said while this item was decoded (capture.py)
        self.count = 1  # the inputs it stands for: a run of blank lines is one item passed over
        super().__init__(f"{self.key}: {self.message}")

    def __reduce__(self):
        """Pickled whole (a Ray run's decoded rows carry their failures to the encode actors and the driver)."""
        return (type(self), (self.key, self.stage, self.message, self.error_type, self.traceback_text), self.__dict__)

    @classmethod
    def wrap(cls, key: str, stage: str, exc: BaseException) -> ItemError:
        if isinstance(exc, ItemError):
            return exc
        import traceback

        text = str(exc) or type(exc).__name__
        return cls(key, stage, text, record_kind(exc, stage), "".join(traceback.format_exception(exc)))

    @property
    def skipped(self) -> bool:
        """Passed over rather than failed (SKIPS: a blank text, a long one with --long-text skip)."""
        return self.error_type in SKIPS

    def as_record(self) -> dict:
        return {
            "key": self.key,
            "stage": self.stage,
            "error": self.error_type,
            "message": self.message,
            "warnings": list(self.warnings),
        }


# ------------------------------------------------------------------------------------------ the map

# OSErrors that say a file cannot be read as it is (not that the run cannot go on: a full disk, an I/O error).
_UNREADABLE = (PermissionError, IsADirectoryError, NotADirectoryError)


def kind_of(exc: BaseException) -> ErrorKind | None:
    """The kind of a fault a command reports in one line, or None for one it does not know (a bug: its traceback
    shows). Besides this package's errors: a missing file (FileNotFoundError), one it cannot read (permissions, a
    folder), an OSError while running (a full disk), a library's ValueError on a file it cannot parse, out of
    memory (MemoryError, torch's OutOfMemoryError), and a stop signal."""
    from gemma_embed.interrupts import Interrupted

    if isinstance(exc, GemmaEmbedError):
        return exc.error_kind
    if isinstance(exc, (KeyboardInterrupt, Interrupted)):
        return INTERRUPTED
    if isinstance(exc, MemoryError) or _is_out_of_memory(exc):
        return OUT_OF_MEMORY
    if isinstance(exc, FileNotFoundError):
        return MISSING
    if isinstance(exc, (*_UNREADABLE, ValueError)):  # readers' ValueErrors name the file (safetensors, numpy)
        return NOT_OURS
    if isinstance(exc, OSError):
        return RUN_STOPPED
    return None


def _is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError (a RuntimeError), without importing torch where it is not loaded."""
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return oom is not None and isinstance(exc, oom)


def signal_of(exc: BaseException) -> int:
    """The signal that stopped a command (Ctrl-C raises KeyboardInterrupt: SIGINT)."""
    return int(getattr(exc, "signum", None) or signal.SIGINT)


def one_line(exc: BaseException) -> str:
    """The message of a fault as its `error:` line says it: one line, naming the file where the error knows it
    (an OSError's `FILE: No such file or directory`, not `[Errno 2] ...`)."""
    kind = kind_of(exc)
    if kind is INTERRUPTED:
        return f"interrupted by {signal.Signals(signal_of(exc)).name}"
    if isinstance(exc, OSError) and not isinstance(exc, GemmaEmbedError) and exc.strerror:
        where = exc.filename if exc.filename is not None else None
        text = f"{where}: {exc.strerror}" if where is not None else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    text = " ".join(text.split())
    if kind is OUT_OF_MEMORY:
        text = "out of memory" + (f": {text}" if text and text != "MemoryError" else "")
    return text


def exit_status_section(width: int = 100) -> str:
    """docs/exit-codes.md's EXIT STATUS section, from the map (a test keeps the doc equal to it): each code, then
    its kinds with what they mean, indented as a man page's list."""
    import textwrap

    codes: dict[str, list[ErrorKind]] = {}
    for kind in EXIT_STATUS:
        codes.setdefault("128+N" if kind.adds_signal else str(kind.code), []).append(kind)
    lines = ["```", "EXIT STATUS"]
    for code, kinds in codes.items():
        for n, kind in enumerate(kinds):
            lines.append(f"     {code if n == 0 else '':<7}{kind.name}")
            lines += textwrap.wrap(kind.meaning, width, initial_indent=" " * 17, subsequent_indent=" " * 17)
        lines.append("")
    lines[-1] = "```"
    return "\n".join(lines)


def diagnostics_section() -> str:
    """docs/exit-codes.md's DIAGNOSTICS table: each kind's exit code and the shapes of its line."""
    rows = ["| kind | exit | the line on stderr |", "|---|---|---|"]
    for kind in EXIT_STATUS:
        if kind.lines:
            code = "128+N" if kind.adds_signal else str(kind.code)
            shapes = "<br>".join(f"`{line}`" for line in kind.lines)
            rows.append(f"| {kind.name} | {code} | {shapes} |")
    return "\n".join(rows)


def record_kinds_section() -> str:
    """docs/exit-codes.md's table of the kinds an item's record gives (`error` in OUT.errors.jsonl)."""
    rows = ["| `error` | what happened | counts as |", "|---|---|---|"]
    for name, meaning in RECORD_KINDS.items():
        counts = "passed over (a note; a failure with `--on-error stop`)" if name in SKIPS else "a failure"
        rows.append(f"| `{name}` | {meaning} | {counts} |")
    return "\n".join(rows)
