"""What sentence-transformers runs after its `Transformer` module, shared by the text towers of EmbeddingGemma and
EmbeddingGemma 2 (`SentenceTextTower`: the text model built unloaded, loaded once, and its weight bytes): token
batches padded for the text model, mean pooling over the tokens that count, the `Dense` modules and `Normalize` the
checkpoint's modules.json lists, and the optional Matryoshka truncation.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gemma_embed.batching import padded_length
from gemma_embed.errors import CheckpointError, UsageError
from gemma_embed.models.base import Unit
from gemma_embed.models.loading import Checkpoint, build_without_init, load_module
from gemma_embed.models.st_inputs import (
    MODULE_WEIGHTS_FILE,
    NORMALIZE,
    DenseLayer,
    SentenceTransformerSetup,
    activation_module,
    read_sentence_transformers,
)
from gemma_embed.pooling import l2_normalize, truncate_dim


class DenseModule(torch.nn.Module):
    """sentence-transformers' `Dense`: `activation(linear(x))`, plus a residual when configured. The parameter
    names are its own (`linear.weight`, ...), so its model.safetensors loads strictly."""

    def __init__(self, spec: DenseLayer):
        super().__init__()
        self.linear = torch.nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        self.activation = activation_module(spec.activation)
        self.use_residual = spec.use_residual
        if spec.use_residual and spec.in_features != spec.out_features:
            self.residual = torch.nn.Linear(spec.in_features, spec.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(self.linear(x))
        if self.use_residual:
            out = out + (self.residual(x) if hasattr(self, "residual") else x)
        return out


class SentenceHead:
    """The modules after pooling, in modules.json's order (Dense modules in float32, strict from their own
    safetensors; Normalize), then `--dim`: the first `dim` components, renormalised.

    `model_width`: the pooled vector's width when no Dense module sets the output width. The width and `--dim`
    are checked when it is made; the Dense weights are read by `load()`."""

    def __init__(
        self, checkpoint: Checkpoint, setup: SentenceTransformerSetup, device, model_width: int, dim: int | None
    ):
        self.checkpoint, self.setup, self.device = checkpoint, setup, device
        full = setup.dim or int(model_width)
        if dim is not None and not 0 < int(dim) <= full:  # before any tensor is read
            raise UsageError(f"--dim {dim}: the model's vectors have {full} dimensions")
        self.dim = int(dim) if dim is not None and int(dim) < full else None
        self.width = self.dim or full  # the output vectors' width
        self.steps: list | None = None

    def load(self) -> None:
        if self.steps is None:
            self.steps = _load_steps(self.checkpoint, self.setup, self.device)

    def weight_bytes(self) -> int:
        """Bytes of the Dense modules (float32), from their shapes."""
        return sum(
            4 * step.out_features * (step.in_features + int(step.bias)) for step in self.setup.head if step != NORMALIZE
        )

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        """Pooled vectors (B, E) -> the output vectors (B, width), float32."""
        if self.steps is None:
            raise RuntimeError("SentenceHead.load() was not called")
        x = pooled.float()
        for step in self.steps:
            x = l2_normalize(x) if step == NORMALIZE else step(x)
        return truncate_dim(x, self.dim)


def _load_steps(checkpoint: Checkpoint, setup: SentenceTransformerSetup, device) -> list:
    from gemma_embed.models.loading import open_weights

    steps: list = []
    for step in setup.head:
        if step == NORMALIZE:
            steps.append(NORMALIZE)
            continue
        relative = f"{step.folder}/{MODULE_WEIGHTS_FILE}"
        path = checkpoint.file_for(relative)
        if not Path(path).is_file():
            raise CheckpointError(f"{checkpoint.source}: no {relative} (only safetensors weights are read)")
        with open_weights(checkpoint.source, relative, path) as fh:  # a pickle in disguise is one line
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}
        module, dtypes = build_without_init(lambda step=step: DenseModule(step), torch.float32)
        steps.append(load_module(module, dtypes, tensors, relative, device))
    return steps


class SentenceTextTower:
    """A text model whose pooled output goes through a `SentenceHead`, as a Tower: one vector per unit (a token
    sequence), units grouped as ragged batches. A subclass checks its checkpoint, then calls `_setup` with its text
    config and the pooled width, and gives `part` (the name and key prefixes of its tensors), `build_model` and
    `encode`. Built with `load=False` it has read only configs (cost model and width known); `load()` reads the
    text model's tensors and the Dense modules, once."""

    grouping = "ragged"
    length_unit = "tokens"
    part: tuple[str, tuple[str, ...]] = ("text model", ("",))

    def _setup(self, checkpoint: Checkpoint, text_config, device, dtype, setup, model_width: int, dim, load: bool):
        text_config._attn_implementation = "sdpa"  # sentence-transformers' default through from_pretrained
        self.checkpoint = checkpoint
        self.config = text_config
        self.device = torch.device(device)
        self.dtype = dtype
        self.setup = setup or read_sentence_transformers(checkpoint)
        self.head = SentenceHead(checkpoint, self.setup, self.device, model_width, dim)
        self.dim, self.width = self.head.dim, self.head.width
        self.pad_id = int(text_config.pad_token_id or 0)
        self.output_dims = {"retrieval": self.width}
        self.model = None
        if load:
            self.load()

    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def load(self) -> None:
        """The text model and the Dense modules (once)."""
        from gemma_embed.models.loading import load_part

        if self.model is not None:
            return
        name, prefixes = self.part
        self.model = load_part(self.checkpoint, name, prefixes, self.build_model, self.dtype, self.device)
        self.head.load()

    def weight_bytes(self) -> int:
        """Bytes of the text model and the Dense modules: measured once loaded, else built on the meta device."""
        from gemma_embed.memory.readings import resident_bytes
        from gemma_embed.models.loading import built_bytes

        if self.model is not None:
            return resident_bytes(self) + self.head.weight_bytes()
        return built_bytes(self.build_model, self.dtype) + self.head.weight_bytes()

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


def token_batch(units: list[Unit], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, pooling mask) on the host for a ragged batch of token units, right-padded:
    a real token keeps its position, padded keys are masked, and pooling skips padding and the `pool_from`
    leading tokens of each unit (a prompt, when Pooling's include_prompt is false). The batch is as long as its
    longest unit's rung of the padding ladder (batching.padded_length), which is every unit's rung: a unit's
    bytes do not depend on the batch it came in."""
    longest = padded_length(max(u.length for u in units))
    ids = torch.full((len(units), longest), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(units), longest), dtype=torch.long)
    pool = torch.zeros((len(units), longest), dtype=torch.long)
    for i, unit in enumerate(units):
        n = unit.length
        ids[i, :n] = unit.inputs["input_ids"]
        mask[i, :n] = 1
        pool[i, unit.inputs.get("pool_from", 0) : n] = 1
    return ids, mask, pool
