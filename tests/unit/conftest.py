"""tests/unit holds tests of the package's parts alone: no checkpoint, no subprocess (the whole folder runs in
under a minute on 2 cores). Collection stops on a test here that asks for a checkpoint fixture or a module that
imports subprocess: such a test belongs in tests/integration or tests/cli."""

from __future__ import annotations

import ast

import pytest

CHECKPOINT_FIXTURES = {"gemma4_dir", "reference_model", "reference_processor"}


def _imports_subprocess(path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name == "subprocess" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "subprocess":
            return True
    return False


def pytest_collection_modifyitems(config, items):
    here = config.rootpath / "tests" / "unit"
    checked: dict = {}
    for item in items:
        if here not in item.path.parents:
            continue
        wanted = CHECKPOINT_FIXTURES & set(getattr(item, "fixturenames", ()))
        if wanted:
            raise pytest.UsageError(f"{item.nodeid} uses {', '.join(sorted(wanted))}: it belongs in tests/integration")
        if checked.setdefault(item.path, _imports_subprocess(item.path)):
            raise pytest.UsageError(f"{item.path.name} imports subprocess: it belongs in tests/integration, tests/cli")
