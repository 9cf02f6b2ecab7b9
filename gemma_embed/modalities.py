"""What differs between images, video and audio: how a file is decoded, and which preparer and tower run.

The pipeline asks `build_modality` for one of these and never branches on the modality itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gemma_embed.config import RunConfig
from gemma_embed.errors import UsageError
from gemma_embed.models.base import Preparer, Tower

# Prepared video frames are float32 patches (about 2 MB a frame at 70 soft tokens): a video window is sized in
# frames, not the pipeline's default count of items, so host memory stays flat.
VIDEO_WINDOW_FRAMES = 512


@dataclass
class Modality:
    name: str
    decode: Callable[[str], Any]  # path -> decoded media; raises with a one-line reason
    preparer: Preparer
    tower: Tower
    pools: tuple[str, ...] = ("none", "mean")  # the --pool values that make sense for these items
    window_items: int | None = None  # items decoded and prepared together; None: the pipeline's default


def _images(config: RunConfig, checkpoint, device, dtype) -> Modality:
    from gemma_embed.media.image import decode_image
    from gemma_embed.models.gemma4 import Gemma4ImagePreparer, Gemma4VisionTower

    preparer = Gemma4ImagePreparer(checkpoint, config.max_soft_tokens)
    return Modality("images", decode_image, preparer, Gemma4VisionTower(checkpoint, device, dtype))


def _audio(config: RunConfig, checkpoint, device, dtype) -> Modality:
    """Gemma 4 (and towers that reuse its audio encoder) or Gemma 3n, by the checkpoint's audio config."""
    from functools import partial

    from gemma_embed.media.audio import decode_audio
    from gemma_embed.models.audio import (
        DEFAULT_WINDOW_S,
        AudioPreparer,
        audio_sub_configs,
        load_feature_extractor,
        validate_window,
    )

    window_s = validate_window(config.extra.get("window_s", DEFAULT_WINDOW_S))
    audio_config, _ = audio_sub_configs(checkpoint)
    family = getattr(audio_config, "model_type", "")
    if family == "gemma3n_audio":
        from gemma_embed.models.gemma3n import Gemma3nAudioTower

        tower = Gemma3nAudioTower(checkpoint, device, dtype)
        rows_for_frames, keep_tail = tower.rows_for_frames, True
    elif family == "gemma4_audio":
        from gemma_embed.models.gemma4_audio import Gemma4AudioTower, gemma4_audio_rows

        tower = Gemma4AudioTower(checkpoint, device, dtype)
        rows_for_frames, keep_tail = gemma4_audio_rows, False
    else:
        raise UsageError(
            f"{checkpoint.source}: no audio support for model type "
            f"{getattr(checkpoint.config, 'model_type', '?')} (audio tower {family or '?'})"
        )
    preparer = AudioPreparer(load_feature_extractor(checkpoint), rows_for_frames, window_s, keep_tail)
    decode = partial(decode_audio, sample_rate=preparer.sample_rate)
    return Modality("audio", decode, preparer, tower)


def _video(config: RunConfig, checkpoint, device, dtype) -> Modality:
    from gemma_embed.media.video import decode_video, resolve_policy
    from gemma_embed.models.gemma4 import Gemma4VideoPreparer, Gemma4VisionTower

    fps, max_frames = config.extra.get("fps"), config.extra.get("max_frames")
    if fps is not None and not fps > 0:
        raise UsageError(f"--fps must be positive, got {fps}")
    if max_frames is not None and max_frames < 1:
        raise UsageError(f"--max-frames must be at least 1, got {max_frames}")
    preparer = Gemma4VideoPreparer(checkpoint, config.max_soft_tokens)
    policy = resolve_policy(preparer.num_frames, preparer.fps, fps=fps, max_frames=max_frames)
    window = max(1, VIDEO_WINDOW_FRAMES // (policy.most_frames or VIDEO_WINDOW_FRAMES))
    # Frames are images to the vision tower: the same tower class, so frames share the image path's buckets.
    return Modality(
        "video",
        partial(decode_video, policy=policy),
        preparer,
        Gemma4VisionTower(checkpoint, device, dtype),
        pools=("none", "mean", "frame"),
        window_items=window,
    )


BUILDERS: dict[str, Callable[..., Modality]] = {
    "images": _images,
    "audio": _audio,
    "video": _video,
}


def build_modality(config: RunConfig, checkpoint, device, dtype) -> Modality:
    try:
        builder = BUILDERS[config.modality]
    except KeyError:
        raise UsageError(f"modality {config.modality!r} is not supported") from None
    modality = builder(config, checkpoint, device, dtype)
    if config.pool not in modality.pools:
        raise UsageError(
            f"--pool {config.pool} does not apply to {config.modality} (choose {', '.join(modality.pools)})"
        )
    return modality
