"""Gemma 4 audio, the pure part: the windows a long clip is cut into, and the window option's checks."""

from __future__ import annotations

import pytest
from audio_helpers import RATE

from gemma_embed.config import RunConfig
from gemma_embed.models.audio import window_bounds

# ------------------------------------------------------------------------------------------- pure parts


def test_window_bounds_cover_every_sample_in_order():
    assert window_bounds(70 * RATE, RATE, 30) == [(0, 480_000), (480_000, 960_000), (960_000, 1_120_000)]
    assert window_bounds(30 * RATE, RATE, 30) == [(0, 480_000)]
    assert window_bounds(30 * RATE + 1, RATE, 30) == [(0, 480_000), (480_000, 480_001)]
    assert window_bounds(0, RATE, 30) == []
    assert window_bounds(5, RATE, 2.5) == [(0, 5)]
    with pytest.raises(ValueError, match="at most 30"):
        RunConfig(window_s=30.5).check()
    with pytest.raises(ValueError):
        RunConfig(window_s=0).check()
