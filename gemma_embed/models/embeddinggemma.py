"""EmbeddingGemma (v1, `google/embeddinggemma-300m`): text to one L2-normalised retrieval vector, in one stage.

The checkpoint is a bidirectional Gemma 3 text model (`Gemma3TextModel`, model type `gemma3_text` with
`use_bidirectional_attention`, weights stored without a prefix) and sentence-transformers' files around it:
mean `Pooling`, two `Dense` modules (768 -> 3072 -> 768, no bias, identity activation), `Normalize`, task prompts
in config_sentence_transformers.json and `max_seq_length` in sentence_bert_config.json. Users run it as
`SentenceTransformer(ckpt).encode(texts, prompt_name="query")`; gemma-embed runs the same computation on its
engine:

    setup = read_sentence_transformers(checkpoint)                  # the ST files, plain JSON + safetensors
    refuse_float16(dtype)                                           # before loading anything
    preparer = EmbeddingGemmaPreparer(checkpoint, setup, prompt_name="query")
    engine = Engine(EmbeddingGemmaTextTower(checkpoint, device, dtype, setup, dim=None), "retrieval")
    items = [preparer.prepare(text) for text in texts]              # one unit each: its token ids
    encode_items(engine, items, keys, on_item)                      # one (1, D) float32 row per item

Token ids come from the checkpoint's own tokenizer through the calls sentence-transformers makes (prompt
prepended to the text, `truncation="longest_first"` at the tokenizer's `model_max_length`, which
sentence-transformers sets from max_seq_length), one text at a time. The text model then sees each text alone or
right-padded in a ragged batch with its attention mask, which for this bidirectional model equals the text alone
to float32 rounding (tests/integration/test_embeddinggemma.py measures it), and equals sentence-transformers'
own batches, which the tokenizer pads on the right too.
"""

from __future__ import annotations

import functools

import torch

from gemma_embed.errors import CheckpointError, UsageError
from gemma_embed.models.base import PreparedItem, TokenIds, Unit, check_token_ids, text_meta
from gemma_embed.models.families.embeddinggemma import MODEL_TYPE
from gemma_embed.models.loading import Checkpoint
from gemma_embed.models.st_head import SentenceTextTower, token_batch
from gemma_embed.models.st_inputs import (
    InputFormer,
    SentenceTransformerSetup,
    load_st_processor,
    read_sentence_transformers,
)
from gemma_embed.models.text_cost import text_sequence_cost
from gemma_embed.pooling import mean_pool

# Gemma3TextModel.save_pretrained writes its tensors without a prefix (embed_tokens., layers.N., norm.).
TEXT_MODEL_PREFIXES = ("",)


def is_embeddinggemma(checkpoint: Checkpoint) -> bool:
    """A bidirectional Gemma 3 text model: EmbeddingGemma's config (a causal `gemma3_text` is a language model)."""
    config = checkpoint.config
    return getattr(config, "model_type", None) == MODEL_TYPE and bool(
        getattr(config, "use_bidirectional_attention", False)
    )


def refuse_float16(dtype) -> None:
    """EmbeddingGemma's residual stream exceeds float16's range (65504): in float16 its vectors come out NaN, in
    transformers too (the model card: float16 is not supported). Called before anything is loaded."""
    if dtype == torch.float16 or dtype == "float16":
        raise UsageError(
            "EmbeddingGemma does not run in float16: its activations overflow float16 (NaN vectors); "
            "use --dtype bfloat16 or float32"
        )


def cut_ids(full: torch.Tensor, limit: int, tail: int) -> torch.Tensor:
    """`limit` ids from untruncated ones as a tokenizer whose post-processor appends `tail` special tokens cuts
    them: the first `limit - tail`, then the last `tail`."""
    return torch.cat([full[: limit - tail], full[full.shape[0] - tail :]])


class EmbeddingGemmaPreparer:
    """A text -> one unit: its token ids as sentence-transformers forms them, with the resolved prompt
    (`prompt`, else `prompts[prompt_name]`, else the checkpoint's default prompt name).

    A text longer than max_seq_length is cut as sentence-transformers cuts it (the tokenizer's longest_first
    truncation, its special tokens kept); the item's metadata says how many tokens were cut."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        setup: SentenceTransformerSetup | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        processor=None,
    ):
        self.checkpoint = checkpoint
        self.setup = setup or read_sentence_transformers(checkpoint)
        self.prompt = self.setup.resolve_prompt(prompt, prompt_name)
        self.tokenizer = processor or load_st_processor(checkpoint, self.setup)
        self.former = InputFormer(self.tokenizer, self.setup, getattr(checkpoint.config, "model_type", MODEL_TYPE))
        self.max_seq_length = self.former.max_length

    def describe(self) -> dict:
        return {
            "tokenizer": type(self.former.tokenizer).__name__,
            "chat_template": self.former.uses_messages,
            "prompt": self.prompt,
            "max_seq_length": self.max_seq_length,
        }

    def prepare(self, text) -> PreparedItem:
        if isinstance(text, TokenIds):  # the model's input ids as given: nothing added, every token pooled
            limit = min(self.max_seq_length, int(self.checkpoint.config.max_position_embeddings))
            ids = torch.tensor(check_token_ids(text, int(self.checkpoint.config.vocab_size), limit), dtype=torch.long)
            unit = Unit(inputs={"input_ids": ids, "pool_from": 0}, length=int(ids.shape[0]), rows=1)
            return PreparedItem(units=[unit], meta={"tokens": unit.length, "truncated_tokens": 0})
        if not isinstance(text, str):
            raise TypeError("a text item must be a str")
        full, pool_from = self._ids(text, truncation=False)
        ids = full if full.shape[0] <= self.max_seq_length else self._cut(full, text)  # within the limit: no cut
        truncated = int(full.shape[0]) - int(ids.shape[0])
        unit = Unit(inputs={"input_ids": ids, "pool_from": pool_from}, length=int(ids.shape[0]), rows=1)
        meta = {**text_meta(text), "tokens": unit.length, "truncated_tokens": truncated}
        return PreparedItem(units=[unit], meta=meta)

    def _cut(self, full: torch.Tensor, text: str) -> torch.Tensor:
        """The ids the tokenizer's own truncation gives, from the untruncated ones (`cut_ids` with the suffix
        length a probe found), else from a second, truncated call. One call instead of two: the truncated call
        costs more than the untruncated one (measured with the sample tokenizer on a 100 kB text: 62 against 40 ms;
        its Rust truncation splits off the rest as overflow encodings)."""
        if self._suffix_length is None:
            return self._ids(text, truncation=True)[0]
        return cut_ids(full, self.max_seq_length, self._suffix_length)

    @functools.cached_property
    def _suffix_length(self) -> int | None:
        """The S of `cut_ids` that reproduces the tokenizer's own truncation on two texts over the limit; None
        where none does (a chat template, left truncation, another post-processor)."""
        if not self.former.bare_tokenizer or self.former.uses_messages:
            return None
        probes = [" ".join([word] * (2 * self.max_seq_length)) for word in ("the", "probe 1 x")]
        pairs = [(self._ids(p, truncation=False)[0], self._ids(p, truncation=True)[0]) for p in probes]
        for tail in range(min(4, self.max_seq_length)):
            if all(torch.equal(cut_ids(full, self.max_seq_length, tail), cut) for full, cut in pairs):
                return tail
        return None

    def _ids(self, text: str, truncation: bool) -> tuple[torch.Tensor, int]:
        out, pool_from = self.former.form("text", text, self.prompt, truncation=truncation)
        ids, mask = torch.as_tensor(out["input_ids"][0]), torch.as_tensor(out["attention_mask"][0]).bool()
        return ids[mask].to(torch.long), pool_from


class EmbeddingGemmaTextTower(SentenceTextTower):
    """Token units -> Gemma3TextModel (bidirectional, SDPA) -> mean pooling -> Dense modules -> Normalize ->
    optional Matryoshka truncation (`dim`: 768, 512, 256, 128 for the real model). One vector per unit.

    Units are grouped as ragged batches (sorted by length, padding capped), right-padded with the attention
    mask: a real token keeps its position, padded keys are masked, pooling counts real tokens only."""

    part = ("text model", TEXT_MODEL_PREFIXES)

    def __init__(
        self,
        checkpoint: Checkpoint,
        device,
        dtype,
        setup: SentenceTransformerSetup | None = None,
        dim: int | None = None,
        load: bool = True,
    ):
        if not is_embeddinggemma(checkpoint):
            raise CheckpointError(
                f"{checkpoint.source}: not an EmbeddingGemma checkpoint (a gemma3_text model with "
                f"use_bidirectional_attention; this one is {getattr(checkpoint.config, 'model_type', '?')})"
            )
        refuse_float16(dtype)
        config = checkpoint.config
        self._setup(checkpoint, config, device, dtype, setup, config.hidden_size, dim, load)

    def build_model(self) -> torch.nn.Module:
        from transformers import Gemma3TextModel

        return Gemma3TextModel(self.config)

    def unit_cost(self, length: int) -> int:
        cfg = self.config
        return text_sequence_cost(
            tokens=length,
            hidden=cfg.hidden_size,
            intermediate=cfg.intermediate_size,
            layers=cfg.num_hidden_layers,
            per_layer_dim=0,  # Gemma 3 has no per-layer inputs
            bytes_per_element=self.element_size,
            sliding_window=cfg.sliding_window if "sliding_attention" in cfg.layer_types else None,
            rotary_dims=cfg.head_dim * len(set(cfg.layer_types)),
            dense_full_mask=True,
        )

    def encode(self, units: list[Unit], space: str = "retrieval") -> torch.Tensor:
        ids, mask, pool = (t.to(self.device) for t in token_batch(units, self.pad_id))
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return self.head(mean_pool(hidden, pool))  # (B, D): one row per unit, split by the engine


# ------------------------------------------------------------- the family's builders (models/families/ declares it)


def build_text(config, checkpoint: Checkpoint, device, dtype, space):
    from gemma_embed.modalities import Stage, text_stages

    setup = read_sentence_transformers(checkpoint)
    preparer = EmbeddingGemmaPreparer(checkpoint, setup, config.prompt, config.prompt_name)
    tower = EmbeddingGemmaTextTower(checkpoint, device, dtype, setup, dim=config.dim, load=False)
    return text_stages(preparer, [Stage(tower, space)])


def check_options(config, space) -> None:
    """The family's check before anything loads: no float16."""
    refuse_float16(config.dtype)
