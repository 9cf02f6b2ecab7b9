"""sentence-transformers' side of EmbeddingGemma and EmbeddingGemma 2, without sentence-transformers: what its
files say, and how its `Transformer` module (6.2) turns one item into processor (or tokenizer) output.

The files are read as plain JSON and safetensors (no pickle, no remote code). Inputs are formed by the same
transformers calls sentence-transformers makes, with the same kwargs, for one item at a time, so the token ids
match whatever chat template or tokenizer a checkpoint ships (tests compare against sentence-transformers).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import dataclass, field
from typing import Any

import torch

from gemma_embed.config import Modality
from gemma_embed.errors import CheckpointError, UsageError
from gemma_embed.models.families.embeddinggemma2 import MODEL_TYPE
from gemma_embed.models.loading import Checkpoint, load_pretrained

MODALITIES = tuple(m.singular for m in (Modality.text, Modality.images, Modality.video, Modality.audio))

# sentence-transformers' files: module list, settings of its Transformer module, model-level settings (prompts).
MODULES_FILE = "modules.json"
TRANSFORMER_CONFIG_FILE = "sentence_bert_config.json"
ST_CONFIG_FILE = "config_sentence_transformers.json"
MODULE_CONFIG_FILE = "config.json"
MODULE_WEIGHTS_FILE = "model.safetensors"
# Files a hub checkpoint needs besides config.json and weights: the ST files and the processor's text side.
SIDE_FILE_PATTERNS = ("*.json", "*.jinja", "tokenizer*", "*/model.safetensors")


@dataclass(frozen=True)
class DenseLayer:
    """One sentence-transformers `Dense` module: `activation(linear(x))` (+ a residual when configured)."""

    folder: str
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a torch.nn module class path, e.g. "torch.nn.modules.linear.Identity"
    use_residual: bool = False


NORMALIZE = "normalize"


@dataclass(frozen=True)
class SentenceTransformerSetup:
    """What the checkpoint's sentence-transformers files say, read as plain JSON.

    `head` is the ordered list of what follows pooling: DenseLayer entries and NORMALIZE.
    `message_format` is set ("structured" or "flat") when its Transformer module feeds inputs through the chat
    template as messages (sentence-transformers' "message" modality); None: the processor is called directly.
    """

    pooling_mode: str = "mean"
    include_prompt: bool = True
    head: tuple = ()
    prompts: dict = field(default_factory=dict)
    default_prompt_name: str | None = None
    modalities: tuple[str, ...] = ("text",)
    message_format: str | None = None
    processing_kwargs: dict = field(default_factory=dict)
    processor_kwargs: dict = field(default_factory=dict)
    similarity_fn_name: str | None = None  # config_sentence_transformers.json's; None: cosine, as ST defaults

    @property
    def normalizes(self) -> bool:
        return NORMALIZE in self.head

    @property
    def dim(self) -> int | None:
        """Output width when the last Dense fixes it; None: the text model's embedding_dim."""
        dense = [step for step in self.head if isinstance(step, DenseLayer)]
        return dense[-1].out_features if dense else None

    def resolve_prompt(self, prompt: str | None = None, prompt_name: str | None = None) -> str | None:
        """The prompt sentence-transformers would use: `prompt`, else `prompts[prompt_name]`, else the default."""
        if prompt is not None:
            return prompt
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                known = ", ".join(sorted(self.prompts)) or "none"
                raise UsageError(f"no prompt named {prompt_name!r} in this checkpoint (its prompts: {known})")
            return self.prompts[prompt_name]
        if self.default_prompt_name is not None:
            return self.prompts.get(self.default_prompt_name)
        return None


def _module_kind(type_ref: str) -> str:
    """'Transformer', 'Pooling', 'Dense', 'Normalize' for sentence-transformers' own module classes."""
    if not type_ref.startswith("sentence_transformers."):
        raise CheckpointError(f"modules.json lists {type_ref!r}: only sentence-transformers' own modules are run")
    return type_ref.rsplit(".", 1)[-1]


def _read_json(checkpoint: Checkpoint, relative: str, optional: bool = False) -> dict | list | None:
    path = checkpoint.folder / relative
    if not path.is_file():
        if optional:
            return None
        raise CheckpointError(f"{checkpoint.source}: no {relative} (not a sentence-transformers checkpoint?)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{checkpoint.source}: cannot read {relative}: {' '.join(str(exc).split())}") from exc


def fetch_side_files(checkpoint: Checkpoint) -> None:
    """For a hub id: download the sentence-transformers files and the tokenizer/chat template into the same
    snapshot folder as config.json (no language-model weights). A local folder needs nothing."""
    if checkpoint.is_local:
        return
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(checkpoint.source, revision=checkpoint.revision, allow_patterns=list(SIDE_FILE_PATTERNS))
    except Exception as exc:  # noqa: BLE001 - any hub failure is one line for the user
        detail = " ".join(str(exc).split())
        raise CheckpointError(f"{checkpoint.source}: cannot fetch its sentence-transformers files: {detail}") from exc


def read_sentence_transformers(checkpoint: Checkpoint) -> SentenceTransformerSetup:
    """Read modules.json and the files it points to. Refuses what this adapter does not run, with one line."""
    fetch_side_files(checkpoint)
    modules = _read_json(checkpoint, MODULES_FILE)
    modules = sorted(modules, key=lambda m: int(m.get("idx", 0)))
    kinds = [_module_kind(m["type"]) for m in modules]
    if not kinds or kinds[0] != "Transformer" or modules[0].get("path", "") not in ("", "."):
        raise CheckpointError(f"{checkpoint.source}: modules.json must start with the Transformer module at the root")
    if kinds.count("Pooling") != 1 or kinds[1] != "Pooling":
        raise CheckpointError(f"{checkpoint.source}: modules.json must have one Pooling module right after Transformer")

    pooling = _read_json(checkpoint, f"{modules[1]['path']}/{MODULE_CONFIG_FILE}")
    mode = pooling.get("pooling_mode")
    if mode is None:  # older saves: one boolean per mode (sentence-transformers' _convert_legacy_pooling_kwargs)
        active = [
            key.removeprefix("pooling_mode_") for key, on in pooling.items() if key.startswith("pooling_mode_") and on
        ]
        mode = {"mean_tokens": "mean"}.get(active[0], active[0]) if len(active) == 1 else (tuple(active) or "mean")
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else tuple(mode)
    if mode != "mean":
        raise CheckpointError(
            f"{checkpoint.source}: pooling mode {mode!r} is not supported (the EmbeddingGemma models use mean)"
        )

    head: list = []
    for module, kind in zip(modules[2:], kinds[2:], strict=True):
        if kind == "Normalize":
            head.append(NORMALIZE)
        elif kind == "Dense":
            cfg = _read_json(checkpoint, f"{module['path']}/{MODULE_CONFIG_FILE}")
            if cfg.get("module_input_name", "sentence_embedding") != "sentence_embedding" or cfg.get(
                "module_output_name"
            ) not in (None, "sentence_embedding"):
                raise CheckpointError(f"{checkpoint.source}: Dense module {module['path']} does not act on the vector")
            head.append(
                DenseLayer(
                    folder=module["path"],
                    in_features=int(cfg["in_features"]),
                    out_features=int(cfg["out_features"]),
                    bias=bool(cfg.get("bias", True)),
                    activation=cfg.get("activation_function", "torch.nn.modules.activation.Tanh"),
                    use_residual=bool(cfg.get("use_residual", False)),
                )
            )
        else:
            raise CheckpointError(f"{checkpoint.source}: module {kind} ({module['path']}) is not supported")

    transformer = _read_json(checkpoint, TRANSFORMER_CONFIG_FILE, optional=True) or {}
    if transformer.get("do_lower_case"):
        raise CheckpointError(f"{checkpoint.source}: do_lower_case is not supported")
    if transformer.get("transformer_task", "feature-extraction") != "feature-extraction":
        raise CheckpointError(
            f"{checkpoint.source}: transformer_task {transformer['transformer_task']!r} is not supported"
        )
    # Without modality_config, sentence-transformers treats an older save as text-only (Transformer.load_config).
    modality_config = transformer.get("modality_config") or {"text": {"method": "forward"}}
    for name, params in modality_config.items():
        if params.get("method", "forward") != "forward":
            raise CheckpointError(f"{checkpoint.source}: modality {name} uses {params['method']}, not forward")
    processor_kwargs = dict(transformer.get("processor_kwargs") or transformer.get("tokenizer_args") or {})
    processor_kwargs.pop("trust_remote_code", None)  # load_pretrained passes False whatever the file says
    if transformer.get("max_seq_length") is not None:
        processor_kwargs.setdefault("model_max_length", int(transformer["max_seq_length"]))

    model_config = _read_json(checkpoint, ST_CONFIG_FILE, optional=True) or {}
    message = modality_config.get("message")
    return SentenceTransformerSetup(
        pooling_mode=mode,
        include_prompt=bool(pooling.get("include_prompt", True)),
        head=tuple(head),
        prompts=dict(model_config.get("prompts") or {}),
        default_prompt_name=model_config.get("default_prompt_name"),
        modalities=tuple(k for k in modality_config if k in (*MODALITIES, "message")),
        message_format=(message.get("format", "auto") if message is not None else None),
        processing_kwargs=dict(transformer.get("processing_kwargs") or {}),
        processor_kwargs=processor_kwargs,
        similarity_fn_name=model_config.get("similarity_fn_name"),
    )


def st_prompts(checkpoint: Checkpoint) -> dict[str, str]:
    """The checkpoint's named prompts (config_sentence_transformers.json)."""
    return dict(read_sentence_transformers(checkpoint).prompts)


def activation_module(path: str) -> torch.nn.Module:
    """A torch.nn activation module from its class path; like sentence-transformers without trust_remote_code,
    only classes under torch. are accepted."""
    module_name, _, class_name = path.rpartition(".")
    if not module_name.startswith("torch."):
        raise CheckpointError(f"Dense activation {path!r} is not a torch.nn module")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise CheckpointError(f"Dense activation {path!r} is not a torch.nn module")
    return cls()


# ------------------------------------------------------------------------------------------ input formation


class InputFormer:
    """Turns one item into the processor output sentence-transformers 6.2 would produce for it.

    It follows `Transformer.preprocess` for one input: the same default processor kwargs (text: padding +
    longest_first truncation; audio: padding; return_tensors="pt"), the checkpoint's `processing_kwargs` on top;
    when the module has the "message" modality, the item becomes a one-turn chat message (the prompt a system
    message before it) rendered by the processor's `apply_chat_template`, and a truncated text-only render gets
    the template's suffix restored; otherwise the processor is called on the item directly, a prompt prepended
    to text only. Token ids then match whatever template or tokenizer a checkpoint ships, since they come from
    the same transformers calls.
    """

    def __init__(self, processor, setup: SentenceTransformerSetup, model_type: str = MODEL_TYPE):
        from transformers import PreTrainedTokenizerBase, ProcessorMixin

        # A text-only checkpoint (EmbeddingGemma) has a bare tokenizer where a multimodal one has a processor:
        # AutoProcessor returns whichever the folder holds, and sentence-transformers calls each its own way.
        self.bare_tokenizer = isinstance(processor, PreTrainedTokenizerBase)
        if not (self.bare_tokenizer or isinstance(processor, ProcessorMixin)):
            raise CheckpointError(f"expected a processor or a tokenizer, got {type(processor).__name__}")
        self.processor = processor
        self.tokenizer = processor if self.bare_tokenizer else processor.tokenizer
        self.setup = setup
        self.message_format = None
        if setup.message_format is not None:
            self.message_format = (
                setup.message_format if setup.message_format != "auto" else _infer_message_format(processor, model_type)
            )
        self._suffix_cache: dict[str, list[int]] = {}
        self._prompt_lengths: dict[str, int] = {}

    @property
    def uses_messages(self) -> bool:
        return self.message_format is not None

    def kwargs(self, modality: str, sampling_rate: int | None) -> tuple[dict, dict, dict]:
        """(per-modality kwargs, common kwargs, chat-template kwargs), as Transformer.preprocess builds them."""
        common: dict[str, Any] = {"return_tensors": "pt"}
        per_modality: dict[str, dict] = {
            "text": {"padding": True, "truncation": "longest_first"},
            "audio": {"padding": True},
            "image": {},
            "video": {},
        }
        configured = self.setup.processing_kwargs
        common.update(configured.get("common") or {})
        for key in per_modality:
            per_modality[key].update(configured.get(key) or {})
        per_modality["text"].pop("logits_to_keep", None)
        if modality == "audio" and sampling_rate is not None:
            per_modality["audio"]["sampling_rate"] = int(sampling_rate)
        return per_modality, common, dict(configured.get("chat_template") or {})

    def form(
        self,
        modality: str,
        value: Any,
        prompt: str | None = None,
        sampling_rate: int | None = None,
        truncation: bool = True,
    ):
        """The processor output (a BatchFeature of one item) and pool_from. `truncation=False`: the same call
        with text truncation off, to count what truncation cut."""
        if modality not in MODALITIES:
            raise ValueError(f"unknown modality {modality!r}")
        per_modality, common, chat = self.kwargs(modality, sampling_rate)
        if not truncation:  # (verbose=False: no "sequence length is longer than" warning on stderr)
            per_modality["text"].update(truncation=False, verbose=False)
            for bucket in (common, chat):
                bucket.pop("truncation", None)
                bucket.pop("max_length", None)
            per_modality["text"].pop("max_length", None)
        if self.uses_messages:
            messages = self._messages(modality, value, prompt)
            return self._process_messages(messages, per_modality, common, chat), 0
        if modality not in self.setup.modalities:
            raise UsageError(f"this checkpoint's sentence-transformers module does not take {modality}")
        pool_from = 0
        if modality == "text" and prompt:
            value = prompt + value
            if not self.setup.include_prompt:
                pool_from = self.prompt_length(prompt)
        if self.bare_tokenizer:  # Transformer._call_single_modality_processor: the text first, flat kwargs
            if modality != "text":
                raise UsageError(f"this checkpoint has a tokenizer only: it embeds text, not {modality}")
            return self.processor([value], **per_modality["text"], **common), pool_from
        argument = {"text": "text", "image": "images", "audio": "audio", "video": "videos"}[modality]
        out = self.processor(
            **{argument: [value]},
            text_kwargs=per_modality["text"],
            images_kwargs=per_modality["image"],
            audio_kwargs=per_modality["audio"],
            videos_kwargs=per_modality["video"],
            common_kwargs=common,
        )
        return out, pool_from

    def prompt_length(self, prompt: str) -> int:
        """Transformer._get_prompt_length: the prompt's token count alone, less a trailing special token."""
        if prompt not in self._prompt_lengths:
            out, _ = self.form("text", prompt)
            ids = out["input_ids"][0]
            length = int(ids.shape[-1])
            if int(ids[-1]) in set(self.tokenizer.all_special_ids):
                length -= 1
            self._prompt_lengths[prompt] = length
        return self._prompt_lengths[prompt]

    # -- the message route (InputFormatter.to_message / prepend_prompt_to_messages / Transformer._apply_chat_template)
    def _messages(self, modality: str, value: Any, prompt: str | None) -> list[dict]:
        if self.message_format == "flat":
            messages = [{"role": "user", "content": value}]
        else:
            messages = [{"role": "user", "content": [{"type": modality, modality: value}]}]
        if prompt:
            system = prompt if self.message_format == "flat" else [{"type": "text", "text": prompt}]
            messages = [{"role": "system", "content": system}, *messages]
        return messages

    def _apply_chat_template(self, messages: list[dict], per_modality: dict, common: dict, chat: dict):
        size_keys = _CHAT_TOP_LEVEL_KWARGS & chat.keys()
        if size_keys:
            chat = dict(chat)
            per_modality = {**per_modality, "text": {**per_modality["text"], **{k: chat.pop(k) for k in size_keys}}}
        if self.bare_tokenizer:  # a bare tokenizer wants the size kwargs at the top level, not nested
            text, common = dict(per_modality["text"]), dict(common)
            top = {key: common.pop(key) for key in _CHAT_TOP_LEVEL_KWARGS & common.keys()}
            top |= {key: text.pop(key) for key in _CHAT_TOP_LEVEL_KWARGS & text.keys()}
            return self.processor.apply_chat_template(
                [messages], tokenize=True, return_dict=True, tokenizer_kwargs=text, common_kwargs=common, **top, **chat
            )
        video = dict(per_modality["video"])
        chat = {"load_audio_from_video": video.pop("load_audio_from_video", False), **chat}
        return self.processor.apply_chat_template(
            [messages],
            tokenize=True,
            return_dict=True,
            return_tensors=common.get("return_tensors"),
            processor_kwargs={
                "text_kwargs": per_modality["text"],
                "images_kwargs": per_modality["image"],
                "audio_kwargs": per_modality["audio"],
                "videos_kwargs": video,
                "common_kwargs": common,
            },
            **chat,
        )

    def _process_messages(self, messages: list[dict], per_modality: dict, common: dict, chat: dict):
        chat = dict(chat)
        restore_suffix = chat.pop("restore_suffix", True)
        text = per_modality["text"]
        truncation = chat.get("truncation", text.get("truncation", common.get("truncation")))
        max_length = chat.get("max_length", text.get("max_length", common.get("max_length")))
        active = bool(truncation) or (truncation is None and max_length is not None)
        out = self._apply_chat_template(messages, per_modality, common, chat)
        if restore_suffix and active and truncation != "do_not_truncate":
            self._restore_suffix(out, messages, per_modality, common, chat, max_length or self.max_length)
        return out

    @property
    def max_length(self) -> int:
        return int(self.tokenizer.model_max_length)

    def _restore_suffix(self, out, messages, per_modality, common, chat, max_length: int) -> None:
        """Transformer._restore_chat_template_suffix for one row: a text-only render truncated at max_length gets
        the template's fixed tail written back over its last real tokens."""
        ids, mask = out["input_ids"], out["attention_mask"]
        real = int(mask[0].sum())
        if real < max_length or not _text_only(messages):
            return
        suffix = self._suffix_ids(messages, per_modality, common, chat)
        keep = min(len(suffix), real)
        if keep:
            end = ids.shape[-1] if int(mask[0, 0]) == 0 else real
            ids[0, end - keep : end] = torch.as_tensor(suffix[-keep:], dtype=ids.dtype)

    def _suffix_ids(self, messages, per_modality, common, chat) -> list[int]:
        size = _CHAT_TOP_LEVEL_KWARGS
        text = {k: v for k, v in per_modality["text"].items() if k not in size}
        common = {k: v for k, v in common.items() if k not in size}
        chat = {k: v for k, v in chat.items() if k not in size}
        key = repr((sorted(chat.items()), sorted(text.items()), sorted(common.items()), _skeleton(messages, "")))
        if key not in self._suffix_cache:
            renders = []
            for filler in ("0", "1 2 3 4"):
                skeleton_kwargs = {"text": {**text, "padding": False, "truncation": False}, "audio": {}, "image": {}}
                skeleton_kwargs["video"] = {}
                rendered = self._apply_chat_template(_skeleton(messages, filler), skeleton_kwargs, common, chat)
                row = rendered["input_ids"]
                row = row.tolist() if isinstance(row, torch.Tensor) else row
                renders.append(row[0] if row and isinstance(row[0], list) else row)
            first, second = renders
            count = 0
            for left, right in zip(reversed(first), reversed(second), strict=False):
                if left != right:
                    break
                count += 1
            self._suffix_cache[key] = first[len(first) - count :] if 0 < count < min(len(first), len(second)) else []
        return self._suffix_cache[key]


# apply_chat_template's own size arguments (sentence-transformers' _APPLY_CHAT_TEMPLATE_TOP_LEVEL_KWARGS).
_CHAT_TOP_LEVEL_KWARGS = frozenset({"padding", "truncation", "max_length", "return_tensors"})


def _text_only(messages: list[dict]) -> bool:
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or any(part.get("type", "text") != "text" for part in content):
            return False
    return True


def _skeleton(messages: list[dict], filler: str) -> list[dict]:
    out = []
    for message in messages:
        if message.get("role") == "system":
            out.append(message)
            continue
        content = [{"type": "text", "text": filler}] if isinstance(message.get("content"), list) else filler
        out.append({**message, "content": content})
    return out


# sentence-transformers' InputFormatter._infer_format: model types it knows, then the template's own shape.
_FLAT_MODEL_TYPES = {"apertus", "deepseek_v3", "gpt_oss", "seed_oss"}
_STRUCTURED_PATTERNS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")


def _infer_message_format(processor, model_type: str) -> str:
    if model_type in _FLAT_MODEL_TYPES:
        return "flat"
    template = getattr(processor, "chat_template", None)
    if not isinstance(template, str) or not template:
        return "structured"
    return "structured" if any(p in template for p in _STRUCTURED_PATTERNS) else "flat"


def load_st_processor(checkpoint: Checkpoint, setup: SentenceTransformerSetup):
    """AutoProcessor from the checkpoint folder with the module's processor_kwargs, its tokenizer's
    model_max_length capped as sentence-transformers caps it."""
    kwargs = {k: v for k, v in setup.processor_kwargs.items() if k not in ("revision", "token", "cache_dir")}
    from transformers import PreTrainedTokenizerBase

    processor = load_pretrained("AutoProcessor", checkpoint.folder, checkpoint.source, "processor", **kwargs)
    # A text-only checkpoint (EmbeddingGemma) has no processor: AutoProcessor gives its tokenizer.
    tokenizer = processor if isinstance(processor, PreTrainedTokenizerBase) else None
    tokenizer = tokenizer or getattr(processor, "tokenizer", None)
    limit = getattr(checkpoint.config, "max_position_embeddings", -1)
    if (
        tokenizer is not None
        and "model_max_length" not in kwargs
        and hasattr(checkpoint.config, "max_position_embeddings")
    ):
        if limit != -1:
            tokenizer.model_max_length = min(tokenizer.model_max_length, limit)
    return processor


def with_processing_kwargs(setup: SentenceTransformerSetup, modality: str, extra: dict) -> SentenceTransformerSetup:
    kwargs = {k: dict(v) if isinstance(v, dict) else v for k, v in setup.processing_kwargs.items()}
    kwargs[modality] = {**kwargs.get(modality, {}), **extra}
    return dataclasses.replace(setup, processing_kwargs=kwargs)
