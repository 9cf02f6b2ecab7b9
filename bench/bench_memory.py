"""Vision-tower memory: the planner's cost model against the measured peak transient, on the CPU.

    python -m bench.bench_memory

Peak transient = the highest running sum of the profiler's allocation/free events during one forward (the CPU
analogue of `cuda.max_memory_allocated() - baseline`), inputs and weights excluded. Two encoder layers suffice:
activations are freed layer by layer, so the peak does not grow with depth. Results go in bench/MEMORY.md.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from gemma_embed.memory import vision_item_cost

GRIDS = {630: (7, 10), 2520: (14, 20), 10080: (28, 40)}  # patches -> token grid (rows, cols)


def vision_inputs(batch: int, patches: int, dtype):
    rows, cols = GRIDS[patches]
    gy, gx = 3 * rows, 3 * cols
    xs, ys = torch.arange(gx).repeat(gy), torch.arange(gy).repeat_interleave(gx)
    positions = torch.stack([xs, ys], -1)[None].repeat(batch, 1, 1)
    return torch.rand(batch, patches, 768, dtype=dtype), positions


def peak_transient(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    running = peak = 0
    for event in events:
        running += event.nbytes()
        peak = max(peak, running)
    return peak


def measure(hidden, intermediate, heads, patches, batch, dtype, attn="sdpa") -> tuple[int, int]:
    from transformers import Gemma4VisionConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionModel

    config = Gemma4VisionConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        position_embedding_size=1024,
    )
    config._attn_implementation = attn
    model = Gemma4VisionModel(config).eval().to(dtype)
    pixels, positions = vision_inputs(batch, patches, dtype)
    with torch.inference_mode():
        model(pixel_values=pixels, pixel_position_ids=positions)  # warm-up
        measured = peak_transient(lambda: model(pixel_values=pixels, pixel_position_ids=positions))
    modelled = batch * vision_item_cost(
        patches,
        hidden,
        intermediate,
        heads,
        torch.empty((), dtype=dtype).element_size(),
        materialises_scores=attn == "eager",
    )
    return measured, modelled


def main() -> None:
    cases = [
        (256, 1024, 4, 630, 1, torch.float32, "sdpa"),
        (256, 1024, 4, 630, 4, torch.float32, "sdpa"),
        (256, 1024, 4, 2520, 1, torch.float32, "sdpa"),
        (256, 1024, 4, 2520, 2, torch.float32, "sdpa"),
        (256, 1024, 4, 10080, 1, torch.float32, "sdpa"),
        (64, 128, 4, 10080, 1, torch.float32, "sdpa"),
        (768, 3072, 12, 630, 1, torch.float32, "sdpa"),
        (768, 3072, 12, 2520, 1, torch.float32, "sdpa"),
        (768, 3072, 12, 2520, 2, torch.float32, "sdpa"),
        (768, 3072, 12, 2520, 1, torch.bfloat16, "sdpa"),
        (768, 3072, 12, 10080, 1, torch.float32, "sdpa"),
        (256, 1024, 4, 2520, 1, torch.float32, "eager"),
    ]
    print("| D | I | H | patches | batch | dtype | attn | measured MiB | model MiB | model / measured |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for hidden, inter, heads, patches, batch, dtype, attn in cases:
        measured, modelled = measure(hidden, inter, heads, patches, batch, dtype, attn)
        print(
            f"| {hidden} | {inter} | {heads} | {patches} | {batch} | {str(dtype)[6:]} | {attn} | "
            f"{measured / 2**20:.1f} | {modelled / 2**20:.1f} | {modelled / measured:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
