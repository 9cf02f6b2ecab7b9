"""The run summary's `chunking` says in words why each length class runs at its chunk size (issue 24): still
exploring, capped by memory, the fastest measured, or fixed by --batch-size. Timings are given, not measured."""

from __future__ import annotations

from gemma_embed.engine import Engine, chunk_reason
from gemma_embed.tuning import ChunkTuner

LENGTH = 1000  # one length class: "512-1023"


def tuned(rates: dict[int, float], cap: int = 1024) -> dict:
    """The report of a tuner that measured these rates (units of length a second) at these sizes, in order."""
    tuner = ChunkTuner()
    tuner.record(LENGTH, 1, LENGTH, 1.0, cap)  # the run's first chunk: one-off costs, not counted
    for size, rate in rates.items():
        tuner.record(LENGTH, size, size * LENGTH, size * LENGTH / rate, cap)
    return tuner.report()["512-1023"]


def test_a_run_that_ends_while_probing_is_still_exploring():
    entry = tuned({1: 18532.1, 2: 17501.3})  # the case: "chosen": 4 with rates at 1 and 2 only
    assert (entry["chosen"], entry["settled"]) == (4, False)
    assert (
        chunk_reason(entry, 64)
        == "still exploring: the run ended before a full chunk of 4 was measured (fastest so far: 1)"
    )


def test_a_search_stopped_by_the_memory_cap_says_so():
    entry = tuned({1: 100.0, 2: 190.0}, cap=2)
    assert (entry["chosen"], entry["settled"]) == (2, True)
    assert chunk_reason(entry, 2) == (
        "capped by memory: 2 is the largest chunk the memory cap allows, so no larger size was tried"
    )


def test_a_settled_search_names_the_fastest_or_the_smaller_size_as_fast():
    entry = tuned({1: 100.0, 2: 300.0, 4: 200.0, 8: 200.0})
    assert (entry["chosen"], entry["settled"]) == (2, True)
    assert chunk_reason(entry, 1024) == "fastest measured: 2"
    entry = tuned({1: 100.0, 2: 300.0, 4: 310.0, 8: 312.0})
    assert entry["chosen"] == 2
    assert chunk_reason(entry, 1024) == "fastest measured: 2 is within 5% of the fastest (8) and needs less memory"


def test_a_fixed_batch_size_says_so(fake_tower):
    assert Engine(fake_tower(), "language", batch_cap=4).chunking(4) == {
        "fixed": 4,
        "reason": "fixed by --batch-size 4 (under the memory cap)",
    }
