"""Hostile inputs the tests build: a checkpoint that ships its own code, names a terminal would act on, a run
stopped where a test wants it (to find its parts folder swapped), and files compared byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

from helpers import ROOT, SAMPLE_MODEL, SLOW_CLI

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


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (not following links) and its bytes: what "unchanged, byte for byte" compares."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class GatedRun:
    """A real `gemma-embed images` run (tests/slow_gemma_embed.py --gate) that saves a part per item and holds each
    device batch until the test lets it through, so the test decides how far it gets and what it finds on disk."""

    def __init__(self, tmp_path: Path, images: Path, out: Path):
        self.gate = tmp_path / "gate"
        self.gate.mkdir()
        self.parts = out.with_name(out.name + ".parts")
        self.args = [str(a) for a in (SLOW_CLI, "--gate", self.gate, "images", images)]
        self.args += ["--model", str(SAMPLE_MODEL), "-o", str(out), "--flush-every", "1", "--batch-size", "1"]
        self.args += ["--max-soft-tokens", "70"]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def let_through(self, batch: int) -> None:
        (self.gate / str(batch)).touch()

    def wait_for_parts(self, count: int) -> None:
        deadline = time.monotonic() + 120  # only against a hang
        while len(list(self.parts.glob("part-*.safetensors"))) < count:
            assert self.proc.poll() is None, self.proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no parts were saved"
            time.sleep(0.05)

    def finish(self, signal: int | None = None) -> subprocess.CompletedProcess:
        if signal is not None:
            self.proc.send_signal(signal)
        stdout, stderr = self.proc.communicate(timeout=120)
        return subprocess.CompletedProcess(self.args, self.proc.returncode, stdout.decode(), stderr.decode())
