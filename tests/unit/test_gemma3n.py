"""Gemma 3n audio's cost model, in plain numbers."""

from __future__ import annotations


def test_cost_model_is_linear_in_frames_and_never_negative():
    from gemma_embed.memory import gemma3n_audio_item_cost

    one = gemma3n_audio_item_cost(1000)
    assert gemma3n_audio_item_cost(2000) == 2 * one > 0
    assert gemma3n_audio_item_cost(0) == 0 == gemma3n_audio_item_cost(-5)
    assert gemma3n_audio_item_cost(1000, bytes_per_element=2) < one  # the group norm stays in float32
    # 30 s in float32 at the real channels: the profiled peak was 284 MiB (bench/bench_audio.py).
    assert 284 * 2**20 <= gemma3n_audio_item_cost(2997) < 300 * 2**20
