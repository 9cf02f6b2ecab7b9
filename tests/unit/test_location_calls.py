"""No module opens a user's location directly: every file the package opens, lists, stats, creates, renames or
removes goes through the seam (gemma_embed/locations), outside the exemptions it lists with their reasons
(`OUTSIDE_THE_SEAM`: checkpoints, the system's own files, the process's own descriptors). The source is read as an
AST, so a new call site anywhere fails here before it ships.

What is refused: the builtin `open`, `io.open`, the `os` and `os.path` functions that touch files, `shutil`'s file
operations, `tempfile`, `glob`, `gzip.open` and `tarfile.open` on a name (over a file object the seam opened they
are streams, not openers: `fileobj=`), pathlib imported or a `Path` built, and the pathlib methods that have no
fsspec name (`is_dir`, `unlink`, `iterdir`, `stat`, ...). A `Location`'s own operations carry fsspec's names
(`isdir`, `rm_file`, `ls`, `info`), so the two cannot be mistaken. Libraries that open by name (safetensors, numpy,
pyarrow, faiss, Pillow, PyAV, soundfile, datasets) are handed `Location.local_path()` or `temp_path()` names."""

from __future__ import annotations

import ast
from pathlib import Path

import gemma_embed
from gemma_embed.locations import OUTSIDE_THE_SEAM

PACKAGE = Path(gemma_embed.__file__).parent
OS_FILES = {
    "open", "fdopen", "stat", "lstat", "scandir", "listdir", "walk", "fwalk", "replace", "rename", "renames",
    "unlink", "remove", "mkdir", "makedirs", "rmdir", "removedirs", "link", "symlink", "readlink", "truncate",
    "chmod", "chown", "utime", "access", "mkfifo", "mknod",
}  # fmt: skip
OS_PATH_FILES = {
    "exists", "lexists", "isdir", "isfile", "islink", "ismount", "getsize", "getmtime", "getatime", "getctime",
    "realpath", "samefile",
}  # fmt: skip
SHUTIL_FILES = {
    "rmtree", "copy", "copy2", "copyfile", "copyfileobj", "copytree", "move", "copymode", "copystat", "chown",
    "make_archive", "unpack_archive", "disk_usage",
}  # fmt: skip
OPENER_MODULES = {"io": {"open", "FileIO"}, "codecs": {"open"}, "builtins": {"open"}, "zipfile": {"ZipFile"}}
STREAM_MODULES = {"gzip": {"open", "GzipFile"}, "bz2": {"open", "BZ2File"}, "lzma": {"open"}, "tarfile": {"open"}}
FORBIDDEN_IMPORTS = {"pathlib", "tempfile", "glob"}
# pathlib's methods that touch files and have no fsspec name (a Location's operations use fsspec's), with the most
# positional arguments pathlib's take (a call with more is some other object's method: `registry.resolve(a, b)`).
PATH_METHODS = {
    **dict.fromkeys(("is_dir", "is_file", "is_symlink", "is_fifo", "is_socket", "is_block_device", "is_char_device",
                     "is_mount", "iterdir", "unlink", "rmdir", "resolve", "stat", "lstat", "readlink"), 0),
    **dict.fromkeys(("rglob", "mkdir", "touch", "samefile", "symlink_to", "hardlink_to", "chmod", "lchmod",
                     "rename", "write_text"), 1),
}  # fmt: skip


def _exempt(relative: str, functions: list[str]) -> bool:
    for key in OUTSIDE_THE_SEAM:
        where, _, function = key.partition(":")
        inside = relative.startswith(where) if where.endswith("/") else relative == where
        if inside and (not function or function in functions):
            return True
    return False


def location_violations(source: str, relative: str) -> list[str]:
    """Every place in one module's source that reaches a file without the seam (the exemptions aside)."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def functions_of(node) -> list[str]:
        names = []
        while node in parents:
            node = parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.append(node.name)
        return names

    found = []

    def refuse(node, what: str) -> None:
        if not _exempt(relative, functions_of(node)):
            found.append(f"{relative}:{node.lineno}: {what}")

    def dotted(node) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            head = dotted(node.value)
            return f"{head}.{node.attr}" if head else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_IMPORTS:
                    refuse(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            banned = {
                "pathlib": None,
                "tempfile": None,
                "glob": None,
                "os": OS_FILES,
                "os.path": OS_PATH_FILES,
                "shutil": SHUTIL_FILES,
                **OPENER_MODULES,
                **STREAM_MODULES,
            }
            if module in banned:
                names = banned[module]
                for alias in node.names:
                    if names is None or alias.name in names:
                        refuse(node, f"imports {alias.name} from {module}")
        elif isinstance(node, ast.Call):
            name = dotted(node.func)
            if name is None:
                continue
            head, _, last = name.rpartition(".")
            keywords = {k.arg for k in node.keywords}
            if name == "open":
                refuse(node, "builtin open()")
            elif head == "os" and last in OS_FILES:
                refuse(node, f"{name}()")
            elif head == "os.path" and last in OS_PATH_FILES:
                refuse(node, f"{name}()")
            elif head == "shutil" and last in SHUTIL_FILES:
                refuse(node, f"{name}()")
            elif head in OPENER_MODULES and last in OPENER_MODULES[head]:
                refuse(node, f"{name}()")
            elif head in STREAM_MODULES and last in STREAM_MODULES[head] and "fileobj" not in keywords:
                refuse(node, f"{name}() on a name (give it the seam's file: fileobj=)")
            elif last in {"Path", "PurePath", "PosixPath", "PurePosixPath"} and head in {"", "pathlib"}:
                refuse(node, f"{name}(...) built")
            elif isinstance(node.func, ast.Attribute) and len(node.args) <= PATH_METHODS.get(last, -1):
                refuse(node, f".{last}() (pathlib's; the seam's Location has fsspec's names)")
    return found


def test_no_module_opens_a_users_location_outside_the_seam():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        violations += location_violations(path.read_text(encoding="utf-8"), relative)
    assert violations == []


def test_every_exemption_names_a_place_that_exists_and_says_why():
    for key, reason in OUTSIDE_THE_SEAM.items():
        where, _, function = key.partition(":")
        assert (PACKAGE / where).exists(), key
        assert len(reason.split()) >= 3, key
        if function:
            tree = ast.parse((PACKAGE / where).read_text(encoding="utf-8"))
            assert function in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, key


def test_the_check_catches_each_kind_of_call_site():
    snippets = {
        "with open(p, 'rb') as fh:\n    pass": 1,
        "import io\nio.open(p)": 1,
        "import os\nos.stat(p)\nos.replace(a, b)\nos.unlink(p)\nos.walk(p)\nos.makedirs(p)": 5,
        "import os\nos.path.exists(p) or os.path.isdir(p) or os.path.getsize(p)": 3,
        "from os.path import realpath": 1,
        "import shutil\nshutil.rmtree(p)": 1,
        "import gzip\ngzip.open(p, 'rb')": 1,
        "import tarfile\ntarfile.open(p)": 1,
        "import pathlib": 1,
        "from pathlib import Path\nPath(p)": 2,
        "x.is_dir() or x.unlink() or x.iterdir() or x.stat() or x.resolve() or x.mkdir(exist_ok=True)": 6,
        "import tempfile": 1,
        "from shutil import move": 1,
    }
    for source, count in snippets.items():
        assert len(location_violations(source, "x.py")) == count, source
    allowed = (
        "import gzip, tarfile, os\n"
        "tarfile.open(fileobj=fh, mode='r:')\n"
        "gzip.GzipFile(fileobj=raw, mode='rb')\n"
        "loc.isdir() or loc.rm_file() or loc.ls() or loc.info() or loc.open('rb') or loc.exists()\n"
        "os.pread(fd, 64, 0)\nos.path.join(a, b)\ntext.replace('a', 'b')\nmatch.group(1)\nregistry.resolve(c, d)\n"
    )
    assert location_violations(allowed, "x.py") == []
    assert location_violations("open(p)", "models/loading.py") == []  # exempt: checkpoints
    assert location_violations("def process_stdin():\n    open(0)", "sources/files.py") == []
    assert location_violations("def other():\n    open(0)", "sources/files.py") != []
