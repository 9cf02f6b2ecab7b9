"""What the tool writes at a name the user gives (an embed command's -o, export's -o, search's --html), and the one
rule for those names, which every command and the library apply (`destination`):

- the name ends with its format's suffix: `-o out.npy` would otherwise hold safetensors bytes, which `np.load`
  refuses with a pickle error, and `export --to npy -o x.parquet` npy bytes that pyarrow cannot read;
- `-` is standard output, for the formats that stream (a parquet or JSON-lines export: written front to back);
  any other refuses it in one line saying why, rather than creating a file named `-`;
- an embedding output named as a folder, with a trailing slash (`-o s3://bucket/run/`), is the output of -o's
  default name in that folder (`output_location`), to write and to read (search, index, inspect, export).

Pure: names only. Whether the folder exists and whether an existing file may be replaced is the store's one check
(`store.check_destination`), which calls this first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gemma_embed.errors import UsageError
from gemma_embed.locations.location import Location, location

STDOUT = "-"  # the name that means standard output
# The embedding output a folder holds when -o (or a reader's argument) names the folder, with a trailing slash:
# -o's own default name.
FOLDER_OUTPUT = "embeddings.safetensors"


class WrongName(UsageError, ValueError):
    """A name that contradicts what is written there (`FILE: REASON`): a usage error, and a ValueError for the
    option checks that expect one."""


@dataclass(frozen=True)
class Written:
    """One kind of file the tool writes where the user says: what it is, the suffix its name ends with, and why it
    cannot go to standard output (empty: it streams there)."""

    what: str
    suffix: str
    not_streamed: str = ""
    other_suffixes: tuple[str, ...] = ()  # also accepted (a page may be .htm)

    @property
    def streams(self) -> bool:
        return not self.not_streamed

    def takes(self, name: str) -> bool:
        return any(name.endswith(s) and len(name) > len(s) for s in (self.suffix, *self.other_suffixes))


EMBEDDINGS = Written(
    "an embedding output",
    ".safetensors",
    "it is saved in parts beside its name and renamed into place when done, so that an interrupted run can be "
    "resumed; write a file, then stream it with gemma-embed export FILE --to jsonl -o -",
)
PARQUET = Written("a parquet export", ".parquet")
JSONL = Written("a JSON-lines export", ".jsonl")
NPY = Written(
    "an npy export",
    ".npy",
    "it is several files (OUT.npy, OUT.keys.txt, and OUT.offsets.npy for items of several rows); a parquet or "
    "JSON-lines export streams there",
)
PAGE = Written(
    "a search page",
    ".html",
    "standard output carries the results (--jsonl: one JSON record per hit)",
    other_suffixes=(".htm",),
)
EXPORTS = {"parquet": PARQUET, "npy": NPY, "jsonl": JSONL}  # export's formats (config.ExportFormat's values)
# Suffixes a name given for another kind is taken apart at, for the name to suggest (`out.index.json` ->
# `out.safetensors`): the longer ones first.
KNOWN_SUFFIXES = (".index.json", ".keys.txt", ".offsets.npy", ".safetensors", ".parquet", ".jsonl", ".npy", ".html")


def output_location(where: str | os.PathLike | Location) -> Location:
    """An embedding output as the user names it, to write or to read: a name that ends with `/` is a folder, and
    the output is the one in it under -o's default name (FOLDER_OUTPUT: `s3://bucket/run/` names
    `s3://bucket/run/embeddings.safetensors`), so the folder holds its shards, their index, the parts of an
    unfinished run, the errors file and the search index. Any other name is `location(where)`, checked later
    (`destination`): `-o run` without the slash stays the mistake it was, a folder where a file was meant."""
    if isinstance(where, str) and where.endswith("/"):
        return location(where) / FOLDER_OUTPUT
    return location(where)


def is_stdout(where: str | os.PathLike | Location | None) -> bool:
    return where is not None and str(where) == STDOUT


def destination(where: str | os.PathLike | Location, kind: Written) -> Location | None:
    """The location `where` names, checked against `kind`: None for standard output (`-`, where `kind` streams);
    `WrongName` when the name contradicts the format or `-` is given for a format that cannot stream."""
    if is_stdout(where):
        if kind.streams:
            return None
        raise WrongName(f"{STDOUT}: {kind.what} cannot go to standard output: {kind.not_streamed}")
    place = location(where)
    if not kind.takes(place.name):
        stem = place.name
        for known in KNOWN_SUFFIXES:
            if stem.endswith(known) and len(stem) > len(known):
                stem = stem.removesuffix(known)
                break
        found = f", not {place.suffix}" if place.suffix else ""
        raise WrongName(f"{where}: {kind.what} is a {kind.suffix} file{found}; name it {stem}{kind.suffix}")
    return place
