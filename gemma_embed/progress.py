"""The one reporting object: rich progress on stderr, JSON on stdout, silence when asked.

The library never prints anywhere else. Stderr is for people (a live bar only when it is a terminal); stdout is
for programs: one JSON record per item with `--jsonl`, and one final JSON summary line (onto a terminal only with
`--jsonl`: a person there reads the summary line on stderr). Every line on
stderr goes through `terminal.printable` (a name's control characters shown as escapes, never acted on, never
read as rich markup); the JSON keeps names exact.

A reader that goes away (`| head -1`) is not a failure of the work: once stdout is closed the records stop, the
run finishes and writes its output, and a note on stderr says so. A closed stderr silences the people's lines.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import IO

from gemma_embed.errors import ItemError
from gemma_embed.redact import redact
from gemma_embed.result import RunResult
from gemma_embed.sizes import human_bytes
from gemma_embed.terminal import printable


def silence(stream: IO[str]) -> None:
    """Point a closed stream's file descriptor at /dev/null, so the interpreter's own flush at exit does not
    fail on it again (it would print "Exception ignored ... BrokenPipeError" and exit 120)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class Reporter:
    """Renders a run's events and its `RunResult`; it counts nothing itself.

    `emit_json=False` keeps stdout silent too (the library's default: a Python caller gets the RunResult).
    """

    def __init__(
        self,
        quiet: bool = False,
        jsonl: bool = False,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
        live: bool | None = None,
        debug: bool = False,
        emit_json: bool = True,
    ):
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.quiet = quiet
        self.jsonl = jsonl and emit_json
        self.emit_json = emit_json
        self.debug = debug
        self.live = (not quiet) and (self.stderr.isatty() if live is None else live)
        self.result: RunResult | None = None
        self.stdout_closed = False  # the reader of stdout went away (| head): no more records
        self.stderr_closed = False
        self._progress = None
        self._task = None
        self._status = ""
        self._loading_shown = False
        self._loading_since: float | None = None  # when the `loading` line was shown

    @classmethod
    def silent(cls) -> Reporter:
        """Nothing on stderr or stdout: for library callers, who read the returned RunResult."""
        return cls(quiet=True, emit_json=False)

    # ------------------------------------------------------------------------------------------ lifecycle
    def loading(self, model: str) -> None:
        """`loading MODEL ...` on a terminal (not with -q), once: the first line a person sees, while torch,
        transformers and the weights load (seconds on a small machine) before the progress bar starts. The command
        line calls it before it imports torch; the run calls it again, a no-op then, for library callers."""
        if self.live and not self._loading_shown:
            self._loading_shown = True
            self._loading_since = time.monotonic()
            self._err(f"loading {model} ...")

    def loaded(self, device: str, dtype: str) -> None:
        """`loaded in X s on DEVICE (DTYPE); encoding ...` on a terminal, once the weights are in: the line between
        `loading` and the progress bar (the seconds before it are mostly torch's and transformers' imports)."""
        if self.live and self._loading_since is not None:
            seconds, self._loading_since = time.monotonic() - self._loading_since, None
            self._err(f"loaded in {seconds:.1f} s on {device} ({dtype}); encoding ...")

    def start(self, description: str, result: RunResult, total: int | None = None) -> None:
        self.result = result
        if not self.live:
            return
        from rich.console import Console
        from rich.markup import escape
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(file=self.stderr),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(escape(printable(description)), total=total, rate="", status="")

    def set_total(self, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=total)

    def _advance(self) -> None:
        if self._progress is None or self.result is None:
            return
        result = self.result
        elapsed = max(1e-9, result.elapsed)
        done = result.ok + result.failed
        status = self._status + (f" [red]{result.failed} failed[/]" if result.failed else "")
        self._progress.update(self._task, completed=done, rate=f"{done / elapsed:.1f} items/s", status=status)

    def _err(self, line: str) -> None:
        """One line for people, its control characters escaped (a newline in a name cannot start a line)."""
        if self.quiet or self.stderr_closed:
            return
        line = printable(line)
        try:
            if self._progress is not None:
                self._progress.console.print(line, markup=False, highlight=False, emoji=False)
            else:
                print(line, file=self.stderr, flush=True)
        # A reader gone (BrokenPipeError), a terminal hung up (EIO: the run saves what is done on its SIGHUP and
        # goes on to exit cleanly), or the stream object itself closed (ValueError): stop writing to it.
        except (OSError, ValueError):
            self.stderr_closed = True
            self._stop_live()
            silence(self.stderr)

    def _out(self, record: dict) -> None:
        if not self.emit_json or self.stdout_closed:
            return
        try:
            print(redact(json.dumps(record, ensure_ascii=True)), file=self.stdout, flush=True)
        except (OSError, ValueError):
            self.stdout_closed = True
            silence(self.stdout)

    # ------------------------------------------------------------------------------------------- events
    def chunk_planned(self, plan, count: int) -> None:
        self._status = f"bucket {plan.length} x{count}, chunk cap {plan.chunk}"
        self._advance()

    def note(self, message: str) -> None:
        self._err(f"note: {message}")

    def warning(self, message: str) -> None:
        self._err(f"warning: {message}")

    def item_done(self, key: str, rows: int, resumed: bool = False, warnings: list[str] | None = None) -> None:
        if self.jsonl:
            status = "resumed" if resumed else "ok"
            self._out({"type": "item", "key": key, "status": status, "rows": rows, "warnings": list(warnings or [])})
        self._advance()

    def library_message(self, key: str | None, message: str) -> None:
        """What a library said (capture.py): attached to the item's record; shown live only with --debug."""
        if self.debug:
            self._err(f"warning: {key}: {message}" if key else f"warning: {message}")

    def send_stderr_to(self, stream: IO[str]) -> None:
        """Write the tool's own lines to `stream` from now on (capture.py points fd 2 elsewhere for a run)."""
        self.stderr = stream
        if self._progress is not None:
            self._progress.console.file = stream

    def item_passed_over(self, error: ItemError) -> None:
        """A blank text, or a long one with --long-text skip: no line of its own (a closing note names them)."""
        if self.jsonl:
            self._out({"type": "item", "status": "skipped", **error.as_record()})
        self._advance()

    def item_failed(self, error: ItemError) -> None:
        record = error.as_record()
        self._err(f"error: {error.key}: {error.message}")
        if self.debug and error.traceback_text:
            # Indented under its error line: the tool's own lines start at the margin, so a newline inside a name
            # in the traceback cannot forge one.
            for line in error.traceback_text.rstrip().split("\n"):
                self._err(f"  {line}")
        if self.jsonl:
            self._out({"type": "item", "status": "failed", **record})
        self._advance()

    def show_plan(self, plan: dict) -> None:
        """A table for people on stderr, the plan as one JSON record on stdout."""
        if not self.quiet:
            from rich.console import Console

            print_plan(plan, Console(file=self.stderr))
            for failure in plan["failures"]:
                self._err(f"error: {failure['key']}: {failure['message']}")
        self._summary(plan)

    def _summary(self, record: dict) -> None:
        """A command's closing record (the summary, the plan): for programs, so onto a terminal only with --jsonl
        (`terminal.shows_summary`)."""
        from gemma_embed.terminal import shows_summary

        if shows_summary(self.stdout, asked=self.jsonl):
            self._out(record)

    def _stop_live(self) -> None:
        if self._progress is not None:
            progress, self._progress = self._progress, None
            try:
                progress.stop()
            except (OSError, ValueError):
                pass

    def finish(self, result: RunResult) -> None:
        """The closing line for people on stderr and the JSON summary on stdout."""
        self._stop_live()
        summary = result.summary()
        if self.stdout_closed and result.output:
            self.note(f"stdout closed; {result.items} items written to {result.output}")
        if not self.quiet:
            skipped = f", {result.skipped} skipped" if result.skipped else ""
            reused = f" ({result.resumed} reused)" if result.resumed else ""
            rate = f"{result.items_per_s or 0:.2f} items/s" if result.computed else "nothing computed"
            line = f"{result.ok} ok{reused}, {result.failed} failed{skipped} in {result.seconds:.1f} s ({rate})"
            if result.peak_device_memory is not None:
                line += f", peak device memory {human_bytes(result.peak_device_memory)}"
            if result.output:
                line += f" -> {result.output}"
            self._err(line)
        self._summary(summary)


def plan_phrases(plan: dict) -> tuple[list[str], list[str]]:
    """What `plan` says around its table, in phrases that are never broken: (heading, caption)."""
    heading = [
        f"{plan['modality']}: {plan['items']} items, {plan['units']} units on {plan['device']} ({plan['dtype']})",
        f"free {human_bytes(plan['free_memory'])} of {human_bytes(plan['total_memory'])}, "
        f"budget {human_bytes(plan['budget'])}",
    ]
    caption = ["chunk = the memory cap", plan["chunking"], f"dtype: {plan.get('dtype_reason', '')}"]
    host = plan.get("host") or {}
    if host.get("encode") is not None:
        caption.append(
            f"host budget {human_bytes(host['budget'])} = model {human_bytes(host['model'])} + decode "
            f"{human_bytes(host['decode'])} + encode {human_bytes(host['encode'])}"
        )
    return heading, caption


def pack_phrases(phrases: list[str], width: int) -> list[str]:
    """Phrases joined by "; " into lines of at most `width` characters, a line breaking only between phrases
    (a phrase longer than the width has a line to itself)."""
    lines: list[str] = []
    for phrase in phrases:
        if lines and len(lines[-1]) + 2 + len(phrase) <= width:
            lines[-1] += "; " + phrase
        else:
            lines.append(phrase)
    return lines


def print_plan(plan: dict, console) -> None:
    """The plan for people on a rich `console`: its heading, the buckets' table, its caption. Heading and caption
    take the console's width (not the table's), broken only between phrases."""
    from rich.table import Table
    from rich.text import Text

    heading, caption = plan_phrases(plan)
    table = Table()
    for column in ("length", "units", "cost per unit", "chunk"):
        table.add_column(column, justify="right")
    for b in plan["buckets"]:
        table.add_row(str(b["length"]), str(b["units"]), human_bytes(b["cost_per_unit"]), str(b["chunk"]))
    for line in pack_phrases([printable(p) for p in heading], console.width):
        console.print(Text(line), soft_wrap=True)
    console.print(table)
    for line in pack_phrases([printable(p) for p in caption], console.width):
        console.print(Text(line), soft_wrap=True)
