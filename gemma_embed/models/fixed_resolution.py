"""Preparers for vision towers that see every image at one fixed resolution (Gemma 3's SigLIP, Gemma 3n's
MobileNetV5): the checkpoint's own image processor resizes each image (or video frame) to the tower's input size,
so every unit has the same length and the same rows, and all units of a run share one bucket: batches are full
and never padded.
"""

from __future__ import annotations

import torch

from gemma_embed.models.base import PreparedItem, Unit
from gemma_embed.models.loading import Checkpoint, load_processor

# Neither family has a video processor: frames are sampled by count, as Gemma 4's video processor does by default.
VIDEO_NUM_FRAMES = 32


class FixedResolutionPreparer:
    """The checkpoint's image processor, one image (or frame) per call. `length`: what the tower's cost model
    counts per unit (the same for every unit); `rows`: the rows one image yields in the requested space."""

    def __init__(self, checkpoint: Checkpoint, length: int, rows: int):
        self.processor = load_processor(checkpoint, "AutoImageProcessor", "image processor")
        self.length = int(length)
        self.rows = int(rows)

    def units(self, pixel_values: torch.Tensor) -> list[Unit]:
        """(N, 3, H, W) processor output -> one unit per image, pixels float32 as the processor made them."""
        return [
            Unit(inputs={"pixel_values": pixels.contiguous()}, length=self.length, rows=self.rows)
            for pixels in pixel_values
        ]

    def resized_size(self) -> dict:
        size = self.processor.size
        return {"resized_width": int(size["width"]), "resized_height": int(size["height"])}

    def describe(self) -> dict:
        return {"processor": type(self.processor).__name__, **self.resized_size()}


class FixedResolutionImagePreparer(FixedResolutionPreparer):
    """A decoded image (`media.image.DecodedImage`) -> one unit."""

    def prepare(self, decoded) -> PreparedItem:
        image = decoded.image
        out = self.processor([image], return_tensors="pt")
        meta = {"width": image.width, "height": image.height, **decoded.meta, **self.resized_size()}
        return PreparedItem(units=self.units(out["pixel_values"]), meta=meta, rows_per_unit=self.rows)


class FixedResolutionVideoPreparer(FixedResolutionPreparer):
    """A decoded video's sampled frames (`media.video.DecodedVideo`) -> one unit per frame, each through the
    image processor alone, as an image. `num_frames` and `fps` are the sampling policy media/video.py's
    `resolve_policy` reads, as from a video processor."""

    num_frames = VIDEO_NUM_FRAMES
    fps = None

    def describe(self) -> dict:
        return {**super().describe(), "num_frames": self.num_frames}

    def prepare(self, video) -> PreparedItem:
        units = []
        for frame in video.frames:
            # (H, W, 3): said so, since left to guess the processor reads a 1x1 or 3-pixel-wide frame as
            # channels-first.
            out = self.processor([frame], return_tensors="pt", input_data_format="channels_last")
            units += self.units(out["pixel_values"])
        meta = {**video.facts(), "rows_per_frame": self.rows, **self.resized_size()}
        return PreparedItem(units=units, meta=meta, rows_per_unit=self.rows)
