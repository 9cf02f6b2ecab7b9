"""The loader reads only tower tensors: the language model's shards are never opened, and it is strict."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import safetensors
import torch
from helpers import ROOT, rel_error, run_images
from make_tiny_checkpoint import build_gemma4
from safetensors.torch import load_file, save_file

import gemma_embed
from gemma_embed.errors import CheckpointError
from gemma_embed.models.gemma4 import Gemma4VisionTower
from gemma_embed.models.loading import resolve_checkpoint


def relayout(src: Path, dst: Path, lm_shards: int = 2) -> Path:
    """Rewrite a checkpoint so the language model's tensors sit in shards of their own."""
    dst.mkdir(parents=True)
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(file))
    for name in ("config.json", "processor_config.json", "generation_config.json"):
        shutil.copy(src / name, dst / name)
    lm = sorted(k for k in tensors if k.startswith("model.language_model."))
    towers = sorted(k for k in tensors if k not in set(lm))
    weight_map = {}
    save_file({k: tensors[k] for k in towers}, dst / "towers.safetensors", metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(towers, "towers.safetensors"))
    for i in range(lm_shards):
        part = lm[i::lm_shards]
        name = f"lm-{i:05d}.safetensors"
        save_file({k: tensors[k] for k in part}, dst / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


@pytest.fixture(scope="module")
def split_checkpoint(tmp_path_factory, gemma4_dir):
    return relayout(gemma4_dir, tmp_path_factory.mktemp("split") / "ckpt")


def test_language_model_shards_are_never_opened(tmp_path, split_checkpoint, gemma4_dir, image_dir):
    # Delete the language model's shards outright: a loader that touched them would fail.
    moved = tmp_path / "ckpt"
    shutil.copytree(split_checkpoint, moved)
    for shard in moved.glob("lm-*.safetensors"):
        shard.unlink()
    without_lm = tmp_path / "a.safetensors"
    with_lm = tmp_path / "b.safetensors"
    assert run_images([image_dir], moved, without_lm, max_soft_tokens=70)[0] == 0
    assert run_images([image_dir], gemma4_dir, with_lm, max_soft_tokens=70)[0] == 0
    a, b = gemma_embed.load(without_lm), gemma_embed.load(with_lm)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key])


def test_only_shards_with_tower_tensors_are_opened(tmp_path, monkeypatch):
    # save_pretrained's own sharding mixes towers and LM in some shards: open exactly those with vision keys.
    ckpt = build_gemma4(tmp_path / "sharded", seed=5, max_shard_size="300KB")
    weight_map = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    vision_files = {f for k, f in weight_map.items() if k.startswith(("model.vision_tower.", "model.embed_vision."))}
    assert len(set(weight_map.values()) - vision_files) >= 1, "some shard must hold no vision tensor"

    opened = []
    real_open = safetensors.safe_open

    def spy(path, *args, **kwargs):
        opened.append(Path(path).name)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", spy)
    Gemma4VisionTower(resolve_checkpoint(str(ckpt)), "cpu", torch.float32)
    assert set(opened) == vision_files

    from transformers import Gemma4ForConditionalGeneration

    monkeypatch.setattr(safetensors, "safe_open", real_open)
    full = Gemma4ForConditionalGeneration.from_pretrained(ckpt).eval()
    ours = Gemma4VisionTower(resolve_checkpoint(str(ckpt)), "cpu", torch.float32)
    for name, value in full.model.vision_tower.state_dict().items():
        assert torch.equal(value, ours.tower.state_dict()[name]), name
    assert torch.equal(full.model.embed_vision.embedding_projection.weight, ours.embed.embedding_projection.weight)


def test_missing_tower_tensor_is_named(tmp_path, split_checkpoint):
    broken = tmp_path / "broken"
    shutil.copytree(split_checkpoint, broken)
    tensors = load_file(broken / "towers.safetensors")
    victim = "model.vision_tower.encoder.layers.1.mlp.up_proj.linear.weight"
    del tensors[victim]
    save_file(tensors, broken / "towers.safetensors", metadata={"format": "pt"})
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    del index["weight_map"][victim]
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="encoder.layers.1.mlp.up_proj.linear.weight"):
        Gemma4VisionTower(resolve_checkpoint(str(broken)), "cpu", torch.float32)


def test_unexpected_tower_tensor_is_named(tmp_path, split_checkpoint):
    broken = tmp_path / "broken"
    shutil.copytree(split_checkpoint, broken)
    tensors = load_file(broken / "towers.safetensors")
    tensors["model.vision_tower.encoder.extra.weight"] = torch.zeros(3)
    save_file(tensors, broken / "towers.safetensors", metadata={"format": "pt"})
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.vision_tower.encoder.extra.weight"] = "towers.safetensors"
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="encoder.extra.weight"):
        Gemma4VisionTower(resolve_checkpoint(str(broken)), "cpu", torch.float32)


def test_checkpoint_without_vision_tower(tmp_path, image_dir):
    audio_only = build_gemma4(tmp_path / "audio-only", seed=2, vision=False)
    with pytest.raises(CheckpointError, match="no vision tower"):
        run_images([image_dir], audio_only, tmp_path / "x.safetensors")


def test_not_a_checkpoint(tmp_path, image_dir):
    with pytest.raises(CheckpointError, match="no config.json"):
        run_images([image_dir], tmp_path, tmp_path / "x.safetensors")


def test_hub_id_offline_gives_clear_error(tmp_path, image_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    with pytest.raises(CheckpointError, match="not in the local cache"):
        resolve_checkpoint("google/gemma-4-e2b-it")


RSS_SCRIPT = textwrap.dedent(r"""
    import json, re, sys, torch
    import transformers
    from transformers import Gemma4ForConditionalGeneration
    from gemma_embed.models.gemma4 import Gemma4VisionTower
    from gemma_embed.models.loading import resolve_checkpoint
    def rss():  # VmHWM: this process's peak RSS (ru_maxrss would inherit the parent's peak across fork)
        return int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
    base = rss()
    if sys.argv[2] == "towers":
        tower = Gemma4VisionTower(resolve_checkpoint(sys.argv[1]), "cpu", torch.bfloat16)
    else:
        model = Gemma4ForConditionalGeneration.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
    print(json.dumps({"base": base, "peak": rss()}))
""")


@pytest.mark.slow
def test_peak_rss_far_below_full_load(tmp_path):
    # A language model of ~270 MB (vocab 262144 x 256, float32) beside a tiny vision tower, in one single-file
    # checkpoint. Both load in bfloat16, as people load Gemma: transformers then has to read every tensor (a
    # same-dtype CPU load would stay lazily memory-mapped and prove nothing), while the towers-only loader
    # must not touch the language model's pages at all.
    ckpt = build_gemma4(tmp_path / "big-lm", seed=4, audio=False, text_hidden=256, vocab_size=262144)
    lm_bytes = 262144 * 256 * 4
    peaks = {}
    for mode in ("towers", "full"):
        proc = subprocess.run(
            [sys.executable, "-c", RSS_SCRIPT, str(ckpt), mode], capture_output=True, text=True, cwd=ROOT, check=True
        )
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
        peaks[mode] = measured["peak"] - measured["base"]
    assert peaks["full"] > lm_bytes * 0.5, peaks  # the full load really reads the language model
    assert peaks["towers"] < lm_bytes * 0.1, peaks  # the towers-only load does not
    print(f"peak RSS growth: towers-only {peaks['towers'] / 2**20:.1f} MiB, full {peaks['full'] / 2**20:.1f} MiB")


def test_towers_only_loader_equals_reference_after_relayout(
    tmp_path, split_checkpoint, reference_model, reference_processor, image_dir
):
    from helpers import reference_image_rows

    out = tmp_path / "o.safetensors"
    assert run_images([image_dir / "wide.jpg"], split_checkpoint, out, max_soft_tokens=280)[0] == 0
    ref = reference_image_rows(reference_model, reference_processor, image_dir / "wide.jpg", 280)
    assert rel_error(gemma_embed.load(out)[str(image_dir / "wide.jpg")], ref) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("tower", ["gemma4-vision", "gemma4-audio", "gemma3n-audio"])
def test_towers_end_exactly_as_from_pretrained_leaves_them(tower, dtype):
    """Every parameter and buffer: the same dtype and the same value as in `from_pretrained(..., dtype=dtype)`,
    including the buffers transformers keeps in float32 in a bf16 model (rotary inv_freq, Gemma 3n timescales and
    softcap) and those it computes in float32 and rounds to bf16 (Gemma 4 audio timescales)."""
    from make_tiny_checkpoint import gemma3n_without_vision_tower
    from transformers import Gemma3nForConditionalGeneration, Gemma4ForConditionalGeneration

    from gemma_embed.models.gemma3n import Gemma3nAudioTower
    from gemma_embed.models.gemma4_audio import Gemma4AudioTower

    family, part = tower.split("-")
    folder = ROOT / "samples" / f"tiny-{family}"
    if family == "gemma3n":
        with gemma3n_without_vision_tower():
            model = Gemma3nForConditionalGeneration.from_pretrained(folder, dtype=dtype).model
    else:
        model = Gemma4ForConditionalGeneration.from_pretrained(folder, dtype=dtype).model
    cls = {"gemma4-vision": Gemma4VisionTower, "gemma4-audio": Gemma4AudioTower, "gemma3n-audio": Gemma3nAudioTower}
    ours = cls[tower](resolve_checkpoint(str(folder)), "cpu", dtype)
    for mine, theirs in ((ours.tower, getattr(model, f"{part}_tower")), (ours.embed, getattr(model, f"embed_{part}"))):
        expected = dict(theirs.named_parameters()) | dict(theirs.named_buffers())
        got = dict(mine.named_parameters()) | dict(mine.named_buffers())
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
    if dtype == torch.bfloat16:  # what a whole-module cast to bf16 got wrong
        float32 = {
            name.rsplit(".", 1)[-1] for name, value in ours.tower.named_buffers() if value.dtype == torch.float32
        }
        expected_float32 = {
            "gemma4-vision": {"inv_freq", "original_inv_freq"},
            "gemma4-audio": set(),  # its constructors name no dtype: all bf16, computed in float32 then rounded
            "gemma3n-audio": {"inv_timescales", "softcap"},
        }
        assert float32 == expected_float32[tower]


def test_stored_dtype_is_read_as_transformers_auto_reads_it(tmp_path):
    """--dtype auto's starting point: the config's `dtype` (an older config's `torch_dtype` too), else the dtype of
    the stored tower tensors themselves, as transformers' `dtype="auto"` falls back to the weights."""
    from gemma_embed.models.loading import stored_dtype

    folder = build_gemma4(tmp_path / "bf16", seed=7, audio=False, dtype=torch.bfloat16)
    assert stored_dtype(resolve_checkpoint(str(folder))) == (torch.bfloat16, "its config's dtype")
    config = json.loads((folder / "config.json").read_text())
    config["torch_dtype"] = config.pop("dtype")  # how older configs say it
    (folder / "config.json").write_text(json.dumps(config))
    assert stored_dtype(resolve_checkpoint(str(folder))) == (torch.bfloat16, "its config's dtype")
    del config["torch_dtype"]
    (folder / "config.json").write_text(json.dumps(config))
    assert stored_dtype(resolve_checkpoint(str(folder))) == (torch.bfloat16, "its tensors' dtype in model.safetensors")
    float32 = build_gemma4(tmp_path / "f32", seed=7, audio=False)
    assert stored_dtype(resolve_checkpoint(str(float32)))[0] == torch.float32
