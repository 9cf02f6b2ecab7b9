"""The cost model of the Gemma text models the two EmbeddingGemma families run (EmbeddingGemma's bidirectional
Gemma 3, EmbeddingGemma 2's text model with per-layer inputs): plain numbers, shared by their towers'
`unit_cost` (models/embeddinggemma.py, models/embeddinggemma2.py)."""

from __future__ import annotations


def text_sequence_cost(
    tokens: int,
    hidden: int,
    intermediate: int,
    layers: int,
    per_layer_dim: int,
    bytes_per_element: int,
    sliding_window: int | None = None,
    padded: bool = True,
    rotary_dims: int = 0,
    dense_full_mask: bool = False,
) -> int:
    """Peak transient bytes one sequence of `tokens` adds to an EmbeddingGemma 2 (or, with `per_layer_dim=0`,
    EmbeddingGemma) text-model forward (SDPA).

    The forward passes through phases whose transients do not coexist; the peak is the largest (bench/MEMORY.md
    compares this with profiler measurements):
    - per-layer embeddings: a (tokens, layers x per_layer_dim) projection in the model dtype and two float32
      copies inside its RMSNorm (s + 8 bytes an element; measured exactly in float32 and bfloat16). The result
      stays alive through every layer. With the real config (24 x 512) this is the largest phase up to a few
      thousand tokens: 144 KiB a token in float32.
    - a layer: the per-layer embeddings, the MLP (gate, act(gate), up and their product: 4 x intermediate), and
      about 7 float32 copies of the hidden state (norms, residual, attention in/out); SDPA materialises no scores.
    - attention masks: transformers builds the sliding-window mask as a dense tokens x tokens bool mask through
      an int64 index difference and its abs (16 bytes per pair), whenever a sequence is longer than the window.
      That is the quadratic term; it is per batch in fact, counted per sequence here (never below the truth).
      With padding the full-attention layers get a dense bool mask too (1 byte per pair).
    Full-attention layers cost nothing quadratic here: without padding transformers passes SDPA no mask, and
    SDPA on the CPU (and CUDA's flash/memory-efficient kernels) materialises no scores.
    EmbeddingGemma (Gemma 3 with bidirectional attention) differs in two ways, measured at 4096 tokens:
    - `dense_full_mask`: its full-attention layers get a dense bool mask even without padding (the bidirectional
      `or_mask_function` makes transformers build one), so the mask phase holds two bool masks (18 bytes a pair);
    - `rotary_dims`: the rotary tables, computed after the masks and alive through every layer: one cos and one
      sin table per layer type in the model dtype (the head widths summed over the layer types: 2 x 256).
    """
    n = max(0, int(tokens))
    if n == 0:
        return 0
    s = max(1, int(bytes_per_element))
    ple = layers * per_layer_dim
    ple_alive = n * ple * s
    rotary_alive = n * 2 * int(rotary_dims) * s
    ple_phase = n * ple * (s + 8)
    quadratic = sliding_window is not None and n > sliding_window
    full_mask = n * n if (padded or dense_full_mask) else 0
    masks = (n * n if quadratic else 0) + full_mask
    layer_phase = ple_alive + rotary_alive + masks + n * (4 * intermediate * s + 7 * hidden * 4)
    # (+ 64 bytes a token: the small position and index vectors the mask functions build; 28 measured)
    sliding_build = 16 * n * n + n * n + (n * n if dense_full_mask else 0) + 64 * n
    mask_phase = ple_alive + (sliding_build if quadratic else 0)
    # Beside every phase: small float32 copies (measured 0.2 MiB over the phase at 1024 tokens in bfloat16) and
    # the sequence's input embeddings once the stage-1 rows are scattered in; one float32 hidden state covers them.
    return int(max(ple_phase, layer_phase, mask_phase) + n * hidden * 4)
