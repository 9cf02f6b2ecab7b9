"""The suite's file order (tests/suite_order.py): the long files first, each file's tests in their own order."""

from __future__ import annotations

from types import SimpleNamespace

from suite_order import LONGEST_FIRST, TESTS, suite_order


def test_each_long_file_named_is_a_test_file_of_the_suite():
    missing = [name for name in LONGEST_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"renamed or removed: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_the_long_files_come_first_in_their_order_and_the_rest_keep_theirs():
    def item(path: str, name: str):
        return SimpleNamespace(path=TESTS / path, name=name)

    collected = [
        item("unit/test_a.py", "1"),
        item(LONGEST_FIRST[1], "x"),
        item("cli/test_b.py", "2"),
        item(LONGEST_FIRST[0], "y"),
        item(LONGEST_FIRST[1], "z"),
        item("unit/test_a.py", "3"),
    ]
    order = [i.name for i in suite_order(collected)]
    assert order == ["y", "x", "z", "1", "2", "3"]
