"""gemma-embed export: parquet and .npy round-trip to what gemma_embed.load reads, in input order."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import torch

import gemma_embed
from gemma_embed.export import export
from gemma_embed.store import EmbeddingWriter


def _output(path, items, dtype="float32", shard_size=None):
    writer = EmbeddingWriter(path, {"model": "m", "modality": "images"}, dtype, shard_size=shard_size)
    for position, (key, rows, meta) in enumerate(items):
        writer.add(key, rows, meta, position)
    return writer.close()


def _items(count, rows_of=lambda i: 1):
    gen = torch.Generator().manual_seed(0)
    return [
        (
            f"img{i}.png",
            torch.randn(rows_of(i), 6, generator=gen),
            {"path": f"/data/img{i}.png", "width": 10 + i, "windows": [{"start_s": 0.0}], "tags": [i, i + 1]},
        )
        for i in range(count)
    ]


def test_pooled_output_to_parquet_round_trips(tmp_path):
    out = _output(tmp_path / "o.safetensors", _items(9), shard_size=4)  # three shards, read in order
    written = export(out, "parquet")
    table = pq.read_table(written["files"][0])
    loaded = gemma_embed.load(out)
    assert table.column("key").to_pylist() == list(loaded)
    assert str(table.schema.field("embedding").type) == "fixed_size_list<element: float>[6]"
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(vectors, torch.cat(list(loaded.values())).numpy())
    assert table.column("width").to_pylist() == list(range(10, 19))
    assert table.column("tags").to_pylist()[2] == [2, 3]
    assert table.column("windows").to_pylist()[0] == [{"start_s": 0.0}]  # a list of objects, natively


def test_a_field_of_mixed_types_becomes_json_text(tmp_path):
    items = [(f"k{i}", torch.ones(1, 2), {"path": "x", "extra": value}) for i, value in enumerate([1, "two", [3]])]
    table = pq.read_table(export(_output(tmp_path / "o.safetensors", items), "parquet")["files"][0])
    assert [json.loads(v) for v in table.column("extra").to_pylist()] == [1, "two", [3]]


def test_items_of_several_rows_keep_their_rows(tmp_path):
    items = _items(5, rows_of=lambda i: i + 1)
    out = _output(tmp_path / "o.safetensors", items, dtype="bfloat16")
    table = pq.read_table(export(out, "parquet")["files"][0])
    loaded = gemma_embed.load(out)
    for key, rows in zip(table.column("key").to_pylist(), table.column("embedding").to_pylist(), strict=True):
        np.testing.assert_array_equal(np.array(rows, dtype=np.float32), loaded[key].float().numpy())

    written = export(out, "npy")
    array, offsets = np.load(written["files"][0]), np.load(written["files"][2])
    assert array.dtype == np.float32 and offsets.tolist() == [0, 1, 3, 6, 10, 15]
    keys = (tmp_path / "o.keys.txt").read_text().splitlines()
    assert keys == list(loaded)
    for i, key in enumerate(keys):
        np.testing.assert_array_equal(array[offsets[i] : offsets[i + 1]], loaded[key].float().numpy())
