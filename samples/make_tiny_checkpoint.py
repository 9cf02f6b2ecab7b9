"""Build tiny random Gemma checkpoints, saved exactly as a real one is (`save_pretrained` + processor files).

    python samples/make_tiny_checkpoint.py   # writes samples/tiny-gemma4/, tiny-gemma3n/, tiny-embeddinggemma2/,
                                             # tiny-embeddinggemma/ and tiny-gemma3/

Tests import `build_gemma4`, `build_gemma3n`, `build_embeddinggemma2`, `build_embeddinggemma` and `build_gemma3` to
make their own checkpoints through the same code. Every parameter is drawn at random with a fixed seed, because
transformers' default init sets some tables (the vision position table, norm weights) to constants, and a constant
weight hides a loader that forgot to read it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def tiny_gemma4_config(
    vision: bool = True,
    audio: bool = True,
    text_hidden: int = 32,
    vocab_size: int = 512,
    vision_hidden: int = 64,
    vision_layers: int = 2,
    vision_heads: int = 4,
    vision_intermediate: int | None = None,
    position_embedding_size: int = 1024,
):
    from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4TextConfig, Gemma4VisionConfig

    text = Gemma4TextConfig(
        vocab_size=vocab_size,
        hidden_size=text_hidden,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=16,
        vocab_size_per_layer_input=vocab_size,
        hidden_size_per_layer_input=4,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=16,
    )
    vision_cfg = (
        Gemma4VisionConfig(
            hidden_size=vision_hidden,
            intermediate_size=vision_intermediate or 2 * vision_hidden,
            num_hidden_layers=vision_layers,
            num_attention_heads=vision_heads,
            num_key_value_heads=vision_heads,
            head_dim=vision_hidden // vision_heads,
            patch_size=16,
            pooling_kernel_size=3,
            position_embedding_size=position_embedding_size,
            standardize=True,
        )
        if vision
        else None
    )
    audio_cfg = (
        Gemma4AudioConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            subsampling_conv_channels=[128, 8],
            output_proj_dims=48,
        )
        if audio
        else None
    )
    return Gemma4Config(text_config=text, vision_config=vision_cfg, audio_config=audio_cfg)


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int, skip: tuple[str, ...] = ()) -> None:
    """Give every saved tensor a random value that matters (clip bounds finite, norms away from 1); tensors whose
    names start with a `skip` prefix keep theirs."""
    gen = torch.Generator().manual_seed(seed)
    for name, tensor in sorted(model.state_dict(keep_vars=True).items()):
        if not tensor.is_floating_point() or name.startswith(skip):
            continue
        leaf = name.rsplit(".", 1)[-1]
        shape = tensor.shape
        if leaf in ("input_min", "output_min"):
            value = -(2.0 + torch.rand(shape, generator=gen))
        elif leaf in ("input_max", "output_max"):
            value = 2.0 + torch.rand(shape, generator=gen)
        elif leaf == "std_scale":
            value = 0.5 + torch.rand(shape, generator=gen)
        elif tensor.dim() <= 1:
            value = 1.0 + 0.2 * torch.randn(shape, generator=gen)
        else:
            value = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        tensor.copy_(value.to(tensor.dtype))


def write_processor_files(folder: Path, max_soft_tokens: int = 280) -> None:
    """The layout real Gemma 4 repos use: one processor_config.json with a section per processor."""
    from transformers import Gemma4AudioFeatureExtractor, Gemma4ImageProcessor, Gemma4VideoProcessor

    sections = {
        "image_processor": json.loads(Gemma4ImageProcessor(max_soft_tokens=max_soft_tokens).to_json_string()),
        "video_processor": json.loads(Gemma4VideoProcessor().to_json_string()),
        "feature_extractor": json.loads(Gemma4AudioFeatureExtractor().to_json_string()),
        "processor_class": "Gemma4Processor",
        "image_seq_length": max_soft_tokens,
    }
    (folder / "processor_config.json").write_text(json.dumps(sections, indent=2, sort_keys=True))


def build_gemma4(
    folder: Path,
    seed: int = 0,
    vision: bool = True,
    audio: bool = True,
    max_shard_size: str | None = None,
    max_soft_tokens: int = 280,
    dtype: torch.dtype = torch.float32,
    **config_kwargs,
) -> Path:
    """`dtype`: the dtype the weights are stored in (real Gemma 4 checkpoints store bfloat16); `save_pretrained`
    then writes it as the config's `dtype`, as a real checkpoint's config says it."""
    from transformers import Gemma4ForConditionalGeneration

    torch.manual_seed(seed)
    config = tiny_gemma4_config(vision=vision, audio=audio, **config_kwargs)
    model = Gemma4ForConditionalGeneration(config).eval()
    randomize(model, seed)  # drawn in float32, then rounded once: the same values whatever the stored dtype
    model = model.to(dtype)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    write_processor_files(folder, max_soft_tokens=max_soft_tokens)
    return folder


# The real MobileNetV5 (`mobilenetv5_300m_enc`, 294M parameters) at 768 px fuses its last two stages (48 x 48 and
# 24 x 24) into 16 x 16 = 256 soft tokens of 2048 (a width fixed by timm's code), average-pooling 3 x 3. The tiny
# one is the same timm architecture, built offline by timm's own code (architectures are code, not downloads) with
# the `model_args` transformers passes to timm.create_model: channels x 0.02 (2.3M parameters; the attention
# heads keep their widths) and the fusion's output at 2 x 2 from a 64 px input, whose fused stages are 4 x 4 and
# 2 x 2: the fusion average-pools 2 x 2, as the real one pools, into 4 soft tokens.
GEMMA3N_TINY_VISION = {"image_size": 64, "model_args": {"channel_multiplier": 0.02, "msfa_output_resolution": 2}}


def tiny_gemma3n_config(
    audio_hidden: int = 32,
    audio_layers: int = 2,
    sscp_channels=(16, 8),
    text_hidden: int = 32,
    vocab_size: int = 512,
    vision_model_args: dict | None = None,
):
    from transformers import Gemma3nAudioConfig, Gemma3nConfig, Gemma3nTextConfig, Gemma3nVisionConfig

    text = Gemma3nTextConfig(
        vocab_size=vocab_size,
        vocab_size_per_layer_input=vocab_size,
        hidden_size=text_hidden,
        hidden_size_per_layer_input=4,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=16,
        num_kv_shared_layers=0,
        altup_num_inputs=2,
        laurel_rank=4,
        activation_sparsity_pattern=[0.0, 0.0],
    )
    audio = Gemma3nAudioConfig(
        hidden_size=audio_hidden,
        conf_num_hidden_layers=audio_layers,
        conf_num_attention_heads=4,
        sscp_conv_channel_size=list(sscp_channels),
    )
    model_args = GEMMA3N_TINY_VISION["model_args"] if vision_model_args is None else vision_model_args
    vision = Gemma3nVisionConfig(model_args=dict(model_args) or None)  # hidden 2048: MobileNetV5's fixed output
    side = int(model_args.get("msfa_output_resolution", 16))
    return Gemma3nConfig(
        text_config=text, audio_config=audio, vision_config=vision, vision_soft_tokens_per_image=side * side
    )


@contextlib.contextmanager
def gemma3n_without_vision_tower():
    """Build Gemma3n models with an empty module in place of the timm vision tower.

    Gemma3nModel always builds `vision_tower` with timm (MobileNetV5, 294M parameters at the default config);
    timm is an optional dependency (the `gemma3n` extra) and the audio path never touches that tower. Audio-only
    checkpoints (`build_gemma3n(vision=False)`) hold no vision-tower tensors, and audio test references (the full
    `Gemma3nForConditionalGeneration` from `from_pretrained`) are built the same way, skipping the tower.
    """
    import transformers.models.gemma3n.modeling_gemma3n as modeling
    from transformers import Gemma3nVisionConfig

    real = modeling.AutoModel

    class _AutoModelWithoutTimm:
        @staticmethod
        def from_config(config, **kwargs):
            if isinstance(config, Gemma3nVisionConfig):
                return torch.nn.Module()
            return real.from_config(config, **kwargs)

    modeling.AutoModel = _AutoModelWithoutTimm
    try:
        yield
    finally:
        modeling.AutoModel = real


def build_gemma3n(
    folder: Path, seed: int = 0, max_shard_size: str | None = None, vision: bool = True, **config_kwargs
) -> Path:
    """A tiny Gemma 3n checkpoint laid out like google/gemma-3n-E2B-it: audio tower, vision tower (timm's
    MobileNetV5, see GEMMA3N_TINY_VISION; needs timm), text model and embedders, saved by transformers, with its
    processor files (`Gemma3nProcessor.save_pretrained`: the audio feature extractor, the image processor at the
    tower's input size, a tokenizer with Gemma 3n's media tokens). `vision=False`: no vision-tower tensors (built
    with an empty module in its place, for machines without timm) and only the feature extractor."""
    from transformers import (
        Gemma3nAudioFeatureExtractor,
        Gemma3nForConditionalGeneration,
        Gemma3nProcessor,
        SiglipImageProcessor,
    )

    torch.manual_seed(seed)
    config = tiny_gemma3n_config(**config_kwargs)
    with contextlib.nullcontext() if vision else gemma3n_without_vision_tower():
        model = Gemma3nForConditionalGeneration(config).eval()
    # The vision tower's tensors sort last: skipping them leaves every other tensor's random value as it was.
    randomize(model, seed, skip=("model.vision_tower.",))
    if vision:
        condition_mobilenetv5(model.model.vision_tower, seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    if not vision:
        Gemma3nAudioFeatureExtractor().save_pretrained(folder)  # preprocessor_config.json
        return folder
    side = GEMMA3N_TINY_VISION["image_size"]
    # MobileNetV5 takes pixels in [0, 1] (its timm config's mean 0, std 1): rescaled, not normalised.
    image_processor = SiglipImageProcessor(size={"height": side, "width": side}, do_normalize=False)
    tokenizer = tiny_tokenizer(named_specials=GEMMA3N_MEDIA_TOKENS)
    Gemma3nProcessor(
        feature_extractor=Gemma3nAudioFeatureExtractor(),
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=config.vision_soft_tokens_per_image,
    ).save_pretrained(folder)
    return folder


@torch.no_grad()
def condition_mobilenetv5(tower: torch.nn.Module, seed: int) -> None:
    """Random norms and layer scales on timm's own initialisation of the convolution and projection weights.

    `randomize` on every MobileNetV5 weight makes a chaotic network (its 33 attention blocks each amplify rounding:
    transformers' own float32 output for an image moved by 6% between a batch of 4 and the image alone, measured
    in float64 to be rounding only). With timm's initialisation, norm weights drawn around 1 and layer scales
    around 0.3 (timm starts them at 1e-5, which would leave every block an identity), it moves by 2e-6. Outputs
    then depend little on any single early weight (halving one changes them by ~1e-6): the loader's tests compare
    every tensor with transformers' own loaded tower instead."""
    gen = torch.Generator().manual_seed(seed + 7)
    for name, tensor in sorted(tower.named_parameters()):
        if name.endswith(".gamma"):
            tensor.copy_(0.3 * (1.0 + 0.2 * torch.randn(tensor.shape, generator=gen)))
        elif tensor.dim() <= 1 and (".norm" in name or ".bn" in name):
            tensor.copy_(1.0 + 0.2 * torch.randn(tensor.shape, generator=gen))


# Gemma 3n's media tokens, by the attribute names Gemma3nProcessor reads from its tokenizer.
GEMMA3N_MEDIA_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
    "boa_token": "<start_of_audio>",
    "eoa_token": "<end_of_audio>",
    "audio_token": "<audio_soft_token>",
}


# ------------------------------------------------------------------------------------------ EmbeddingGemma 2

# The tiny tokenizer's special tokens, in id order. The Gemma 4 family's placeholder spellings (the processor reads
# them from the tokenizer's image_token, boi_token, ... attributes); the config's token ids are read back from the
# tokenizer, so config and tokenizer agree by construction with a 400-token vocabulary instead of 262 144.
EG2_SPECIAL_TOKENS = (
    "<pad>", "<eos>", "<bos>", "<unk>", "<mask>",
    "<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>", "<|video|>",
    "<start_of_turn>", "<end_of_turn>",
)  # fmt: skip
EG2_CONFIG_TOKENS = {
    "boi_token_id": "<|image>",
    "eoi_token_id": "<image|>",
    "image_token_id": "<|image|>",
    "video_token_id": "<|video|>",
    "boa_token_id": "<|audio>",
    "eoa_token_index": "<audio|>",
    "audio_token_id": "<|audio|>",
}
EG2_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "A photograph of a red car parked by the sea at sunset.",
    "task: search result | query: title: none | text: ",
    "Sound of rain falling on a tin roof at night, a bird singing.",
    "Video of a cat playing piano in the living room.",
    "0123456789 !?.,;:'\"()[]{}<>/\\-_+=*&%$#@",
)
# A TEST chat template, written for these samples: the real checkpoint's template is not available offline.
# It has the Gemma turn shape and puts each media item's placeholder where the item is; the processor expands the
# placeholder into <|image> + n x <|image|> + <image|> (audio, video alike). Tests check gemma-embed against
# sentence-transformers with this template and with none: sentence-transformers takes a different route for each.
EG2_TEST_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<start_of_turn>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{- item['text'] -}}"
    "{%- elif item['type'] == 'image' -%}{{- '<|image|>' -}}"
    "{%- elif item['type'] == 'audio' -%}{{- '<|audio|>' -}}"
    "{%- elif item['type'] == 'video' -%}{{- '<|video|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
)
MEDIA_TOKEN_NAMES = {
    "image_token": "<|image|>",
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "audio_token": "<|audio|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
}
EG2_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}


def tiny_tokenizer(
    vocab_size: int = 400, add_eos: bool = False, media_tokens: bool = True, named_specials: dict | None = None
):
    """A byte-level BPE trained on a few sentences (any text tokenizes), adding <bos> like Gemma's tokenizers
    (and <eos> after the text with `add_eos`: a trailing special token, which sentence-transformers' prompt length
    and truncation must both account for). `media_tokens`: name the Gemma 4 family's placeholder tokens as the
    tokenizer's image_token, boi_token, ... attributes (the multimodal processors read them there);
    `named_specials`: other families' special tokens by attribute name instead, added after the shared ones."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(EG2_SPECIAL_TOKENS) + [t for t in (named_specials or {}).values()],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(EG2_CORPUS * 4, trainer=trainer)
    specials = [("<bos>", tokenizer.token_to_id("<bos>"))]
    end = ""
    if add_eos:
        specials.append(("<eos>", tokenizer.token_to_id("<eos>")))
        end = " <eos>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"<bos> $A{end}", pair=f"<bos> $A $B{end}", special_tokens=specials
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        extra_special_tokens=named_specials or (MEDIA_TOKEN_NAMES if media_tokens else {}),
        padding_side="right",
    )


def tiny_embeddinggemma2_config(
    tokenizer,
    vision: bool = True,
    audio: bool = True,
    embedding_dim: int = 384,
    text_layers: int = 3,
    sliding_window: int = 8,
    text_hidden: int = 32,
    **tower_sizes,
):
    """Text model: 3 layers (2 sliding with a radius of 8 tokens, so the samples' sequences cross it, then 1 full).
    Vision/audio towers: the tiny Gemma 4 towers. Benchmarks pass bigger sizes (`text_hidden`, `text_layers`, and
    `tiny_gemma4_config`'s vision sizes)."""
    from transformers.models.embedding_gemma2.configuration_embedding_gemma2 import (
        EmbeddingGemma2Config,
        EmbeddingGemma2TextConfig,
    )

    text = EmbeddingGemma2TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=text_hidden,
        intermediate_size=2 * text_hidden,
        num_hidden_layers=text_layers,
        num_attention_heads=max(2, text_hidden // 64),
        num_key_value_heads=1,
        head_dim=16 if text_hidden == 32 else 64,
        global_head_dim=16 if text_hidden == 32 else 64,
        hidden_size_per_layer_input=8,
        embedding_dim=embedding_dim,
        sliding_window=sliding_window,
        layer_types=["sliding_attention"] * (text_layers - 1) + ["full_attention"],
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    towers = tiny_gemma4_config(vision=vision, audio=audio, **tower_sizes)
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in EG2_CONFIG_TOKENS.items()}
    return EmbeddingGemma2Config(
        text_config=text, vision_config=towers.vision_config, audio_config=towers.audio_config, **ids
    )


def build_embeddinggemma2(
    folder: Path,
    seed: int = 0,
    vision: bool = True,
    audio: bool = True,
    chat_template: bool = True,
    max_soft_tokens: int = 70,
    embedding_dim: int = 384,
    dense: bool = True,
    max_shard_size: str | None = None,
    **sizes,
) -> Path:
    """A tiny EmbeddingGemma 2 checkpoint laid out like the hub repo, written by the libraries themselves:
    transformers' `save_pretrained` (model; processor = image/video processors, feature extractor, tokenizer and
    chat template), then sentence-transformers' own `SentenceTransformer.save` (modules.json, 1_Pooling/, Dense
    modules, Normalize, config_sentence_transformers.json with its prompts, sentence_bert_config.json).

    Matryoshka: `embedding_dim` (384) exceeds 256 so `truncate_dim=256` truncates. `dense`: two Dense modules
    after pooling (384 -> 192 tanh -> 384), every weight random, as the text model's."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import Gemma4AudioFeatureExtractor, Gemma4ImageProcessor
    from transformers.models.embedding_gemma2.modeling_embedding_gemma2 import EmbeddingGemma2Model
    from transformers.models.embedding_gemma2.processing_embedding_gemma2 import EmbeddingGemma2Processor
    from transformers.models.embedding_gemma2.video_processing_embedding_gemma2 import EmbeddingGemma2VideoProcessor

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    model = EmbeddingGemma2Model(
        tiny_embeddinggemma2_config(tokenizer, vision=vision, audio=audio, embedding_dim=embedding_dim, **sizes)
    ).eval()
    randomize(model, seed)
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    processor = EmbeddingGemma2Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(max_soft_tokens=max_soft_tokens),
        tokenizer=tokenizer,
        video_processor=EmbeddingGemma2VideoProcessor(),
        chat_template=EG2_TEST_CHAT_TEMPLATE if chat_template else None,
        image_seq_length=max_soft_tokens,
    )
    processor.save_pretrained(folder)

    transformer = Transformer(str(folder))  # reads back what transformers wrote: the library's own modality setup
    modules = [transformer, Pooling(embedding_dim, "mean")]
    if dense:
        middle = embedding_dim // 2
        first = Dense(embedding_dim, middle, bias=True, activation_function=torch.nn.Tanh())
        second = Dense(middle, embedding_dim, bias=False, activation_function=torch.nn.Identity())
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for layer in (first, second):
                for parameter in layer.parameters():
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) / math.sqrt(parameter.shape[-1]))
        modules += [first, second]
    modules.append(Normalize())
    SentenceTransformer(modules=modules, prompts=dict(EG2_PROMPTS)).save(str(folder))
    (folder / "README.md").unlink(missing_ok=True)  # the generated model card: no loader reads it
    if max_shard_size:
        # SentenceTransformer.save wrote the model again as one file next to the shards: keep the sharded layout.
        (folder / "model.safetensors").unlink(missing_ok=True)
        model.save_pretrained(folder, max_shard_size=max_shard_size)
    return folder


# ------------------------------------------------------------------------------------------------- Gemma 3

# Gemma 3's image tokens, by the attribute names Gemma3Processor reads from its tokenizer.
GEMMA3_IMAGE_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}


def tiny_gemma3_config(
    tokenizer,
    image_size: int = 224,
    patch_size: int = 14,
    tokens_per_image: int = 16,
    vision_hidden: int = 32,
    vision_layers: int = 2,
    vision_heads: int = 2,
    vision_intermediate: int | None = None,
    text_hidden: int = 32,
):
    """The real google/gemma-3-4b-it is SigLIP at 896 px in 14 px patches (4096 patches, 1152 wide, 27 layers) and
    256 soft tokens (4 x 4 patches averaged each); here 224 px in 14 px patches (256 patches) and 16 soft tokens,
    the same 4 x 4 pooling."""
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

    vision = SiglipVisionConfig(
        hidden_size=vision_hidden,
        intermediate_size=vision_intermediate or 2 * vision_hidden,
        num_hidden_layers=vision_layers,
        num_attention_heads=vision_heads,
        image_size=image_size,
        patch_size=patch_size,
        vision_use_head=False,
    )
    text = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=text_hidden,
        intermediate_size=2 * text_hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    ids = {
        "boi_token_index": tokenizer.convert_tokens_to_ids(GEMMA3_IMAGE_TOKENS["boi_token"]),
        "eoi_token_index": tokenizer.convert_tokens_to_ids(GEMMA3_IMAGE_TOKENS["eoi_token"]),
        "image_token_index": tokenizer.convert_tokens_to_ids(GEMMA3_IMAGE_TOKENS["image_token"]),
    }
    return Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=tokens_per_image, **ids)


def build_gemma3(
    folder: Path, seed: int = 0, max_shard_size: str | None = None, dtype: torch.dtype = torch.float32, **sizes
) -> Path:
    """A tiny Gemma 3 checkpoint laid out like google/gemma-3-4b-it, written by transformers itself:
    `Gemma3ForConditionalGeneration.save_pretrained` (SigLIP vision tower, multi_modal_projector, language model)
    and `Gemma3Processor.save_pretrained` (its image processor at the tower's resolution, the tokenizer with
    Gemma 3's image tokens, image_seq_length)."""
    from transformers import Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer(add_eos=False, named_specials=GEMMA3_IMAGE_TOKENS)
    config = tiny_gemma3_config(tokenizer, **sizes)
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    randomize(model, seed)
    model = model.to(dtype)
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    side = config.vision_config.image_size
    image_processor = Gemma3ImageProcessor(size={"height": side, "width": side})
    Gemma3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_length=config.mm_tokens_per_image
    ).save_pretrained(folder)
    return folder


# -------------------------------------------------------------------------------------------- EmbeddingGemma

# The task prompts google/embeddinggemma-300m's config_sentence_transformers.json lists (its model card's table).
EMBEDDINGGEMMA_PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "BitextMining": "task: search result | query: ",
    "Clustering": "task: clustering | query: ",
    "Classification": "task: classification | query: ",
    "InstructionRetrieval": "task: code retrieval | query: ",
    "MultilabelClassification": "task: classification | query: ",
    "PairClassification": "task: sentence similarity | query: ",
    "Reranking": "task: search result | query: ",
    "Retrieval": "task: search result | query: ",
    "Retrieval-query": "task: search result | query: ",
    "Retrieval-document": "title: none | text: ",
    "STS": "task: sentence similarity | query: ",
    "Summarization": "task: summarization | query: ",
}


def build_embeddinggemma(
    folder: Path,
    seed: int = 0,
    max_seq_length: int = 32,
    text_hidden: int = 32,
    text_layers: int = 3,
    sliding_window: int = 8,
    dense_dims: tuple[int, int] = (384, 256),
    dtype: torch.dtype = torch.float32,
    **text_sizes,
) -> Path:
    """A tiny EmbeddingGemma (v1) checkpoint laid out like google/embeddinggemma-300m, written by the libraries
    themselves: transformers' `Gemma3TextModel.save_pretrained` (a bidirectional Gemma 3 text model, weights
    without a prefix) and the tokenizer, then sentence-transformers' own `SentenceTransformer.save` (mean
    Pooling, two Dense modules without bias and with the identity activation, Normalize, the task prompts,
    max_seq_length).

    The real model is 768 -> 3072 -> 768; here the text model is `text_hidden` wide and the Dense modules map it
    to `dense_dims` (the output, 256, exceeds 128 so `--dim 128` truncates). `max_seq_length` (32 tokens) is short
    so a test line exceeds it; the sliding window (8, a radius of 5 tokens once transformers halves it for
    bidirectional attention) is crossed by every sample sequence."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import Gemma3TextConfig, Gemma3TextModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer(add_eos=True, media_tokens=False)
    heads = max(2, text_hidden // 64)
    sizes = {
        "intermediate_size": 2 * text_hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": 1,
        "head_dim": 16 if text_hidden == 32 else 64,
        "query_pre_attn_scalar": 16 if text_hidden == 32 else 64,
        **text_sizes,
    }
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=text_hidden,
        num_hidden_layers=text_layers,
        layer_types=["sliding_attention"] * (text_layers - 1) + ["full_attention"],
        sliding_window=sliding_window,
        use_bidirectional_attention=True,
        max_position_embeddings=max(2048, max_seq_length),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **sizes,
    )
    torch.manual_seed(seed)
    model = Gemma3TextModel(config).eval()
    randomize(model, seed)
    model.to(dtype).save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    transformer = Transformer(str(folder), max_seq_length=max_seq_length)
    first = Dense(text_hidden, dense_dims[0], bias=False, activation_function=torch.nn.Identity())
    second = Dense(dense_dims[0], dense_dims[1], bias=False, activation_function=torch.nn.Identity())
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in (first, second):
            for parameter in layer.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / math.sqrt(parameter.shape[-1]))
    modules = [transformer, Pooling(text_hidden, "mean"), first, second, Normalize()]
    SentenceTransformer(modules=modules, prompts=dict(EMBEDDINGGEMMA_PROMPTS)).save(str(folder))
    (folder / "README.md").unlink(missing_ok=True)  # the generated model card: no loader reads it
    # The hub repository states its max_seq_length in sentence_bert_config.json too (sentence-transformers 6 saves
    # it in the tokenizer's model_max_length only); both say the same here.
    st_config = folder / "sentence_bert_config.json"
    st_config.write_text(json.dumps({**json.loads(st_config.read_text()), "max_seq_length": max_seq_length}, indent=4))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "tiny-gemma4")
    parser.add_argument("--out-gemma3n", type=Path, default=HERE / "tiny-gemma3n")
    parser.add_argument("--out-embeddinggemma2", type=Path, default=HERE / "tiny-embeddinggemma2")
    parser.add_argument("--out-embeddinggemma", type=Path, default=HERE / "tiny-embeddinggemma")
    parser.add_argument("--out-gemma3", type=Path, default=HERE / "tiny-gemma3")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    build_gemma4(args.out, seed=args.seed)
    print(f"wrote {args.out}")
    build_gemma3n(args.out_gemma3n, seed=args.seed)
    print(f"wrote {args.out_gemma3n}")
    build_embeddinggemma2(args.out_embeddinggemma2, seed=args.seed)
    print(f"wrote {args.out_embeddinggemma2}")
    build_embeddinggemma(args.out_embeddinggemma, seed=args.seed)
    print(f"wrote {args.out_embeddinggemma}")
    build_gemma3(args.out_gemma3, seed=args.seed)
    print(f"wrote {args.out_gemma3}")


if __name__ == "__main__":
    main()
