from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file as load_numpy

import gemma_embed
from gemma_embed.errors import UsageError
from gemma_embed.store import EmbeddingWriter, check_output_path


def write(path, items, dtype="float32"):
    writer = EmbeddingWriter(path, {"model": "m", "modality": "images"}, dtype)
    for key, rows in items:
        writer.add(key, rows, {"path": key})
    return writer.close()


def test_round_trip_in_input_order(tmp_path):
    items = [("z.jpg", torch.randn(3, 4)), ("a.jpg", torch.randn(1, 4)), ("m/ü.png", torch.randn(5, 4))]
    out = write(tmp_path / "o.safetensors", items)
    loaded = gemma_embed.load(out)
    assert list(loaded) == ["z.jpg", "a.jpg", "m/ü.png"]
    for key, rows in items:
        assert torch.equal(loaded[key], rows)
    meta = gemma_embed.read_metadata(out)
    assert [i["rows"] for i in meta["items"]] == [3, 1, 5]
    # A plain safetensors user (numpy) can read it with the two tensors and the JSON metadata.
    plain = load_numpy(out)
    assert plain["offsets"].tolist() == [0, 3, 4, 9] and plain["embeddings"].shape == (9, 4)
    np.testing.assert_array_equal(plain["embeddings"][4:9], items[2][1].numpy())


def test_no_temp_files_left_and_empty_output(tmp_path):
    out = write(tmp_path / "empty.safetensors", [])
    assert gemma_embed.load(out) == {}
    assert sorted(os.listdir(tmp_path)) == ["empty.safetensors"]


def test_failed_write_leaves_no_final_file(tmp_path, monkeypatch):
    import safetensors.torch

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError):
        write(tmp_path / "o.safetensors", [("a", torch.ones(1, 2))])
    assert os.listdir(tmp_path) == []


def test_check_output_path(tmp_path):
    existing = tmp_path / "x.safetensors"
    existing.write_bytes(b"1")
    with pytest.raises(UsageError, match="--overwrite"):
        check_output_path(existing, overwrite=False)
    check_output_path(existing, overwrite=True)
    with pytest.raises(UsageError, match="does not exist"):
        check_output_path(tmp_path / "nope" / "x.safetensors", overwrite=False)
    with pytest.raises(UsageError, match="folder"):
        check_output_path(tmp_path, overwrite=True)


def test_reader_rejects_foreign_files(tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, tmp_path / "f.safetensors")
    with pytest.raises(ValueError, match="gemma-embed/1"):
        gemma_embed.load(tmp_path / "f.safetensors")


def test_keys_with_special_characters_are_data(tmp_path):
    keys = ["../../etc/passwd", "a\nb", '{"json": 1}']
    out = write(tmp_path / "o.safetensors", [(k, torch.ones(1, 2)) for k in keys])
    assert list(gemma_embed.load(out)) == keys
    assert gemma_embed.read_metadata(out)["items"][0]["path"] == "../../etc/passwd"
    assert sorted(os.listdir(tmp_path)) == ["o.safetensors"]


def test_plan_shards():
    from gemma_embed.store import plan_shards

    assert plan_shards([10] * 5, None) == [range(0, 5)]
    assert plan_shards([10] * 5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert plan_shards([10] * 5, None, header_cap=25) == [range(0, 2), range(2, 4), range(4, 5)]
    assert plan_shards([100, 1, 1], None, header_cap=50) == [range(0, 1), range(1, 3)]  # an oversized item alone
    assert plan_shards([], 3) == [range(0, 0)]


def test_sharded_output_reads_like_one_file(tmp_path):
    from gemma_embed.store import index_path

    items = [(f"k{i}", torch.full((i + 1, 3), float(i))) for i in range(7)]
    writer = EmbeddingWriter(tmp_path / "o.safetensors", {"model": "m"}, shard_size=3)
    for key, rows in items:
        writer.add(key, rows, {"path": key})
    out = writer.close()
    assert out == index_path(tmp_path / "o.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "o-00000.safetensors",
        "o-00001.safetensors",
        "o-00002.safetensors",
        "o.index.json",
    ]
    for path in (tmp_path / "o.safetensors", out):  # either name opens the sharded output
        loaded = gemma_embed.load(path)
        assert list(loaded) == [k for k, _ in items]
        assert all(torch.equal(loaded[k], r) for k, r in items)
        assert len(gemma_embed.read_metadata(path)["items"]) == 7


def test_header_cap_forces_shards(tmp_path, monkeypatch):
    from gemma_embed import store

    monkeypatch.setattr(store, "HEADER_CAP", 300)
    writer = EmbeddingWriter(tmp_path / "o.safetensors", {"model": "m"})
    for i in range(6):
        writer.add(f"key-{i}", torch.ones(1, 2), {"path": "x" * 100})
    writer.close()
    assert len(store.output_files(tmp_path / "o.safetensors")) >= 2
    assert list(gemma_embed.load(tmp_path / "o.safetensors")) == [f"key-{i}" for i in range(6)]
