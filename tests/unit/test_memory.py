"""The planner: pure functions of plain numbers."""

from __future__ import annotations

import itertools

import pytest

from gemma_embed import memory
from gemma_embed.memory import BudgetSpec, budget, chunk_size, host_memory, parse_budget, vision_item_cost

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


def test_vision_cost_grows_with_patches_and_counts_attention_only_when_materialised():
    small = vision_item_cost(630, 768, 3072, 12, 4)
    large = vision_item_cost(10080, 768, 3072, 12, 4)
    assert large >= 16 * small  # at least linear in patches
    eager = vision_item_cost(10080, 768, 3072, 12, 4, materialises_scores=True)
    assert eager >= 2 * 12 * 10080 * 10080 * 4  # eager attention scores dominate at 1120 tokens
    assert vision_item_cost(0, 768, 3072, 12, 4) == 0
    # Where the pooler's N x M one-hot outgrows the MLP (a narrow tower at a big budget), it sets the cost.
    assert vision_item_cost(10080, 64, 128, 4, 4) >= 13 * 10080 * 1120
    assert vision_item_cost(2520, 768, 3072, 12, 2) < vision_item_cost(2520, 768, 3072, 12, 4)


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
    assert memory.cgroup_memory(tmp_path) == (None, 123)
    (tmp_path / "memory.max").write_text("1073741824\n")
    assert memory.cgroup_memory(tmp_path) == (GIB, 123)
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    (v1 / "memory" / "memory.usage_in_bytes").write_text("5")
    assert memory.cgroup_memory(v1) == (None, 5)


def test_device_memory_on_cpu_is_sane():
    free, total = memory.device_memory("cpu")
    assert 0 < free <= total


# Peak transients measured with the profiler on the CPU (bench/bench_memory.py, recorded in bench/MEMORY.md):
# (D, I, H, patches, batch, bytes per element, eager, measured MiB).
MEASURED = [
    (256, 1024, 4, 630, 4, 4, False, 40.6),
    (256, 1024, 4, 2520, 2, 4, False, 81.2),
    (256, 1024, 4, 10080, 1, 4, False, 162.4),
    (64, 128, 4, 10080, 1, 4, False, 136.8),
    (768, 3072, 12, 630, 1, 4, False, 29.8),
    (768, 3072, 12, 2520, 2, 4, False, 238.7),
    (768, 3072, 12, 2520, 1, 2, False, 74.4),
    (768, 3072, 12, 10080, 1, 4, False, 477.4),
    (256, 1024, 4, 2520, 1, 4, True, 209.8),
]


@pytest.mark.parametrize("d, i, h, n, b, s, eager, measured_mib", MEASURED)
def test_cost_model_never_underestimates_measured_peaks(d, i, h, n, b, s, eager, measured_mib):
    modelled = b * vision_item_cost(n, d, i, h, s, materialises_scores=eager)
    assert measured_mib * 2**20 <= modelled <= 1.25 * measured_mib * 2**20


# EmbeddingGemma 2's text model (stage 2), measured the same way (bench/bench_text_memory.py, bench/MEMORY.md):
# (layers, per-layer dim, lengths in one batch, bytes per element, measured MiB); hidden 512, intermediate 2048,
# sliding radius 512.
TEXT_MEASURED = [
    (24, 512, [128], 4, 18.0),
    (24, 512, [2048], 4, 288.0),
    (24, 512, [1024, 800], 4, 288.0),
    (24, 512, [1024], 2, 120.2),
    (6, 64, [1024], 4, 48.5),
    (6, 64, [4096], 4, 262.1),
    (6, 64, [8192], 4, 1036.2),
]


@pytest.mark.parametrize("layers, ple, lengths, s, measured_mib", TEXT_MEASURED)
def test_text_cost_model_never_underestimates_measured_peaks(layers, ple, lengths, s, measured_mib):
    cost = memory.text_sequence_cost(max(lengths), 512, 2048, layers, ple, s, sliding_window=512)
    modelled = len(lengths) * cost  # the engine plans a ragged group at its padded length
    assert measured_mib * 2**20 <= modelled <= 1.25 * measured_mib * 2**20


# EmbeddingGemma's text model (Gemma 3, bidirectional), measured the same way (`python -m bench.bench_text_memory
# embeddinggemma`, bench/MEMORY.md): (lengths in one batch, bytes per element, measured MiB); hidden 768,
# intermediate 1152, head_dim 256, sliding radius 257, 6 layers.
EMBEDDINGGEMMA_TEXT_MEASURED = [
    ([128], 4, 5.2),
    ([2048], 4, 91.0),
    ([2048, 2048], 4, 174.0),
    ([1024, 800], 4, 83.0),
    ([2048], 2, 75.1),
    ([4096], 4, 300.1),
]


@pytest.mark.parametrize("lengths, s, measured_mib", EMBEDDINGGEMMA_TEXT_MEASURED)
def test_embeddinggemma_text_cost_model_never_underestimates_measured_peaks(lengths, s, measured_mib):
    cost = memory.text_sequence_cost(
        max(lengths), 768, 1152, 6, 0, s, sliding_window=257, rotary_dims=512, dense_full_mask=True
    )
    modelled = len(lengths) * cost
    assert measured_mib * 2**20 <= modelled <= 1.2 * measured_mib * 2**20


# Gemma 3's SigLIP tower + multi_modal_projector (`python -m bench.bench_family_memory gemma3`, bench/MEMORY.md):
# (hidden, intermediate, heads, patches, batch, bytes per element, measured MiB); 14 px patches, SDPA, 2 layers.
SIGLIP_MEASURED = [
    (1152, 4304, 16, 4096, 1, 4, 206.5),
    (1152, 4304, 16, 4096, 2, 4, 413.0),
    (1152, 4304, 16, 1024, 1, 4, 51.6),
    (1152, 4304, 16, 4096, 1, 2, 103.2),
    (256, 1024, 4, 4096, 1, 4, 48.0),
]


@pytest.mark.parametrize("d, i, h, n, b, s, measured_mib", SIGLIP_MEASURED)
def test_siglip_cost_model_never_underestimates_measured_peaks(d, i, h, n, b, s, measured_mib):
    modelled = b * memory.siglip_item_cost(n, d, i, h, s)
    assert measured_mib * 2**20 <= modelled <= 1.2 * measured_mib * 2**20


# Gemma 3n's MobileNetV5 encoder as released (`python -m bench.bench_family_memory gemma3n`, bench/MEMORY.md):
# (input side in pixels, batch, bytes per element, measured MiB).
MOBILENETV5_MEASURED = [
    (768, 1, 4, 375.9),
    (512, 1, 4, 168.6),
    (512, 2, 4, 337.2),
    (768, 1, 2, 297.2),
]


@pytest.mark.parametrize("side, b, s, measured_mib", MOBILENETV5_MEASURED)
def test_mobilenetv5_cost_model_never_underestimates_measured_peaks(side, b, s, measured_mib):
    modelled = b * memory.mobilenetv5_item_cost(side * side, s)
    assert measured_mib * 2**20 <= modelled <= 1.2 * measured_mib * 2**20


def test_text_cost_is_linear_below_the_window_and_quadratic_above():
    def cost(n):
        return memory.text_sequence_cost(n, 512, 2048, 6, 64, 4, sliding_window=512)

    assert cost(400) == pytest.approx(2 * cost(200), rel=0.01)  # (a padded batch adds a 1-byte mask per pair)
    assert cost(16384) > 3.5 * cost(8192)  # the sliding mask's tokens x tokens term takes over
    assert memory.text_sequence_cost(0, 512, 2048, 24, 512, 4, 512) == 0
