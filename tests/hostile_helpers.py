"""Hostile inputs the tests build: a checkpoint that ships its own code, names a terminal would act on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers import ROOT

EG2 = ROOT / "samples" / "tiny-embeddinggemma2"

# Where auto_map goes, what it names, the fields that go with it, the module and its body. Before the loader
# refused them, each variant made `printf 'hello\ny\nworld\n' | gemma-embed text - --model evil/` import the
# module (the marker was written in all three) once 'y' was read from stdin as the answer to transformers' prompt.
EVIL_VARIANTS = {
    "tokenizer": (
        "tokenizer_config.json",
        {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]},
        {"tokenizer_class": "EvilTokenizer"},
        "tokenization_evil.py",
        "from transformers import TokenizersBackend as EvilTokenizer\n",
    ),
    "config": (
        "config.json",
        {"AutoConfig": "configuration_evil.EvilConfig"},
        {"model_type": "evil_gemma"},
        "configuration_evil.py",
        "from transformers import EmbeddingGemma2Config\n\n\nclass EvilConfig(EmbeddingGemma2Config):\n"
        "    model_type = 'evil_gemma'\n",
    ),
    "processor": (
        "processor_config.json",
        {"AutoProcessor": "processing_evil.EvilProcessor"},
        {"processor_class": "EvilProcessor"},
        "processing_evil.py",
        "from transformers import EmbeddingGemma2Processor as EvilProcessor\n",
    ),
}


def evil_checkpoint(root: Path, variant: str) -> tuple[Path, Path]:
    """(folder, marker): the tiny EmbeddingGemma 2 with `auto_map` in one of its JSON files, pointing at a module
    of its own that writes `marker` when imported."""
    file, auto_map, fields, module, body = EVIL_VARIANTS[variant]
    folder, marker = root / "evil", root / "MARKER"
    shutil.copytree(EG2, folder)
    (folder / module).write_text(f"import pathlib\n\npathlib.Path({str(marker)!r}).write_text('ran')\n{body}")
    edit_json(folder / file, lambda data: data.update(fields, auto_map=auto_map))
    return folder, marker


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def control_bytes(data: bytes) -> list[int]:
    """The bytes a terminal acts on (C0 controls and DEL), the line-ending newlines left out."""
    return [b for b in data.replace(b"\n", b"") if b < 0x20 or b == 0x7F]
