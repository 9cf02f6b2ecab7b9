"""The order the suite's test files run in: the longest first, so that the workers of `-n 2` finish together."""

from __future__ import annotations

from pathlib import Path

# The test files that run longest on their worker, longest first: seconds each took on its worker in a `-n 2` run
# of the whole suite on the 2-core EPYC (2026-12-06, a 287 s run; in the 492 s run this order was first made from,
# the two Ray files took 84 and 66 s, before their workers forked from the warm server). xdist hands files to the
# workers in the collection's order (`pytest_configure` turns off its own reordering, which puts the files with the
# most tests first and so left the long one- and two-test files for the end: one worker then ran alone for the last
# 49 s). Long files first and the many short ones last let both workers finish together (266 s of tests each in
# the 287 s run). A name missing here only runs later; tests/unit/test_suite_order.py checks that each name is a
# test file.
LONGEST_FIRST = (
    "integration/test_kernel_paths.py",  # 5 fresh processes under forced kernel paths (about 2 min; 2026-12-07)
    "integration/test_ray_data.py",  # 35 s
    "cli/test_warm_cli.py",  # 32 s
    "integration/test_ray_object_storage.py",  # 31 s
    "cli/test_text_limits.py",  # 25 s
    "cli/test_scale.py",  # 19 s
    "cli/test_pipelines.py",  # 18 s
    "integration/test_loading.py",  # 17 s
    "cli/test_start_up_imports.py",  # 16 s
    "integration/test_bf16.py",  # 16 s
    "cli/test_first_contact_names.py",  # 16 s
    "cli/test_remote_outputs.py",  # 15 s
    "cli/test_reliability.py",  # 15 s
    "integration/test_text_tables.py",  # 14 s
    "cli/test_distributed.py",  # 14 s
    "cli/test_remote_secrets.py",  # 13 s
    "integration/test_video.py",  # 13 s
    "cli/test_hub_inputs.py",  # 12 s
    "integration/test_thread_count_bytes.py",  # 11 s
    "serve/test_serve.py",  # 11 s
    "integration/test_images_equivalence.py",  # 8 s
    "cli/test_hostile_inputs.py",  # 8 s
    "integration/test_embeddinggemma2.py",  # 7 s
    "serve/test_serve_overload.py",  # 7 s
    "cli/test_decode_waits_for_room.py",  # 7 s
    "integration/test_decode_peak_estimates.py",  # 7 s
    "integration/test_gpu_check.py",  # 7 s
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
