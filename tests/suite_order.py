"""The order the suite's test files run in: the longest first, so that the workers of `-n 2` finish together."""

from __future__ import annotations

from pathlib import Path

# The test files that run longest on their worker, longest first: seconds each took on its worker in a `-n 2` run
# of the whole suite on the 2-core EPYC (2026-12-06, a 492 s run). xdist hands files to the workers in the
# collection's order (`pytest_configure` turns off its own reordering, which puts the files with the most tests
# first and so left the long one- and two-test files for the end: one worker then ran alone for the last 49 s).
# Long files first and the many short ones last let both workers finish together. A name missing here only runs
# later; tests/unit/test_suite_order.py checks that each name is a test file.
LONGEST_FIRST = (
    "integration/test_ray_object_storage.py",  # 84 s
    "integration/test_ray_data.py",  # 66 s
    "cli/test_reliability.py",  # 42 s
    "cli/test_remote_secrets.py",  # 36 s
    "cli/test_text_limits.py",  # 34 s
    "cli/test_warm_cli.py",  # 34 s
    "integration/test_text_tables.py",  # 30 s
    "cli/test_distributed.py",  # 30 s
    "cli/test_hub_inputs.py",  # 30 s
    "cli/test_concurrent_runs.py",  # 27 s
    "cli/test_scale.py",  # 25 s
    "serve/test_serve.py",  # 23 s
    "integration/test_parquet_sources.py",  # 22 s
    "cli/test_remote_outputs.py",  # 22 s
    "cli/test_start_up_imports.py",  # 20 s
    "integration/test_loading.py",  # 18 s
    "cli/test_hostile_inputs.py",  # 18 s
    "integration/test_video.py",  # 18 s
    "cli/test_pipelines.py",  # 18 s
    "serve/test_serve_overload.py",  # 17 s
    "integration/test_bf16.py",  # 17 s
    "cli/test_first_contact_names.py",  # 15 s
    "integration/test_images_equivalence.py",  # 14 s
    "cli/test_hostile_outputs.py",  # 13 s
    "cli/test_exit_codes.py",  # 13 s
    "integration/test_thread_count_bytes.py",  # 12 s
)
TESTS = Path(__file__).parent


def suite_order(items) -> list:
    """`items` with the files of LONGEST_FIRST first, in its order; the rest after them as collected (a stable
    sort: each file's tests keep their order)."""
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}

    def place(item) -> int:
        path = Path(item.path)
        return rank.get(path.relative_to(TESTS).as_posix() if TESTS in path.parents else "", len(rank))

    return sorted(items, key=place)
