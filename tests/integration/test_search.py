"""Search: exact cosine top-k over an output read in blocks (single file or shards), its three renderings, and the
refusal of a query made with other settings."""

from __future__ import annotations

import base64
import io
import json
import re

import pytest
import soundfile
import torch
from helpers import ROOT

import gemma_embed
from gemma_embed import store
from gemma_embed.engine import Engine, encode_chain_list
from gemma_embed.errors import UsageError
from gemma_embed.media.audio import decode_audio
from gemma_embed.media.image import decode_image
from gemma_embed.media.video import FramePolicy, decode_video
from gemma_embed.models.embeddinggemma2 import EmbeddingGemma2Preparer, EmbeddingGemma2TextTower, stage2_item
from gemma_embed.models.gemma4 import Gemma4VisionTower
from gemma_embed.models.loading import resolve_checkpoint
from gemma_embed.models.st_inputs import read_sentence_transformers
from gemma_embed.search import check_query_settings, render_html, render_jsonl, render_table, search
from gemma_embed.store import EmbeddingWriter, read_metadata

SAMPLE = ROOT / "samples" / "tiny-embeddinggemma2"
MEDIA = ROOT / "samples" / "media"
HEADER = {"model": str(SAMPLE), "revision": "", "space": "retrieval", "dim": "384", "pooling": "mean"}


def write_index(path, entries, header=HEADER, shard_size=None):
    writer = EmbeddingWriter(path, {**header, "modality": header.get("modality", "images")}, shard_size=shard_size)
    for position, (key, rows, meta) in enumerate(entries):
        writer.add(key, rows, meta, position)
    return writer.close()


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory):
    """The sample images embedded with the sample EmbeddingGemma 2 checkpoint, written in our format."""
    checkpoint = resolve_checkpoint(str(SAMPLE))
    setup = read_sentence_transformers(checkpoint)
    stage1 = Engine(Gemma4VisionTower(checkpoint, "cpu", torch.float32), "language", batch_cap=8)
    stage2 = Engine(EmbeddingGemma2TextTower(checkpoint, "cpu", torch.float32, setup), "retrieval", batch_cap=8)
    preparer = EmbeddingGemma2Preparer(checkpoint, "image", setup)
    paths = sorted((MEDIA / "images").iterdir())
    items = [preparer.prepare(decode_image(str(p))) for p in paths]
    vectors = encode_chain_list([stage1, stage2], [None, stage2_item], items, [str(p) for p in paths])
    entries = [(p.name, v, {"path": str(p)}) for p, v in zip(paths, vectors, strict=True)]
    out = write_index(tmp_path_factory.mktemp("index") / "images.safetensors", entries)
    return out, {"stage1": stage1, "stage2": stage2, "preparer": preparer, "paths": paths}


def test_an_items_own_vector_finds_it_first(sample_index):
    index, _ = sample_index
    for key, vector in gemma_embed.load(index).items():
        hits = search(index, vector[0], k=3)
        assert hits[0].key == key and hits[0].rank == 1
        assert abs(hits[0].score - 1.0) < 1e-5
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_a_query_embedded_again_through_the_model_finds_its_item_first(sample_index):
    index, parts = sample_index
    target = parts["paths"][2]
    item = parts["preparer"].prepare(decode_image(str(target)))
    (query,) = encode_chain_list([parts["stage1"], parts["stage2"]], [None, stage2_item], [item], ["query"])
    check_query_settings(read_metadata(index), dict(HEADER), str(index))  # same settings: accepted
    hits = search(index, query[0], k=len(parts["paths"]))
    assert hits[0].key == target.name and hits[0].path == str(target)
    assert len({h.key for h in hits}) == len(parts["paths"])


def brute_force(index, query, k):
    """Per item: its best row's cosine; top k (key, score)."""
    q = query / query.norm()
    scored = []
    for key, rows in gemma_embed.load(index).items():
        rows = rows.float()
        scored.append((key, float((rows @ q / rows.norm(dim=1)).max())))
    return sorted(scored, key=lambda e: -e[1])[:k]


@pytest.mark.parametrize("shard_size", [None, 3])
@pytest.mark.parametrize("block_rows", [1, 4, 7, 10_000])
def test_blocked_search_equals_brute_force_over_multi_row_items(tmp_path, shard_size, block_rows):
    generator = torch.Generator().manual_seed(0)
    entries = [
        (f"item{i:02d}", torch.randn(1 + (i * 7) % 5, 16, generator=generator) * (1 + i % 3), {"path": f"/x/{i}"})
        for i in range(23)
    ]
    index = write_index(tmp_path / "multi.safetensors", entries, {**HEADER, "pooling": "none"}, shard_size)
    if shard_size:
        assert index.suffix == ".json"
    for seed in range(5):
        query = torch.randn(16, generator=torch.Generator().manual_seed(100 + seed))
        hits = search(index, query, k=6, block_rows=block_rows)
        expected = brute_force(index, query, 6)
        assert [h.key for h in hits] == [key for key, _ in expected]
        assert all(abs(h.score - s) < 1e-5 for h, (_, s) in zip(hits, expected, strict=True))


@pytest.fixture
def frame_index(tmp_path):
    """A --pool frame video index: one row per sampled frame, with the frames' timestamps."""
    generator = torch.Generator().manual_seed(1)
    videos = {"clip-h264.mp4": 5, "short-vp9.webm": 3}
    entries = []
    for name, frames in videos.items():
        decoded = decode_video(str(MEDIA / "video" / name), FramePolicy(num_frames=frames))
        meta = {
            "path": str(MEDIA / "video" / name),
            "frame_indices": decoded.frame_indices,
            "timestamps": decoded.timestamps,
            "frames": frames,
            "rows_per_frame": 1,
        }
        entries.append((name, torch.randn(frames, 8, generator=generator), meta))
    header = {**HEADER, "pooling": "frame", "modality": "video", "dim": "8"}
    return write_index(tmp_path / "frames.safetensors", entries, header), entries


def test_frame_pooled_video_hits_name_their_best_frames_time(frame_index):
    index, entries = frame_index
    name, rows, meta = entries[0]
    hits = search(index, rows[3], k=2)
    assert [h.key for h in hits] == [name, entries[1][0]]  # one hit per video, not per frame
    assert hits[0].row == 3 and hits[0].frame == 3
    assert hits[0].timestamp == pytest.approx(meta["timestamps"][3]) and hits[0].timestamp > 0
    assert "time_s" in render_table(hits)
    assert f"{meta['timestamps'][3]:.2f}" in render_table(hits)


def test_table_and_json_lines(sample_index):
    index, _ = sample_index
    vector = gemma_embed.load(index)["square.webp"][0]
    hits = search(index, vector, k=3)
    table = render_table(hits).splitlines()
    assert table[0].split() == ["rank", "score", "key", "path"]
    assert table[1].split()[:3] == ["1", "1.0000", "square.webp"] and len(table) == 4
    records = [json.loads(line) for line in render_jsonl(hits).splitlines()]
    assert [r["rank"] for r in records] == [1, 2, 3]
    assert records[0]["key"] == "square.webp" and records[0]["path"].endswith("square.webp")
    assert set(records[0]) == {"rank", "score", "key", "path", "row", "frame", "timestamp"}


def test_html_page_embeds_thumbnails_and_audio_players(tmp_path, sample_index, frame_index):
    index, _ = sample_index
    hits = search(index, gemma_embed.load(index)["landscape.jpg"][0], k=2)
    page = render_html(hits, "a landscape", "images", str(index))
    assert page.count('src="data:image/jpeg;base64,') == 2 and "a landscape" in page
    assert "http" not in page  # self-contained: nothing to fetch

    video_index, entries = frame_index
    page = render_html(search(video_index, entries[1][1][0], k=2), "video", "video")
    assert page.count('src="data:image/jpeg;base64,') == 2

    clips = ["chirp-16k.wav", "stereo-48k.m4a"]
    audio_entries = [
        (name, torch.randn(1, 4), {"path": str(MEDIA / "audio" / name), "duration_s": 1.0}) for name in clips
    ]
    audio_entries.append(("gone.wav", torch.randn(1, 4), {"path": str(tmp_path / "gone.wav")}))
    audio_index = write_index(tmp_path / "audio.safetensors", audio_entries, {**HEADER, "modality": "audio"})
    page = render_html(search(audio_index, torch.ones(4), k=3), "sound", "audio")
    assert page.count('<audio controls src="data:audio/wav;base64,') == 2
    assert "(unavailable:" in page  # a missing file is named on the page, not fatal
    # Each player holds the clip itself: 16 kHz mono WAV of the decoded samples.
    lengths = []
    for payload in re.findall(r'data:audio/wav;base64,([^"]+)"', page):
        samples, rate = soundfile.read(io.BytesIO(base64.b64decode(payload)))
        assert rate == 16_000
        lengths.append(len(samples))
    assert sorted(lengths) == sorted(len(decode_audio(str(MEDIA / "audio" / n), 16_000).samples) for n in clips)


def test_a_query_with_other_settings_is_refused_in_one_line(sample_index, tmp_path):
    index, _ = sample_index
    header = read_metadata(index)
    with pytest.raises(UsageError) as caught:
        check_query_settings(header, {**HEADER, "model": "google/embeddinggemma-2"}, str(index))
    message = str(caught.value)
    assert "\n" not in message and "model=" in message and "google/embeddinggemma-2" in message
    with pytest.raises(UsageError, match="dim=384.*dim=256"):
        check_query_settings(header, {**HEADER, "dim": "256"}, str(index))
    # The same folder spelled differently is the same model.
    check_query_settings(header, {**HEADER, "model": str(SAMPLE) + "/../tiny-embeddinggemma2/"}, str(index))


def test_a_query_of_another_width_is_refused(sample_index):
    index, _ = sample_index
    with pytest.raises(UsageError, match="384 dimensions, the query 256"):
        search(index, torch.ones(256))
    with pytest.raises(UsageError, match="zero"):
        search(index, torch.zeros(384))


def test_search_reads_blocks_not_the_whole_file(sample_index, monkeypatch):
    index, _ = sample_index
    sizes = []
    real = store.iter_row_blocks

    def spy(path, rows, files=None):
        for block in real(path, rows, files):
            sizes.append(block.rows.shape[0])
            yield block

    monkeypatch.setattr(store, "iter_row_blocks", spy)
    search(index, torch.ones(384), k=2, block_rows=2)
    assert max(sizes) == 2 and sum(sizes) == len(gemma_embed.load(index))
