"""Find sources: everything the input names -> ordered, de-duplicated items with stable keys.

Every kind of input yields the same `Source` (a key, a file path or the item's own bytes, a content hash for
--resume, and what its collection says about it), so the decoders never know where bytes came from:

- `files.py`: files as given, folders walked for the extensions the command's decoders read, lists of paths on
  stdin, brace patterns (`shards/{00000..00999}.tar`);
- `tar.py`: tar shards (webdataset's layout), streamed member by member: `SHARD:MEMBER`;
- `table.py`: rows of `.parquet` and JSON-lines files and of a Hugging Face dataset (`--dataset`), by `--column`:
  `FILE:ROW`;
- `expand.py`: which found file is a collection, for every command (the text command's other files are lines).

For the media commands a `.tar` file is read as a shard, a `.parquet` or JSON-lines file as a table (folder walks
take tables when `--column` is given); for text, tables too. A `--dataset`'s rows come after the paths' items.
Positions number the items in input order (they order the output and deal items to distributed slices).
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import IO

from gemma_embed.config import Modality
from gemma_embed.errors import MissingFile, UsageError
from gemma_embed.interrupts import responsive
from gemma_embed.locations import location
from gemma_embed.sources import table
from gemma_embed.sources.base import Collection, SkippedMember, Source
from gemma_embed.sources.expand import Collections
from gemma_embed.sources.files import (
    expand_braces,
    extensions,
    find_files,
    is_brace_pattern,
    is_glob_pattern,
    parse_extensions,
    read_path_list,
)

__all__ = [
    "Collection",
    "Source",
    "check_given_paths",
    "count_sources",
    "expand_braces",
    "extensions",
    "iter_sources",
    "no_input_message",
    "parse_extensions",
    "read_path_list",
    "require_input",
    "skipped_note",
]


def _items(
    inputs: Iterable[str],
    modality: str,
    stdin: IO | None,
    null_separated: bool,
    ext: Iterable[str] | None,
    skipped: Counter | None,
    collection: Collection,
    read: bool = True,
) -> Iterator[Source]:
    inputs = list(inputs)
    wanted = frozenset(ext) if ext else extensions(modality)
    collections = Collections.open(inputs, modality, collection, wanted, skipped, read)
    for found in find_files(inputs, wanted | collections.walked(), stdin, null_separated, skipped):
        yield from collections.expand(found)
    yield from collections.dataset_rows()


def iter_sources(
    inputs: Iterable[str],
    modality: str,
    stdin: IO | None = None,
    null_separated: bool = False,
    ext: Iterable[str] | None = None,
    skipped: Counter | None = None,
    collection: Collection | None = None,
) -> Iterator[Source]:
    """Yield each item once, in input order, numbered by `position`; folders are walked recursively in sorted
    order.

    Keys: the path as given for files, the path relative to the folder for folder contents (prefixed with the
    folder as given when that name is already taken); `SHARD:MEMBER` for tar members, `FILE:ROW` for parquet rows
    (or the --key-column's value), `DATASET:SPLIT:ROW` for a dataset's. Folders are walked for `ext` (default: the
    modality's `extensions`) and for the collections the command reads, whether given as arguments or listed on
    stdin; files named explicitly are taken whatever their extension. Files (and shard members) passed over are
    counted in `skipped` by extension. What cannot be an item (a missing path, a member or row that cannot be
    read) is yielded with an error so the run reports it and goes on; a run that cannot start (a parquet file
    given without the columns, a dataset that cannot be opened) raises UsageError before the first item.

    A run's stop signal ends a wait for the next item however long its read blocks (`interrupts.responsive`).
    """
    items = _items(inputs, modality, stdin, null_separated, ext, skipped, collection or Collection())
    return responsive(replace(source, position=position) for position, source in enumerate(items))


def count_sources(
    inputs: Iterable[str], modality: str, ext: Iterable[str] | None = None, collection: Collection | None = None
) -> int | None:
    """How many items `iter_sources` yields for these inputs, read cheaply (file names, tar headers, parquet
    footers, a saved dataset's row count), for a progress total; None when it cannot be known without reading
    everything (a streamed dataset) or the inputs cannot be read. Never stdin."""
    collection = collection or Collection()
    try:
        total = sum(1 for _ in _items(inputs, modality, None, False, ext, None, collection, read=False))
        if collection.dataset:
            if not location(collection.dataset).expanduser().exists():
                return None  # a hub dataset: counting it would ask the network again
            opened = table.open_dataset(collection)
            if opened.num_rows is None:
                return None
            total += opened.num_rows
    except Exception:  # noqa: BLE001 - a progress total is never worth a failure
        return None
    return total


def check_given_paths(
    inputs: Iterable[str], modality: str | None = None, ext: Iterable[str] | None = None, plan: bool = False
) -> None:
    """A path named on the command line that does not exist, or on a protocol the tool cannot open, is a usage error,
    before anything loads (paths read from stdin are data: each missing one is a failed item). With `modality`, so
    is a file named whose extension is another command's and not this one's (`gemma-embed images clip.mp4`): the
    line names the command that takes it, as the folder walk's does (`plan`: `plan --modality`)."""
    for given in inputs:
        if given == "-" or is_brace_pattern(given) or is_glob_pattern(given):
            continue
        path = location(given)
        if path.islink() and not path.exists():
            raise MissingFile(f"{given}: dangling symbolic link (its target does not exist)")
        if not path.exists():
            hint = f"; {_stdin_hint(given)}" if modality == "text" and _reads_as_text(given) else ""
            raise MissingFile(f"{given}: no such file or directory{hint}")
        if modality is not None:
            _check_kind(given, modality, ext, plan)


def _reads_as_text(given: str) -> bool:
    """Whether a missing path given to `text` reads as the text itself (`gemma-embed text "a cat"`) rather than a
    file name: it holds a space, or has neither a folder nor a suffix."""
    return any(c.isspace() for c in given) or ("/" not in given and not location(given).suffix)


def _stdin_hint(given: str) -> str:
    """How to embed a text given on the command line: on stdin, as a file of one line."""
    quoted = f'"{given}"' if not set(given) & set('"$`\\!') else shlex.quote(given)
    return f"to embed this text, give it on stdin: echo {quoted} | gemma-embed text -"


def _check_kind(given: str, modality: str, ext: Iterable[str] | None, plan: bool) -> None:
    """UsageError for a file given by name whose extension the command's walk does not take (nor --ext) and
    another command's does; a folder, a collection or an unknown extension passes (its items say what they are)."""
    path = location(given)
    suffix = path.suffix.lower()
    if not suffix or suffix in (frozenset(ext) if ext else extensions(modality)):
        return
    other = other_command(modality, Counter({suffix: 1}))
    if other is None or path.isdir():
        return
    noun = Modality(modality).singular
    article = "an" if noun[0] in "aeiou" else "a"
    raise UsageError(f"{given}: not {article} {noun} file; {right_command(other, plan)}")


def right_command(other: str, plan: bool = False) -> str:
    """The hint for files of another command: `these are video files: gemma-embed video PATH...`."""
    command = f"plan --modality {other}" if plan else other
    return f"these are {Modality(other).singular} files: gemma-embed {command} PATH..."


def require_input(
    sources: Iterator[Source],
    inputs: Iterable[str],
    modality: str,
    ext: Iterable[str] | None,
    skipped: Counter,
    dataset: str | None = None,
    plan: bool = False,
) -> Iterator[Source]:
    """The same sources, lazily; UsageError before the first if there is none at all (a wrong folder or the
    wrong command: `gemma-embed images videos/` must not succeed with an empty output). `plan`: the message's
    hint names `plan --modality` rather than a command."""
    first = next(sources, None)
    if first is None:
        raise UsageError(no_input_message(inputs, modality, ext, skipped, dataset, plan))

    def chained() -> Iterator[Source]:
        yield first
        yield from sources

    return chained()


def no_input_message(
    inputs: Iterable[str],
    modality: str,
    ext: Iterable[str] | None,
    skipped: Counter,
    dataset: str | None = None,
    plan: bool = False,
) -> str:
    """One line: where it looked, for what, and what it passed over; when every file passed over is another
    command's (`gemma-embed images videos/`), which command takes them."""
    inputs = list(inputs)
    if not inputs and not dataset:
        return "nothing to embed: give files, folders, tar shards or - (a list on stdin), or --dataset NAME"
    given = [i for i in inputs if i != "-"]
    where = ", ".join(given[:3]) + (f" and {len(given) - 3} more" if len(given) > 3 else "")
    if "-" in inputs:
        where = (where + " and " if where else "") + "the list on stdin"
    if dataset:
        where = (where + " and " if where else "") + f"the dataset {dataset}"
    wanted = sorted(ext) if ext else sorted(extensions(modality))
    listing = f"gemma-embed {modality} --list-extensions"
    shown = " ".join(wanted[:12]) + (f" ... ({len(wanted)} extensions: {listing})" if len(wanted) > 12 else "")
    noun = Modality(modality).singular
    line = f"no {noun} files found in {where or 'the arguments'}: looked for {shown}"
    files, members = _by_extension_and_kind(skipped)
    if files:
        passed = ", ".join(f"{e} x{n}" for e, n in files.most_common(5))
        more = "" if len(files) <= 5 else f", {len(files) - 5} more kinds"
        line += f"; passed over {files.total()} files ({passed}{more})"
        other = other_command(modality, files) if not ext else None
        if other is None:
            line += "; --ext chooses the extensions"
        else:
            line += f"; {right_command(other, plan)}"
    if members:
        line += f"; {_members_note(members)}"
    return line


def other_command(modality: str, passed_over: Counter) -> str | None:
    """The first other command (images, video, audio, text) whose folder walk takes every extension in
    `passed_over`; None when there is none."""
    found = set(passed_over)
    for other in Modality:
        if other != modality and found and found <= extensions(other):
            return other.value
    return None


def skipped_note(modality: str, skipped: Counter) -> str | None:
    """A note for the end of a run: the files the walk (or a tar shard's members) passed over, by extension,
    and the members of shards that are no regular files, by kind (one line for both)."""
    files, members = _by_extension_and_kind(skipped)
    parts = []
    if files:
        kinds = ", ".join(f"{e} x{n}" for e, n in files.most_common(5))
        more = "" if len(files) <= 5 else f", {len(files) - 5} more kinds"
        total = files.total()
        parts.append(
            f"skipped {total} file{'s' if total != 1 else ''} the folder walk does not take for {modality} "
            f"({kinds}{more}); --ext chooses the extensions"
        )
    if members:
        parts.append(_members_note(members))
    return "; ".join(parts) or None


def _by_extension_and_kind(skipped: Counter) -> tuple[Counter, Counter]:
    """(files passed over, by extension; shard members that are no files, by SkippedMember) of `skipped`."""
    files, members = Counter(), Counter()
    for key, count in skipped.items():
        (members if isinstance(key, SkippedMember) else files)[key] += count
    return files, members


def _members_note(members: Counter) -> str:
    """`shard.tar: skipped 2 members: 1 symlink, 1 fifo`, or for several shards the kinds over all of them and
    the first shards by name with their counts."""
    kinds, shards = Counter(), Counter()
    for (shard, kind), count in members.items():
        kinds[kind] += count
        shards[shard] += count
    total = kinds.total()
    listed = ", ".join(f"{n} {_plural(kind, n)}" for kind, n in kinds.most_common())
    if len(shards) == 1:
        return f"{next(iter(shards))}: skipped {total} member{'s' if total != 1 else ''}: {listed}"
    named = ", ".join(f"{shard} {n}" for shard, n in list(shards.items())[:3])
    more = f", {len(shards) - 3} more shards" if len(shards) > 3 else ""
    return f"skipped {total} tar members that are no regular files: {listed} (in {named}{more})"


def _plural(kind: str, count: int) -> str:
    if count == 1:
        return kind
    return kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
