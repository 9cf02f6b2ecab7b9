"""What every audio tower shares: windows of long clips, the feature extractor on one window at a time, and
zero-padded batches with a mask.

A unit is one window of at most `window_s` seconds. The checkpoint's feature extractor runs on that window alone
(as a one-element list: a bare 1-D array crashes it), exactly as transformers' per-clip reference does, so each
unit's features are the reference's features. The extractor silently truncates at 30 s, which is why long clips
are windowed here first, and every window is encoded.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from gemma_embed.batching import padded_length
from gemma_embed.config import MAX_WINDOW_S, audio_window
from gemma_embed.models.base import PreparedItem, Unit
from gemma_embed.models.loading import load_processor, tower_configs

RowsForFrames = Callable[[int, int], int]  # (valid frames, frames the unit carries) -> output rows


def window_bounds(n_samples: int, sample_rate: int, window_s: float) -> list[tuple[int, int]]:
    """[start, end) sample ranges covering all `n_samples`, each at most `window_s` long, in order.

    Windows start every `window_s` seconds (regular timestamps: row r of window w sits at w * window_s plus the
    row's offset); only the last one is shorter.
    """
    if n_samples <= 0:
        return []
    size = int(math.floor(window_s * sample_rate))
    if size <= 0:
        raise ValueError(f"window of {window_s} s holds no sample at {sample_rate} Hz")
    return [(start, min(start + size, n_samples)) for start in range(0, n_samples, size)]


def load_feature_extractor(checkpoint):
    return load_processor(checkpoint, "AutoFeatureExtractor", "audio feature extractor")


class AudioPreparer:
    """The checkpoint's feature extractor on one window at a time -> one unit per window.

    keep_tail=False (Gemma 4): the unit keeps only the valid frames; the extractor zeroes the rest and the tower
    masks them, so they cannot change a real frame's rows.
    keep_tail=True (Gemma 3n): the unit keeps every frame the extractor produced for that window alone, whatever
    its mask says (for a window alone it marks them all valid today), because that tower's convolutions look two
    frames past the end and the reference saw exactly those frames.
    """

    def __init__(
        self, feature_extractor, rows_for_frames: RowsForFrames, window_s: float = MAX_WINDOW_S, keep_tail: bool = False
    ):
        self.extractor = feature_extractor
        self.rows_for_frames = rows_for_frames
        audio_window(window_s)  # the same check as --window-s
        self.window_s = float(window_s)
        self.keep_tail = keep_tail
        self.sample_rate = int(feature_extractor.sampling_rate)
        self._frame_samples: int | None = None

    def describe(self) -> dict:
        return {
            "feature_extractor": type(self.extractor).__name__,
            "sample_rate": self.sample_rate,
            "window_s": self.window_s,
        }

    def window_unit(self, samples) -> Unit | None:
        """One unit for one window of samples, or None when it is too short to give a single frame."""
        out = self.extractor([samples], return_tensors="pt")
        features = out["input_features"][0]
        mask = out["input_features_mask"][0].bool()
        valid = int(mask.sum())
        if valid == 0:
            return None
        # Rows are sliced as a prefix below; the extractor puts real frames first, but check rather than assume.
        if not bool(mask[:valid].all()):
            raise ValueError("feature extractor output has padding frames before real ones")
        if self.keep_tail:
            inputs = {"input_features": features.contiguous(), "input_features_mask": mask.contiguous()}
            length = int(features.shape[0])
        else:
            inputs = {"input_features": features[:valid].contiguous()}
            length = valid
        return Unit(inputs=inputs, length=length, rows=self.rows_for_frames(valid, length))

    def prepare(self, decoded) -> PreparedItem:
        samples = decoded.samples
        if int(decoded.sample_rate) != self.sample_rate:
            raise ValueError(f"audio at {decoded.sample_rate} Hz, the feature extractor needs {self.sample_rate} Hz")
        bounds = window_bounds(len(samples), self.sample_rate, self.window_s)
        units: list[Unit] = []
        windows: list[dict] = []
        for start, end in bounds:
            unit = self.window_unit(samples[start:end])
            rows = unit.rows if unit else 0
            if unit is not None and rows > 0:
                units.append(unit)
            windows.append({"start_s": start / self.sample_rate, "end_s": end / self.sample_rate, "rows": rows})
        if not units:
            raise ValueError(self._too_short(decoded))
        meta = decoded.facts()
        if len(bounds) > 1:
            meta["window_s"] = self.window_s
            meta["windows"] = windows
        return PreparedItem(units=units, meta=meta)

    def _too_short(self, decoded) -> str:
        needed = self.frame_samples()
        n = len(decoded.samples)
        if int(decoded.source_rate) != self.sample_rate and decoded.source_samples >= 0:
            return (
                f"too short: {decoded.source_samples} samples at {decoded.source_rate} Hz ({n} at "
                f"{self.sample_rate} Hz), one frame needs {needed}"
            )
        return f"too short: {n} samples, one frame needs {needed}"

    def frame_samples(self) -> int:
        """The fewest samples (at the extractor's rate) for which the extractor yields one valid frame: asked of
        the extractor itself (a bisection, on the error path only), so it holds for any checkpoint's window and
        padding rules."""
        if self._frame_samples is None:
            self._frame_samples = self._fewest_samples_for_a_frame()
        return self._frame_samples

    def _fewest_samples_for_a_frame(self) -> int:
        low, high = 0, 1
        while self._valid_frames(high) == 0:
            low, high = high, high * 2
            if high > self.sample_rate * 10:
                return high
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if self._valid_frames(middle) else (middle, high)
        return high

    def _valid_frames(self, n: int) -> int:
        if n == 0:
            return 0
        out = self.extractor([np.zeros(n, dtype=np.float32)], return_tensors="pt")
        return int(out["input_features_mask"][0].sum())


def pad_batch(tower, units: list[Unit]) -> tuple[torch.Tensor, torch.Tensor]:
    """Features zero-padded to the longest unit (B, T, F) and the mask (B, T), True = a valid frame, on the tower's
    device. Built on the host (pinned on CUDA) and copied in one transfer each, not unit by unit. Features stay
    float32, as the extractor made them: both audio towers mask and pad them, then cast to their own dtype, the
    same whichever dtype they arrive in. Padded to the longest unit's rung of the padding ladder
    (batching.padded_length), every unit's rung, so a unit's rows do not depend on the batch it came in."""
    longest = padded_length(max(u.length for u in units))
    width = units[0].inputs["input_features"].shape[-1]
    features = tower.host_zeros((len(units), longest, width), torch.float32)
    mask = tower.host_zeros((len(units), longest), torch.bool)
    for i, unit in enumerate(units):
        features[i, : unit.length] = unit.inputs["input_features"]
        own = unit.inputs.get("input_features_mask")
        mask[i, : unit.length] = own if own is not None else True
    return tower.to_device(features), tower.to_device(mask)


def strip_rows(hidden: torch.Tensor, valid: torch.Tensor, units: list[Unit]) -> torch.Tensor:
    """The valid output rows of every unit, in order, as one tensor on the device. A count that disagrees with a
    unit's planned rows is a bug, not data. Two syncs per batch (the counts, and the boolean index), none per
    unit."""
    counts = valid.sum(dim=1).tolist()
    planned = [u.rows for u in units]
    if counts != planned:
        raise RuntimeError(f"audio tower gave {counts} valid rows for units planned at {planned}")
    return hidden[valid]


def audio_sub_configs(checkpoint) -> tuple:
    """(audio_config, text_config) of a composite checkpoint; a clear error when it has no audio tower."""
    return tower_configs(checkpoint, "audio")
