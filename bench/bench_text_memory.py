"""EmbeddingGemma 2 text model (stage 2) and EmbeddingGemma text model memory: the planner's cost model against
the measured peak transient.

    python -m bench.bench_text_memory                   # EmbeddingGemma 2
    python -m bench.bench_text_memory embeddinggemma    # EmbeddingGemma (v1)

As bench_memory does for the vision tower: the peak of the running sum of the profiler's allocation events
during one forward on the CPU (SDPA), inputs and weights excluded. The real text config (hidden 512, 24 layers:
20 sliding with a 512-token radius + 4 full, per-layer inputs 512) with a small vocabulary (the embedding table
is a weight, not a transient), at lengths around the window; and a 6-layer config with per-layer inputs of 64 at
4096 and 8192 tokens, where the quadratic mask term shows. EmbeddingGemma: the real Gemma 3 text config of
google/embeddinggemma-300m (hidden 768, intermediate 1152, 3 heads of 256, sliding window 512 halved to a radius
of 257 for bidirectional attention) with 6 layers instead of 24 (activations are freed layer by layer, so the
peak does not grow with depth) and a small vocabulary. Results go in bench/MEMORY.md.
"""

from __future__ import annotations

import sys

import torch

from bench.bench_memory import peak_transient
from gemma_embed.models.text_cost import text_sequence_cost

REAL = {"num_hidden_layers": 24, "hidden_size_per_layer_input": 512}
LONG = {"num_hidden_layers": 6, "hidden_size_per_layer_input": 64}


def build(shape: dict, dtype):
    from transformers.models.embedding_gemma2.configuration_embedding_gemma2 import EmbeddingGemma2TextConfig
    from transformers.models.embedding_gemma2.modeling_embedding_gemma2 import EmbeddingGemma2TextModel

    config = EmbeddingGemma2TextConfig(vocab_size=1024, **shape)
    config._attn_implementation = "sdpa"
    return config, EmbeddingGemma2TextModel(config).eval().to(dtype)


def measure(config, model, lengths: list[int], dtype) -> tuple[int, int]:
    longest = max(lengths)
    embeds = torch.randn(len(lengths), longest, config.hidden_size, dtype=dtype)
    mask = torch.zeros(len(lengths), longest, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    with torch.inference_mode():
        model(inputs_embeds=embeds, attention_mask=mask)  # warm-up
        measured = peak_transient(lambda: model(inputs_embeds=embeds, attention_mask=mask))
    # The engine plans a ragged group at its padded length: every unit costs cost(longest).
    modelled = len(lengths) * text_sequence_cost(
        tokens=longest,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        layers=config.num_hidden_layers,
        per_layer_dim=config.hidden_size_per_layer_input,
        bytes_per_element=torch.empty((), dtype=dtype).element_size(),
        sliding_window=config.sliding_window,
    )
    return measured, modelled


def build_embeddinggemma(layers: int, dtype):
    from transformers import Gemma3TextConfig, Gemma3TextModel

    config = Gemma3TextConfig(
        vocab_size=1024,
        hidden_size=768,
        intermediate_size=1152,
        num_hidden_layers=layers,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=512,
        use_bidirectional_attention=True,
        max_position_embeddings=8192,
    )
    config._attn_implementation = "sdpa"
    return config, Gemma3TextModel(config).eval().to(dtype)


def measure_embeddinggemma(config, model, lengths: list[int], dtype) -> tuple[int, int]:
    longest = max(lengths)
    ids = torch.randint(3, config.vocab_size, (len(lengths), longest))
    mask = torch.zeros(len(lengths), longest, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask)  # warm-up
        measured = peak_transient(lambda: model(input_ids=ids, attention_mask=mask))
    modelled = len(lengths) * text_sequence_cost(
        tokens=longest,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        layers=config.num_hidden_layers,
        per_layer_dim=0,
        bytes_per_element=torch.empty((), dtype=dtype).element_size(),
        sliding_window=config.sliding_window,
        rotary_dims=config.head_dim * len(set(config.layer_types)),
        dense_full_mask=True,
    )
    return measured, modelled


def main_embeddinggemma() -> None:
    cases = [
        ([128], torch.float32),
        ([512], torch.float32),
        ([1024], torch.float32),
        ([2048], torch.float32),
        ([2048, 2048], torch.float32),
        ([1024, 800], torch.float32),
        ([2048], torch.bfloat16),
        ([4096], torch.float32),
    ]
    print("| tokens | dtype | measured MiB | model MiB | model / measured |")
    print("|---|---|---|---|---|")
    built: dict = {}
    for lengths, dtype in cases:
        if dtype not in built:
            built[dtype] = build_embeddinggemma(6, dtype)
        config, model = built[dtype]
        measured, modelled = measure_embeddinggemma(config, model, lengths, dtype)
        print(
            f"| {' + '.join(map(str, lengths))} | {str(dtype)[6:]} | {measured / 2**20:.1f} | "
            f"{modelled / 2**20:.1f} | {modelled / measured:.2f} |",
            flush=True,
        )


def main() -> None:
    if sys.argv[1:] == ["embeddinggemma"]:
        main_embeddinggemma()
        return
    cases = [
        (REAL, [128], torch.float32),
        (REAL, [512], torch.float32),
        (REAL, [1024], torch.float32),
        (REAL, [2048], torch.float32),
        (REAL, [1024, 1024], torch.float32),
        (REAL, [1024, 800], torch.float32),
        (REAL, [1024], torch.bfloat16),
        (LONG, [1024], torch.float32),
        (LONG, [4096], torch.float32),
        (LONG, [8192], torch.float32),
    ]
    print("| layers | per-layer dim | tokens | dtype | measured MiB | model MiB | model / measured |")
    print("|---|---|---|---|---|---|---|")
    built: dict = {}
    for shape, lengths, dtype in cases:
        key = (tuple(sorted(shape.items())), dtype)
        if key not in built:
            built[key] = build(shape, dtype)
        config, model = built[key]
        measured, modelled = measure(config, model, lengths, dtype)
        print(
            f"| {shape['num_hidden_layers']} | {shape['hidden_size_per_layer_input']} | "
            f"{' + '.join(map(str, lengths))} | {str(dtype)[6:]} | {measured / 2**20:.1f} | {modelled / 2**20:.1f} | "
            f"{modelled / measured:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
