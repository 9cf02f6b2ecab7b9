"""What a run returns: counts, failures, timing, chunking and where the output went.

The pipeline fills one `RunResult` as items finish; the reporter renders it; the CLI maps it to an exit code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gemma_embed.errors import ItemError
from gemma_embed.locations import Location

NAMED_KEYS = 3  # keys a closing note names of each kind passed over


@dataclass
class RunResult:
    ok: int = 0  # items written (including those reused from earlier work)
    failed: int = 0
    resumed: int = 0  # items reused from parts or an earlier output, not recomputed
    kept: int = 0  # --resume: items of the existing output this input does not name, kept
    pruned: int = 0  # --resume --prune: such items dropped
    rows: int = 0  # rows computed by this run
    skipped: int = 0  # files in walked folders whose extension the walk does not take (never silent)
    with_warnings: int = 0  # items whose record carries library warnings (capture.py)
    failures: list[dict] = field(default_factory=list)  # one record per failed item (key, stage, error, message)
    # Items passed over, by kind (errors.SKIPS: blank texts, long ones with --long-text skip), and texts cut at
    # --max-text-bytes ("cut"); `named` keeps each kind's first keys for the closing notes.
    passed_over: dict[str, int] = field(default_factory=dict)
    cut: int = 0
    named: dict[str, list[str]] = field(default_factory=dict)
    _entries: dict[str, int] = field(default_factory=dict)  # named entries of each kind, the first NAMED_KEYS kept
    output: Location | None = None  # the file written (or the index of shards); None when interrupted
    items: int = 0  # items in this run's output
    interrupted: str | None = None  # the signal's name when the run was stopped by one
    signum: int | None = None
    stopped_at_first_failure: bool = False  # --on-error stop ended the run
    chunking: dict = field(default_factory=dict)
    cpu_threads: dict | None = None  # on a CPU: the forwards' thread count and why (cpu_threads.CpuThreads)
    oom_backoffs: int = 0
    peak_device_memory: int | None = None  # bytes, CUDA only
    device: str = ""
    dtype: str = ""
    dtype_reason: str = ""  # why this compute dtype (--dtype auto's choice, or the option)
    started: float = field(default_factory=time.monotonic)
    seconds: float = 0.0

    # ------------------------------------------------------------------------------------------- updates
    def item_done(self, rows: int, resumed: bool = False, warnings: list[str] | None = None) -> None:
        self.ok += 1
        self.resumed += resumed
        self.rows += rows
        self.with_warnings += bool(warnings)

    def item_passed_over(self, error: ItemError) -> None:
        self.passed_over[error.error_type] = self.passed_over.get(error.error_type, 0) + error.count
        self._name(error.error_type, f"{error.key} ({error.message})")

    def text_cut(self, key: str) -> None:
        self.cut += 1
        self._name("cut", key)

    def _name(self, kind: str, key: str) -> None:
        self._entries[kind] = self._entries.get(kind, 0) + 1
        keys = self.named.setdefault(kind, [])
        if len(keys) < NAMED_KEYS:
            keys.append(key)

    def passed_over_notes(self, text_limit: int) -> list[str]:
        """The closing notes on what was passed over or cut, each naming the first keys (their files)."""
        from gemma_embed.sizes import human_bytes

        limit = human_bytes(text_limit)
        words = {
            "blank": "blank text{s} (nothing to embed)",
            "too-long": f"text{{s}} over --max-text-bytes {limit} (--long-text skip)",
        }
        notes = []
        for kind, count in self.passed_over.items():
            what = words.get(kind, kind + " item{s}").format(s="s" if count != 1 else "")
            notes.append(f"passed over {count} {what}: {self._keys(kind)}")
        if self.cut:
            plural = "s" if self.cut != 1 else ""
            notes.append(
                f"cut {self.cut} text{plural} at --max-text-bytes {limit} (--long-text skip passes them over; "
                f"cut_from_bytes in their metadata): {self._keys('cut')}"
            )
        return notes

    def _keys(self, kind: str) -> str:
        keys = self.named.get(kind, [])
        entries = self._entries.get(kind, 0)  # a run of blank lines is one entry
        more = f" and {entries - len(keys)} more" if entries > len(keys) else ""
        return ", ".join(keys) + more

    def item_failed(self, error: ItemError) -> None:
        self.failed += 1
        self.with_warnings += bool(error.warnings)
        self.failures.append(error.as_record())

    def finish(self) -> RunResult:
        self.seconds = time.monotonic() - self.started
        return self

    # ------------------------------------------------------------------------------------------- reading
    @property
    def elapsed(self) -> float:
        return self.seconds or (time.monotonic() - self.started)

    @property
    def computed(self) -> int:
        """Items this run embedded itself (not reused from earlier work)."""
        return self.ok - self.resumed

    @property
    def items_per_s(self) -> float | None:
        """The rate of the items this run computed: reused items cost nothing and would inflate it."""
        return round(self.computed / self.seconds, 3) if self.seconds > 0 else None

    def summary(self) -> dict:
        """The JSON summary record (the last line on stdout)."""
        record = {
            "type": "summary",
            "ok": self.ok,
            "failed": self.failed,
            "resumed": self.resumed,
            "kept": self.kept,
            "pruned": self.pruned,
            "skipped": self.skipped,
            "with_warnings": self.with_warnings,
            "rows": self.rows,
            "seconds": round(self.seconds, 3),
            "items_per_s": self.items_per_s,
            "output": str(self.output) if self.output else None,
            "items": self.items,
            "failures": self.failures,
            "passed_over": dict(self.passed_over),
            "cut": self.cut,
        }
        if self.interrupted is not None:
            record["interrupted"] = self.interrupted
            return record
        record.update(
            peak_device_memory=self.peak_device_memory,
            oom_backoffs=self.oom_backoffs,
            chunking=self.chunking,
            cpu_threads=self.cpu_threads,
            device=self.device,
            dtype=self.dtype,
            dtype_reason=self.dtype_reason,
        )
        return record
