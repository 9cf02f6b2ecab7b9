"""Media nobody on the project made (tests/media/SOURCES.md): every Pillow mode converted as transformers converts
it, non-UTF-8 container tags, 1x1 video frames, messages that say the cause, and a stderr that carries only the
tool's own lines while the libraries' messages land in the items' records."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import av
import pytest
import torch
from helpers import EXE, ROOT, TEST_MEDIA, rel_error, run_images
from PIL import Image, ImageOps
from transformers.image_utils import load_image

import gemma_embed

BUDGET = 70
# The tool's own stderr lines: error:/warning:/note: lines and the closing summary line.
OWN_LINE = re.compile(r"^(error|warning|note): |^\d+ ok, \d+ failed")
# Every mode the issue names; `mode` in the item metadata is the file's own mode before conversion.
MODES = {"RGBA", "LA", "PA", "P", "CMYK", "I;16", "I", "F", "1", "LAB", "L", "RGB"}


def gemma_embed_cmd(*args, stdin: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *map(str, args)], input=stdin, capture_output=True, timeout=timeout)


def foreign_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not OWN_LINE.match(line)]


def records(stdout: bytes) -> tuple[dict[str, dict], dict]:
    lines = [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]
    return {r["key"]: r for r in lines if r["type"] == "item"}, lines[-1]


def has_alpha_for_transformers(path: Path) -> bool:
    """transformers' own test (image_transforms.convert_to_rgb): an "A" band or a transparency entry."""
    with Image.open(path) as img:
        return "A" in img.getbands() or img.info.get("transparency") is not None


def image_features(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        out = model.get_image_features(
            pixel_values=inputs["pixel_values"], image_position_ids=inputs["image_position_ids"]
        )
    (rows,) = out.pooler_output
    return rows


def reference_rows(model, processor, path: Path) -> torch.Tensor:
    """transformers from the file: Pillow opens it, `ImageOps.exif_transpose` as `load_image` does, and the
    processor converts the image itself (its `convert_to_rgb`: alpha composited onto white)."""
    with Image.open(path) as img:
        inputs = processor([ImageOps.exif_transpose(img)], return_tensors="pt", max_soft_tokens=BUDGET)
    return image_features(model, inputs)


def test_mode_matrix_equals_transformers_and_stderr_is_the_tools_own(
    tmp_path, gemma4_dir, reference_model, reference_processor
):
    folder = TEST_MEDIA / "images"
    out = tmp_path / "modes.safetensors"
    proc = gemma_embed_cmd("images", folder, "--model", gemma4_dir, "-o", out, "--jsonl", "--max-soft-tokens", BUDGET)
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    assert foreign_lines(stderr) == [], stderr
    items, summary = records(proc.stdout)
    files = sorted(p.name for p in folder.iterdir())
    assert sorted(items) == files and summary["ok"] == len(files) and summary["skipped"] == 0

    meta = dict(zip(gemma_embed.read_metadata(out)["keys"], gemma_embed.read_metadata(out)["items"], strict=True))
    assert MODES <= {m["mode"] for m in meta.values()}, "the matrix lost a mode"
    with Image.open(folder / "python.png") as img:  # palette with per-entry alpha, and with one transparent index
        assert img.mode == "P" and isinstance(img.info["transparency"], bytes)
    with Image.open(folder / "python.gif") as img:
        assert img.mode == "P" and isinstance(img.info["transparency"], int)
    for name, frames in {"animated.gif": 3, "animated.png": 3, "animated.webp": 3, "multipage.tif": 2}.items():
        assert meta[name]["frames_in_file"] == frames, name
    assert meta["flower.jpg"]["frames_in_file"] == 1
    assert (meta["exif-rotated.jpg"]["width"], meta["exif-rotated.jpg"]["height"]) == (64, 96)  # stored 96x64

    rows = gemma_embed.load(out)
    for name in files:
        ref = reference_rows(reference_model, reference_processor, folder / name)
        assert rows[name].shape == ref.shape, name
        assert rel_error(rows[name], ref) < 1e-5, (name, meta[name]["mode"], rel_error(rows[name], ref))
        if not has_alpha_for_transformers(folder / name):
            # Without alpha, transformers' own file loader (`load_image`: exif_transpose, convert("RGB")) agrees.
            loaded = load_image(str(folder / name))
            theirs = image_features(
                reference_model, reference_processor([loaded], return_tensors="pt", max_soft_tokens=BUDGET)
            )
            assert rel_error(rows[name], theirs) < 1e-5, name

    # The foreign message is in the item's record, not on stderr.
    assert any("Tag data larger than file" in w for w in items["tag-overflow.tif"]["warnings"])
    assert "Tag data larger than file" not in stderr and summary["with_warnings"] >= 1


def test_non_utf8_metadata_video_and_audio(tmp_path, gemma4_dir, reference_model):
    from audio_helpers import reference_audio_rows
    from helpers import items_by_key, reference_video_rows
    from transformers import AutoFeatureExtractor, AutoVideoProcessor

    from gemma_embed.media.audio import decode_audio

    video, sound = TEST_MEDIA / "video" / "latin1-title.mp4", TEST_MEDIA / "audio" / "latin1-title.m4a"
    for path in (video, sound):  # the defect is real: PyAV's default strict decoding refuses the file
        with pytest.raises(UnicodeDecodeError):
            av.open(str(path)).close()

    out = tmp_path / "video.safetensors"
    code, _, err = run_images([video], gemma4_dir, out, modality="video")
    assert code == 0, err
    meta = items_by_key(out)[str(video)]
    assert meta["frames"] == 8
    processor = AutoVideoProcessor.from_pretrained(gemma4_dir)
    # transformers' own reader (read_video_pyav) refuses the file too: the reference reads a copy whose tag byte
    # is made ASCII again (same stream, same pixels).
    valid_copy = tmp_path / "valid-title.mp4"
    valid_copy.write_bytes(video.read_bytes().replace(b"Flower cami\xed", b"Flower camiX"))
    ref = reference_video_rows(reference_model, processor, valid_copy, meta)
    ours = gemma_embed.load(out)[str(video)]
    assert ours.shape == ref.shape and rel_error(ours, ref) < 1e-5

    out = tmp_path / "audio.safetensors"
    code, _, err = run_images([sound, video], gemma4_dir, out, modality="audio")  # the m4a and the soundtrack
    assert code == 0, err
    rows = gemma_embed.load(out)
    extractor = AutoFeatureExtractor.from_pretrained(gemma4_dir)
    for path in (sound, video):
        samples = decode_audio(str(path), extractor.sampling_rate).samples
        ref = reference_audio_rows(reference_model, extractor, samples, "gemma4")
        assert rows[str(path)].shape == ref.shape and rel_error(rows[str(path)], ref) < 1e-5, path


def test_one_pixel_video_frames_give_a_square_patch_grid(tmp_path, gemma4_dir, reference_model):
    from helpers import reference_video_rows
    from transformers import AutoVideoProcessor

    from gemma_embed.media.video import decode_video

    path = TEST_MEDIA / "video" / "one-pixel.mp4"
    processor = AutoVideoProcessor.from_pretrained(gemma4_dir)
    frames = decode_video(str(path)).frames
    assert frames.shape[1:] == (1, 1, 3)
    # Left to guess the layout, the processor reads (1, 1, 3) as channels-first: a 1x3 strip, a 7x10 grid.
    guessed = processor(videos=[frames], do_sample_frames=False, return_tensors="pt")["video_position_ids"][0]
    guessed = guessed[(guessed != -1).all(-1)]
    assert int(guessed[:, 0].max()) != int(guessed[:, 1].max())

    out = tmp_path / "pixel.safetensors"
    code, records, err = run_images([path], gemma4_dir, out, modality="video")
    assert code == 0 and records[0]["warnings"] == [], err  # no "channel dimension is ambiguous" any more
    (meta,) = gemma_embed.read_metadata(out)["items"]
    assert meta["resized_width"] == meta["resized_height"] and meta["rows_per_frame"] == 64  # 8x8 at 70 tokens
    ref = reference_video_rows(reference_model, _ChannelsLast(processor), path, meta)
    assert rel_error(gemma_embed.load(out)[str(path)], ref) < 1e-5


class _ChannelsLast:
    """The video processor told the frames' layout, as a caller who knows it must."""

    def __init__(self, processor):
        self.processor = processor

    def __call__(self, *args, **kwargs):
        return self.processor(*args, input_data_format="channels_last", **kwargs)


def test_a_run_that_finds_no_input_is_a_usage_error(tmp_path):
    from typer.testing import CliRunner

    from gemma_embed.cli import app

    videos = ROOT / "samples" / "media" / "video"
    # The model does not exist: the input is checked first, before any model is loaded.
    (tmp_path / "no-model").mkdir()  # a folder, but no checkpoint: loading it would fail, so it must not happen
    proc = gemma_embed_cmd("images", videos, "--model", tmp_path / "no-model", "-o", tmp_path / "o.safetensors")
    (line,) = proc.stderr.decode().splitlines()
    assert proc.returncode == 2
    assert line.startswith(f"error: no image files found in {videos}: looked for .apng .avif"), line
    assert "passed over 5 files (.mp4 x2, " in line
    assert line.endswith("; these are video files: gemma-embed video PATH...")  # the command that takes them
    assert not (tmp_path / "o.safetensors").exists()
    for command, stdin in ((["plan", videos], None), (["audio", "-", "-o", tmp_path / "o.safetensors"], "")):
        result = CliRunner().invoke(app, [*map(str, command), "--model", str(tmp_path / "no-model")], input=stdin)
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.splitlines()
        assert line.startswith("error: no "), line
