"""A real run over files whose names are not UTF-8 or hold a newline: export gives back names that open the
very files (parquet's key_bytes, keys.txt through read_keys) (issue 20)."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
from helpers import SAMPLE_MODEL, run_images, write_image

import gemma_embed
from gemma_embed.export import export, read_keys


def test_names_that_are_not_utf8_or_hold_a_newline_survive_export(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    names = [b"caf\xe9.png", b"two\nlines.png", b"plain.png"]
    for seed, name in enumerate(names):
        write_image(folder / os.fsdecode(name), 40, 30, seed)
    out = tmp_path / "out.safetensors"
    code, _, err = run_images([folder], SAMPLE_MODEL, out, max_soft_tokens=70, pool="mean")
    assert code == 0, err
    keys = list(gemma_embed.load(out))
    assert sorted(os.fsencode(k) for k in keys) == sorted(names)

    table = pq.read_table(export(out, "parquet")["files"][0])
    from_parquet = [
        os.fsdecode(raw) if raw is not None else key
        for key, raw in zip(table.column("key").to_pylist(), table.column("key_bytes").to_pylist(), strict=True)
    ]
    assert from_parquet == keys
    assert all((folder / name).is_file() for name in from_parquet)  # the bytes are the file system's own
    (row,) = [r for r in table.to_pylist() if r["key_bytes"] is not None]
    assert row["key_bytes"] == b"caf\xe9.png" and row["key"] == "caf\\xe9.png"
    assert row["path_bytes"] == os.fsencode(str(folder / os.fsdecode(b"caf\xe9.png")))

    export(out, "npy")
    assert read_keys(tmp_path / "out.keys.txt") == keys
    assert (tmp_path / "out.keys.txt").read_bytes().count(b"\n") == 3
