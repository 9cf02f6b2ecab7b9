"""The writer: collects finished items, flushes them to parts, and writes the final output in a stable order.

Finished items are flushed to part files (`OUT.parts/part-NNNNNN.safetensors`, each written atomically) every
`flush_every` items and at least every `flush_seconds`, so a killed run loses at most that much.

With `resume`, everything already saved (an existing output, single file or shards, and the parts of an
interrupted run) is indexed by key and content hash:
- an item of this run whose key and content are saved is reused, not recomputed;
- an item whose content is saved under another key (the same files reached by another path) is reused too;
- an item of the existing output that this run's input does not name is kept (`kept`), unless `prune`, which
  drops it (`pruned`). Nothing is dropped silently.
The final order: the existing output's items in their order (each replaced by this run's version when this
run has one), then this run's other items in input order. Without an existing output that is input order.

Each part records a CRC-32 of every item's rows (`rows_crc32`); --resume checks them and computes again, with
a warning naming the part, any item whose rows changed on disk. Anything in the way that is not what it should
be (a folder named like a part, a part or output with broken metadata) stops the run with one line naming it.
One writer per output: the caller holds the output's lock (`lock.py`) for the writer's whole life.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gemma_embed.errors import UsageError
from gemma_embed.locations import Location, NotPlain, location
from gemma_embed.locations.written import EMBEDDINGS, destination
from gemma_embed.store import tensors_file
from gemma_embed.store.layout import (
    HEADER_CAP,
    DamagedFile,
    Where,
    check_output_folder,
    index_path,
    output_files,
    parts_folder,
    plan_shards,
    refuse_existing,
    shard_path,
    write_index,
)
from gemma_embed.store.tensors_file import FileRows, file_metadata, json_list, row_checksum

if TYPE_CHECKING:  # torch comes with the writer (EmbeddingWriter): `check_output_path` answers without it
    import torch

# Settings that change an item's rows: work saved under other values cannot be resumed into this run.
FINGERPRINT = ("model", "revision", "modality", "space", "pooling", "compute_dtype", "preprocessing", "dtype", "dim")
# Item metadata that describes the file rather than its content: what a reused item takes from its own file.
FILE_FACTS = ("path", "bytes", "mtime", "sha256")
PART_NAME = re.compile(r"part-(\d{6,})\.safetensors")
# How to get past a file in the way of --resume.
RESUME_FIX = "remove it or run with --overwrite"


@dataclass(frozen=True)
class Saved:
    """An item's rows in a file written earlier (a part, or an existing output)."""

    file: Location
    position: int
    meta: dict


@dataclass(frozen=True)
class ReuseIndex:
    """Which saved key an item's content can take its rows from (`EmbeddingWriter.find_reusable`). It reads the
    writer's own tables, so it sees items saved later in the run; pickled, it carries only each key's hash."""

    saved: dict[str, Saved]
    by_content: dict[str, str]

    def __call__(self, key: str, sha256: str) -> str | None:
        entry = self.saved.get(key)
        if entry is not None and entry.meta.get("sha256") == sha256:
            return key
        return self.by_content.get(sha256)

    def __reduce__(self) -> tuple:
        hashes = {k: Saved(s.file, s.position, {"sha256": s.meta.get("sha256")}) for k, s in self.saved.items()}
        return (ReuseIndex, (hashes, dict(self.by_content)))


class EmbeddingWriter:
    def __init__(
        self,
        path: Where,
        header: dict[str, str],
        output_dtype: str = "float32",
        flush_every: int | None = None,
        flush_seconds: float = 60.0,
        resume: bool = False,
        prune: bool = False,
        shard_size: int | None = None,
        warn: Callable[[str], None] | None = None,
    ):
        self.path = location(path)
        self.parts = parts_folder(self.path)
        from gemma_embed.device import DTYPES, dtype_name

        self.dtype = DTYPES[str(output_dtype)]
        self.header = {**header, "dtype": dtype_name(self.dtype)}
        self.flush_every = flush_every
        self.flush_seconds = flush_seconds
        self.prune = prune
        self.shard_size = shard_size
        self.pending: dict[str, tuple[dict, torch.Tensor]] = {}  # finished, not yet in a part
        self.order: dict[str, int] = {}  # this run's items: key -> input position
        self.saved: dict[str, Saved] = {}  # key -> where its rows are (latest wins)
        self.by_content: dict[str, str] = {}  # sha256 -> a key whose saved rows have that content
        self.base: list[str] = []  # the existing output's keys, in its order (--resume)
        self.part_count = 0
        self.last_flush = time.monotonic()
        self.kept = 0  # existing items this run's input did not name, kept (set by close)
        self.pruned = 0  # ... dropped with --prune
        self.items_written = 0
        self.warn = warn or (lambda message: None)
        if resume:
            self._index_previous_work()
        elif self.parts.lexists():
            self.parts.rm(recursive=True)  # --overwrite: start over (a link there is removed, never followed)

    # ------------------------------------------------------------------------------------------ resume
    def _index_previous_work(self) -> None:
        previous, parts = previous_work(self.path)
        in_parts = set(parts)
        for file in previous + parts:
            with ExitStack() as stack:
                saved, checksums = _open_saved(file, file in in_parts, stack)
                meta = saved.metadata
                for field in FINGERPRINT:
                    if meta.get(field, "") != self.header.get(field, ""):
                        raise UsageError(
                            f"{file}: made with {field}={meta.get(field)!r}, this run has "
                            f"{self.header.get(field)!r}; use the same settings or --overwrite"
                        )
                damaged = 0
                keys = []
                for position, (old_key, old_item) in enumerate(zip(saved.keys, saved.items, strict=True)):
                    key, item = renumbered(old_key, old_item)
                    keys.append(key)
                    if checksums is not None and row_checksum(saved.rows(position)) != checksums[position]:
                        damaged += 1  # not remembered: computed again
                        continue
                    self._remember(key, Saved(file, position, item))
                if damaged:
                    self.warn(
                        f"{file}: the rows of {damaged} of its {len(saved.keys)} items do not match their checksum "
                        f"(changed on disk); they are computed again"
                    )
                if file not in in_parts:
                    self.base += keys
        self.part_count = max((_part_number(p) for p in parts), default=-1) + 1

    def _remember(self, key: str, saved: Saved) -> None:
        self.saved[key] = saved
        if saved.meta.get("sha256"):
            self.by_content.setdefault(saved.meta["sha256"], key)

    def find_reusable(self, key: str, sha256: str) -> str | None:
        """The key whose saved rows this content already has: the same key when it is unchanged, else any key
        with the same content hash; None when the item must be computed."""
        return self.reuse_index(key, sha256)

    @property
    def reuse_index(self) -> ReuseIndex:
        """`find_reusable` as a value (the pipeline's --resume lookup): live in this process, a snapshot of
        what is saved now when pickled (a Ray run's decode tasks get it)."""
        return ReuseIndex(self.saved, self.by_content)

    def reuse(self, key: str, position: int, source_key: str, facts: dict) -> None:
        """This run's item `key` takes the saved rows of `source_key` (same content); its file facts (path,
        size, mtime, hash) are its own."""
        source = self.saved[source_key]
        if source_key != key:
            meta = {**source.meta, **{k: v for k, v in facts.items() if k in FILE_FACTS}}
            self._remember(key, Saved(source.file, source.position, meta))
        self.order[key] = position

    # ------------------------------------------------------------------------------------------- writing
    def add(self, key: str, rows: torch.Tensor, meta: dict, position: int = 0) -> None:
        rows = rows.detach().to("cpu", self.dtype).contiguous()
        if rows.dim() != 2:
            raise ValueError(f"{key}: rows must be 2-D, got shape {tuple(rows.shape)}")
        self.order[key] = position
        self.pending[key] = ({**meta, "rows": int(rows.shape[0])}, rows)
        due = self.flush_every and len(self.pending) >= self.flush_every
        if due or time.monotonic() - self.last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        """Move pending items into a new part file (atomically)."""
        self.last_flush = time.monotonic()
        if not self.pending:
            return
        part = self.parts / f"part-{self.part_count:06d}.safetensors"
        keys = list(self.pending)
        metas = [meta for meta, _ in self.pending.values()]
        rows = [tensor for _, tensor in self.pending.values()]
        with _own_parts_folder(self.parts, create=True):
            tensors_file.write_embedding_file(
                part,
                file_metadata(self.header, self.dtype, keys, metas, [row_checksum(r) for r in rows]),
                [r.shape[0] for r in rows],
                rows[0].shape[1],
                self.dtype,
                rows,
                own_folder=True,  # opened without following a link: a folder swapped for one after the check too
            )
        self.part_count += 1
        for position, (key, meta) in enumerate(zip(keys, metas, strict=True)):
            self._remember(key, Saved(part, position, meta))
        self.pending.clear()

    @property
    def saved_in_parts(self) -> int:
        return sum(1 for s in self.saved.values() if s.file.parent == self.parts)

    def final_order(self) -> list[str]:
        """The output's keys: the existing output's (replaced, kept or pruned), then this run's new ones."""
        keys = []
        for key in self.base:
            if key in self.order or not self.prune:
                keys.append(key)
        ours = set(self.base)
        keys += sorted((k for k in self.order if k not in ours), key=self.order.__getitem__)
        return keys

    def positions(self) -> dict[str, int]:
        """Each output key's place in this run's input; kept items (not in the input) come first, in order."""
        kept = [k for k in self.final_order() if k not in self.order]
        return {**{k: i - len(kept) for i, k in enumerate(kept)}, **self.order}

    def close(self) -> Location:
        """Write the output: one file, or shards plus an index when `shard_size` (or the metadata's size) calls
        for them, streaming every item's rows; then remove what it replaces and the parts."""
        keys = self.final_order()
        not_in_input = sum(1 for k in self.base if k not in self.order)
        self.kept, self.pruned = (0, not_in_input) if self.prune else (not_in_input, 0)
        self.items_written = len(keys)
        metas = [self.pending[k][0] if k in self.pending else self.saved[k].meta for k in keys]
        sizes = [len(json.dumps(k)) + len(json.dumps(m)) + 2 for k, m in zip(keys, metas, strict=True)]
        ranges = plan_shards(sizes, self.shard_size, HEADER_CAP)
        previous = output_files(self.path)
        with ExitStack() as stack:
            opened: dict[Location, FileRows] = {}

            def rows_of(key: str) -> torch.Tensor:
                if key in self.pending:
                    return self.pending[key][1]
                saved = self.saved[key]
                if saved.file not in opened:
                    opened[saved.file] = FileRows(saved.file, stack)
                return opened[saved.file].rows(saved.position)

            width = self._width(keys, rows_of)

            def write(path: Location, span: range) -> Location:
                span_keys = [keys[i] for i in span]
                span_metas = [metas[i] for i in span]
                return tensors_file.write_embedding_file(
                    path,
                    file_metadata(self.header, self.dtype, span_keys, span_metas),
                    [int(m["rows"]) for m in span_metas],
                    width,
                    self.dtype,
                    (rows_of(k) for k in span_keys),
                )

            if len(ranges) == 1:
                written = [write(self.path, ranges[0])]
            else:
                written = [write(shard_path(self.path, n), span) for n, span in enumerate(ranges)]
        if len(ranges) > 1:
            if self.path.exists():
                self.path.rm_file()  # an older single-file output: the index below replaces it
            write_index(self.path, written, [(keys[i], n) for n, span in enumerate(ranges) for i in span])
        for stale in set(previous) - set(written):
            stale.rm_file(missing_ok=True)
        if len(ranges) == 1:
            index_path(self.path).rm_file(missing_ok=True)
        if self.parts.exists():
            self.parts.rm(recursive=True)
        return self.path if len(ranges) == 1 else index_path(self.path)

    def _width(self, keys: list[str], rows_of: Callable[[str], torch.Tensor]) -> int:
        """Row width of the output (0 when it holds no item)."""
        for tensor in (t for _, t in self.pending.values()):
            return int(tensor.shape[1])
        return int(rows_of(keys[0]).shape[1]) if keys else 0


# ---------------------------------------------------------------------------------------- previous work


def previous_work(output: Where) -> tuple[list[Location], list[Location]]:
    """What --resume reads: the existing output's files, and the parts of an interrupted run in order.
    Anything in `.parts` named like a part must be one."""
    parts = parts_folder(output)
    files: list[Location] = []
    if parts.lexists():
        with _own_parts_folder(parts, create=False):
            pass
        files = parts.glob("part-*.safetensors")
        for file in files:
            if not PART_NAME.fullmatch(file.name):
                raise DamagedFile(file, "a name other than part-NNNNNN.safetensors", "part file", RESUME_FIX)
            if file.islink():
                raise DamagedFile(file, f"a symbolic link to {file.realpath()}; not followed", "part file", RESUME_FIX)
    try:
        previous = output_files(output)
    except DamagedFile as exc:
        raise exc.told(fix=RESUME_FIX) from None
    return previous, sorted(files, key=_part_number)


@contextmanager
def _own_parts_folder(parts: Location, create: bool) -> Iterator[None]:
    """The parts folder is the output's own: a plain folder of this user's, never a link (resume would read and
    write parts wherever it led), checked on entry and by every write in the block; anything else is one line
    naming it (`DamagedFile`, exit 2; not the full disk's "free space and run again")."""
    try:
        parts.own_folder(create)
        yield
    except NotPlain as exc:
        raise DamagedFile(parts, str(exc), "parts folder", RESUME_FIX) from None


def renumbered(key: str, item: dict) -> tuple[str, dict]:
    """A line of a text file as this version keys it, from an output written when lines counted from 1 (key
    `FILE:LINE`, metadata `line`): `FILE:ROW` with `row` = LINE - 1, as every item counts now. So --resume over such
    an output reuses its lines under their new keys instead of keeping them beside this run's (readers show an old
    output as it is). Any other item is itself."""
    line = item.get("line")
    if type(line) is not int or "row" in item or not key.endswith(f":{line}"):
        return key, item
    meta = {name: value for name, value in item.items() if name != "line"}
    return f"{key.removesuffix(str(line))}{line - 1}", {**meta, "row": line - 1}


def check_output_path(path: Where, overwrite: bool, resume: bool = False) -> None:
    """Fail before any work if the run would clobber something, or the output folder is not writable: the rule of
    every file the tool writes at a name given (`layout.check_destination`: a `.safetensors` name, no `-`, an
    existing output replaced only with overwrite), with --resume as the other way past an existing one. It imports
    no torch (nor does this module): the command line checks before torch loads, so its usage error comes at once."""
    if overwrite and resume:
        raise UsageError(
            "--overwrite and --resume contradict each other: --overwrite starts the output over, --resume finishes "
            "or adds to it; give one"
        )
    if location(path).isdir():  # said before the name's suffix: `-o photos/` names the mistake itself
        raise UsageError(f"{path}: output path is a folder")
    named = destination(path, EMBEDDINGS)
    if named is None:  # never: an embedding output does not stream
        raise AssertionError("an embedding output has a file name")
    path = named
    parts = parts_folder(path)
    if resume:  # before a model loads: a damaged part or output is one line now, not minutes later
        check_resumable(path)
    else:
        if parts.exists() and not overwrite:
            raise UsageError(
                f"{parts}: an unfinished run left parts here; pass --resume to finish it or --overwrite to start over"
            )
        refuse_existing(path, overwrite, " or --resume to add to it", exists=bool(output_files(path)))
    check_output_folder(path)


def check_resumable(output: Where) -> None:
    """Before a model is loaded: every file --resume will read opens as what it should be (rows are checked
    against their checksums later, by the writer)."""
    previous, parts = previous_work(output)
    for file in previous:
        with ExitStack() as stack:
            _open_saved(file, False, stack)
    for file in parts:
        with ExitStack() as stack:
            _open_saved(file, True, stack)


def _part_number(part: Location) -> int:
    match = PART_NAME.fullmatch(part.name)
    if match is None:
        raise ValueError(f"{part}: not a part name")
    return int(match[1])


def _open_saved(file: Location, is_part: bool, stack: ExitStack) -> tuple[FileRows, list[str] | None]:
    """A file of earlier work, checked, with its checksums of each item's rows (parts only; None for a part
    written before parts had them)."""
    try:
        saved = FileRows(file, stack)
        if not is_part or "rows_crc32" not in saved.metadata:
            return saved, None
        checksums = json_list(file, saved.metadata, "rows_crc32", str)
        if len(checksums) != len(saved.keys):
            raise DamagedFile(file, f"{len(checksums)} row checksums for {len(saved.keys)} items")
        return saved, checksums
    except DamagedFile as exc:
        raise exc.told("part file" if is_part else None, RESUME_FIX) from None
