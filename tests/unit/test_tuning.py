"""The chunk tuner keeps the fastest measured size within the memory cap, per length class (timings simulated)."""

from __future__ import annotations

from gemma_embed.tuning import ChunkTuner, length_class

LENGTH = 630  # patches of a 70-token image


def drive(tuner: ChunkTuner, seconds_per_unit, cap: int = 1000, chunks: int = 20, length: int = LENGTH):
    sizes = []
    for _ in range(chunks):
        n = tuner.size(length, cap)
        sizes.append(n)
        tuner.record(length, n, n * length, n * seconds_per_unit(n), cap)
    return sizes


def test_gpu_like_scaling_grows_until_it_stops_paying():
    # Per-unit time falls with batch size until 16, then flattens (a saturated device).
    tuner = ChunkTuner()
    sizes = drive(tuner, lambda n: 1.0 / min(n, 16))
    assert tuner.search(LENGTH).settled == 16
    assert sizes[-1] == 16 and max(sizes) == 64  # probed two sizes past the knee, then settled back


def test_a_gain_that_comes_after_a_flat_doubling_is_found():
    # Measured on a 2-core CPU with AMX, release-size tower in bf16 at 70 tokens: patches/s at 1, 2 and 4 images a
    # chunk (+3% at 2, then +45%); flat beyond.
    rate = {1: 1380.0, 2: 1420.0, 4: 2004.0}
    tuner = ChunkTuner()
    tuner.record(LENGTH, 1, LENGTH, 10.0, 64)  # the warm-up chunk
    drive(tuner, lambda n: LENGTH / rate.get(n, 2004.0), cap=64)
    assert tuner.search(LENGTH).settled == 4


def test_cpu_like_scaling_stays_at_one():
    # Batching makes each unit slower (as measured for realistic towers on 2 cores).
    tuner = ChunkTuner()
    drive(tuner, lambda n: 1.0 + 0.1 * (n - 1))
    assert tuner.search(LENGTH).settled == 1


def test_memory_cap_bounds_probing_and_choice():
    tuner = ChunkTuner()
    sizes = drive(tuner, lambda n: 1.0 / n, cap=6)
    assert max(sizes) <= 6 and tuner.search(LENGTH).settled == 6 and sizes[-1] == 6  # the cap, being fastest


def test_first_chunk_is_warm_up_and_oom_limits():
    tuner = ChunkTuner()
    tuner.record(LENGTH, 1, 100, 100.0, 64)  # a slow first call must not count against size 1
    assert tuner.search(LENGTH).rates == {}
    tuner.record(LENGTH, 1, 100, 1.0, 64)
    tuner.record(LENGTH, 2, 200, 1.0, 64)
    assert tuner.search(LENGTH).probe == 4
    tuner.limit(LENGTH, 4)  # out of memory at 4
    assert tuner.size(LENGTH, 64) == 2
    report = tuner.report()["512-1023"]
    assert report["chosen"] == 2 and set(report["rate_per_s"]) == {"1", "2"}


def gpu_seconds(units: int, length: int) -> float:
    """A simulated GPU that is latency-bound below 10080 patches per forward and throughput-bound above: one
    1120-token image (10080 patches) fills it, 70-token frames (630 patches) need 16 per forward to."""
    return max(0.05, units * length / 200_000)


def test_long_and_short_buckets_settle_on_their_own_sizes():
    long, short = 10080, 630  # 1120-token images and 70-token video frames, in alternating groups
    assert length_class(long) != length_class(short)
    tuner = ChunkTuner()
    sizes: dict[int, list[int]] = {long: [], short: []}
    for _ in range(12):
        for length in (long, short):
            for _chunk in range(2):
                n = tuner.size(length, cap=256)
                sizes[length].append(n)
                tuner.record(length, n, n * length, gpu_seconds(n, length), cap=256)
    assert tuner.search(long).settled == 1  # batching long images buys nothing once one fills the device
    assert tuner.search(short).settled == 16  # short frames want the device filled: 16 x 630 patches
    assert sizes[long][-1] == 1 and sizes[short][-1] == 16
    assert set(tuner.report()) == {"512-1023", "8192-16383"}

    # An out-of-memory error at 16 short frames limits short frames only.
    tuner.limit(short, 16)
    assert tuner.size(short, cap=256) == 8
    tuner.limit(long, 2)
    assert tuner.size(long, cap=256) == 1 and tuner.size(short, cap=256) == 8
    # A length within a factor of two shares its class's search (594-patch frames of another aspect ratio).
    assert tuner.size(594, cap=256) == 8
