"""The engine in plain numbers, on a weightless tower and a fake CUDA device: planning from the memory a device
can really reuse after an out-of-memory error, the cost scale, the run's peak, and which errors end a run."""

from __future__ import annotations

import sys

import torch

from gemma_embed.device import DeviceOps
from gemma_embed.engine import Engine, is_fatal_device_error, is_out_of_memory
from gemma_embed.memory import readings
from gemma_embed.memory.planner import BudgetSpec
from gemma_embed.models.base import Unit

# ------------------------------------------------------------------------------------------- a fake device

GIB = 2**30


class FakeCuda(DeviceOps):
    """A CUDA device with a caching allocator, in plain numbers: tensors hold `allocated` bytes, the allocator has
    `reserved` bytes from the driver (it keeps freed blocks cached until `release_cache`), the driver has
    `total - reserved` free. Asking for more than the driver has raises torch.OutOfMemoryError."""

    def __init__(self, total: int, weights: int):
        super().__init__(torch.device("cpu"))
        self.total, self.reserved, self.allocated_bytes, self.peak_bytes = total, weights, weights, weights
        self.releases: list[tuple] = []  # (exception being handled, allocated bytes) at each cache release

    def allocate(self, size: int) -> FakeBlock:
        if self.allocated_bytes + size > self.reserved:
            grow = self.allocated_bytes + size - self.reserved
            if grow > self.total - self.reserved:
                raise torch.OutOfMemoryError(f"fake CUDA out of memory: tried to allocate {size} bytes")
            self.reserved += grow
        self.allocated_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.allocated_bytes)
        return FakeBlock(self, size)

    def memory(self) -> tuple[int, int]:
        return readings.cuda_free(self.total - self.reserved, self.reserved, self.allocated_bytes), self.total

    def allocated(self) -> int:
        return self.allocated_bytes

    def peak(self) -> int:
        return self.peak_bytes

    def reset_peak(self) -> None:
        self.peak_bytes = self.allocated_bytes

    def release_cache(self) -> None:
        self.releases.append((sys.exc_info()[1], self.allocated_bytes))
        self.reserved = self.allocated_bytes


class FakeBlock:
    """Device memory a live tensor holds: freed when the last reference to it goes (as a CUDA tensor's is)."""

    def __init__(self, device: FakeCuda, size: int):
        self.device, self.size = device, size

    def __del__(self):
        self.device.allocated_bytes -= self.size


def fake_units(count: int, length: int = 1) -> list[Unit]:
    return [Unit(inputs={}, length=length, rows=1) for _ in range(count)]


def run_group(engine: Engine, units: list[Unit]) -> dict:
    """Each unit's rows (or failure) by index, as the engine hands them over chunk by chunk."""
    (group,) = engine.grouping()([u.length for u in units])
    results = {}
    engine.run(units, group, [f"u{i}" for i in range(len(units))], results.__setitem__)
    return results


def test_after_an_oom_later_buckets_plan_from_reusable_memory_and_the_cache_is_released_outside_the_handler(
    fake_tower,
):
    fake = FakeCuda(total=80 * GIB, weights=1 * GIB)
    tower = fake_tower(device_memory=fake, actual=2.5)
    engine = Engine(tower, "language", BudgetSpec(fraction_of_total=1.0), batch_cap=64, device_ops=fake)

    # 40 units planned at the model's 1 GiB each fit 79 GiB, but really need 100 GiB: out of memory once, with
    # 50 GiB of activations alive in the failed forward's frames.
    results = run_group(engine, fake_units(40))
    assert [len(c) for c in tower.calls] == [40, 20, 20] and engine.backoffs == 1
    assert all(isinstance(r, torch.Tensor) for r in results.values()) and len(results) == 40
    # The cache was released outside the except block, once the failed chunk's activations were freed.
    assert fake.releases == [(None, 1 * GIB)]

    # The allocator now caches 50 GiB that no tensor uses; the driver reports 29 GiB free.
    assert (fake.reserved, fake.allocated_bytes) == (51 * GIB, 1 * GIB)
    plan = engine.plan(1)
    assert plan.free == 79 * GIB  # 29 free at the driver + 50 cached and reusable, not the driver's 29
    # The second chunk of 20 measured 2.5x the model (the first chunk is never learned from): 79 / 2.5 = 31.
    assert engine.cost_scale == 2.5
    assert plan.cost_per_unit == int(2.5 * GIB) and plan.chunk == 31
    tower.calls.clear()
    run_group(engine, fake_units(31))
    assert [len(c) for c in tower.calls] == [31] and engine.backoffs == 1  # fits at once: no second out-of-memory error


def test_cost_scale_skips_first_chunk_persistent_memory_and_unmeasurable_chunks(fake_tower):
    fake = FakeCuda(total=80 * GIB, weights=1 * GIB)
    # Every chunk really needs 1.5x the model, and the first call also leaves a 4 GiB workspace allocated.
    tower = fake_tower(device_memory=fake, actual=1.5, workspace=4 * GIB)
    engine = Engine(tower, "language", BudgetSpec(fraction_of_total=1.0), batch_cap=4, device_ops=fake)
    run_group(engine, fake_units(4))  # the first chunk: workspace + 6 GiB, never learned from
    assert engine.cost_scale == 1.0
    tiny = [Unit(inputs={}, length=0, rows=1)]  # modelled at 0 bytes: too small to measure against overheads
    run_group(engine, tiny)
    assert engine.cost_scale == 1.0
    run_group(engine, fake_units(4))
    assert engine.cost_scale == 1.5  # 6 GiB transient over 4 GiB modelled; the 4 GiB workspace is not counted


def test_peak_device_memory_is_the_runs_peak_not_the_last_chunks(fake_tower):
    fake = FakeCuda(total=80 * GIB, weights=1 * GIB)
    tower = fake_tower(device_memory=fake)
    engine = Engine(tower, "language", BudgetSpec(fraction_of_total=1.0), batch_cap=64, device_ops=fake)
    run_group(engine, fake_units(2))
    run_group(engine, fake_units(30))  # the big one: 1 + 30 GiB
    run_group(engine, fake_units(3))
    assert fake.peak() == 4 * GIB  # what the device's own counter says after the last chunk
    assert engine.peak_device_memory() == 31 * GIB
    assert Engine(fake_tower(), "language").peak_device_memory() is None  # the CPU keeps no statistics


def test_error_classification():
    assert is_fatal_device_error(torch.AcceleratorError("CUDA error: misaligned address"))
    assert is_fatal_device_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_fatal_device_error(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_fatal_device_error(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert not is_fatal_device_error(ValueError("vision batch mixes patch counts"))
