"""Gemma 4 (and EmbeddingGemma 2, which reuses its towers): audio tower + `embed_audio`.

The tower is padding-invariant when it gets the mask (True = valid): its subsampling convolutions multiply the
input by the mask before each layer, its local attention masks padded keys, and its light convolutions are
causal. So units of different lengths share a batch, zero-padded to the longest, and each unit's rows are
stripped with the tower's output mask.
"""

from __future__ import annotations

import torch

from gemma_embed.models.audio import audio_sub_configs, pad_batch, strip_rows
from gemma_embed.models.base import EncoderTower, Unit

SUBSAMPLING_LAYERS = 2  # two stride-2 convolutions over time, each keeping mask[:, ::2]


def gemma4_audio_rows(valid_frames: int, frames: int | None = None) -> int:
    """Valid output tokens for a clip of `valid_frames` mel frames, as the tower's output mask counts them."""
    rows = max(0, int(valid_frames))
    for _ in range(SUBSAMPLING_LAYERS):
        rows = (rows + 1) // 2  # len(mask[::2]) of a valid prefix
    return rows


class Gemma4AudioTower(EncoderTower):
    """Gemma 4 audio encoder + projection over ragged, zero-padded batches."""

    grouping = "ragged"
    length_unit = "frames"
    # EmbeddingGemma 2 stores the same tower without the "model." prefix.
    parts = (
        ("audio_tower", ("model.audio_tower.", "audio_tower.")),
        ("embed_audio", ("model.embed_audio.", "embed_audio.")),
    )

    def __init__(self, checkpoint, device, dtype, load: bool = True):
        from transformers.models.gemma4.modeling_gemma4 import Gemma4AudioModel, Gemma4MultimodalEmbedder

        audio_config, text_config = audio_sub_configs(checkpoint)
        audio_config._attn_implementation = "eager"  # the chunked local attention exists only in eager
        super().__init__(
            checkpoint,
            device,
            dtype,
            audio_config,
            lambda: Gemma4AudioModel(audio_config),
            lambda: Gemma4MultimodalEmbedder(audio_config, text_config),
            {"tower": audio_config.output_proj_dims, "language": text_config.hidden_size},
            load=load,
        )

    def unit_cost(self, length: int) -> int:
        return audio_item_cost(length, self.element_size)

    def encode(self, units: list[Unit], space: str) -> torch.Tensor:
        features, mask = pad_batch(self, units)
        out = self.tower(features, mask, return_dict=True)
        return strip_rows(self.project(out.last_hidden_state, space), out.attention_mask.bool(), units)


# ------------------------------------------------------------------------------------------- the cost model


def audio_item_cost(mel_frames: int, bytes_per_element: int) -> int:
    """Gemma 4 audio tower: about 52 KB per mel frame in float32 (SSCP conv output, ~3 live copies).

    Profiled (bench/bench_audio.py): 145.2 MiB for one 30 s clip (2999 frames), 50.8 KB per frame; the research
    notes' 49 KB was 3% under that, and the planner must not be under."""
    return int(max(0, int(mel_frames)) * 52_000 * max(1, int(bytes_per_element)) / 4)


def build_audio(config, checkpoint, device, dtype, space):
    """Gemma 4's audio tower (EmbeddingGemma 2 reuses it): windows of at most --window-s through the checkpoint's
    feature extractor, ragged batches."""
    from gemma_embed.modalities import Stage, audio_stages
    from gemma_embed.models.audio import AudioPreparer, load_feature_extractor

    preparer = AudioPreparer(load_feature_extractor(checkpoint), gemma4_audio_rows, config.window_s, keep_tail=False)
    chain = [Stage(Gemma4AudioTower(checkpoint, device, dtype, load=False), space)]
    return audio_stages(preparer, chain, preparer.sample_rate)
