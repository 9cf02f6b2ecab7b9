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
    from gemma_embed.store import tensors_file

    def boom(*args, **kwargs):  # the disk fills up after the header is written
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tensors_file, "_raw_bytes", boom)
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
    with pytest.raises(ValueError, match=r"f\.safetensors: not a gemma-embed output \(a safetensors file without "):
        gemma_embed.load(tmp_path / "f.safetensors")
    save_file({"x": torch.zeros(1)}, tmp_path / "old.safetensors", metadata={"format": "gemma-embed/0"})
    with pytest.raises(
        ValueError, match=r"not a gemma-embed/1 file \(format='gemma-embed/0'\); embed the inputs again"
    ):
        gemma_embed.load(tmp_path / "old.safetensors")  # an older version's output: rebuilding it is the way


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
    from gemma_embed.store import writer as writer_module

    monkeypatch.setattr(writer_module, "HEADER_CAP", 300)
    writer = EmbeddingWriter(tmp_path / "o.safetensors", {"model": "m"})
    for i in range(6):
        writer.add(f"key-{i}", torch.ones(1, 2), {"path": "x" * 100})
    writer.close()
    assert len(store.output_files(tmp_path / "o.safetensors")) >= 2
    assert list(gemma_embed.load(tmp_path / "o.safetensors")) == [f"key-{i}" for i in range(6)]


def test_files_are_byte_identical_across_runs_and_honour_the_umask(tmp_path):
    import hashlib

    from safetensors.torch import load_file

    items = [(f"k{i}", torch.randn(i + 2, 8, generator=torch.Generator().manual_seed(i))) for i in range(5)]
    previous = os.umask(0o022)
    try:
        digests = set()
        for n in range(3):
            out = tmp_path / f"run{n}" / "o.safetensors"
            out.parent.mkdir()
            write(out, items, dtype="bfloat16")
            digests.add(hashlib.sha256(out.read_bytes()).hexdigest())
            assert out.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(previous)
    assert len(digests) == 1
    # The layout is safetensors' own: its loader reads every tensor back.
    tensors = load_file(out)
    assert tensors["offsets"].tolist() == [0, 2, 5, 9, 14, 20]
    assert torch.equal(tensors["embeddings"][2:5], items[1][1].to(torch.bfloat16))


def _writer(path, resume=False, prune=False):
    return EmbeddingWriter(path, {"model": "m", "modality": "images"}, resume=resume, prune=prune)


def _add(writer, key, seed, position):
    rows = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
    writer.add(key, rows, {"path": key, "sha256": f"content-{seed}"}, position)
    return rows


def test_resume_keeps_items_this_input_does_not_name(tmp_path):
    out = tmp_path / "o.safetensors"
    first = _writer(out)
    a = _add(first, "a.png", 1, 0)
    b = _add(first, "b.png", 2, 1)
    first.close()

    second = _writer(out, resume=True)
    c = _add(second, "c.png", 3, 0)
    second.close()
    assert (second.kept, second.pruned, second.items_written) == (2, 0, 3)
    loaded = gemma_embed.load(out)
    assert list(loaded) == ["a.png", "b.png", "c.png"]
    assert all(torch.equal(loaded[k], r) for k, r in [("a.png", a), ("b.png", b), ("c.png", c)])

    third = _writer(out, resume=True, prune=True)
    assert third.find_reusable("c.png", "content-3") == "c.png"
    third.reuse("c.png", 0, "c.png", {"path": "c.png", "sha256": "content-3"})
    third.close()
    assert (third.kept, third.pruned) == (0, 2)
    assert list(gemma_embed.load(out)) == ["c.png"]


def test_resume_reuses_the_same_content_under_another_key(tmp_path):
    out = tmp_path / "o.safetensors"
    first = _writer(out)
    a = _add(first, "a.png", 1, 0)
    first.close()

    second = _writer(out, resume=True)
    assert second.find_reusable("/abs/a.png", "content-1") == "a.png"  # same bytes, another key
    assert second.find_reusable("a.png", "content-9") is None  # same key, changed content
    second.reuse("/abs/a.png", 0, "a.png", {"path": "/abs/a.png", "sha256": "content-1", "mtime": 5.0})
    second.close()
    loaded = gemma_embed.load(out)
    assert list(loaded) == ["a.png", "/abs/a.png"] and torch.equal(loaded["/abs/a.png"], a)
    items = gemma_embed.read_metadata(out)["items"]
    assert items[1]["path"] == "/abs/a.png" and items[1]["mtime"] == 5.0 and items[1]["rows"] == 2
