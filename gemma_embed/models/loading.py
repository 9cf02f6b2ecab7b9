"""Resolve a checkpoint (local folder or hub id) and load only the encoder towers' tensors.

The language model's weights are never read: the index's `weight_map` says which weight files (the checkpoint's
own shards) hold tower tensors, and only those are opened (and, for a hub id, downloaded). A single-file
checkpoint is opened with `safe_open`, which maps the file and reads only the requested tensors.

A checkpoint is data, never code: `load_pretrained` is the package's one call into transformers' `from_pretrained`
(a test walks the source for any other), it passes `trust_remote_code=False`, and before it loads anything it
refuses a checkpoint whose JSON names `auto_map` (code shipped in the folder) or a class transformers does not
have. Weights are read only as safetensors (`open_weights`); anything else named `.safetensors` is one error line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import socket
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gemma_embed.config import DTYPE_CODES, looks_like_path
from gemma_embed.errors import CheckpointError

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")
# Every JSON file transformers' Auto loaders read from a checkpoint folder (its CONFIG_NAME, PROCESSOR_NAME,
# IMAGE_PROCESSOR_NAME, VIDEO_PROCESSOR_NAME, AUDIO_TOKENIZER_NAME, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE,
# ADDED_TOKENS_FILE, LEGACY_PROCESSOR_CHAT_TEMPLATE_FILE; a test checks the list against transformers' own names).
LOADER_JSON_FILES = (
    CONFIG_FILE,
    *PROCESSOR_FILES,
    "audio_tokenizer_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
)
# The Auto classes `load_pretrained` may call: configs and the processors that turn media into model inputs.
AUTO_CLASSES = (
    "AutoConfig",
    "AutoProcessor",
    "AutoTokenizer",
    "AutoImageProcessor",
    "AutoVideoProcessor",
    "AutoFeatureExtractor",
)


@dataclass
class Checkpoint:
    """A checkpoint's config and where each tensor lives; tensors are fetched on demand."""

    source: str  # what the user passed: a folder or a hub id
    revision: str | None
    folder: Path  # local folder with config.json and processor files
    config: object  # transformers PretrainedConfig (composite)
    weight_map: dict[str, str]  # tensor key -> file name relative to the checkpoint
    is_local: bool
    _fetched: dict[str, Path] = field(default_factory=dict)

    def file_for(self, filename: str) -> Path:
        """Local path of one weight file, downloading it (alone) for a hub id. A name that climbs out of the
        folder (an index's `weight_map` is the checkpoint's own data) is refused."""
        if filename not in self._fetched:
            if self.is_local:
                relative = Path(filename)
                if relative.is_absolute() or ".." in relative.parts:
                    raise CheckpointError(f"{self.source}: weight file {filename!r} is outside the checkpoint folder")
                path = self.folder / filename
            else:
                path = Path(_hub_download(self.source, filename, self.revision))
            self._fetched[filename] = path
        return self._fetched[filename]


# One connection attempt, this long, decides whether the hub is reachable; huggingface_hub's own default is five
# retries with backoff (measured here without network: 25 s and six warning lines before the error).
HUB_PROBE_TIMEOUT_S = 3.0


@functools.cache
def hub_offline() -> str | None:
    """Why the hub cannot be used (HF_HUB_OFFLINE, or no connection within the probe's timeout); None if it
    can. Asked once per process; downloads then read only the local cache."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    endpoint = urllib.parse.urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        return f"{host} cannot be reached ({exc.strerror or exc})"
    return None


@contextlib.contextmanager
def _quiet_logger(name: str):
    """A library that logs retries and warnings itself (huggingface_hub, transformers): the tool says what failed
    in one line instead."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _hub_download(repo_id: str, filename: str, revision: str | None, optional: bool = False) -> str | None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    offline = hub_offline()
    try:
        with _quiet_logger("huggingface_hub"):
            return hf_hub_download(repo_id, filename, revision=revision, local_files_only=offline is not None)
    except RepositoryNotFoundError as exc:
        raise CheckpointError(
            f"{repo_id}: no such model on the hub (or it is gated; log in with `hf auth login`)"
        ) from exc
    except LocalEntryNotFoundError as exc:
        if optional:
            return None
        raise CheckpointError(
            f"{repo_id}: {filename} is not in the local cache and {offline or 'the hub cannot be reached'}; "
            f"pass a local checkpoint folder with --model, or download it where there is a network "
            f"(hf download {repo_id}) and run with HF_HUB_OFFLINE=1"
        ) from exc
    except EntryNotFoundError as exc:
        if optional:
            return None
        raise CheckpointError(f"{repo_id}: the hub repository has no {filename}") from exc
    except OSError as exc:
        if optional:
            return None
        raise CheckpointError(f"{repo_id}: cannot download {filename}: {exc}") from exc


def resolve_checkpoint(model: str, revision: str | None = None) -> Checkpoint:
    """Find config, processor files and the tensor -> file map, downloading no weights yet."""
    path = Path(model).expanduser()
    is_local = path.is_dir()
    if is_local:
        folder = path
        if not (folder / CONFIG_FILE).is_file():
            raise CheckpointError(f"{model}: no {CONFIG_FILE} in this folder; is it a Hugging Face checkpoint?")
    elif path.exists():
        raise CheckpointError(f"{model}: not a checkpoint folder (a checkpoint is a folder with {CONFIG_FILE})")
    elif looks_like_path(model):
        raise CheckpointError(f"{model}: no such folder (and not a hub id)")
    else:
        config_path = _hub_download(model, CONFIG_FILE, revision)
        folder = Path(config_path).parent
        for name in PROCESSOR_FILES:
            _hub_download(model, name, revision, optional=True)

    config = load_pretrained("AutoConfig", folder, model, f"config ({CONFIG_FILE})")

    index_path = folder / INDEX_FILE
    if not is_local and not index_path.exists():
        fetched = _hub_download(model, INDEX_FILE, revision, optional=True)
        index_path = Path(fetched) if fetched else index_path
    if index_path.is_file():
        weight_map = _read_weight_map(index_path, model)
    else:
        single = folder / SINGLE_FILE
        if not is_local:
            single = Path(_hub_download(model, SINGLE_FILE, revision))
        elif not single.is_file():
            raise CheckpointError(f"{model}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors weights are read)")
        with open_weights(model, SINGLE_FILE, single) as fh:
            weight_map = {key: SINGLE_FILE for key in fh.keys()}
    return Checkpoint(
        source=model, revision=revision, folder=folder, config=config, weight_map=weight_map, is_local=is_local
    )


# safetensors' dtype names for the floating-point dtypes a checkpoint stores.
STORED_DTYPES = {code: name for name, code in DTYPE_CODES.items() if name.startswith(("float", "bfloat"))}
TOWER_KEY_PARTS = ("vision_tower.", "audio_tower.", "embed_vision.", "embed_audio.")


def stored_dtype(checkpoint: Checkpoint) -> tuple[object, str]:
    """(dtype, where it was read) of the checkpoint's weights, as transformers' `dtype="auto"` reads it: the config's
    `dtype` (transformers reads an older config's `torch_dtype` into it), else the stored tensors' own dtype, from
    the header of the weight file that holds the first floating-point tower tensor (a file the tower is read from
    anyway). (None, "") when neither says."""
    import torch

    dtype = getattr(checkpoint.config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if isinstance(dtype, torch.dtype):
        return dtype, "its config's dtype"
    towers_first = sorted(checkpoint.weight_map, key=lambda key: not any(part in key for part in TOWER_KEY_PARTS))
    for key in towers_first:
        filename = checkpoint.weight_map[key]
        with open_weights(checkpoint.source, filename, checkpoint.file_for(filename)) as fh:
            stored = STORED_DTYPES.get(fh.get_slice(key).get_dtype())
        if stored is not None:
            return getattr(torch, stored), f"its tensors' dtype in {filename}"
    return None, ""


def find_prefix(checkpoint: Checkpoint, candidates: Iterable[str]) -> str | None:
    """The first candidate prefix under which the checkpoint stores any tensor."""
    keys = checkpoint.weight_map.keys()
    for prefix in candidates:
        if any(k.startswith(prefix) for k in keys):
            return prefix
    return None


def read_tensors(checkpoint: Checkpoint, prefix: str) -> dict:
    """All tensors under `prefix` (prefix stripped), opening only the files that hold them."""
    by_file: dict[str, list[str]] = {}
    for key, filename in checkpoint.weight_map.items():
        if key.startswith(prefix):
            by_file.setdefault(filename, []).append(key)
    tensors = {}
    for filename, keys in sorted(by_file.items()):
        with open_weights(checkpoint.source, filename, checkpoint.file_for(filename)) as fh:
            for key in keys:
                tensors[key[len(prefix) :]] = fh.get_tensor(key)
    return tensors


def load_module(module, dtypes: dict, tensors: dict, where: str, device):
    """Fill a module built by `build_without_init` from checkpoint tensors, strict both ways (naming the first bad
    key); cast each parameter and buffer to its dtype in `dtypes`, then move the module to the device with those
    dtypes unchanged (a `.to(dtype=...)` of the whole module would also cast the buffers transformers keeps in
    float32: measured 1-10% off transformers' own bf16 output, growing with the RoPE position)."""
    import torch

    expected = module.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        raise CheckpointError(f"{where}: checkpoint lacks tensor {missing[0]!r} ({len(missing)} missing)")
    if unexpected:
        raise CheckpointError(
            f"{where}: checkpoint has unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected)"
        )
    for key, value in tensors.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise CheckpointError(
                f"{where}: tensor {key!r} has shape {tuple(value.shape)}, "
                f"the config expects {tuple(expected[key].shape)}"
            )
    # Each stored tensor is rounded once to its final dtype and put in place (assign), never copied into the
    # float32 tensor the build allocated: those stay untouched pages. Peak RSS of loading the release-size vision
    # tower (167M parameters, stored bf16) in bf16 fell from 1.54 to 0.34 GiB over the process's start.
    for key in list(tensors):
        tensors[key] = tensors[key].to(dtypes[key])
    module.load_state_dict(tensors, strict=True, assign=True)
    tensors.clear()
    cast_like(module, dtypes)  # the buffers the constructor computed (rotary tables), not stored
    module.to(device=torch.device(device))
    return module.eval().requires_grad_(False)


def from_pretrained_dtypes(factory, dtype) -> dict:
    """The dtype of every parameter and buffer of the module `factory` builds, as `from_pretrained(...,
    dtype=dtype)` leaves it.

    transformers decides this by building the model with torch's default dtype set to `dtype`
    (`local_torch_dtype` in `get_init_context`): tensors a constructor creates without naming a dtype take that
    default, those it creates as float32 on purpose stay float32 (the Gemma 4 vision rotary `inv_freq`, Gemma 3n
    audio `inv_timescales` and `softcap`; Gemma 4 audio names none, so all of its buffers follow the default).
    The same build on the meta device reads those decisions off without computing anything.
    """
    import torch
    from transformers.initialization import no_init_weights
    from transformers.modeling_utils import local_torch_dtype

    with torch.device("meta"), local_torch_dtype(dtype), no_init_weights():
        layout = factory()
    return {name: t.dtype for name, t in (*layout.named_parameters(), *layout.named_buffers())}


def built_bytes(factory, dtype) -> int:
    """Bytes the module `factory` builds will hold in `dtype` once loaded (parameters and buffers, as
    `from_pretrained_dtypes` decides their dtypes), computed on the meta device: no memory, no tensor read."""
    import torch
    from transformers.initialization import no_init_weights
    from transformers.modeling_utils import local_torch_dtype

    with torch.device("meta"), local_torch_dtype(dtype), no_init_weights():
        layout = factory()
    return sum(t.numel() * t.element_size() for t in (*layout.parameters(), *layout.buffers()))


def cast_like(module, dtypes: dict) -> None:
    """Cast each parameter and buffer of `module` to its dtype in `dtypes` (in place, values rounded once)."""
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        if tensor.dtype != dtypes[name]:
            tensor.data = tensor.data.to(dtypes[name])


def build_without_init(factory, dtype) -> tuple:
    """(module, dtypes): a module constructed skipping random init (the checkpoint overwrites every parameter
    anyway), and the dtype each of its tensors must end in.

    The module is built in float32 on the CPU (not the meta device), so non-persistent buffers such as the rotary
    tables are computed by their own constructors, in float32, as `from_pretrained`'s `_init_weights` computes
    them before copying them into their final dtype; `load_module` then rounds each tensor once to that dtype.
    """
    import torch
    from transformers.initialization import no_init_weights
    from transformers.modeling_utils import local_torch_dtype

    with local_torch_dtype(torch.float32), no_init_weights():
        module = factory()
    return module, from_pretrained_dtypes(factory, dtype)


def tower_configs(checkpoint: Checkpoint, tower: str) -> tuple:
    """(`{tower}_config`, text_config) of a composite checkpoint; a clear error when it has no such tower."""
    config = checkpoint.config
    tower_config = getattr(config, f"{tower}_config", None)
    text_config = getattr(config, "text_config", None)
    if tower_config is None or text_config is None:
        raise CheckpointError(
            f"{checkpoint.source}: this checkpoint has no {tower} tower (no {tower}_config); "
            f"model type {getattr(config, 'model_type', '?')}"
        )
    return tower_config, text_config


def load_part(checkpoint: Checkpoint, name: str, prefixes: tuple[str, ...], factory, dtype, device):
    """Build one module without init and fill it strictly from the tensors under the first prefix present."""
    prefix = find_prefix(checkpoint, prefixes)
    if prefix is None:
        raise CheckpointError(
            f"{checkpoint.source}: no {name} tensors in the checkpoint (looked for {' or '.join(prefixes)})"
        )
    module, dtypes = build_without_init(factory, dtype)
    return load_module(module, dtypes, read_tensors(checkpoint, prefix), prefix, device)


def load_processor(checkpoint: Checkpoint, auto_class: str, what: str):
    """transformers' own processor of the checkpoint (`AutoImageProcessor`, ...), from its processor files."""
    return load_pretrained(auto_class, checkpoint.folder, checkpoint.source, what)


def load_pretrained(auto_class: str, folder: Path, source: str, what: str, **kwargs):
    """`transformers.<auto_class>.from_pretrained(folder, **kwargs)`: the package's only call of a
    `from_pretrained`. The checkpoint's JSON files are checked first (`refuse_checkpoint_code`), and
    `trust_remote_code=False` is always passed (whatever `kwargs`, which may come from the checkpoint's own
    files, say), so transformers neither imports the folder's code nor asks about it on stdin/stdout (with
    `trust_remote_code` left unset it prompts, and reads the answer from stdin). Any failure is one
    CheckpointError line."""
    import transformers

    if auto_class not in AUTO_CLASSES:
        raise ValueError(f"load_pretrained: {auto_class!r} is not one of {', '.join(AUTO_CLASSES)}")
    refuse_checkpoint_code(folder, source)
    kwargs["trust_remote_code"] = False
    try:
        return getattr(transformers, auto_class).from_pretrained(str(folder), **kwargs)
    except (OSError, ValueError, KeyError, TypeError, ImportError) as exc:
        raise CheckpointError(f"{source}: cannot load its {what}: {' '.join(str(exc).split())}") from exc


def refuse_checkpoint_code(folder: Path, source: str) -> None:
    """A CheckpointError when any JSON file transformers' loaders would read from `folder` names `auto_map` (at
    any depth: processor_config.json nests its parts' configs) or a tokenizer/processor class, or a model type,
    that transformers does not have: either would make transformers look for code in the checkpoint itself."""
    for name in LOADER_JSON_FILES:
        path = folder / name
        if not path.is_file():  # absent, or not a regular file (a FIFO would block the read)
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{source}: cannot read {name}: {' '.join(str(exc).split())}") from exc
        problem = _code_reference(data)
        if problem is None and name == CONFIG_FILE and isinstance(data, dict):
            problem = _unknown_model_type(data.get("model_type"))
        if problem is not None:
            raise CheckpointError(
                f"{source}: {name} {problem}; gemma-embed runs only transformers' own classes, never a checkpoint's "
                f"own code"
            )


def _code_reference(data) -> str | None:
    """What in one parsed JSON file points at code outside transformers, or None."""
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if "auto_map" in node:
                return f"names auto_map ({' '.join(str(node['auto_map']).split())[:200]})"
            for field, value in node.items():
                if field in CLASS_FIELDS and isinstance(value, str) and not _known_class(field, value):
                    return f"names {field} {value!r}, which transformers does not have"
                if isinstance(value, dict | list):
                    stack.append(value)
    return None


# Fields naming a class the Auto loaders look up by name, and transformers' own lookup for each (None: unknown).
CLASS_FIELDS = {
    "tokenizer_class": ("tokenization_auto", "tokenizer_class_from_name"),
    "processor_class": ("processing_auto", "processor_class_from_name"),
    "image_processor_type": ("image_processing_auto", "get_image_processor_class_from_name"),
    "video_processor_type": ("video_processing_auto", "video_processor_class_from_name"),
    "feature_extractor_type": ("feature_extraction_auto", "feature_extractor_class_from_name"),
}


@functools.cache
def _known_class(field: str, name: str) -> bool:
    """Whether transformers has the class `name` for `field`, as its Auto loaders look it up; a pre-v5 `...Fast`
    name counts as its base class (transformers maps one to the other).

    A name transformers' top-level module exports is its own class: each Auto lookup ends by asking that module
    for the name, so it finds every such name. That table is read without importing any class
    (`_exported_by_transformers`); the lookup itself imports the field's whole registry (the image processors pull
    in torchvision: about 6 s of a text query's start on this project's 2-core machine). Any other name (one
    registered at run time, a legacy alias, a checkpoint's own class) goes through transformers' own lookup."""
    candidates = tuple(dict.fromkeys((name.removesuffix("Fast"), name)))
    if any(_exported_by_transformers(candidate) for candidate in candidates):
        return True
    return _found_by_lookup(field, candidates)


def _exported_by_transformers(name: str) -> bool:
    """Whether `name` is in the top-level `transformers` module's import structure: the classes it imports on
    first use (`_class_to_module`), the ones it holds (`_objects`) and those whose backend is missing (a
    placeholder naming the package to install). False where transformers keeps no such tables (another layout
    of its lazy module): then the lookup decides."""
    import transformers

    tables = [
        getattr(transformers, table, None) for table in ("_class_to_module", "_objects", "_object_missing_backend")
    ]
    return any(isinstance(table, dict) and name in table for table in tables)


def _found_by_lookup(field: str, candidates: tuple[str, ...]) -> bool:
    import importlib

    module_name, function = CLASS_FIELDS[field]
    lookup = getattr(importlib.import_module(f"transformers.models.auto.{module_name}"), function)
    with _quiet_logger("transformers"):  # a `...Fast` image processor name logs a deprecation warning
        return any(lookup(candidate) is not None for candidate in candidates)


def _unknown_model_type(model_type) -> str | None:
    from transformers import CONFIG_MAPPING

    if isinstance(model_type, str) and model_type not in CONFIG_MAPPING:
        return f"names model_type {model_type!r}, which transformers does not have"
    return None


def _read_weight_map(index_path: Path, source: str) -> dict[str, str]:
    """The index's tensor -> file map, checked to be one (the file is the checkpoint's own data)."""
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        detail = f"no {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())
        raise CheckpointError(f"{source}: cannot read {INDEX_FILE}: {detail}") from exc
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise CheckpointError(f"{source}: {INDEX_FILE}: weight_map is not a map of tensor names to file names")
    return weight_map


@contextlib.contextmanager
def open_weights(source: str, filename: str, path: Path):
    """`safe_open(path)` for a checkpoint's weight file: a file that is not safetensors (a pickle renamed
    `model.safetensors`, a truncated download), an unreadable one, or a tensor it lacks is one CheckpointError
    naming the file, never a traceback."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if path.exists() and not path.is_file():
        raise CheckpointError(f"{source}: {filename} is not a regular file")
    try:
        handle = safe_open(str(path), framework="pt")
    except SafetensorError as exc:
        raise CheckpointError(
            f"{source}: {filename} is not a safetensors file ({' '.join(str(exc).split())}); "
            f"only safetensors weights are read"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"{source}: cannot read {filename}: {exc.strerror or exc}") from None
    with handle:
        try:
            yield handle
        except SafetensorError as exc:
            raise CheckpointError(f"{source}: {filename}: {' '.join(str(exc).split())}") from None
