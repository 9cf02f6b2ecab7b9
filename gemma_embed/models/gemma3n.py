"""Gemma 3n: audio tower (a USM conformer) + `embed_audio`. Its vision tower (timm's MobileNetV5) is
models/gemma3n_vision.py.

Two things differ from Gemma 4 and both matter for exactness:

- The tower's mask is inverted: True = padding (`Gemma3nModel.forward` passes `~input_features_mask`).
- Its subsampling convolutions pad time by two frames at the *end* ("reverse causal") and take no mask. A unit's
  last valid token therefore sees the frames after the clip: in the per-clip reference those are the extractor's
  own tail frames, then zeros (the convolution's padding), both for the mel input of the first convolution and
  for the first convolution's output feeding the second. Zero-padding a batch reproduces the first case (units
  keep the extractor's tail, see `AudioPreparer(keep_tail=True)`), but not the second: padded frames come out of
  the first convolution's cumulative group norm as non-zero values, which the second convolution then reads
  (measured: the last valid token of a short clip moves by ~1, the rest by <1e-6).

So the batch is padded with zeros *and* the first convolution's output is zeroed past each unit's own length
before the second convolution reads it: every valid row then sees exactly the numbers the per-clip reference
saw (tests/integration/test_gemma3n.py proves both the leak and the fix). Everything after the subsampling is masked
(attention), causal and masked (light convolution) or per frame, and the group norms are cumulative over time,
so later frames never reach earlier ones.
"""

from __future__ import annotations

import contextlib
import math

import torch

from gemma_embed.models.audio import audio_sub_configs, pad_batch, strip_rows
from gemma_embed.models.base import EncoderTower, Unit


def conv_output_frames(frames: int, kernel: int, stride: int) -> int:
    """Time length after one subsampling convolution: padded (0, kernel - 1) at the end, no padding in front."""
    return (frames + (kernel - 1) - kernel) // stride + 1 if frames > 0 else 0


def subsampled_frames(config, frames: int) -> list[int]:
    """Time length after each subsampling convolution, for a unit of `frames` mel frames."""
    lengths = []
    for (kernel, _), (stride, _) in zip(config.sscp_conv_kernel_size, config.sscp_conv_stride_size, strict=True):
        frames = conv_output_frames(frames, kernel, stride)
        lengths.append(frames)
    return lengths


def gemma3n_audio_rows(config, valid_frames: int, frames: int) -> int:
    """Valid output tokens, as the tower's output mask counts them.

    Subsampled position t is valid when mel frame t * (product of time strides) is; the conformer then keeps
    every `conf_reduction_factor`-th position.
    """
    stride = math.prod(s for s, _ in config.sscp_conv_stride_size)
    reduction = max(1, int(config.conf_reduction_factor))
    positions = -(-subsampled_frames(config, frames)[-1] // reduction)
    valid = -(-int(valid_frames) // (stride * reduction))
    return max(0, min(positions, valid))


class Gemma3nAudioTower(EncoderTower):
    """Gemma 3n audio encoder + projection over ragged, zero-padded batches (see the module note)."""

    grouping = "ragged"
    length_unit = "frames"
    parts = (("audio_tower", ("model.audio_tower.",)), ("embed_audio", ("model.embed_audio.",)))

    def __init__(self, checkpoint, device, dtype, load: bool = True):
        from transformers.models.gemma3n.modeling_gemma3n import Gemma3nAudioEncoder, Gemma3nMultimodalEmbedder

        audio_config, text_config = audio_sub_configs(checkpoint)
        # Gemma3nAudioEncoder.from_pretrained(composite dir) silently keeps random weights (its base prefix is
        # "model"): the base class builds it without init and loads its tensors strictly instead.
        super().__init__(
            checkpoint,
            device,
            dtype,
            audio_config,
            lambda: Gemma3nAudioEncoder(audio_config),
            lambda: Gemma3nMultimodalEmbedder(audio_config, text_config),
            {"tower": audio_config.hidden_size, "language": text_config.hidden_size},
            load=load,
        )
        self.zero_conv_padding = True  # tests switch it off to show the leak it prevents

    def rows_for_frames(self, valid_frames: int, frames: int) -> int:
        return gemma3n_audio_rows(self.config, valid_frames, frames)

    def unit_cost(self, length: int) -> int:
        channels = self.config.sscp_conv_channel_size[0]
        return gemma3n_audio_item_cost(length, channels, self.config.input_feat_size, self.element_size)

    @contextlib.contextmanager
    def _first_conv_output_cut(self, units: list[Unit], frames: int):
        """Zero the first convolution's output past each unit's own length, as the per-clip reference sees it;
        `frames`: the batch's padded length."""
        if not self.zero_conv_padding:
            yield
            return
        # The keep mask is built on the host and staged before the forward: a pageable host-to-device copy inside
        # the hook would make the CPU wait for the GPU mid-forward.
        longest = subsampled_frames(self.config, frames)[0]
        keep = self.host_zeros((len(units), longest), torch.bool)
        for i, unit in enumerate(units):
            keep[i, : subsampled_frames(self.config, unit.length)[0]] = True
        keep = self.to_device(keep)

        def cut(_module, args):
            (hidden,) = args  # (B, C, T, F)
            if hidden.shape[2] != keep.shape[1]:
                raise RuntimeError(f"first convolution gave {hidden.shape[2]} frames, expected {keep.shape[1]}")
            return (hidden * keep[:, None, :, None].to(hidden.dtype),)

        handle = self.tower.subsample_conv_projection.conv_1.register_forward_pre_hook(cut)
        try:
            yield
        finally:
            handle.remove()

    def encode(self, units: list[Unit], space: str) -> torch.Tensor:
        features, valid = pad_batch(self, units)
        with self._first_conv_output_cut(units, features.shape[1]):
            out = self.tower(features, ~valid, return_dict=True)  # this tower's mask: True = padding
        return strip_rows(self.project(out.last_hidden_state, space), ~out.audio_mel_mask, units)


# ------------------------------------------------------------------------------------------- the cost model


def gemma3n_audio_item_cost(
    mel_frames: int, channels: int = 128, mel_bins: int = 128, bytes_per_element: int = 4
) -> int:
    """Gemma 3n audio tower: per mel frame, the first subsampling convolution's output (channels x mel_bins/2
    values per two frames) and the copies its cumulative group norm makes, which it computes in float32 whatever
    the model dtype. Profiled in float32 (bench/bench_audio.py): 284 MiB for one 30 s clip at channels 128, about
    six live copies of that output; five of them are float32 whatever the dtype."""
    per_frame = channels * ((int(mel_bins) + 1) // 2) / 2
    copies_fp32, copies_model = 5, 1
    per_frame_bytes = per_frame * (copies_fp32 * 4 + copies_model * max(1, int(bytes_per_element)))
    per_frame_bytes += 3 * int(mel_bins) * 4  # the padded mel batch and its copies inside the first block
    return int(max(0, int(mel_frames)) * per_frame_bytes)


# ------------------------------------------------------------- the family's builders (models/families/ declares it)


def build_audio(config, checkpoint, device, dtype, space):
    from gemma_embed.modalities import Stage, audio_stages
    from gemma_embed.models.audio import AudioPreparer, load_feature_extractor

    tower = Gemma3nAudioTower(checkpoint, device, dtype, load=False)
    # keep_tail: this tower's convolutions look past a window's end, so a unit keeps every frame (see AudioPreparer)
    preparer = AudioPreparer(load_feature_extractor(checkpoint), tower.rows_for_frames, config.window_s, True)
    return audio_stages(preparer, [Stage(tower, space)], preparer.sample_rate)
