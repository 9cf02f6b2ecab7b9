"""`Embedder`: the engine from Python, in memory. Its rows are the command line's, bit for bit, on the same inputs
(the command line is the same stream: sources -> Embedder -> store), and a bad input is an ItemError in its slot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, run_images

import gemma_embed
from gemma_embed.embedder import Embedder
from gemma_embed.errors import ItemError

GEMMA4 = ROOT / "samples" / "tiny-gemma4"
EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
IMAGES = sorted((ROOT / "samples" / "media" / "images").iterdir())
AUDIO = ROOT / "samples" / "media" / "audio"


@pytest.fixture(scope="module")
def gemma4() -> Embedder:
    return Embedder(GEMMA4, device="cpu")


@pytest.fixture(scope="module")
def cli_rows(tmp_path_factory) -> dict:
    """The command line's rows for the sample images (run in-process as the CLI runs it)."""
    out = tmp_path_factory.mktemp("cli") / "images.safetensors"
    code, _, _ = run_images([str(p) for p in IMAGES], GEMMA4, out)
    assert code == 0
    return gemma_embed.load(out)


def test_embed_paths_equals_the_command_line_bit_for_bit(gemma4, cli_rows):
    rows = gemma4.embed([str(p) for p in IMAGES])
    assert len(rows) == len(IMAGES)
    for path, got in zip(IMAGES, rows, strict=True):
        assert torch.equal(got, cli_rows[str(path)]), path.name


def test_embed_pil_images_equals_the_command_line_bit_for_bit(gemma4, cli_rows):
    """PIL images as a caller opened them (not converted, not rotated): the Embedder turns them upright and to RGB
    exactly as it decodes the files."""
    from PIL import Image

    opened = [Image.open(p) for p in IMAGES]
    try:
        rows = gemma4.embed(opened)
    finally:
        for image in opened:
            image.close()
    for path, got in zip(IMAGES, rows, strict=True):
        assert torch.equal(got, cli_rows[str(path)]), path.name


def test_a_bad_input_is_an_item_error_in_its_slot(gemma4, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png at all")
    rows = gemma4.embed([str(IMAGES[0]), str(broken), str(IMAGES[1])])
    assert isinstance(rows[1], ItemError) and "not a recognised image format" in rows[1].message
    assert all(isinstance(r, torch.Tensor) for r in (rows[0], rows[2]))
    assert isinstance(gemma4.embed([12345])[0], ItemError)  # a type nothing decodes: also in its slot


def test_audio_samples_equal_the_file_they_came_from(gemma4):
    """(samples, rate) goes through the same downmix and resampler as the file's samples: the same rows."""
    import soundfile

    path = AUDIO / "stereo-44k.flac"
    samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    from_file, from_array, as_dict = gemma4.embed(
        [path, (samples.T, rate), {"array": samples.T, "sampling_rate": rate}]
    )
    assert torch.equal(from_file, from_array) and torch.equal(from_file, as_dict)


def test_encode_text_equals_the_text_command(tmp_path):
    lines = ["a photo of a cat", "the quick brown fox jumps over the lazy dog", "x"]
    source = tmp_path / "lines.txt"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "text.safetensors"
    code, _, _ = run_images([str(source)], EG2, out, modality="text")
    assert code == 0
    written = gemma_embed.load(out)
    vectors = Embedder(EG2, device="cpu").encode(lines)
    assert vectors.shape == (3, written[f"{source}:0"].shape[-1]) and vectors.dtype == np.float32
    for number, vector in enumerate(vectors):  # keys count the file's lines from 0
        assert np.array_equal(vector, written[f"{source}:{number}"][0].numpy())


def test_encode_pools_soft_tokens_and_keeps_the_order(gemma4):
    vectors = gemma4.encode([Path(p) for p in IMAGES[:3]])
    assert vectors.shape[0] == 3
    for path, vector in zip(IMAGES[:3], vectors, strict=True):
        (alone,) = gemma4.embed([str(path)])
        assert np.allclose(vector, alone.float().mean(dim=0).numpy(), rtol=0, atol=1e-6)


def test_one_vision_tower_serves_images_and_video(gemma4):
    assert gemma4.load("images").stages.chain[0].tower is gemma4.load("video").stages.chain[0].tower


def test_a_stop_mid_stream_closes_the_decode_stream_and_its_threads():
    """A stop signal raises between windows while the decode stream is suspended mid-window (with decodes waiting
    for room). The stream is closed there and then: its decode threads are gone while the exception (and its
    traceback, which holds the stream's frame) is still alive. Before, an interrupted run printed its summary and
    then hung at exit, joining decode threads that waited for room nothing would release."""
    import threading

    from gemma_embed.embedder import _source
    from gemma_embed.interrupts import Interrupted

    embedder = Embedder(GEMMA4, device="cpu", batch_size=1, workers=2)
    finished: list = []

    def stop_once_an_item_is_done():  # asked between windows and between chunks
        if finished:
            raise Interrupted(2)

    embedder.should_stop = stop_once_an_item_is_done

    class Collect:
        def reused(self, prepared):
            raise AssertionError(prepared.source.key)

        def failed(self, error, warnings=None):
            raise AssertionError(error)

        def done(self, prepared, rows):
            finished.append(prepared.source.key)

    sources = [_source(f"input{i}", str(p), "images", i) for i, p in enumerate(IMAGES * 3)]
    with pytest.raises(Interrupted) as caught:
        embedder.embed_stream(sources, "images", Collect(), window_items=2)
    assert 0 < len(finished) < len(sources)
    assert caught.value.__traceback__ is not None
    alive = [t.name for t in threading.enumerate() if t.name.startswith("decode")]
    assert alive == []


def test_encode_fills_its_first_window_where_the_command_line_starts_small(tmp_path, monkeypatch):
    """`encode` returns every vector at once, so its first decode window is as full as the later ones: texts of two
    lengths at --batch-size 4 make two full batches. The command line's first window is one batch (its first
    records leave early; Engine.enough_work), so the same texts make four half batches there. Same bytes both ways."""
    from gemma_embed.batching import padded_length
    from gemma_embed.engine import Engine

    short, long = "a cat", "the quick brown fox jumps over the lazy dog " * 3
    embedder = Embedder(EG2, device="cpu", batch_size=4)
    lengths = [embedder.load("text").stages.preparer.prepare(t).units[0].length for t in (short, long)]
    assert padded_length(lengths[0]) != padded_length(lengths[1])  # two rungs: they never share a batch
    lines = [short, long] * 4
    batches: list[int] = []
    encode = Engine._encode

    def counted(self, batch):
        batches.append(len(batch))
        return encode(self, batch)

    monkeypatch.setattr(Engine, "_encode", counted)
    vectors = embedder.encode(lines)
    assert batches == [4, 4]
    batches.clear()
    source = tmp_path / "lines.txt"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "text.safetensors"
    assert run_images([str(source)], EG2, out, modality="text", batch_size=4)[0] == 0
    assert batches == [2, 2, 2, 2]
    written = gemma_embed.load(out)
    for number, vector in enumerate(vectors):
        assert np.array_equal(vector, written[f"{source}:{number}"][0].numpy())
