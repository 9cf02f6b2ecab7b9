"""EmbeddingGemma 2 (`embedding_gemma2`): one L2-normalised retrieval vector per item, in two stages.

EmbeddingGemma 2 reuses the Gemma 4 vision and audio towers (stored without the `model.` prefix) and adds a
bidirectional text model. Its users run it through sentence-transformers, whose `Transformer` module turns an
item into token ids with placeholder slots (through the checkpoint's chat template when there is one), runs the
whole model, then the modules listed in `modules.json` (mean `Pooling`, any `Dense`, `Normalize`). gemma-embed
runs the same computation as two stages on its own engine:

1. stage 1: today's towers. The item's image, video frames or audio clip become units of
   `Gemma4VisionTower` / `Gemma4AudioTower` (`space="language"`: the rows the model scatters into its sequence);
2. stage 2: `EmbeddingGemma2TextTower`. One unit per item: its token ids, with the stage-1 rows written into the
   placeholder slots, through the text model, then pooling, the Dense modules, normalisation and an optional
   Matryoshka truncation. One vector per unit.

As a chain of stages on the shared engine (`retrieval_stages` below builds it; `engine.encode_chain` runs it):

    setup = read_sentence_transformers(checkpoint)                  # the ST files, plain JSON + safetensors
    preparer = EmbeddingGemma2Preparer(checkpoint, "image", setup, prompt_name="query")
    stage1 = Engine(Gemma4VisionTower(checkpoint, device, dtype), "language")   # audio: Gemma4AudioTower;
    stage2 = Engine(EmbeddingGemma2TextTower(checkpoint, device, dtype, setup, dim=None), "retrieval")
    1. decode:  media/ (PIL image, DecodedVideo, DecodedAudio) or a str for text
    2. prepare: item = preparer.prepare(decoded)        # item.units: stage-1 units; item.sequence: TokenSequence
    3. encode:  encode_chain([stage1, stage2], [None, stage2_item], items, keys, on_item)
       (stage2_item: the text model's unit, token ids + the stage-1 rows for the placeholder slots; text items
       have no stage 1: their prepared unit is that sequence, and the chain is [stage2] alone)

Only what a run needs is loaded: the text model always (`language_model.`), the vision tower and `embed_vision`
for images/video, the audio tower and `embed_audio` for audio, each strictly, through `load_part`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gemma_embed.config import Pool
from gemma_embed.errors import CheckpointError, UsageError
from gemma_embed.models import gemma4, gemma4_audio
from gemma_embed.models.base import PreparedItem, TokenIds, Unit, check_token_ids, text_meta
from gemma_embed.models.gemma4 import resized_size, trim_vision_inputs
from gemma_embed.models.gemma4_audio import gemma4_audio_rows
from gemma_embed.models.loading import Checkpoint
from gemma_embed.models.st_head import SentenceTextTower, token_batch
from gemma_embed.models.st_inputs import (
    MODALITIES,
    MODEL_TYPE,
    InputFormer,
    SentenceTransformerSetup,
    load_st_processor,
    read_sentence_transformers,
    with_processing_kwargs,
)
from gemma_embed.models.text_cost import text_sequence_cost
from gemma_embed.pooling import mean_pool

TEXT_MODEL_PREFIXES = ("language_model.", "model.language_model.")


def is_embeddinggemma2(checkpoint: Checkpoint) -> bool:
    return getattr(checkpoint.config, "model_type", None) == MODEL_TYPE


# ------------------------------------------------------------------------------------------------ preparer


@dataclass
class TokenSequence:
    """One item's token ids and where the stage-1 rows go. `pool_from`: leading tokens pooling skips (a prompt,
    when the checkpoint's Pooling has include_prompt=false)."""

    input_ids: torch.Tensor  # (L,) int64
    placeholders: torch.Tensor  # (L,) bool: slots filled, in order, with the item's stage-1 rows
    pool_from: int = 0

    @property
    def slots(self) -> int:
        return int(self.placeholders.sum())


class EmbeddingGemma2Preparer:
    """Decoded item -> stage-1 units (trimmed, as the towers take them) + the token sequence with its slots.

    One preparer per modality ("text", "image", "video", "audio"). The prompt is resolved once, as
    sentence-transformers resolves it (`prompt`, else `prompts[prompt_name]`, else the default prompt name).
    `max_soft_tokens` overrides the processor's image/frame budget (it changes the vectors: sentence-transformers
    uses the checkpoint's default).
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        modality: str,
        setup: SentenceTransformerSetup | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        max_soft_tokens: int | None = None,
        processor=None,
    ):
        if modality not in MODALITIES:
            raise UsageError(f"EmbeddingGemma 2 embeds {', '.join(MODALITIES)}, not {modality!r}")
        self.checkpoint = checkpoint
        self.modality = modality
        self.setup = setup or read_sentence_transformers(checkpoint)
        self.prompt = self.setup.resolve_prompt(prompt, prompt_name)
        self.processor = processor or load_st_processor(checkpoint, self.setup)
        self.max_soft_tokens = max_soft_tokens
        forming = self.setup
        if max_soft_tokens is not None and modality in ("image", "video"):
            # As sentence-transformers' processing_kwargs={"image": {"max_soft_tokens": N}} (or "video").
            forming = with_processing_kwargs(self.setup, modality, {"max_soft_tokens": int(max_soft_tokens)})
        self.former = InputFormer(self.processor, forming, getattr(checkpoint.config, "model_type", MODEL_TYPE))
        config = checkpoint.config
        self.token_ids = {
            "image": config.image_token_id,
            "video": config.video_token_id,
            "audio": config.audio_token_id,
        }
        vision = getattr(config, "vision_config", None)
        self.pool_area = (vision.pooling_kernel_size if vision is not None else 3) ** 2
        self.patch_size = vision.patch_size if vision is not None else 16

    def describe(self) -> dict:
        return {
            "processor": type(self.processor).__name__,
            "chat_template": self.former.uses_messages,
            "prompt": self.prompt,
            "max_soft_tokens": self.max_soft_tokens,
        }

    def prepare(self, decoded) -> PreparedItem:
        if isinstance(decoded, TokenIds) and self.modality == "text":
            return self._from_ids(decoded)
        value, rate, meta = _st_input(self.modality, decoded)
        out, pool_from = self.former.form(self.modality, value, self.prompt, sampling_rate=rate)
        mask = out["attention_mask"][0].bool()
        ids = out["input_ids"][0][mask].to(torch.long)
        units = self._units(out)
        # The slots of this item's own modality take its rows; other placeholder ids (say, in a prompt) embed as
        # padding, as EmbeddingGemma2Model.forward does when that modality has no input.
        token = self.token_ids.get(self.modality)
        placeholders = ids == int(token) if token is not None else torch.zeros_like(ids, dtype=torch.bool)
        slots = int(placeholders.sum())
        rows = sum(u.rows for u in units)
        if slots != rows:
            raise ValueError(f"the token sequence has {slots} placeholder slots for {rows} {self.modality} rows")
        meta = {**meta, "tokens": int(ids.shape[0])}
        if units and self.modality in ("image", "video"):
            meta.update(resized_size(units[0], self.patch_size), patches=units[0].length, soft_tokens=units[0].rows)
        elif units:  # audio: the mel frames embedded (the feature extractor keeps the first 30 s, as in ST)
            meta["feature_frames"] = units[0].length
        item = PreparedItem(units=units, meta=meta, sequence=TokenSequence(ids, placeholders, pool_from))
        # Text has no tower: its one stage is the text model, whose unit is the sequence itself.
        return item if units else stage2_item(item, None)

    def _from_ids(self, given: TokenIds) -> PreparedItem:
        """A text given as token ids: the text model's input as it is (no prompt or template), every token pooled;
        a placeholder id among them embeds as padding, as in a text with no media."""
        text = self.checkpoint.config.text_config
        limit = min(self.former.max_length, int(text.max_position_embeddings))
        ids = torch.tensor(check_token_ids(given, int(text.vocab_size), limit), dtype=torch.long)
        sequence = TokenSequence(ids, torch.zeros_like(ids, dtype=torch.bool), 0)
        return stage2_item(PreparedItem(units=[], meta={"tokens": int(ids.shape[0])}, sequence=sequence), None)

    def _units(self, out) -> list[Unit]:
        if self.modality == "image":
            return trim_vision_inputs(out["pixel_values"], out["image_position_ids"], self.pool_area)
        if self.modality == "video":
            return trim_vision_inputs(out["pixel_values_videos"], out["video_position_ids"], self.pool_area)
        if self.modality == "audio":
            features, mask = out["input_features"][0], out["input_features_mask"][0].bool()
            valid = int(mask.sum())
            if valid == 0:
                raise ValueError("too short to embed: the clip gives no feature frame")
            if not bool(mask[:valid].all()):
                raise ValueError("feature extractor output has padding frames before real ones")
            return [
                Unit(
                    inputs={"input_features": features[:valid].contiguous()},
                    length=valid,
                    rows=gemma4_audio_rows(valid),
                )
            ]
        return []


def _st_input(modality: str, decoded) -> tuple[Any, int | None, dict]:
    """What a sentence-transformers user passes for this decoded item, its sampling rate, and item metadata."""
    if modality == "text":
        if not isinstance(decoded, str):
            raise TypeError("a text item must be a str")
        return decoded, None, text_meta(decoded)
    if modality == "image":  # a media.image.DecodedImage (its RGB image and what the file was), or an image
        image = getattr(decoded, "image", decoded)
        return image, None, {"width": image.width, "height": image.height, **getattr(decoded, "meta", {})}
    if modality == "audio":  # a media.audio.DecodedAudio, or bare samples
        samples = getattr(decoded, "samples", decoded)
        rate = getattr(decoded, "sample_rate", None)
        meta = decoded.facts() if hasattr(decoded, "facts") else {}
        return samples, rate, meta
    frames = getattr(decoded, "frames", decoded)  # a media.video.DecodedVideo, or bare frames
    return frames, None, decoded.facts() if hasattr(decoded, "facts") else {"frames": int(len(frames))}


# --------------------------------------------------------------------------------------------- stage 2


def stage2_item(item: PreparedItem, rows: torch.Tensor | None) -> PreparedItem:
    """The stage-2 unit of one item: its token ids and its stage-1 rows (one per placeholder slot, in order)."""
    sequence: TokenSequence = item.sequence
    if sequence is None:
        raise ValueError("item has no token sequence (not prepared by EmbeddingGemma2Preparer)")
    count = 0 if rows is None else int(rows.shape[0])
    if count != sequence.slots:
        raise ValueError(f"{count} stage-1 rows for {sequence.slots} placeholder slots")
    inputs = {"input_ids": sequence.input_ids, "placeholders": sequence.placeholders, "pool_from": sequence.pool_from}
    if rows is not None and count:
        inputs["rows"] = rows
    unit = Unit(inputs=inputs, length=int(sequence.input_ids.shape[0]), rows=1)
    return PreparedItem(units=[unit], meta=item.meta, sequence=sequence)


class EmbeddingGemma2TextTower(SentenceTextTower):
    """Stage 2 as a Tower: sequences -> text model -> mean pooling -> Dense modules -> normalise -> truncate.

    Units are whole sequences; the engine groups them as ragged batches (sorted by length, padding capped):
    padding is exact here because attention masks padded keys, positions are right-padded (a real token keeps
    its position), and pooling counts real tokens only. Measured against each sequence alone: 1e-7 to 2e-6
    relative error in float32 (SDPA's masked kernel rounds differently), under the 1e-5 the tool promises
    (tests/integration/test_embeddinggemma2.py::test_padded_ragged_stage2_batches_equal_each_sequence_alone).
    """

    part = ("language_model", TEXT_MODEL_PREFIXES)

    def __init__(
        self,
        checkpoint: Checkpoint,
        device,
        dtype,
        setup: SentenceTransformerSetup | None = None,
        dim: int | None = None,
        load: bool = True,
    ):
        text_config = getattr(checkpoint.config, "text_config", None)
        if text_config is None or not is_embeddinggemma2(checkpoint):
            raise CheckpointError(
                f"{checkpoint.source}: not an EmbeddingGemma 2 checkpoint "
                f"(model type {getattr(checkpoint.config, 'model_type', '?')})"
            )
        config = checkpoint.config
        ids = [getattr(config, name, None) for name in ("image_token_id", "video_token_id", "audio_token_id")]
        self.multimodal_ids = torch.tensor([int(i) for i in ids if i is not None], dtype=torch.long)
        self._setup(checkpoint, text_config, device, dtype, setup, text_config.embedding_dim, dim, load)

    def build_model(self) -> torch.nn.Module:
        from transformers.models.embedding_gemma2.modeling_embedding_gemma2 import EmbeddingGemma2TextModel

        return EmbeddingGemma2TextModel(self.config)

    def unit_cost(self, length: int) -> int:
        cfg = self.config
        return text_sequence_cost(
            tokens=length,
            hidden=cfg.hidden_size,
            intermediate=cfg.intermediate_size,
            layers=cfg.num_hidden_layers,
            per_layer_dim=cfg.hidden_size_per_layer_input,
            bytes_per_element=self.element_size,
            sliding_window=cfg.sliding_window if "sliding_attention" in cfg.layer_types else None,
        )

    def encode(self, units: list[Unit], space: str = "retrieval") -> torch.Tensor:
        ids, mask, pool = token_batch(units, self.pad_id)
        slots = torch.zeros(ids.shape, dtype=torch.bool)
        for i, unit in enumerate(units):
            slots[i, : unit.length] = unit.inputs["placeholders"]
        ids, mask, slots, pool = (t.to(self.device) for t in (ids, mask, slots, pool))
        # As EmbeddingGemma2Model.forward: every placeholder id embeds as padding, then the item's rows overwrite
        # its own slots in order.
        multimodal = torch.isin(ids, self.multimodal_ids.to(self.device))
        embeds = self.model.get_input_embeddings()(torch.where(multimodal, self.pad_id, ids))
        rows = [u.inputs["rows"] for u in units if "rows" in u.inputs]
        if rows:
            embeds = embeds.masked_scatter(slots.unsqueeze(-1), torch.cat(rows).to(self.device, embeds.dtype))
        hidden = self.model(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
        return self.head(mean_pool(hidden, pool))  # (B, D): one row per unit, split by the engine


# ------------------------------------------------------------- the family's builders (models/families/ declares it)


def retrieval_stages(config, checkpoint: Checkpoint, device, dtype, modality):
    """One retrieval vector per item: the Gemma 4 tower of the item's kind (none for text), then the text model
    over the item's token sequence with the tower's rows in its placeholder slots."""
    from gemma_embed.config import Space
    from gemma_embed.modalities import Stage, audio_stages, image_stages, text_stages, video_stages
    from gemma_embed.models.gemma4 import Gemma4VisionTower
    from gemma_embed.models.gemma4_audio import Gemma4AudioTower

    setup = read_sentence_transformers(checkpoint)
    kind = modality.singular
    preparer = EmbeddingGemma2Preparer(
        checkpoint, kind, setup, config.prompt, config.prompt_name, max_soft_tokens=config.max_soft_tokens
    )
    text = EmbeddingGemma2TextTower(checkpoint, device, dtype, setup, dim=config.dim, load=False)
    if kind == "text":
        return text_stages(preparer, [Stage(text, Space.retrieval)])
    tower_class = Gemma4AudioTower if kind == "audio" else Gemma4VisionTower
    # Stage 1 gives the rows the text model takes into its sequence: the tower's language-space rows.
    chain = [
        Stage(tower_class(checkpoint, device, dtype, load=False), Space.language),
        Stage(text, Space.retrieval, feed=stage2_item, lengths=lambda item: [int(item.sequence.input_ids.shape[0])]),
    ]
    if kind == "image":
        return image_stages(preparer, chain)
    if kind == "audio":
        return audio_stages(preparer, chain, int(preparer.processor.feature_extractor.sampling_rate))
    frames = preparer.processor.video_processor  # its own sampling: 1 frame per second, at most 32
    return video_stages(
        config,
        preparer,
        chain,
        getattr(frames, "num_frames", None),
        getattr(frames, "fps", None),
        processor_max_frames=getattr(frames, "max_frames", None),
        pools=(Pool.none, Pool.mean),
    )


def _build(tower_build):
    """A command's builder: retrieval vectors, or (--space language|tower) the Gemma 4 tower's own rows."""

    def build(config, checkpoint: Checkpoint, device, dtype, space):
        if space == "retrieval":
            return retrieval_stages(config, checkpoint, device, dtype, config.modality)
        return tower_build(config, checkpoint, device, dtype, space)

    return build


build_images = _build(gemma4.build_images)
build_video = _build(gemma4.build_video)
build_audio = _build(gemma4_audio.build_audio)
build_text = _build(None)
