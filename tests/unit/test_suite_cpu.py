"""bench/suite_cpu.py's accounting: each process of a suite's run named by kind, and its CPU counted once, under
the test file it started for."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.suite_cpu import Seen, kind, totals  # noqa: E402

PY = "/usr/bin/python3"
WORKER = f"{PY} -u -c import sys;exec(eval(sys.stdin.readline()))"
SERVER = f"{PY} /repo/tests/warm_cli.py 7"


def _suite() -> list[Seen]:
    test = "tests/cli/test_pipelines.py::test_head (call)"
    return [
        Seen(10, 1, 1.0, 0.5, f"{PY} -m pytest -q -n 2 --dist loadfile", ""),
        Seen(11, 10, 40.0, 4.0, WORKER, ""),
        Seen(12, 11, 4.0, 1.0, SERVER, "tests/integration/test_ray_data.py::test_images (setup)"),
        Seen(13, 12, 0.4, 0.1, SERVER, ""),  # a command the server forked: its argv is the server's
        Seen(14, 11, 0.1, 0.0, f"{PY} /tmp/gemma-embed-tests-0123456789ab/gemma-embed images x", test),
        Seen(15, 11, 5.0, 0.5, f"{PY} /usr/bin/gemma-embed images - --model m", test),
        Seen(16, 1, 0.3, 0.2, "/site-packages/ray/core/src/ray/raylet/raylet --node", ""),
        Seen(17, 16, 7.0, 0.5, "ray::Embed.__init__", "tests/integration/test_ray_data.py::test_images (setup)"),
        Seen(18, 11, 2.0, 0.0, f"{PY} -c import torch", "tests/cli/test_text_limits.py::test_bomb (call)"),
    ]


def test_each_process_is_named_by_its_kind():
    processes = _suite()
    kinds = [kind(p, servers={12}) for p in processes]
    assert kinds == [
        "pytest controller",
        "pytest worker (tests in process)",
        "warm command server",
        "command forked by the warm server",
        "launcher of a forked command",  # the test's EXE
        "command, real start",
        "Ray daemons (GCS, raylet, agents)",
        "Ray workers (tasks, actors)",
        "other processes (python -c helpers, ...)",
    ]


def test_totals_count_each_process_once_by_kind_and_by_the_file_of_its_test():
    processes = _suite()
    by_kind, count, by_file = totals(processes)
    assert sum(by_kind.values()) == sum(p.cpu for p in processes)
    assert by_kind["command forked by the warm server"] == 0.5 and count["warm command server"] == 1
    assert by_kind["command, real start"] == 5.5 and count["command, real start"] == 1
    assert by_file[("tests/cli/test_pipelines.py", "command, real start")] == 5.5
    assert by_file[("tests/integration/test_ray_data.py", "Ray workers (tasks, actors)")] == 7.5
    assert by_file[("-", "pytest worker (tests in process)")] == 44.0
