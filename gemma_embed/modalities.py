"""What differs between images, video, audio and text: how an item is decoded, and which preparer and towers run.

The pipeline asks `build_modality` for a `ModalityStages` and never branches on the modality itself. Two kinds:
- the towers' own rows (`--space language|tower`): one encode stage, the tower;
- EmbeddingGemma 2 retrieval vectors (`--space retrieval`, the default for such a checkpoint): stage 1 is the
  same tower (none for text), stage 2 (`second`) the text model that turns each item's token sequence, its
  placeholders filled with the stage-1 rows, into one normalised vector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gemma_embed.config import Pool, RunConfig, Space
from gemma_embed.errors import CheckpointError, UsageError
from gemma_embed.models.base import Preparer, Tower

# Prepared video frames are float32 patches (about 2 MB a frame at 70 soft tokens): a video window is sized in
# frames, not the pipeline's default count of items, so host memory stays flat.
VIDEO_WINDOW_FRAMES = 512


@dataclass
class ModalityStages:
    """The decode, prepare and encode stages of one modality, ready to run."""

    name: str
    decode: Callable[[str | bytes], Any]  # a path or an item's bytes -> decoded media; one-line reason on failure
    preparer: Preparer
    tower: Tower | None  # stage 1 (None: text, whose items have no tower units)
    space: Space = Space.language  # what the rows are (resolved from --space auto)
    second: Tower | None = None  # stage 2 (EmbeddingGemma 2's text model), fed each item's stage-1 rows
    pools: tuple[Pool, ...] = (Pool.none, Pool.mean)  # the --pool values that make sense for these items
    window_items: int | None = None  # items decoded and prepared together; None: the pipeline's default

    @property
    def width(self) -> int:
        """Row width of the output."""
        last = self.second or self.tower
        return int(last.output_dims[str(self.space)])


def _images(config: RunConfig, checkpoint, device, dtype) -> ModalityStages:
    from gemma_embed.media.image import decode_image
    from gemma_embed.models.gemma4 import Gemma4ImagePreparer, Gemma4VisionTower

    preparer = Gemma4ImagePreparer(checkpoint, config.max_soft_tokens)
    tower = Gemma4VisionTower(checkpoint, device, dtype)
    return ModalityStages("images", decode_image, preparer, tower, space=_tower_space(config))


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
    return ModalityStages("audio", decode, preparer, tower, space=_tower_space(config))


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
        space=_tower_space(config),
        pools=(Pool.none, Pool.mean, Pool.frame),
        window_items=window,
    )


def _tower_space(config: RunConfig) -> Space:
    return Space.language if config.space == Space.auto else config.space


def _embeddinggemma2(config: RunConfig, checkpoint, device, dtype) -> ModalityStages:
    """One retrieval vector per item: the Gemma 4 tower of the item's kind, then EmbeddingGemma 2's text model."""
    from gemma_embed.models.embeddinggemma2 import EmbeddingGemma2Preparer, EmbeddingGemma2TextTower
    from gemma_embed.models.st_inputs import read_sentence_transformers

    setup = read_sentence_transformers(checkpoint)
    kind = {"images": "image", "video": "video", "audio": "audio", "text": "text"}[str(config.modality)]
    preparer = EmbeddingGemma2Preparer(
        checkpoint,
        kind,
        setup,
        prompt=config.prompt,
        prompt_name=config.prompt_name,
        max_soft_tokens=config.max_soft_tokens,
    )
    tower, window = None, None
    if kind == "text":
        from gemma_embed.sources.text import decode_text as decode
    elif kind == "image":
        from gemma_embed.media.image import decode_image as decode
        from gemma_embed.models.gemma4 import Gemma4VisionTower

        tower = Gemma4VisionTower(checkpoint, device, dtype)
    elif kind == "video":
        from gemma_embed.media.video import decode_video, resolve_policy
        from gemma_embed.models.gemma4 import Gemma4VisionTower

        frames = preparer.processor.video_processor  # its own sampling: 1 frame per second, at most 32
        policy = resolve_policy(
            getattr(frames, "num_frames", None),
            getattr(frames, "fps", None),
            fps=config.fps,
            max_frames=config.max_frames,
            processor_max_frames=getattr(frames, "max_frames", None),
        )
        decode = partial(decode_video, policy=policy)
        window = max(1, VIDEO_WINDOW_FRAMES // (policy.most_frames or VIDEO_WINDOW_FRAMES))
        tower = Gemma4VisionTower(checkpoint, device, dtype)
    else:
        from gemma_embed.media.audio import decode_audio
        from gemma_embed.models.gemma4_audio import Gemma4AudioTower

        decode = partial(decode_audio, sample_rate=int(preparer.processor.feature_extractor.sampling_rate))
        tower = Gemma4AudioTower(checkpoint, device, dtype)
    second = EmbeddingGemma2TextTower(checkpoint, device, dtype, setup, dim=config.dim)
    return ModalityStages(
        str(config.modality), decode, preparer, tower, space=Space.retrieval, second=second, window_items=window
    )


def is_embeddinggemma2(checkpoint) -> bool:
    return getattr(checkpoint.config, "model_type", None) == "embedding_gemma2"


def resolve_space(config: RunConfig, checkpoint) -> Space:
    """--space auto: retrieval vectors for an EmbeddingGemma 2 checkpoint (and always for text), soft tokens
    (language) for the others. Retrieval needs EmbeddingGemma 2; the towers' spaces need a tower."""
    space = config.space
    if space == Space.auto:
        space = Space.retrieval if is_embeddinggemma2(checkpoint) or config.modality == "text" else Space.language
    if config.modality == "text" and space != Space.retrieval:
        raise UsageError("text has no tower rows: --space retrieval (EmbeddingGemma 2) is the only one")
    if space == Space.retrieval and not is_embeddinggemma2(checkpoint):
        raise CheckpointError(
            f"{checkpoint.source}: {config.modality} to retrieval vectors need an EmbeddingGemma 2 checkpoint "
            f"(model type embedding_gemma2); this one is {getattr(checkpoint.config, 'model_type', '?')}"
        )
    return space


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
    space = resolve_space(config, checkpoint)
    if space == Space.retrieval:
        if config.modality != "text":
            check_supported(config.modality, checkpoint)
        stages = _embeddinggemma2(config, checkpoint, device, dtype)
    else:
        try:
            builder = BUILDERS[config.modality]
        except KeyError:
            raise UsageError(f"modality {config.modality!r} is not supported") from None
        if config.dim is not None or config.prompt is not None or config.prompt_name is not None:
            raise UsageError("--dim, --prompt and --prompt-name apply to EmbeddingGemma 2 retrieval vectors only")
        check_supported(config.modality, checkpoint)
        stages = builder(config, checkpoint, device, dtype)
    if config.pool not in stages.pools:
        raise UsageError(
            f"--pool {config.pool} does not apply to {config.modality} (choose {', '.join(map(str, stages.pools))})"
        )
    return stages
