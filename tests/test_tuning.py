"""The chunk tuner keeps the fastest measured size within the memory cap (timings simulated)."""

from __future__ import annotations

from gemma_embed.tuning import ChunkTuner


def drive(tuner: ChunkTuner, seconds_per_unit, cap: int = 1000, chunks: int = 20, work_per_unit: int = 100):
    sizes = []
    for _ in range(chunks):
        n = tuner.size(cap)
        sizes.append(n)
        tuner.record(n, n * work_per_unit, n * seconds_per_unit(n), cap)
    return sizes


def test_gpu_like_scaling_grows_until_it_stops_paying():
    # Per-unit time falls with batch size until 16, then flattens (a saturated device).
    tuner = ChunkTuner()
    sizes = drive(tuner, lambda n: 1.0 / min(n, 16))
    assert tuner.settled == 16
    assert sizes[-1] == 16 and max(sizes) == 32  # probed one size past the knee, then settled back


def test_cpu_like_scaling_stays_at_one():
    # Batching makes each unit slower (as measured for realistic towers on 2 cores).
    tuner = ChunkTuner()
    drive(tuner, lambda n: 1.0 + 0.1 * (n - 1))
    assert tuner.settled == 1


def test_memory_cap_bounds_probing_and_choice():
    tuner = ChunkTuner()
    sizes = drive(tuner, lambda n: 1.0 / n, cap=6)
    assert max(sizes) <= 6 and tuner.settled == 6 and sizes[-1] == 6  # the cap itself, being fastest


def test_first_chunk_is_warm_up_and_oom_limits():
    tuner = ChunkTuner()
    tuner.record(1, 100, 100.0, 64)  # a slow first call must not count against size 1
    assert tuner.rates == {}
    tuner.record(1, 100, 1.0, 64)
    tuner.record(2, 200, 1.0, 64)
    assert tuner.probe == 4
    tuner.limit(4)  # out of memory at 4
    assert tuner.size(64) == 2
    report = tuner.report()
    assert report["chosen"] == 2 and set(report["patches_per_s"]) == {"1", "2"}
