"""The planner: pure functions of plain numbers."""

from __future__ import annotations

import itertools

import pytest

from gemma_embed.memory import readings
from gemma_embed.memory.planner import BudgetSpec, budget, chunk_size, parse_budget
from gemma_embed.memory.readings import host_memory
from gemma_embed.models.gemma4 import vision_item_cost

GIB = 2**30


@pytest.mark.parametrize(
    "cost, room", itertools.product([1, 7, 10**6, 3 * 10**8, 2**31 + 1], [0, 5, 10**6, 10**9, 40 * GIB])
)
def test_tight_budget_never_exceeded(cost, room):
    n = chunk_size(cost, room)
    assert n >= 1
    if n > 1:
        assert n * cost <= room
    assert (n + 1) * cost > room  # and it is the largest such chunk


def test_cap_and_degenerate_inputs():
    assert chunk_size(10, 1000, cap=4) == 4
    assert chunk_size(10, 1000, cap=None) == 100
    assert chunk_size(0, 1000) == 1  # zero patches: no cost model, no division by zero
    assert chunk_size(0, 1000, cap=8) == 8
    assert chunk_size(-5, 1000) == 1
    assert chunk_size(float("nan"), 1000) == 1
    assert chunk_size(100, 0) == 1  # zero free memory still makes progress, one at a time
    assert chunk_size(100, -50) == 1
    assert chunk_size(10**12, 10**9) == 1  # an item bigger than the budget runs alone


def test_budget_default_rule():
    assert budget(free=10 * GIB, total=80 * GIB) == 5 * GIB  # free/2 is the tighter bound
    assert budget(free=70 * GIB, total=80 * GIB) == 8 * GIB  # total/10 is the tighter bound
    assert budget(free=0, total=80 * GIB) == 0
    assert budget(free=-1, total=0) == 0
    assert budget(free=10 * GIB, total=80 * GIB, spec=BudgetSpec(bytes=2 * GIB)) == 2 * GIB
    assert budget(free=1 * GIB, total=80 * GIB, spec=BudgetSpec(bytes=2 * GIB)) == 1 * GIB  # never over free
    assert budget(free=30 * GIB, total=80 * GIB, spec=BudgetSpec(fraction_of_total=0.3)) == 24 * GIB
    assert budget(free=10 * GIB, total=80 * GIB, spec=BudgetSpec(fraction_of_total=0.3)) == 10 * GIB  # never over free


def test_roomy_device_keeps_batching():
    # A 140 GiB GPU with the real vision tower (D=768, I=3072, bf16) at the default 280-token budget.
    cost = vision_item_cost(patches=2520, hidden=768, intermediate=3072, heads=12, bytes_per_element=2)
    room = budget(free=130 * GIB, total=140 * GIB)
    assert room == 14 * GIB
    n = chunk_size(cost, room)
    assert n >= 64
    assert n * cost <= room


def test_parse_budget():
    assert parse_budget(None) == BudgetSpec()
    assert parse_budget("auto") == BudgetSpec()
    assert parse_budget("2GiB") == BudgetSpec(bytes=2 * GIB)
    assert parse_budget("500MB") == BudgetSpec(bytes=500 * 10**6)
    assert parse_budget("512MiB") == BudgetSpec(bytes=512 * 2**20)
    assert parse_budget("1.5GB") == BudgetSpec(bytes=1_500_000_000)
    assert parse_budget("30%") == BudgetSpec(fraction_of_total=0.3)
    assert parse_budget("100%") == BudgetSpec(fraction_of_total=1.0)
    # A bare number was ambiguous ("2" meant 2 bytes, "1.5" one byte): now it is refused, with the fix.
    for bare in ("2", "1.5", "0.3", "800000000"):
        with pytest.raises(ValueError, match="no unit"):
            parse_budget(bare)
    for bad in ("lots", "-1GB", "2 parsecs", "0GiB", "0%", "150%"):
        with pytest.raises(ValueError):
            parse_budget(bad)


def test_host_memory_honours_cgroup_limit():
    assert host_memory(20 * GIB, 24 * GIB, None, None) == (20 * GIB, 24 * GIB)
    assert host_memory(20 * GIB, 24 * GIB, 4 * GIB, 3 * GIB) == (1 * GIB, 4 * GIB)
    assert host_memory(20 * GIB, 24 * GIB, 4 * GIB, 5 * GIB) == (0, 4 * GIB)  # over the limit already
    assert host_memory(20 * GIB, 24 * GIB, 64 * GIB, 1 * GIB) == (20 * GIB, 24 * GIB)  # limit above the host


def test_cgroup_files(tmp_path):
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("123\n")
    assert readings.cgroup_memory(tmp_path) == (None, 123)
    (tmp_path / "memory.max").write_text("1073741824\n")
    assert readings.cgroup_memory(tmp_path) == (GIB, 123)
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    (v1 / "memory" / "memory.usage_in_bytes").write_text("5")
    assert readings.cgroup_memory(v1) == (None, 5)


def test_device_memory_on_cpu_is_sane():
    free, total = readings.device_memory("cpu")
    assert 0 < free <= total
