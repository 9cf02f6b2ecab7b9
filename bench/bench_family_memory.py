"""Gemma 3 (SigLIP) and Gemma 3n (MobileNetV5) vision-tower memory: the planner's cost models against the
measured peak transient.

    python -m bench.bench_family_memory gemma3
    python -m bench.bench_family_memory gemma3n      # needs timm (pip install gemma-embed[gemma3n])

As bench_memory does for Gemma 4: the peak of the running sum of the profiler's allocation events during one
forward on the CPU (tower + projection, as the tool runs them), inputs and weights excluded. Gemma 3: the real
SigLIP width of google/gemma-3-4b-it (hidden 1152, intermediate 4304, 16 heads, 14 px patches) at its 896 px
resolution (4096 patches) and at 448 px, with 2 layers instead of 27 (activations are freed layer by layer), and
a narrow tower. Gemma 3n: timm's `mobilenetv5_300m_enc` as released (294M parameters, random weights) at 768 px
(its processor's size) and 512 px. Results go in bench/MEMORY.md.
"""

from __future__ import annotations

import sys

import torch

from bench.bench_memory import peak_transient
from gemma_embed.models.gemma3 import siglip_item_cost


def measure_siglip(hidden, intermediate, heads, image_size, batch, dtype, patch=14) -> tuple[int, int]:
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig, SiglipVisionModel
    from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector

    vision = SiglipVisionConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=heads,
        image_size=image_size,
        patch_size=patch,
        vision_use_head=False,
    )
    vision._attn_implementation = "sdpa"
    side = image_size // patch
    config = Gemma3Config(
        text_config=Gemma3TextConfig(hidden_size=2560, vocab_size=128, num_hidden_layers=1),
        vision_config=vision,
        mm_tokens_per_image=(side // 4) ** 2,
    )
    tower = SiglipVisionModel(vision).eval().to(dtype)
    projector = Gemma3MultiModalProjector(config).eval().to(dtype)
    pixels = torch.rand(batch, 3, image_size, image_size)

    def forward():
        return projector(tower(pixel_values=pixels).last_hidden_state)

    with torch.inference_mode():
        forward()  # warm-up
        measured = peak_transient(forward)
    element = torch.empty((), dtype=dtype).element_size()
    modelled = batch * siglip_item_cost(side * side, hidden, intermediate, heads, element, patch_dim=3 * patch**2)
    return measured, modelled


def main_gemma3() -> None:
    cases = [
        (1152, 4304, 16, 896, 1, torch.float32),
        (1152, 4304, 16, 896, 2, torch.float32),
        (1152, 4304, 16, 448, 1, torch.float32),
        (1152, 4304, 16, 896, 1, torch.bfloat16),
        (256, 1024, 4, 896, 1, torch.float32),
        (32, 64, 2, 224, 4, torch.float32),
        (32, 64, 2, 224, 4, torch.bfloat16),
    ]
    print("| D | I | H | patches | batch | dtype | measured MiB | model MiB | model / measured |")
    print("|---|---|---|---|---|---|---|---|---|")
    for hidden, intermediate, heads, image_size, batch, dtype in cases:
        measured, modelled = measure_siglip(hidden, intermediate, heads, image_size, batch, dtype)
        print(
            f"| {hidden} | {intermediate} | {heads} | {(image_size // 14) ** 2} | {batch} | {str(dtype)[6:]} | "
            f"{measured / 2**20:.1f} | {modelled / 2**20:.1f} | {modelled / measured:.2f} |",
            flush=True,
        )


def measure_mobilenetv5(image_size: int, batch: int, dtype, channel_multiplier: float = 1.0) -> tuple[int, int]:
    """timm's encoder forward (what TimmWrapperModel runs for get_image_features); embed_vision on its 256 soft
    tokens is a few MiB and never the peak."""
    import timm

    from gemma_embed.models.gemma3n_vision import mobilenetv5_item_cost

    model = timm.create_model(
        "mobilenetv5_300m_enc", pretrained=False, num_classes=0, channel_multiplier=channel_multiplier
    )
    model = model.eval().to(dtype)
    pixels = torch.rand(batch, 3, image_size, image_size).to(dtype)
    with torch.inference_mode():
        model.forward_features(pixels)  # warm-up
        measured = peak_transient(lambda: model.forward_features(pixels))
    element = torch.empty((), dtype=dtype).element_size()
    return measured, batch * mobilenetv5_item_cost(image_size * image_size, element)


def main_gemma3n() -> None:
    cases = [
        (768, 1, torch.float32),
        (512, 1, torch.float32),
        (512, 2, torch.float32),
        (768, 1, torch.bfloat16),
    ]
    print("| input px | batch | dtype | measured MiB | model MiB | model / measured |")
    print("|---|---|---|---|---|---|")
    for image_size, batch, dtype in cases:
        measured, modelled = measure_mobilenetv5(image_size, batch, dtype)
        print(
            f"| {image_size} | {batch} | {str(dtype)[6:]} | {measured / 2**20:.1f} | {modelled / 2**20:.1f} | "
            f"{modelled / measured:.2f} |",
            flush=True,
        )


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "gemma3"
    {"gemma3": main_gemma3, "gemma3n": main_gemma3n}[which]()


if __name__ == "__main__":
    main()
