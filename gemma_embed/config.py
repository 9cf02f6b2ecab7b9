"""The frozen run configuration the CLI builds and the pipeline reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MODEL = "google/gemma-4-e2b-it"
IMAGE_SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)


@dataclass(frozen=True)
class RunConfig:
    modality: str  # "images" | "video" | "audio"
    inputs: tuple[str, ...]
    output: Path = Path("embeddings.safetensors")
    model: str = DEFAULT_MODEL
    revision: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    output_dtype: str = "float32"
    pool: str = "none"  # none | mean (video adds frame)
    space: str = "language"  # language | tower
    batch_size: int | None = None  # a cap; None plans from memory
    memory_budget: str | None = None  # bytes ("2GiB", "500000000") or a fraction of free memory ("0.3")
    workers: int = 2
    overwrite: bool = False
    resume: bool = False
    shard_size: int | None = None  # items per output shard; None: one file (unless its metadata grows too big)
    flush_every: int = 500  # part files at least every this many items (and every 60 s)
    debug: bool = False  # tracebacks for failures
    num_shards: int | None = None  # scheduler arrays: this process embeds input items i % num_shards == shard_index
    shard_index: int | None = None
    on_error: str = "skip"  # skip | stop
    null_separated: bool = False
    max_soft_tokens: int | None = None  # images: the processor's budget; None keeps the checkpoint's
    extra: dict = field(default_factory=dict)  # modality-specific options (fps, max_frames, window_s, ...)
