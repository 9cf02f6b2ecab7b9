"""The small interface every model family implements: prepare one item, encode one batch of units.

A *unit* is one input to an encoder tower: an image, one sampled video frame, or one audio window. Items become
units in the prepare stage; the batching stage groups units of all items; the engine encodes groups; the
pipeline regroups unit rows per item. Nothing here knows about files or output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Unit:
    """One encoder input, unbatched, with what batching and planning need to know about it."""

    inputs: dict[str, Any]  # tensors without a batch dimension, padding already trimmed
    length: int  # patches (vision) or feature frames (audio): the batching key
    rows: int  # output rows this unit yields
    item: int = -1  # index of the item it belongs to, set by the pipeline


@dataclass
class PreparedItem:
    units: list[Unit]
    meta: dict = field(default_factory=dict)  # per-item metadata for the output file
    rows_per_unit: int | None = None  # set when every unit yields the same rows (video frames)
    # A second stage's input built in the prepare stage, e.g. EmbeddingGemma 2's token sequence whose placeholder
    # slots take the units' rows (models/embeddinggemma2.py). None for single-stage models.
    sequence: Any = None


# A text item's metadata keeps its text (what a search hit shows: `search.SearchHit.text`), at most this many
# characters of it: the texts a search shows whole (a line, a passage: MS MARCO's average about 330 characters)
# while an output's metadata stays bounded at about 1 kB more per item (ASCII; the 200 B an item has without, 6x).
# Measured on 100k items (2-core AMD EPYC): their JSON metadata 121 MB against 20 MB, parsed in 0.53 s against
# 0.23 s; long documents (--per-file) keep their beginning, and `chars` says how long the whole text was.
STORED_TEXT_CHARS = 1000


def text_meta(text: str) -> dict:
    """What a text item's metadata records of its text: its length and (cut at STORED_TEXT_CHARS) the text."""
    return {"chars": len(text), "text": text[:STORED_TEXT_CHARS]}


@dataclass(frozen=True)
class TokenIds:
    """A text given as token ids (the OpenAI embeddings API's token arrays): the text model's input ids as they are,
    with no prompt, chat template or special tokens added. A text preparer that takes them checks each id against
    the vocabulary and the length against the model's limit (`check_token_ids`)."""

    ids: tuple[int, ...]


def check_token_ids(given: TokenIds, vocab_size: int, max_length: int | None) -> list[int]:
    """The ids as a list, or ValueError (the item's one-line reason): none, one outside the vocabulary (an
    out-of-range embedding lookup is a device-side assert on CUDA), or more than the model takes."""
    ids = list(given.ids)
    if not ids:
        raise ValueError("no token ids")
    wrong = next((i for i in ids if not 0 <= i < vocab_size), None)
    if wrong is not None:
        raise ValueError(f"token id {wrong} is outside the vocabulary (0 to {vocab_size - 1})")
    if max_length is not None and len(ids) > max_length:
        raise ValueError(f"{len(ids)} token ids, over the {max_length} the model takes")
    return ids


class Tower(Protocol):
    """An encoder tower plus its projection into the language model's space."""

    grouping: str  # "exact": only equal lengths share a batch; "ragged": padded with a mask
    length_unit: str  # what a unit's length counts ("patches", "frames", "tokens"): batches are sized in it
    device: Any
    dtype: Any

    def load(self) -> None:
        """Read the weights (once). Until then only the cost model and the widths may be used."""

    def weight_bytes(self) -> int:
        """Bytes its weights hold on the device (known from the config before they are read)."""

    def unit_cost(self, length: int) -> int:
        """Modelled peak transient bytes one unit of this length adds to a forward pass."""

    def encode(self, units: list[Unit], space: str) -> Any:
        """The rows of every unit, in unit order, as one (sum of unit rows, width) tensor still on the device:
        the engine copies it to the host once and splits it there (one transfer and one sync per chunk)."""


class Preparer(Protocol):
    """Turns one decoded item into units, with transformers' own processor applied to that item alone."""

    def prepare(self, decoded: Any) -> PreparedItem: ...

    def describe(self) -> dict: ...


class EncoderTower:
    """What every tower shares: its device and dtype, its two checkpoint parts (the encoder and the `embed_*`
    projection into the language model's space) built without init and loaded strictly, and that projection.

    Built with `load=False`, a tower has read only its config: its cost model (`unit_cost`) and row widths are
    known, so `plan` and every check run before any tensor is read; `load()` then reads the weights (once).
    A subclass names its parts and their key prefixes (`parts`), gives the module factories, and implements
    `unit_cost` and `encode`.
    """

    grouping = "exact"
    length_unit = "patches"
    # (part name, key prefixes to try in order) for the encoder and for its projection.
    parts: tuple[tuple[str, tuple[str, ...]], tuple[str, tuple[str, ...]]] = ()

    def __init__(
        self, checkpoint, device, dtype, config, build_encoder, build_projection, output_dims: dict, load: bool = True
    ):
        import torch

        self.checkpoint = checkpoint
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self._factories = (build_encoder, build_projection)
        self.tower = self.embed = None  # the modules, once loaded
        self.output_dims = output_dims  # row width per --space
        if load:
            self.load()

    def load(self) -> None:
        """Read this tower's tensors (and only those) into its modules; a second call does nothing."""
        from gemma_embed.models.loading import load_part

        if self.tower is not None:
            return
        (encoder_name, encoder_prefixes), (projection_name, projection_prefixes) = self.parts
        build_encoder, build_projection = self._factories
        self.tower = load_part(self.checkpoint, encoder_name, encoder_prefixes, build_encoder, self.dtype, self.device)
        self.embed = load_part(
            self.checkpoint, projection_name, projection_prefixes, build_projection, self.dtype, self.device
        )

    def weight_bytes(self) -> int:
        """Bytes its weights hold on the device: measured once loaded, else from the config (meta build)."""
        from gemma_embed.memory.readings import resident_bytes
        from gemma_embed.models.loading import built_bytes

        if self.tower is not None:
            return resident_bytes(self)
        return sum(built_bytes(factory, self.dtype) for factory in self._factories)

    @property
    def element_size(self) -> int:
        """Bytes per element of the compute dtype (for the cost models)."""
        import torch

        return torch.empty((), dtype=self.dtype).element_size()

    def host_stack(self, tensors: list) -> Any:
        """`torch.stack(tensors)` on the host, into pinned memory when the tower runs on CUDA (`to_device`)."""
        import torch

        out = torch.empty((len(tensors), *tensors[0].shape), dtype=tensors[0].dtype, pin_memory=self.pinned)
        return torch.stack(tensors, out=out)

    def host_zeros(self, shape: tuple, dtype) -> Any:
        """A zeroed host buffer to fill (padded batches), pinned when the tower runs on CUDA."""
        import torch

        return torch.zeros(shape, dtype=dtype, pin_memory=self.pinned)

    def to_device(self, host):
        """A host batch onto the device. From pinned memory the copy is asynchronous (non_blocking): it queues
        before the forward's kernels on the same stream, so the CPU never waits for it."""
        return host.to(self.device, non_blocking=self.pinned)

    @property
    def pinned(self) -> bool:
        """Host batches are staged in pinned (page-locked) memory on CUDA only: pinning needs the CUDA driver,
        and only pinned memory copies asynchronously."""
        return self.device.type == "cuda"

    def project(self, hidden, space: str):
        """The rows in the requested space: after the projection (language) or the encoder's own (tower)."""
        return self.embed(inputs_embeds=hidden) if space == "language" else hidden
