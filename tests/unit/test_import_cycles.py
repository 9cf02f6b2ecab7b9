"""No import cycle among gemma_embed's modules, counting imports inside functions too: an import moved into a
function hides a loop from the interpreter at start-up, it does not remove it.

The package's source is read with `ast` (nothing is imported), so this test also sees imports that only run on
some path. The walker itself is checked on a small package written here, with the shapes it must catch.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import gemma_embed

PACKAGE = Path(gemma_embed.__file__).resolve().parent


@dataclass(frozen=True)
class Import:
    """One import statement of `source` that reaches module `target` of the package."""

    source: str
    target: str
    file: Path
    line: int


def module_names(package: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under `package` (a package is named by its __init__.py)."""
    names = {}
    for file in sorted(package.rglob("*.py")):
        parts = file.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return names


def package_imports(package: Path) -> list[Import]:
    """Every import in the package's modules (at any depth: functions, methods, branches) that names one of its
    own modules, relative imports resolved. A module importing one of its own enclosing packages is left out:
    Python runs the package's __init__ first, so that is not a loop."""
    modules = module_names(package)
    found = []
    for name, file in modules.items():
        # The package a relative import starts from: the module's own for an __init__.py, else its parent's.
        here = name.split(".") if file.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), filename=str(file))):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    start = here[: len(here) - node.level + 1]
                    base = ".".join([*start, base] if base else start)
                # `from a.b import c` reaches a.b, and a.b.c too when c is a submodule rather than a name.
                wanted = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in wanted:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    found.append(Import(name, target, file, node.lineno))
    return found


def cycles(imports: list[Import]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan's algorithm, iterative), each sorted."""
    edges: dict[str, set[str]] = {}
    for imp in imports:
        edges.setdefault(imp.source, set()).add(imp.target)
        edges.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return sorted(groups)


def describe(group: list[str], imports: list[Import], root: Path) -> str:
    """A cycle as its module names and each import inside the group (file:line), so the failure says what to cut."""
    members = set(group)
    lines = [" <-> ".join(group)]
    for imp in sorted({(i.source, i.target, i.file, i.line) for i in imports if {i.source, i.target} <= members}):
        source, target, file, line = imp
        lines.append(f"    {source} -> {target}  ({file.relative_to(root)}:{line})")
    return "\n".join(lines)


def test_no_import_cycle_among_package_modules():
    imports = package_imports(PACKAGE)
    found = cycles(imports)
    assert not found, "import cycles among gemma_embed modules:\n" + "\n".join(
        describe(group, imports, PACKAGE.parent) for group in found
    )


def test_walker_finds_cycles_hidden_in_functions_and_relative_imports(tmp_path):
    """The walker on a package with the shapes the real one has had: a loop closed only inside a function, one
    through a relative `from . import`, one through a subpackage's __init__; and edges that are not loops."""
    pkg = tmp_path / "pkg"
    files = {
        "__init__.py": "from pkg import leaf\n",  # the package importing its submodule, which imports it back
        "leaf.py": "import pkg\nVALUE = 1\n",
        # a <-> b: top-level one way, inside a function the other
        "a.py": "from pkg.b import helper\n",
        "b.py": "def helper():\n    from pkg import a\n    return a\n",
        # sub.x <-> sub.y: relative imports, one of them two levels up and back down
        "sub/__init__.py": "",
        "sub/x.py": "from . import y\n",
        "sub/y.py": "from ..sub.x import name\n",
        # c -> deep.__init__ -> deep.inner -> c
        "c.py": "import pkg.deep\n",
        "deep/__init__.py": "from .inner import thing\n",
        "deep/inner.py": "class K:\n    def m(self):\n        import pkg.c\n",
        # no loop: d -> e only, and e names a module that is not in the package
        "d.py": "from pkg.e import f\n",
        "e.py": "import json\nfrom os import path\n",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)

    imports = package_imports(pkg)

    assert cycles(imports) == [
        ["pkg.a", "pkg.b"],
        ["pkg.c", "pkg.deep", "pkg.deep.inner"],
        ["pkg.sub.x", "pkg.sub.y"],
    ]
    report = describe(["pkg.a", "pkg.b"], imports, tmp_path)
    assert "pkg.b -> pkg.a  (pkg/b.py:2)" in report and "pkg.a -> pkg.b  (pkg/a.py:1)" in report
