"""What differs between images, video and audio: how a file is decoded, and which preparer and tower run.

The pipeline asks `build_modality` for a `ModalityStages` and never branches on the modality itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gemma_embed.config import Pool, RunConfig
from gemma_embed.errors import CheckpointError, UsageError
from gemma_embed.models.base import Preparer, Tower

# Prepared video frames are float32 patches (about 2 MB a frame at 70 soft tokens): a video window is sized in
# frames, not the pipeline's default count of items, so host memory stays flat.
VIDEO_WINDOW_FRAMES = 512


@dataclass
class ModalityStages:
    """The decode, prepare and encode stages of one modality, ready to run."""

    name: str
    decode: Callable[[str], Any]  # path -> decoded media; raises with a one-line reason
    preparer: Preparer
    tower: Tower
    pools: tuple[Pool, ...] = (Pool.none, Pool.mean)  # the --pool values that make sense for these items
    window_items: int | None = None  # items decoded and prepared together; None: the pipeline's default


def _images(config: RunConfig, checkpoint, device, dtype) -> ModalityStages:
    from gemma_embed.media.image import decode_image
    from gemma_embed.models.gemma4 import Gemma4ImagePreparer, Gemma4VisionTower

    preparer = Gemma4ImagePreparer(checkpoint, config.max_soft_tokens)
    return ModalityStages("images", decode_image, preparer, Gemma4VisionTower(checkpoint, device, dtype))


def _audio(config: RunConfig, checkpoint, device, dtype) -> ModalityStages:
    """Gemma 4 (and towers that reuse its audio encoder) or Gemma 3n, by the checkpoint's audio config."""
    from gemma_embed.media.audio import decode_audio
    from gemma_embed.models.audio import AudioPreparer, audio_sub_configs, load_feature_extractor

    audio_config, _ = audio_sub_configs(checkpoint)
    family = getattr(audio_config, "model_type", "")
    if family == "gemma3n_audio":
        from gemma_embed.models.gemma3n import Gemma3nAudioTower

        tower = Gemma3nAudioTower(checkpoint, device, dtype)
        rows_for_frames, keep_tail = tower.rows_for_frames, True
    else:  # gemma4_audio: check_supported lets no other family through
        from gemma_embed.models.gemma4_audio import Gemma4AudioTower, gemma4_audio_rows

        tower = Gemma4AudioTower(checkpoint, device, dtype)
        rows_for_frames, keep_tail = gemma4_audio_rows, False
    preparer = AudioPreparer(load_feature_extractor(checkpoint), rows_for_frames, config.window_s, keep_tail)
    decode = partial(decode_audio, sample_rate=preparer.sample_rate)
    return ModalityStages("audio", decode, preparer, tower)


def _video(config: RunConfig, checkpoint, device, dtype) -> ModalityStages:
    from gemma_embed.media.video import decode_video, resolve_policy
    from gemma_embed.models.gemma4 import Gemma4VideoPreparer, Gemma4VisionTower

    preparer = Gemma4VideoPreparer(checkpoint, config.max_soft_tokens)
    policy = resolve_policy(preparer.num_frames, preparer.fps, fps=config.fps, max_frames=config.max_frames)
    window = max(1, VIDEO_WINDOW_FRAMES // (policy.most_frames or VIDEO_WINDOW_FRAMES))
    # Frames are images to the vision tower: the same tower class, so frames share the image path's buckets.
    return ModalityStages(
        "video",
        partial(decode_video, policy=policy),
        preparer,
        Gemma4VisionTower(checkpoint, device, dtype),
        pools=(Pool.none, Pool.mean, Pool.frame),
        window_items=window,
    )


# The towers each command can run, by the model type of the checkpoint's tower config, and where they are found.
SUPPORTED_TOWERS = {
    "images": ("vision", {"gemma4_vision": "Gemma 4 and EmbeddingGemma 2 checkpoints"}),
    "video": ("vision", {"gemma4_vision": "Gemma 4 and EmbeddingGemma 2 checkpoints"}),
    "audio": (
        "audio",
        {"gemma4_audio": "Gemma 4 and EmbeddingGemma 2 checkpoints", "gemma3n_audio": "Gemma 3n checkpoints"},
    ),
}


def check_supported(modality: str, checkpoint) -> None:
    """A checkpoint without a tower this command can run is refused by name, before anything is loaded."""
    tower, supported = SUPPORTED_TOWERS[modality]
    found = getattr(getattr(checkpoint.config, f"{tower}_config", None), "model_type", None)
    if found in supported:
        return
    model_type = getattr(checkpoint.config, "model_type", "?")
    wanted = "; ".join(f"{kind} ({where})" for kind, where in supported.items())
    if found is None:
        raise CheckpointError(
            f"{checkpoint.source}: this {model_type} checkpoint has no {tower} tower; {modality} need one of "
            f"type {wanted}"
        )
    raise CheckpointError(
        f"{checkpoint.source}: {modality} need a {tower} tower of type {wanted}; this {model_type} checkpoint's "
        f"is {found}, which is not supported"
    )


BUILDERS: dict[str, Callable[..., ModalityStages]] = {
    "images": _images,
    "audio": _audio,
    "video": _video,
}


def build_modality(config: RunConfig, checkpoint, device, dtype) -> ModalityStages:
    try:
        builder = BUILDERS[config.modality]
    except KeyError:
        raise UsageError(f"modality {config.modality!r} is not supported") from None
    check_supported(config.modality, checkpoint)
    stages = builder(config, checkpoint, device, dtype)
    if config.pool not in stages.pools:
        raise UsageError(
            f"--pool {config.pool} does not apply to {config.modality} (choose {', '.join(map(str, stages.pools))})"
        )
    return stages
