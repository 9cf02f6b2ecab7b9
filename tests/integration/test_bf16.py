"""--dtype bfloat16 against transformers' own bf16 path (`from_pretrained(..., dtype=torch.bfloat16)`), for Gemma 4
images at 1120 tokens (wide and tall), video frames, Gemma 4 audio and Gemma 3n audio.

Each comparison is printed (`pytest -s` shows them):
- same ops, bit-identical: every device batch the tool ran, given to transformers' model as it is (the
  processor's own inputs without their padding patches, stacked; the extractor's features zero-padded with the
  mask), gives the tool's rows bit for bit;
- per item, against transformers' per-item call on the same inputs: bit-identical where the tool ran the item
  alone, else within transformers' own difference between batch sizes on that item (measured here: two copies
  against one; for video, frames one and two at a time against the whole video);
- against the call on the processor's output as it is: the tool never sends the processor's padding patches or
  frames (its buckets need none), and transformers' own bf16 result moves by 0.2-0.4% for images and frames when
  they are left out (measured here; on this CPU that is the whole difference).

Before the fix the loader cast every buffer to bf16 (the vision RoPE tables, Gemma 3n's timescales and softcap),
and the vision tower cast pixels to bf16 before the patch embedder's 2 * (px - 0.5): 0.4-2% off.
The `device` fixture runs each test on the CPU, and on CUDA under the `gpu` marker (bench/gpu_check.sh).

transformers' calls run with the tool's CPU kernels (`numerics.aligned`): on a CPU without bf16 instructions the tool
computes bf16 products in float32 (numerics.py: oneDNN's emulation changes with the thread count), so "bit-identical"
means the same inputs through the same kernels there. Where the CPU has bf16 instructions the kernels are oneDNN's
own, and the 1120-token test also holds the tool to transformers' call without them, bit for bit.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch
from audio_helpers import CLIP_SECONDS, write_clips
from helpers import record_outputs, reference_image_rows, rel_error, run_images, write_image

import gemma_embed
from gemma_embed import engine, numerics
from gemma_embed.batching import longest_first, padded_length
from gemma_embed.models.gemma3n import Gemma3nAudioTower
from gemma_embed.models.gemma4 import Gemma4VisionTower
from gemma_embed.models.gemma4_audio import Gemma4AudioTower

# A batched item may differ from transformers' per-item call by transformers' own batch-size difference; the
# slack covers kernels that differ a little between the batch sizes measured and the tool's. Zero stays zero.
SLACK = 1.25


@pytest.fixture(scope="module")
def bf16_model():
    """transformers' full model in bf16, per (checkpoint, device), loaded once per module."""
    cache: dict = {}

    def get(checkpoint, device):
        if (checkpoint, device) not in cache:
            from make_tiny_checkpoint import gemma3n_without_vision_tower
            from transformers import AutoConfig, Gemma3nForConditionalGeneration, Gemma4ForConditionalGeneration

            if AutoConfig.from_pretrained(checkpoint).model_type == "gemma3n":
                with gemma3n_without_vision_tower():
                    model = Gemma3nForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.bfloat16)
            else:
                model = Gemma4ForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.bfloat16)
            cache[checkpoint, device] = model.to(device).eval()
        return cache[checkpoint, device]

    return get


@pytest.fixture(scope="module")
def gemma3n_dir(tmp_path_factory):
    from make_tiny_checkpoint import build_gemma3n

    return build_gemma3n(tmp_path_factory.mktemp("ckpt") / "g3n", seed=1, vision=False)  # audio tests


def check_item(name: str, ours, reference, alone: bool, own: dict[str, float], padded=None) -> None:
    """`reference`: transformers' per-item call on the tool's inputs; `own`: transformers' own differences on this
    item between batch sizes, measured by the caller; `padded`: its call on the processor's output as it is."""
    error = rel_error(ours, reference)
    allowed = SLACK * max(own.values(), default=0.0)
    line = f"{name}: tool vs transformers {error:.2e} ({'alone' if alone else 'batched'}); transformers' own: "
    line += ", ".join(f"{label} {value:.2e}" for label, value in own.items())
    if padded is not None:
        own_padding, padded_error = rel_error(reference, padded), rel_error(ours, padded)
        line += f"; vs the call with padding: tool {padded_error:.2e}, transformers' own {own_padding:.2e}"
    print(line)
    if alone:
        assert torch.equal(ours, reference), line
    assert error <= allowed, line
    if padded is not None:
        assert padded_error <= own_padding + allowed + 1e-7, line  # the two effects add up at most


def stacked(units, name: str, device) -> torch.Tensor:
    return torch.stack([u.inputs[name] for u in units]).to(device)


def fingerprint(pixels: torch.Tensor) -> bytes:
    return pixels.cpu().contiguous().numpy().tobytes()


def vision_rows(model, pixels, positions, video: bool = False, tool_kernels: bool = True) -> torch.Tensor:
    """transformers' get_image_features / get_video_features (all frames one video) on one stacked batch, with the
    tool's CPU kernels unless told otherwise."""
    kernels = numerics.aligned(pixels.device) if tool_kernels else contextlib.nullcontext()
    with torch.no_grad(), kernels:
        if video:
            out = model.model.get_video_features(pixels, positions, torch.tensor([pixels.shape[0]]))
        else:
            out = model.get_image_features(pixel_values=pixels, image_position_ids=positions)
    return torch.cat(out.pooler_output).cpu()


def same_ops_vision(model, calls, device, video: bool = False) -> dict[bytes, torch.Tensor]:
    """Every device batch the tool ran, through transformers' own call: bit-identical. Returns transformers' rows
    of every unit in the tool's batches, by the unit's pixels."""
    by_pixels = {}
    for units, rows in calls:
        theirs = vision_rows(
            model, stacked(units, "pixel_values", device), stacked(units, "position_ids", device), video
        )
        assert torch.equal(theirs, rows), [u.length for u in units]
        for unit, unit_rows in zip(units, torch.split(theirs, [u.rows for u in units]), strict=True):
            by_pixels[fingerprint(unit.inputs["pixel_values"])] = unit_rows
    print(f"same ops: {len(calls)} device batches of {sorted({len(u) for u, _ in calls})} units, bit-identical")
    return by_pixels


@pytest.fixture(scope="module")
def one_layer_dir(tmp_path_factory):
    """A Gemma 4 vision tower of one layer: at 1120 tokens (10080 patches) each forward is the test's cost."""
    from make_tiny_checkpoint import build_gemma4

    return build_gemma4(tmp_path_factory.mktemp("ckpt") / "g4-1", seed=3, audio=False, vision_layers=1)


def test_images_at_1120_tokens_wide_and_tall(tmp_path, device, one_layer_dir, bf16_model, monkeypatch):
    from PIL import Image
    from transformers import AutoImageProcessor

    model = bf16_model(one_layer_dir, device)
    processor = AutoImageProcessor.from_pretrained(one_layer_dir)
    folder = tmp_path / "images"
    folder.mkdir()
    # The wides share a chunk: they come first in the walk, so the first window (closed at one chunk of 2 while
    # the encode rate is unknown) holds both.
    sizes = {"a-wide.jpg": (4000, 300), "b-wide.jpg": (4000, 300), "c-tall.webp": (200, 1400)}
    for seed, (name, (width, height)) in enumerate(sizes.items()):
        write_image(folder / name, width, height, seed)
    calls = record_outputs(monkeypatch, Gemma4VisionTower)
    out = tmp_path / "o.safetensors"
    code, records, err = run_images(
        [folder], one_layer_dir, out, dtype="bfloat16", max_soft_tokens=1120, batch_size=2, device=device
    )
    assert code == 0 and records[-1]["dtype"] == "bfloat16", err
    assert gemma_embed.read_metadata(out)["compute_dtype"] == "bfloat16"
    assert sorted(len(units) for units, _ in calls) == [1, 2]
    in_tool_batches = same_ops_vision(model, calls, device)

    ours = gemma_embed.load(out)
    for name in sizes:
        with Image.open(folder / name) as image:
            processed = processor([image.convert("RGB")], return_tensors="pt", max_soft_tokens=1120)
        pixels, positions = processed["pixel_values"].to(device), processed["image_position_ids"].to(device)
        n = int((positions != -1).all(dim=-1).sum())
        assert 9000 < n < pixels.shape[1]  # 1120 tokens, and padding patches for the tool to leave out
        alone_rows = vision_rows(model, pixels[:, :n], positions[:, :n])
        if device == "cpu" and numerics.half_native(torch.bfloat16):  # oneDNN's own kernels: the same bits
            assert torch.equal(alone_rows, vision_rows(model, pixels[:, :n], positions[:, :n], tool_kernels=False))
        check_item(
            f"{name} ({n} patches)",
            ours[name],
            alone_rows,
            alone=name == "c-tall.webp",
            own={"in the tool's batch vs alone": rel_error(in_tool_batches[fingerprint(pixels[0, :n])], alone_rows)},
            padded=vision_rows(model, pixels, positions),
        )


def test_video_frames(tmp_path, device, gemma4_dir, bf16_model, monkeypatch):
    from make_video_samples import make_samples
    from transformers import AutoVideoProcessor
    from transformers.video_utils import read_video_pyav

    model = bf16_model(gemma4_dir, device)
    processor = AutoVideoProcessor.from_pretrained(gemma4_dir)
    made = {v.name: v for v in make_samples(tmp_path / "videos")}
    # The two videos that share the 4:3 bucket first, the one-frame video before the other: the first decode
    # window closes at one chunk's frames (engine.enough_work, while no batch has been measured), so it holds
    # both (1 + 8 frames), and its chunks of 5 mix them. Windows after it close at WINDOW_SECONDS of work at the
    # measured rate: on a slow (loaded) machine a few seconds are one video's frames, so the window is made to
    # hold the rest whatever the rate.
    monkeypatch.setattr("gemma_embed.embedder.WINDOW_SECONDS", 1e9)
    videos = [made[name] for name in ("one-frame.avi", "clip-h264.mp4", "short-vp9.webm")]
    calls = record_outputs(monkeypatch, Gemma4VisionTower)
    out = tmp_path / "o.safetensors"
    # 8 frames a video; chunks of 5: the 4:3 bucket's first chunk mixes two videos (1 + 4 of 8 frames).
    code, _, err = run_images(
        videos, gemma4_dir, out, modality="video", dtype="bfloat16", max_frames=8, batch_size=5, device=device
    )
    assert code == 0, err
    assert any(len({u.item for u in units}) > 1 for units, _ in calls), "no chunk mixed videos"
    in_tool_batches = same_ops_vision(model, calls, device, video=True)

    def in_tool_batches_of(frames) -> torch.Tensor:
        return torch.cat([in_tool_batches[fingerprint(frame)] for frame in frames])

    meta, ours = gemma_embed.read_metadata(out), gemma_embed.load(out)
    for key, item in zip(meta["keys"], meta["items"], strict=True):
        wanted = np.array(item["frame_indices"])
        frames, _ = read_video_pyav(item["path"], sample_indices_fn=lambda **_: wanted)  # noqa: B023
        processed = processor(videos=[frames], do_sample_frames=False, return_tensors="pt")
        pixels, positions = processed["pixel_values_videos"].to(device), processed["video_position_ids"].to(device)
        n = int((positions[0] != -1).all(dim=-1).sum())
        padded = vision_rows(model, pixels, positions, video=True)  # the processor's output as it is
        pixels, positions = pixels[:, :n], positions[:, :n]
        per_video = vision_rows(model, pixels, positions, video=True)  # transformers' per-video call: all frames
        own = {"in the tool's batches vs per video": rel_error(in_tool_batches_of(pixels), per_video)}
        if len(pixels) >= 2:  # batch size 1 against 2, on the first two frames
            pair = vision_rows(model, pixels[:2], positions[:2], video=True)
            alone = torch.cat([vision_rows(model, pixels[i : i + 1], positions[i : i + 1], video=True) for i in (0, 1)])
            own["frames 2 at a time vs 1"] = rel_error(pair, alone)
        check_item(f"{Path(key).name} ({len(wanted)} frames of {n} patches)", ours[key], per_video, False, own, padded)


def audio_rows(model, family: str, features, mask) -> list[torch.Tensor]:
    """transformers' get_audio_features on one batch: each clip's valid rows (mask: True = a valid frame), with the
    tool's CPU kernels."""
    with torch.no_grad(), numerics.aligned(features.device):
        if family == "gemma3n":
            out = model.model.get_audio_features(features, ~mask)  # this tower's mask: True = padding
            valid = ~out.audio_mel_mask
        else:
            out = model.model.get_audio_features(features, mask)
            valid = out.attention_mask.bool()
    return [rows[keep].cpu() for rows, keep in zip(out.pooler_output, valid, strict=True)]


@pytest.mark.parametrize("family", ["gemma4", "gemma3n"])
def test_audio_clips_in_one_ragged_batch(tmp_path, device, family, gemma4_dir, gemma3n_dir, bf16_model, monkeypatch):
    from transformers import AutoFeatureExtractor

    checkpoint, tower_cls = (gemma4_dir, Gemma4AudioTower) if family == "gemma4" else (gemma3n_dir, Gemma3nAudioTower)
    model = bf16_model(checkpoint, device)
    extractor = AutoFeatureExtractor.from_pretrained(checkpoint)
    clips = write_clips(
        tmp_path / "clips", {name: CLIP_SECONDS[name] for name in ("a-1.00s.wav", "b-2.37s.wav", "c-3.50s.wav")}
    )
    monkeypatch.setattr(engine, "padded_buckets", longest_first)  # every clip in one ragged batch
    calls = record_outputs(monkeypatch, tower_cls)
    out = tmp_path / "o.safetensors"
    code, _, err = run_images(
        [tmp_path / "clips"], checkpoint, out, modality="audio", dtype="bfloat16", batch_size=len(clips), device=device
    )
    assert code == 0, err
    assert [len(units) for units, _ in calls] == [len(clips)]

    in_tool_batch = {}  # transformers' rows of each clip in the tool's batch, by frames
    if family == "gemma4":
        # Same ops: transformers on the tool's own zero-padded batch and mask. (Gemma 3n's batches differ from
        # its per-clip call on purpose: the tool zeroes the first convolution's output past each clip's end.)
        ((units, rows),) = calls
        longest = padded_length(max(u.length for u in units))  # as the tool pads (its ladder)
        features = torch.zeros(len(units), longest, units[0].inputs["input_features"].shape[-1])
        mask = torch.zeros(len(units), longest, dtype=torch.bool)
        for i, unit in enumerate(units):
            features[i, : unit.length], mask[i, : unit.length] = unit.inputs["input_features"], True
        theirs = audio_rows(model, family, features.to(device), mask.to(device))
        assert torch.equal(torch.cat(theirs), rows)
        in_tool_batch = {unit.length: unit_rows for unit, unit_rows in zip(units, theirs, strict=True)}
        print("same ops: the ragged batch is bit-identical")

    ours = gemma_embed.load(out)
    for name, samples in clips.items():
        extracted = extractor([samples], return_tensors="pt")  # the clip alone, as transformers' per-clip path
        features, mask = extracted["input_features"].to(device), extracted["input_features_mask"].bool().to(device)
        # Gemma 4 units keep only the valid frames (the extractor may add one masked frame); Gemma 3n units keep
        # every frame the extractor made for the clip alone.
        n = int(mask.sum()) if family == "gemma4" else mask.shape[1]
        (reference,) = audio_rows(model, family, features[:, :n], mask[:, :n])
        check_item(
            f"{family} {name}",
            ours[name],
            reference,
            alone=False,
            own={
                "batch 2 vs 1": rel_error(
                    audio_rows(model, family, features[:, :n].repeat(2, 1, 1), mask[:, :n].repeat(2, 1))[0], reference
                ),
                **({"in the tool's batch vs alone": rel_error(in_tool_batch[n], reference)} if in_tool_batch else {}),
            },
            padded=audio_rows(model, family, features, mask)[0] if n < mask.shape[1] else None,
        )


@pytest.fixture(scope="module")
def bf16_stored_dir(tmp_path_factory):
    """A Gemma 4 checkpoint stored in bf16, as real ones are (its config says `"dtype": "bfloat16"`)."""
    from make_tiny_checkpoint import build_gemma4

    return build_gemma4(tmp_path_factory.mktemp("ckpt") / "g4-bf16", seed=6, audio=False, dtype=torch.bfloat16)


BF16_CPU = {"avx512_f": True, "amx_tile": True, "amx_bf16": True, "avx512_bf16": True}
PLAIN_CPU = {"avx512_f": True, "amx_tile": False, "amx_bf16": False, "avx512_bf16": False}


def test_auto_runs_a_bf16_checkpoint_in_bf16_like_transformers_auto(
    tmp_path, device, bf16_stored_dir, image_dir, monkeypatch
):
    """--dtype auto on a bf16 checkpoint, on a CPU with bf16 units (this machine kind has AMX; the query is faked
    so the test takes that path on any CPU) or a GPU with native bf16: the tool computes in bf16, and equals
    transformers' own `from_pretrained(dtype="auto")`, which also reads bf16 from the checkpoint."""
    from PIL import Image
    from transformers import AutoImageProcessor, Gemma4ForConditionalGeneration

    if device == "cpu":
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: dict(BF16_CPU))
    model = Gemma4ForConditionalGeneration.from_pretrained(bf16_stored_dir, dtype="auto").to(device).eval()
    assert model.dtype == torch.bfloat16  # transformers' own auto
    processor = AutoImageProcessor.from_pretrained(bf16_stored_dir)
    calls = record_outputs(monkeypatch, Gemma4VisionTower)
    out = tmp_path / "o.safetensors"
    code, records, err = run_images([image_dir], bf16_stored_dir, out, max_soft_tokens=70, device=device)
    assert code == 0, err
    summary = records[-1]
    assert summary["dtype"] == "bfloat16", summary
    assert "stores bfloat16 (its config's dtype)" in summary["dtype_reason"], summary
    meta = gemma_embed.read_metadata(out)
    assert meta["compute_dtype"] == "bfloat16" and meta["dtype_reason"] == summary["dtype_reason"]
    if device == "cpu":
        assert "this CPU has bf16 matrix instructions (amx_bf16, avx512_bf16)" in summary["dtype_reason"]
    in_tool_batches = same_ops_vision(model, calls, device)
    alone = {fingerprint(units[0].inputs["pixel_values"]) for units, _ in calls if len(units) == 1}

    ours = gemma_embed.load(out)
    for name in sorted(ours):
        with Image.open(image_dir / name) as image:
            processed = processor([image.convert("RGB")], return_tensors="pt", max_soft_tokens=70)
        pixels, positions = processed["pixel_values"].to(device), processed["image_position_ids"].to(device)
        n = int((positions != -1).all(dim=-1).sum())
        alone_rows = vision_rows(model, pixels[:, :n], positions[:, :n])
        if device == "cpu" and numerics.half_native(torch.bfloat16):  # oneDNN's own kernels: the same bits
            assert torch.equal(alone_rows, vision_rows(model, pixels[:, :n], positions[:, :n], tool_kernels=False))
        key = fingerprint(pixels[0, :n])
        check_item(
            f"auto {name} ({n} patches)",
            ours[name],
            alone_rows,
            alone=key in alone,
            own={"in the tool's batch vs alone": rel_error(in_tool_batches[key], alone_rows)},
            padded=vision_rows(model, pixels, positions) if n < pixels.shape[1] else None,
        )


def test_auto_runs_a_bf16_checkpoint_in_float32_on_a_cpu_without_bf16_units(
    tmp_path, bf16_stored_dir, image_dir, monkeypatch
):
    """Without bf16 units bf16 is emulated (0.5x of float32 on such a CPU): auto computes in float32, and every item
    is within 1e-5 of transformers' float32 per-item reference on the same (bf16-stored) weights."""
    from transformers import AutoImageProcessor, Gemma4ForConditionalGeneration

    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: dict(PLAIN_CPU))
    out = tmp_path / "o.safetensors"
    code, records, err = run_images([image_dir], bf16_stored_dir, out, max_soft_tokens=70)
    assert code == 0, err
    assert records[-1]["dtype"] == "float32", records[-1]
    assert "this CPU has no bf16 matrix instructions" in records[-1]["dtype_reason"]
    model = Gemma4ForConditionalGeneration.from_pretrained(bf16_stored_dir, dtype=torch.float32).eval()
    processor = AutoImageProcessor.from_pretrained(bf16_stored_dir)
    ours = gemma_embed.load(out)
    for name in sorted(ours):
        reference = reference_image_rows(model, processor, image_dir / name, 70)
        assert rel_error(ours[name], reference) < 1e-5, name
