"""A checkpoint is data, never code: a folder whose JSON names `auto_map` or a class transformers does not have is
refused before anything loads; transformers, reached only through `load_pretrained`, never prompts on stdin; weight
files that are not safetensors (a pickle named model.safetensors) are one CheckpointError naming the file."""

from __future__ import annotations

import builtins
import io
import json
import pickle
import shutil
import sys
from pathlib import Path

import pytest
from helpers import ROOT
from hostile_helpers import EG2, EVIL_VARIANTS, edit_json, evil_checkpoint

from gemma_embed.errors import CheckpointError
from gemma_embed.models import loading
from gemma_embed.models.loading import load_pretrained, read_tensors, refuse_checkpoint_code, resolve_checkpoint

SAMPLES = ROOT / "samples"
GEMMA4 = SAMPLES / "tiny-gemma4"


@pytest.fixture(autouse=True)
def modules_cache(tmp_path, monkeypatch):
    """transformers copies a checkpoint's code into its modules cache before importing it: should a regression
    let it, the copy lands in tmp (the module reads HF_MODULES_CACHE once, at import)."""
    from transformers import dynamic_module_utils

    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))


@pytest.mark.parametrize("variant", sorted(EVIL_VARIANTS))
def test_auto_map_is_refused_before_anything_loads(tmp_path, variant):
    folder, marker = evil_checkpoint(tmp_path, variant)
    with pytest.raises(CheckpointError, match=rf"{EVIL_VARIANTS[variant][0]} names auto_map .*evil") as caught:
        resolve_checkpoint(str(folder))
    assert "\n" not in str(caught.value)
    assert not marker.exists()


UNKNOWN_CLASSES = {
    "tokenizer_class": ("tokenizer_config.json", lambda d: d.update(tokenizer_class="EvilTokenizer")),
    "processor_class": ("processor_config.json", lambda d: d.update(processor_class="EvilProcessor")),
    "image_processor_type": (  # nested: processor_config.json holds its parts' configs
        "processor_config.json",
        lambda d: d["image_processor"].update(image_processor_type="EvilImageProcessor"),
    ),
    "model_type": ("config.json", lambda d: d.update(model_type="evil_gemma")),
}


@pytest.mark.parametrize("field", sorted(UNKNOWN_CLASSES))
def test_a_class_transformers_does_not_have_is_refused(tmp_path, field):
    folder = tmp_path / "odd"
    shutil.copytree(EG2, folder)
    file, edit = UNKNOWN_CLASSES[field]
    edit_json(folder / file, edit)
    with pytest.raises(CheckpointError, match=rf"{file} names {field} '(?i:\w*evil\w*)', which transformers does not"):
        refuse_checkpoint_code(folder, str(folder))


def test_the_samples_and_legacy_class_names_pass_without_a_word(tmp_path, capfd):
    for sample in ("tiny-embeddinggemma2", "tiny-gemma4", "tiny-gemma3n"):
        refuse_checkpoint_code(SAMPLES / sample, sample)
    # Names saved by transformers 4 (the ...Fast tokenizer and image processor classes) are transformers' own.
    folder = tmp_path / "v4-names"
    shutil.copytree(EG2, folder)
    edit_json(folder / "tokenizer_config.json", lambda d: d.update(tokenizer_class="GemmaTokenizerFast"))
    edit_json(
        folder / "processor_config.json",
        lambda d: d["image_processor"].update(image_processor_type="SiglipImageProcessorFast"),
    )
    refuse_checkpoint_code(folder, "v4-names")
    assert capfd.readouterr().err == ""  # transformers' deprecation note for the Fast name is not shown


class _RecordingStdin(io.TextIOBase):
    """A stdin that notes each read (transformers turns an exception raised in its prompt into its own
    ValueError, so a read is recorded rather than raised)."""

    def __init__(self, reads: list):
        self.reads = reads

    def readable(self) -> bool:
        return True

    def read(self, *args):
        self.reads.append("read")
        return "y\n"

    readline = read


@pytest.mark.parametrize(
    ("variant", "auto_class"),
    [("tokenizer", "AutoProcessor"), ("config", "AutoConfig"), ("processor", "AutoProcessor")],
)
def test_transformers_never_prompts_even_without_the_refusal(tmp_path, monkeypatch, variant, auto_class):
    """The second line of defence: with the JSON check switched off, `load_pretrained`'s trust_remote_code=False
    makes transformers refuse the code itself, without asking on stdout or reading stdin (left unset, it prompts
    `Do you wish to run the custom code? [y/N]` and reads the answer from stdin)."""
    folder, marker = evil_checkpoint(tmp_path, variant)
    monkeypatch.setattr(loading, "refuse_checkpoint_code", lambda folder, source: None)
    reads: list = []
    monkeypatch.setattr(sys, "stdin", _RecordingStdin(reads))
    monkeypatch.setattr(builtins, "input", lambda *args: reads.append(args) or "y")
    with pytest.raises(CheckpointError, match="cannot load its"):
        load_pretrained(auto_class, folder, str(folder), "processor")
    assert reads == [] and not marker.exists()


def test_load_pretrained_passes_false_whatever_the_checkpoint_asks(tmp_path, monkeypatch):
    seen = {}

    class Recorder:
        @staticmethod
        def from_pretrained(folder, **kwargs):
            seen.update(kwargs)
            return "loaded"

    import transformers

    monkeypatch.setattr(transformers, "AutoProcessor", Recorder)
    assert load_pretrained("AutoProcessor", EG2, "eg2", "processor", trust_remote_code=True, use_fast=True) == "loaded"
    assert seen == {"trust_remote_code": False, "use_fast": True}
    with pytest.raises(ValueError, match="not one of"):
        load_pretrained("AutoModel", EG2, "eg2", "model")


class _Payload:
    """Unpickling this writes the marker: a pickle that is read as one runs code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _with_pickle_weights(root: Path, name: str = "model.safetensors") -> tuple[Path, Path]:
    folder, marker = root / "ckpt", root / "MARKER"
    shutil.copytree(GEMMA4, folder)
    (folder / name).write_bytes(pickle.dumps({"model.vision_tower.x": _Payload(marker)}))
    return folder, marker


def test_a_pickle_named_model_safetensors_is_one_error_naming_the_file(tmp_path):
    folder, marker = _with_pickle_weights(tmp_path)
    with pytest.raises(CheckpointError) as caught:
        resolve_checkpoint(str(folder))
    message = str(caught.value)
    assert message.startswith(f"{folder}: model.safetensors is not a safetensors file (") and "\n" not in message
    assert not marker.exists()


def test_weight_files_named_by_an_index_are_checked_too(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(GEMMA4, folder)
    real = resolve_checkpoint(str(GEMMA4))
    (folder / "model.safetensors").rename(folder / "towers.safetensors")
    index = {"metadata": {}, "weight_map": dict.fromkeys(real.weight_map, "towers.safetensors")}
    (folder / loading.INDEX_FILE).write_text(json.dumps(index))
    data = (folder / "towers.safetensors").read_bytes()
    (folder / "towers.safetensors").write_bytes(data[: len(data) // 2])  # a download cut short
    with pytest.raises(CheckpointError, match=r"towers.safetensors is not a safetensors file \(.*not fully covered"):
        read_tensors(resolve_checkpoint(str(folder)), "model.vision_tower.")

    (folder / "towers.safetensors").unlink()
    (folder / "towers.safetensors").mkdir()
    with pytest.raises(CheckpointError, match="towers.safetensors is not a regular file"):
        read_tensors(resolve_checkpoint(str(folder)), "model.vision_tower.")

    index["weight_map"] = dict.fromkeys(real.weight_map, "../../outside.safetensors")
    (folder / loading.INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        read_tensors(resolve_checkpoint(str(folder)), "model.vision_tower.")

    for broken, why in (("{not json", "cannot read model.safetensors.index.json"), ("{}", "no 'weight_map'")):
        (folder / loading.INDEX_FILE).write_text(broken)
        with pytest.raises(CheckpointError, match=why):
            resolve_checkpoint(str(folder))
    (folder / loading.INDEX_FILE).write_text(json.dumps({"weight_map": ["a", "b"]}))
    with pytest.raises(CheckpointError, match="weight_map is not a map"):
        resolve_checkpoint(str(folder))
