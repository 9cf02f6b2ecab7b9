"""EmbeddingGemma 2 through the commands: every item's vector equals SentenceTransformer(ckpt).encode on the
same input, batched however the engine batched it; only the parts a run needs are read; search finds what it
should and refuses what it cannot answer."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch
from helpers import ROOT, record_batches, rel_error, run_images, spy_tensor_reads

import gemma_embed
from gemma_embed.models.embeddinggemma2 import EmbeddingGemma2TextTower

EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
MEDIA = ROOT / "samples" / "media"
LINES = [
    "a cat sleeps on a warm windowsill",
    "stock markets fell sharply on tuesday",
    "how do I bake sourdough bread",
    "the quick brown fox",
    "embeddings map text, images and audio into one space for search",
]


@pytest.fixture(scope="module")
def sentence_transformer():
    from sentence_transformers import SentenceTransformer

    models = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in models:
            models[key] = SentenceTransformer(str(EG2), device="cpu", **options)
        return models[key]

    return get


def _check(ours: dict, keys: list[str], reference: np.ndarray, width: int = 384) -> None:
    assert list(ours) == keys
    for key, expected in zip(keys, reference, strict=True):
        vector = ours[key]
        assert vector.shape == (1, width) and abs(float(vector.norm()) - 1) < 1e-5
        assert rel_error(vector[0], torch.from_numpy(np.asarray(expected))) < 1e-5, key


def _lines_file(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(LINES[:2]) + "\n\n" + "\n".join(LINES[2:]) + "\n")  # a blank line: no item
    return path


def _keys(path) -> list[str]:
    return [f"{path}:{n}" for n in (0, 1, 3, 4, 5)]  # lines count from 0, as a table's rows; the blank one is 2


@pytest.mark.parametrize("prompt_name", [None, "query"], ids=["no-prompt", "query-prompt"])
def test_text_lines_equal_sentence_transformers(tmp_path, monkeypatch, sentence_transformer, prompt_name):
    lines = _lines_file(tmp_path)
    batches = record_batches(monkeypatch, EmbeddingGemma2TextTower)
    out = tmp_path / "text.safetensors"
    code, records, err = run_images([lines], EG2, out, modality="text", prompt_name=prompt_name, batch_size=8)
    assert code == 0, err
    reference = sentence_transformer().encode(LINES, prompt_name=prompt_name)
    _check(gemma_embed.load(out), _keys(lines), reference)
    # The lines' sequences (different lengths) shared one ragged stage-2 batch.
    assert any(len(batch) > 1 and len({u.length for u in batch}) > 1 for batch in batches)
    meta = gemma_embed.read_metadata(out)
    assert (meta["space"], meta["dim"], meta["modality"]) == ("retrieval", "384", "text")
    assert [item["row"] for item in meta["items"]] == [0, 1, 3, 4, 5]
    assert [item["text"] for item in meta["items"]] == LINES  # stored: what a search shows for a hit


def test_dim_256_equals_truncate_dim_256(tmp_path, sentence_transformer):
    lines = _lines_file(tmp_path)
    out = tmp_path / "d256.safetensors"
    assert run_images([lines], EG2, out, modality="text", dim=256)[0] == 0
    # sentence-transformers truncates without renormalising unless asked to; gemma-embed renormalises.
    reference = sentence_transformer(truncate_dim=256).encode(LINES, normalize_embeddings=True)
    _check(gemma_embed.load(out), _keys(lines), reference, width=256)


def test_images_of_several_aspect_ratios_equal_sentence_transformers(tmp_path, monkeypatch, sentence_transformer):
    from transformers.image_utils import load_image

    batches = record_batches(monkeypatch, EmbeddingGemma2TextTower)
    out = tmp_path / "images.safetensors"
    folder = MEDIA / "images"
    code, _, err = run_images([folder], EG2, out, batch_size=8)
    assert code == 0, err
    keys = sorted(p.name for p in folder.iterdir())
    reference = sentence_transformer().encode([load_image(str(folder / k)) for k in keys])
    _check(gemma_embed.load(out), keys, reference)
    assert any(len(batch) > 1 and len({u.length for u in batch}) > 1 for batch in batches)


def test_videos_equal_sentence_transformers(tmp_path, sentence_transformer):
    from transformers.video_utils import read_video_pyav

    out = tmp_path / "videos.safetensors"
    videos = [MEDIA / "video" / name for name in ("clip-h264.mp4", "one-frame.avi", "short-vp9.webm")]
    code, _, err = run_images(videos, EG2, out, modality="video", batch_size=8)
    assert code == 0, err
    meta = gemma_embed.read_metadata(out)
    frames = []
    for item in meta["items"]:
        wanted = np.array(item["frame_indices"])
        frames.append(read_video_pyav(item["path"], sample_indices_fn=lambda **_: wanted)[0])  # noqa: B023
    assert len({len(f) for f in frames}) > 1  # 1 frame per second: clips of different lengths
    reference = sentence_transformer().encode([{"video": f} for f in frames])
    _check(gemma_embed.load(out), [str(v) for v in videos], reference)


def test_audio_clips_of_different_lengths_equal_sentence_transformers(tmp_path, sentence_transformer):
    from gemma_embed.media.audio import decode_audio

    out = tmp_path / "audio.safetensors"
    folder = MEDIA / "audio"
    code, _, err = run_images([folder], EG2, out, modality="audio", batch_size=8)
    assert code == 0, err
    keys = sorted(p.name for p in folder.iterdir())
    clips = [decode_audio(str(folder / k), sample_rate=16_000) for k in keys]
    assert len({len(c.samples) for c in clips}) > 2
    reference = sentence_transformer().encode([{"array": c.samples, "sampling_rate": 16_000} for c in clips])
    _check(gemma_embed.load(out), keys, reference)


# ------------------------------------------------------------------------------------------ loading


TOWERS = ("vision_tower.", "embed_vision.", "audio_tower.", "embed_audio.")


def test_a_text_run_reads_no_tower_tensor_and_an_image_run_no_audio_tensor(tmp_path, monkeypatch):
    read = spy_tensor_reads(monkeypatch)
    assert run_images([_lines_file(tmp_path)], EG2, tmp_path / "t.safetensors", modality="text")[0] == 0
    assert read and not any(key.startswith(TOWERS) for key in read)
    read.clear()
    assert run_images([MEDIA / "images" / "square.webp"], EG2, tmp_path / "i.safetensors")[0] == 0
    assert any(key.startswith("vision_tower.") for key in read)
    assert not any(key.startswith(("audio_tower.", "embed_audio.")) for key in read)


# ------------------------------------------------------------------------------------------ search


def _cli(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The command in this process (CliRunner): the search tests make and query 10 indexes, and a fresh process
    costs ~4 s of imports each. The installed command's own process is tested in test_cli.py."""
    from typer.testing import CliRunner

    from gemma_embed.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args], input=stdin)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def test_search_finds_the_item_a_query_repeats_in_every_form(tmp_path):
    index = tmp_path / "lines.safetensors"
    made = _cli("text", "-", "--model", EG2, "-o", index, "--prompt-name", "query", "-q", stdin="\n".join(LINES))
    assert made.returncode == 0, made.stderr
    table = _cli("search", index, LINES[2], "--html", tmp_path / "hits.html")
    assert table.returncode == 0, table.stderr
    scoring, header, first = table.stdout.splitlines()[:3]
    assert scoring.startswith("queries and items embedded with the query prompt") and "cosine similarity" in scoring
    assert header.split() == ["rank", "score", "key", "path", "text"]  # stdin's path (-) starts no key: shown
    assert first.split()[:3] == ["1", "1.0000", "stdin:2"]  # the same text, embedded the same way

    records = [json.loads(line) for line in _cli("search", index, LINES[0], "--jsonl", "-k", "3").stdout.splitlines()]
    assert [r["rank"] for r in records] == [1, 2, 3] and records[0]["key"] == "stdin:0"
    assert records[0]["score"] > 0.9999 and records[1]["score"] < records[0]["score"]

    page = (tmp_path / "hits.html").read_text()
    assert page.startswith("<!doctype html>") and "stdin:2" in page and LINES[2] in page


def test_search_refuses_what_it_cannot_answer_in_one_line(tmp_path):
    index = tmp_path / "images.safetensors"
    assert _cli("images", MEDIA / "images", "--model", EG2, "-o", index, "-q").returncode == 0
    other = _cli("search", index, "a tall building", "--model", ROOT / "samples" / "tiny-gemma4")
    assert other.returncode == 2
    assert other.stderr.splitlines() == [
        f"error: {index}: made with model={EG2}, the query has model={ROOT / 'samples' / 'tiny-gemma4'}; "
        f"embed the query with the index's settings"
    ]
    soft_tokens = tmp_path / "g4.safetensors"
    assert (
        _cli("images", MEDIA / "images", "--model", ROOT / "samples" / "tiny-gemma4", "-o", soft_tokens).returncode == 0
    )
    text_query = _cli("search", soft_tokens, "a tall building")
    assert text_query.returncode == 2 and len(text_query.stderr.splitlines()) == 1
    assert "search it with --image, --audio or --video" in text_query.stderr
    # A media query against a soft-token index works: the image's own mean row finds it first.
    found = _cli("search", soft_tokens, "--image", MEDIA / "images" / "tall.png", "--jsonl", "-k", "1")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["key"] == "tall.png"
