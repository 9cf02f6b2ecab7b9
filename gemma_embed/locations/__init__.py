"""The one opener of locations: every byte the tool reads from a user's input (media files, tar shards, parquet,
JSON lines, text files, path cells, a dataset's folder) and every byte it writes (outputs, parts, the lock, the
errors file, the search index, exports, the search page) goes through here. No other module opens, lists, stats,
creates, renames or removes a user's file (tests/unit/test_location_calls.py reads the source to hold that).

- `location(value)` -> `Location` (location.py): a string with its protocol, resolved to (filesystem, path) as
  `fsspec.core.url_to_fs` does; path arithmetic that keeps the protocol; fsspec's operations bound to it (`info`,
  `exists`, `isdir`, `isfile`, `ls`, `walk`, `glob`, `open`, `cat_file`, `rm_file`, `rm`, `makedirs`) and the
  tool's (`regular_file`, `open_input`, `input_by_name`, `facts`, `fetch`, `atomic_write`, `temp_path`,
  `own_folder`, `open_lock`, `holds_files`, `probe_folder`). A local location is a `LocalLocation`, the
  `pathlib.Path` callers always had; any other protocol a `RemoteLocation`.
- `Files` (base.py): what a filesystem provides; `LocalFiles` (local.py), with the safety of every file the tool
  creates and every input it opens; `RemoteFiles` (remote.py), fsspec's filesystem of s3://, gs://, hf://, http://
  and https:// (each client an optional extra: `CLIENTS`), with ranged reads, whole-object uploads and local copies
  for libraries that open by name.

A location is a small picklable value (two strings): Ray workers and decode threads are sent locations, never
bytes, and open them themselves. Libraries that open files by name (Pillow, PyAV, soundfile, pyarrow, numpy's
memmap, safetensors, faiss, datasets) get `Location.local_path()` of a local location (they read a real file
faster than a Python file object: PyAV and soundfile especially), `input_by_name()` where the file must be the one
checked (a search index and the files it maps), or `temp_path()` to write; of a remote one, `local_path()` is a
local copy (outputs, indexes), and readers that take a file object (pyarrow, tarfile, the decoders' bytes) get
`Location.open()`'s seekable file instead. A computation's own spill (dedup's pooled item sums) is a
`scratch_file()`: anonymous, in the system's temporary folder, gone when closed.

What is not a user's location, and stays outside the seam, with why (`OUTSIDE_THE_SEAM`): model checkpoints (the
hub's cache or a checkpoint folder, read by transformers and safetensors through models/loading.py), the system's
own files (/proc, cgroup limits, /dev/null, the process's stderr and stdin), and the option table's spelling of
paths (config.py).
"""

from __future__ import annotations

import os

from gemma_embed.locations.base import FetchFailed, Files, NotPlain, NotRegularFile, TooLarge
from gemma_embed.locations.local import scratch_file
from gemma_embed.locations.location import (
    LocalLocation,
    Location,
    RemoteLocation,
    UnsupportedLocation,
    filesystem_for,
    location,
    split_protocol,
)
from gemma_embed.locations.remote import CLIENTS

__all__ = [
    "OUTSIDE_THE_SEAM",
    "CLIENTS",
    "FetchFailed",
    "Files",
    "LocalLocation",
    "Location",
    "NotPlain",
    "NotRegularFile",
    "RemoteLocation",
    "TooLarge",
    "UnsupportedLocation",
    "filesystem_for",
    "location",
    "regular_file",
    "scratch_file",
    "split_protocol",
]


def regular_file(where: str | os.PathLike | Location, what: str = "a media file") -> os.stat_result:
    """`Location.regular_file` of any location value: the file's stat after the regular-file refusal."""
    return location(where).regular_file(what)


# Modules (or module:function) that open files the seam does not cover, and why. Everything else in the package
# reaches files through a Location.
OUTSIDE_THE_SEAM = {
    "locations/": "the seam itself",
    "models/": "checkpoints: the hub cache or a checkpoint folder (transformers, safetensors, tokenizer files)",
    "config.py": "the option table: model ids that look like folders, and how RunConfig spells paths",
    "cpu_threads.py": "the system's /proc/stat",
    "memory/readings.py": "the system's cgroup memory limits under /sys/fs/cgroup",
    "device.py": "the system's /proc/cpuinfo",
    "cpu_kernels.py": "the system's /proc/cpuinfo (its first processor's flags, before torch loads)",
    "numerics.py": "torch's own CPU library (MKL's mode and thread calls, through ctypes)",
    "capture.py": "the process's own stderr (fd 2), duplicated",
    "progress.py": "/dev/null over the process's own descriptors",
    "sources/files.py:process_stdin": "the process's standard input, unbuffered",
}
