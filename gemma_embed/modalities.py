"""What differs between images, video, audio and text, whatever the model family: how an item is decoded, and the
shape every family's answer takes (`ModalityStages`: a decoder, a preparer and a chain of encode stages).

A family module (`models/gemma4.py`, `models/embeddinggemma2.py`, ...) builds one `ModalityStages` per command it
supports from the helpers below; the pipeline and the `Embedder` run it and never branch on the modality or the
family. A chain is one or more `Stage`s:
- a tower alone (soft tokens: Gemma 4 images, video, audio; Gemma 3n audio);
- a tower, then a text model fed the tower's rows (EmbeddingGemma 2 retrieval vectors of media);
- a text model alone (EmbeddingGemma 2 text).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gemma_embed.config import Modality, Pool, RunConfig, Space
from gemma_embed.models.base import PreparedItem, Preparer, Tower

# Prepared video frames are float32 patches (about 2 MB a frame at 70 soft tokens): a video window is sized in
# frames, not the pipeline's default count of items, so host memory stays flat.
VIDEO_WINDOW_FRAMES = 512
# A prepared line of text is its token ids (a few KB): a text window may hold thousands of lines, which short lines
# need to make seconds of encode work and batches of equal lengths (the engine closes a window at that work).
TEXT_WINDOW_ITEMS = 8192

# A later stage's input for one item, from the item and the previous stage's rows (ValueError: it cannot be formed).
Feed = Callable[[PreparedItem, Any], PreparedItem]


@dataclass(frozen=True)
class Stage:
    """One encode stage: a tower (an Engine runs it: its own memory plan, cost scale and chunk tuning), the space
    its rows are in, and how an item's input to it is formed from the previous stage's rows (`feed`; None for the
    first stage, which takes the prepared item's own units)."""

    tower: Tower
    space: Space
    feed: Feed | None = None
    # A later stage: the lengths of an item's units at this stage, known before the stages before it run (plan).
    lengths: Callable[[PreparedItem], list[int]] | None = None


@dataclass
class ModalityStages:
    """The decode, prepare and encode stages of one modality, ready to run."""

    modality: Modality
    decode: Callable[[Any], Any]  # a path, an item's bytes or an in-memory value -> decoded media
    preparer: Preparer
    chain: list[Stage]
    pools: tuple[Pool, ...] = (Pool.none, Pool.mean)  # the --pool values that make sense for these items
    window_items: int | None = None  # items decoded and prepared together; None: the pipeline's default

    @property
    def space(self) -> Space:
        """What the output rows are: the last stage's space."""
        return self.chain[-1].space

    @property
    def width(self) -> int:
        """Row width of the output."""
        last = self.chain[-1]
        return int(last.tower.output_dims[str(last.space)])

    @property
    def towers(self) -> list[Tower]:
        return [stage.tower for stage in self.chain]


def image_stages(preparer: Preparer, chain: list[Stage]) -> ModalityStages:
    from gemma_embed.media.image import decode_image_value

    return ModalityStages(Modality.images, decode_image_value, preparer, chain)


def video_stages(
    config: RunConfig,
    preparer: Preparer,
    chain: list[Stage],
    num_frames: int | None,
    fps: float | None,
    processor_max_frames: int | None = None,
    pools: tuple[Pool, ...] = (Pool.none, Pool.mean, Pool.frame),
) -> ModalityStages:
    """Sampled frames (the processor's policy, or --fps / --max-frames), decoded by PyAV in a window sized in
    frames."""
    from gemma_embed.media.video import decode_video, resolve_policy

    policy = resolve_policy(
        num_frames, fps, fps=config.fps, max_frames=config.max_frames, processor_max_frames=processor_max_frames
    )
    window = max(1, VIDEO_WINDOW_FRAMES // (policy.most_frames or VIDEO_WINDOW_FRAMES))
    return ModalityStages(
        Modality.video, partial(decode_video, policy=policy), preparer, chain, pools=pools, window_items=window
    )


def audio_stages(preparer: Preparer, chain: list[Stage], sample_rate: int) -> ModalityStages:
    """Mono float32 at the feature extractor's rate."""
    from gemma_embed.media.audio import decode_audio_value

    return ModalityStages(Modality.audio, partial(decode_audio_value, sample_rate=int(sample_rate)), preparer, chain)


def text_stages(preparer: Preparer, chain: list[Stage]) -> ModalityStages:
    from gemma_embed.sources.text import decode_text

    return ModalityStages(
        Modality.text, decode_text, preparer, chain, pools=(Pool.none,), window_items=TEXT_WINDOW_ITEMS
    )
