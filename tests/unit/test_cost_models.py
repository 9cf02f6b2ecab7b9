"""The towers' cost models (each in its family module, beside its tower), in plain numbers: against the peaks the
profiler measured (bench/MEMORY.md), never under them and not far over."""

from __future__ import annotations

import pytest

from gemma_embed.models.gemma3 import siglip_item_cost
from gemma_embed.models.gemma3n import gemma3n_audio_item_cost
from gemma_embed.models.gemma3n_vision import mobilenetv5_item_cost
from gemma_embed.models.gemma4 import vision_item_cost
from gemma_embed.models.text_cost import text_sequence_cost


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
def test_vision_cost_model_never_underestimates_measured_peaks(d, i, h, n, b, s, eager, measured_mib):
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
    cost = text_sequence_cost(max(lengths), 512, 2048, layers, ple, s, sliding_window=512)
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
    cost = text_sequence_cost(
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
    modelled = b * siglip_item_cost(n, d, i, h, s)
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
    modelled = b * mobilenetv5_item_cost(side * side, s)
    assert measured_mib * 2**20 <= modelled <= 1.2 * measured_mib * 2**20


def test_text_cost_is_linear_below_the_window_and_quadratic_above():
    def cost(n):
        return text_sequence_cost(n, 512, 2048, 6, 64, 4, sliding_window=512)

    assert cost(400) == pytest.approx(2 * cost(200), rel=0.01)  # (a padded batch adds a 1-byte mask per pair)
    assert cost(16384) > 3.5 * cost(8192)  # the sliding mask's tokens x tokens term takes over
    assert text_sequence_cost(0, 512, 2048, 24, 512, 4, 512) == 0


def test_gemma3n_audio_cost_is_linear_in_frames_and_never_negative():
    one = gemma3n_audio_item_cost(1000)
    assert gemma3n_audio_item_cost(2000) == 2 * one > 0
    assert gemma3n_audio_item_cost(0) == 0 == gemma3n_audio_item_cost(-5)
    assert gemma3n_audio_item_cost(1000, bytes_per_element=2) < one  # the group norm stays in float32
    # 30 s in float32 at the real channels: the profiled peak was 284 MiB (bench/bench_audio.py).
    assert 284 * 2**20 <= gemma3n_audio_item_cost(2997) < 300 * 2**20
