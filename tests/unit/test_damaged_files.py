"""Tampered files where an output, a part or an index should be: one line naming the file and the fix, never a
traceback, whether --resume or a reader (load, inspect, export, search) meets them (issue 20)."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import pytest
import torch
from store_helpers import CASES, HEADER, NOT_OURS, REBUILD, RESUME_FIX, write_output, write_part

import gemma_embed
from gemma_embed.errors import UsageError
from gemma_embed.store import EmbeddingWriter, check_output_path, output_index


def expected(file: Path, kind: str, reason: str, fix: str) -> str:
    return rf"^{re.escape(f'{file}: not a {kind} (')}[^\n]*{re.escape(reason)}[^\n]*\); {re.escape(fix)}$"


def not_ours(file: Path, reason: str) -> str:
    return rf"^{re.escape(f'{file}: not a gemma-embed output (')}[^\n]*{re.escape(reason)}[^\n]*\)$"


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_part_stops_resume_with_one_line(tmp_path, case):
    out = tmp_path / "out.safetensors"
    good = write_part(out)
    damaged = good.with_name("part-000050.safetensors")
    damaged.write_bytes(good.read_bytes())
    damage, reason = CASES[case]
    damage(damaged)
    pattern = expected(damaged, "part file", reason, RESUME_FIX)
    with pytest.raises(UsageError, match=pattern):
        check_output_path(out, overwrite=False, resume=True)  # before a model loads
    with pytest.raises(UsageError, match=pattern):
        EmbeddingWriter(out, HEADER, resume=True)
    writer = EmbeddingWriter(out, HEADER)  # the fix works: --overwrite starts over
    assert not writer.parts.exists()


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_output_stops_resume_and_readers_with_one_line(tmp_path, case):
    out = write_output(tmp_path / "out.safetensors")
    damage, reason = CASES[case]
    damage(out)
    kind = "gemma-embed output" if case in NOT_OURS else "gemma-embed/1 file"
    resume_says = expected(out, kind, reason, RESUME_FIX)
    if case == "a directory":  # the run's own check, before anything is read
        resume_says = f"^{re.escape(str(out))}: output path is a folder$"
    with pytest.raises(UsageError, match=resume_says):
        check_output_path(out, overwrite=False, resume=True)
    # A reader advises a rebuild only where there is a gemma-embed output to rebuild.
    readers_say = expected(out, kind, reason, REBUILD) if case not in NOT_OURS else not_ours(out, reason)
    for read in (gemma_embed.load, gemma_embed.read_metadata):
        with pytest.raises(UsageError, match=readers_say):
            read(out)
    with pytest.raises(UsageError, match=readers_say):
        files = output_index(out)  # search's reader: keys and items are decoded when a hit needs them
        [(file.keys, file.items) for file in files]


def test_a_damaged_index_or_shard_list_is_one_line(tmp_path):
    out = tmp_path / "out.safetensors"
    writer = EmbeddingWriter(out, HEADER, shard_size=2)
    for i in range(5):
        writer.add(f"k{i}", torch.ones(1, 4), {"path": f"k{i}"}, i)
    index = writer.close()
    original = index.read_text()

    index.write_text(original[:-3])
    with pytest.raises(UsageError, match=rf"^{re.escape(str(index))}: not a gemma-embed/1 index \(not valid JSON"):
        gemma_embed.load(out)
    with pytest.raises(UsageError, match=rf"index \(not valid JSON.*\); {RESUME_FIX}$"):
        check_output_path(out, overwrite=False, resume=True)

    content = json.loads(original)
    index.write_text(json.dumps({**content, "keys": {**content["keys"], "k9": 0}}))
    with pytest.raises(UsageError, match="not a gemma-embed/1 index .*keys are not those of its files"):
        gemma_embed.load(out)

    index.write_text(json.dumps({**content, "keys": {"k0": 7}}))
    with pytest.raises(UsageError, match="keys is not a map of key to file number"):
        gemma_embed.load(out)


def test_part_names_and_a_parts_file_are_checked(tmp_path):
    out = tmp_path / "out.safetensors"
    part = write_part(out)
    odd = part.with_name("part-x.safetensors")
    odd.write_bytes(part.read_bytes())
    with pytest.raises(UsageError, match=r"part-x.safetensors: not a part file \(a name other than part-NNNNNN"):
        EmbeddingWriter(out, HEADER, resume=True)
    parts = part.parent
    for file in parts.iterdir():
        file.unlink()
    parts.rmdir()
    parts.write_text("not a folder")
    with pytest.raises(UsageError, match=r"out.safetensors.parts: not a parts folder \(is a file\)"):
        EmbeddingWriter(out, HEADER, resume=True)
    EmbeddingWriter(out, HEADER).add("a", torch.ones(1, 2), {}, 0)  # --overwrite replaces the file
    assert not parts.exists()


def test_a_damaged_slice_manifest_is_one_line(tmp_path):
    from gemma_embed.store import manifest_path, merge_slices, slice_path, write_manifest

    out = tmp_path / "out.safetensors"
    for index in range(2):
        write_output(slice_path(out, index, 2), count=2)
        write_manifest(slice_path(out, index, 2), {"k0": index, "k1": 2 + index})
    manifest = manifest_path(slice_path(out, 1, 2))
    manifest.write_text("{")
    with pytest.raises(UsageError, match=r"positions.json: not a positions manifest \(not valid JSON.*\); run that"):
        merge_slices(out, 2)
    manifest.write_text(json.dumps({"k0": 1}))
    with pytest.raises(UsageError, match=r"positions manifest \(no position for 'k1'"):
        merge_slices(out, 2)


def test_parts_carry_row_checksums_that_resume_checks(tmp_path):
    from gemma_embed.store.tensors_file import row_checksum

    out = tmp_path / "out.safetensors"
    writer = EmbeddingWriter(out, HEADER, "bfloat16")
    rows = {key: torch.randn(3, 4, generator=torch.Generator().manual_seed(i)) for i, key in enumerate("abc")}
    for i, (key, value) in enumerate(rows.items()):
        writer.add(key, value, {"path": key, "sha256": f"c{key}"}, i)
    writer.flush()
    (part,) = writer.parts.glob("part-*.safetensors")
    stored = gemma_embed.load(part)
    assert json.loads(gemma_embed.read_metadata(part)["rows_crc32"]) == [row_checksum(stored[k]) for k in "abc"]
    assert row_checksum(stored["b"]) == f"{zlib.crc32(stored['b'].view(torch.uint8).numpy().tobytes()):08x}"

    data = bytearray(part.read_bytes())
    data[-(8 * 4) - 3 * 4 * 2 + 1] ^= 0x01  # a bit of item "c"'s rows (bf16: 2 bytes each), before the offsets
    part.write_bytes(bytes(data))
    warnings = []
    resumed = EmbeddingWriter(out, HEADER, "bfloat16", resume=True, warn=warnings.append)
    assert resumed.find_reusable("a", "ca") == "a" and resumed.find_reusable("b", "cb") == "b"
    assert resumed.find_reusable("c", "cc") is None  # computed again
    assert warnings == [
        f"{part}: the rows of 1 of its 3 items do not match their checksum (changed on disk); they are computed again"
    ]
