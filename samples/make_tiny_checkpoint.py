"""Build tiny random Gemma checkpoints, saved exactly as a real one is (`save_pretrained` + processor files).

    python samples/make_tiny_checkpoint.py            # writes samples/tiny-gemma4/ and samples/tiny-gemma3n/

Tests import `build_gemma4` and `build_gemma3n` to make their own checkpoints through the same code. Every
parameter is drawn at random with a fixed seed, because transformers' default init sets some tables (the vision
position table, norm weights) to constants, and a constant weight hides a loader that forgot to read it.
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
def randomize(model: torch.nn.Module, seed: int) -> None:
    """Give every saved tensor a random value that matters (clip bounds finite, norms away from 1)."""
    gen = torch.Generator().manual_seed(seed)
    for name, tensor in sorted(model.state_dict(keep_vars=True).items()):
        if not tensor.is_floating_point():
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
    **config_kwargs,
) -> Path:
    from transformers import Gemma4ForConditionalGeneration

    torch.manual_seed(seed)
    config = tiny_gemma4_config(vision=vision, audio=audio, **config_kwargs)
    model = Gemma4ForConditionalGeneration(config).eval()
    randomize(model, seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    write_processor_files(folder, max_soft_tokens=max_soft_tokens)
    return folder


def tiny_gemma3n_config(
    audio_hidden: int = 32, audio_layers: int = 2, sscp_channels=(16, 8), text_hidden: int = 32, vocab_size: int = 512
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
    # Only embed_vision is built from the vision config (the timm tower is stubbed out, see below).
    vision = Gemma3nVisionConfig(hidden_size=16)
    return Gemma3nConfig(text_config=text, audio_config=audio, vision_config=vision)


@contextlib.contextmanager
def gemma3n_without_vision_tower():
    """Build Gemma3n models with an empty module in place of the timm vision tower.

    Gemma3nModel always builds `vision_tower` with timm (MobileNetV5, 294M parameters at the default config);
    timm is not a dependency of this project and the audio path never touches that tower. The tiny checkpoints
    therefore hold no vision-tower tensors, and the test reference (the full `Gemma3nForConditionalGeneration`
    from `from_pretrained`) is built the same way.
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


def build_gemma3n(folder: Path, seed: int = 0, max_shard_size: str | None = None, **config_kwargs) -> Path:
    """A tiny Gemma 3n checkpoint (audio tower, text model, embedders; no vision tower) + its feature extractor."""
    from transformers import Gemma3nAudioFeatureExtractor, Gemma3nForConditionalGeneration

    torch.manual_seed(seed)
    with gemma3n_without_vision_tower():
        model = Gemma3nForConditionalGeneration(tiny_gemma3n_config(**config_kwargs)).eval()
    randomize(model, seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    Gemma3nAudioFeatureExtractor().save_pretrained(folder)  # preprocessor_config.json
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "tiny-gemma4")
    parser.add_argument("--out-gemma3n", type=Path, default=HERE / "tiny-gemma3n")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    build_gemma4(args.out, seed=args.seed)
    print(f"wrote {args.out}")
    build_gemma3n(args.out_gemma3n, seed=args.seed)
    print(f"wrote {args.out_gemma3n}")


if __name__ == "__main__":
    main()
