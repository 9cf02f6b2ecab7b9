"""Text from tables: a parquet file (two row groups), JSON lines (plain and gzipped) and a saved Hugging Face dataset
give the same vectors as the same texts one per line of a text file, keyed by --key-column, other columns kept by
--keep-columns; null and blank cells are passed over as blank lines are, named in a note, never silently."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import ROOT, items_by_key, rel_error, run_images

import gemma_embed

EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
TEXTS = [
    "a cat sleeps on a warm windowsill",
    "stock markets fell sharply on tuesday after the report",
    "how do I bake sourdough bread",
    "the quick brown fox",
    "embeddings map text, images and audio into one space for search",
    "red car",
]
IDS = [f"doc-{i}" for i in range(len(TEXTS))]
LABELS = [10 * i for i in range(len(TEXTS))]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The texts one per line of a text file, embedded: each text's vector."""
    root = tmp_path_factory.mktemp("text-tables")
    lines = root / "lines.txt"
    lines.write_text("".join(f"{t}\n" for t in TEXTS))
    out = root / "lines.safetensors"
    code, _, err = run_images([lines], EG2, out, modality="text")
    assert code == 0, err
    vectors = gemma_embed.load(out)
    return {"root": root, "vectors": [vectors[f"{lines}:{n}"] for n in range(len(TEXTS))]}


def _assert_same_vectors(out, keys: list[str], reference: dict) -> None:
    ours = gemma_embed.load(out)
    assert list(ours) == keys
    for key, expected in zip(keys, reference["vectors"], strict=True):
        assert rel_error(ours[key], expected) < 1e-6, key


def test_parquet_rows_in_two_row_groups_give_the_vectors_of_the_same_lines(reference):
    path = reference["root"] / "texts.parquet"
    pq.write_table(pa.table({"text": TEXTS, "id": IDS, "label": LABELS}), path, row_group_size=3)
    assert pq.ParquetFile(path).num_row_groups == 2
    out = reference["root"] / "parquet.safetensors"
    code, _, err = run_images([path], EG2, out, modality="text", column="text", key_column="id", keep_columns="label")
    assert code == 0, err
    _assert_same_vectors(out, IDS, reference)
    items = items_by_key(out)
    assert [(items[k]["row"], items[k]["label"]) for k in IDS] == list(enumerate(LABELS))
    # Without --key-column: FILE:ROW, rows from 0 over the whole file.
    code, _, err = run_images([path], EG2, out, modality="text", column="text")
    assert code == 0, err
    _assert_same_vectors(out, [f"{path}:{row}" for row in range(len(TEXTS))], reference)


@pytest.mark.parametrize("name", ["texts.jsonl", "texts.jsonl.gz"])
def test_json_lines_give_the_vectors_of_the_same_lines(reference, name):
    path = reference["root"] / name
    records = "".join(
        json.dumps({"id": i, "body": t, "label": n, "extra": {"nested": True}}) + "\n\n"  # a blank line: no record
        for i, t, n in zip(IDS, TEXTS, LABELS, strict=True)
    )
    path.write_bytes(gzip.compress(records.encode()) if name.endswith(".gz") else records.encode())
    out = reference["root"] / f"{name}.safetensors"
    code, _, err = run_images([path], EG2, out, modality="text", column="body", key_column="id", keep_columns="label")
    assert code == 0, err
    _assert_same_vectors(out, IDS, reference)
    assert [items_by_key(out)[k]["label"] for k in IDS] == LABELS


def test_a_saved_dataset_split_gives_the_vectors_of_the_same_lines(reference):
    datasets = pytest.importorskip("datasets")  # the [datasets] extra; installed with [test]
    folder = reference["root"] / "saved"
    rows = datasets.Dataset.from_dict({"text": TEXTS, "id": IDS, "label": LABELS})
    datasets.DatasetDict({"train": rows.select(range(2)), "test": rows}).save_to_disk(str(folder))
    out = reference["root"] / "dataset.safetensors"
    code, _, err = run_images(
        [], EG2, out, modality="text", dataset=str(folder), split="test", column="text", keep_columns="id,label"
    )
    assert code == 0, err
    keys = [f"{folder}:test:{row}" for row in range(len(TEXTS))]
    _assert_same_vectors(out, keys, reference)
    items = items_by_key(out)
    assert [(items[k]["id"], items[k]["label"]) for k in keys] == list(zip(IDS, LABELS, strict=True))


def test_null_and_blank_cells_are_passed_over_by_name_and_the_other_rows_are_written(reference):
    path = reference["root"] / "holes.parquet"
    texts = [TEXTS[0], None, "   ", TEXTS[3]]
    pq.write_table(pa.table({"text": pa.array(texts, pa.string()), "id": IDS[:4]}), path)
    out = reference["root"] / "holes.safetensors"
    code, records, err = run_images([path], EG2, out, modality="text", column="text", key_column="id")
    assert code == 0, err  # as blank lines of a text file: nothing to embed, no failure
    skipped = {r["key"]: r for r in records if r.get("status") == "skipped"}
    assert set(skipped) == {"doc-1", "doc-2"}, records
    assert {r["error"] for r in skipped.values()} == {"blank"}
    assert skipped["doc-1"]["message"] == f"row 1 of {path} has no text (column 'text' is null)"
    assert skipped["doc-2"]["message"] == f"row 2 of {path}: its text is blank"
    notes = [line for line in err.splitlines() if line.startswith("note: passed over")]
    assert notes == [
        f"note: passed over 2 blank texts (nothing to embed): doc-1 ({skipped['doc-1']['message']}), "
        f"doc-2 ({skipped['doc-2']['message']})"
    ]
    assert "error:" not in err
    assert list(gemma_embed.load(out)) == ["doc-0", "doc-3"]


def test_a_table_without_its_column_is_one_usage_error_before_the_model_loads(reference, tmp_path):
    path = tmp_path / "texts.parquet"
    pq.write_table(pa.table({"body": TEXTS}), path)
    from gemma_embed.errors import UsageError

    with pytest.raises(UsageError, match=r"give --column NAME, the column of texts \(its columns: body\)"):
        run_images([path], tmp_path / "no-model-needed", tmp_path / "o.safetensors", modality="text")
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(UsageError, match=r"no column 'text' \(its columns: body\)"):
        run_images([jsonl], tmp_path / "no-model", tmp_path / "o.safetensors", modality="text", column="text")


@pytest.mark.slow
def test_peak_rss_is_flat_from_1_to_10_row_groups_of_text(tmp_path):
    """The same row group (50 cells of 100 kB of text) once and ten times: `text` reads a record batch at a time,
    so the command's peak RSS must not grow with the file (read whole as Python strings, 10 row groups add 50 MB;
    measured +68 MiB against +2 MiB). The checkpoint cuts every text at 32 tokens, so the run is reading and
    tokenising; the cells repeat one word that is one token of the sample tokenizer, which reads it 3x as fast as
    mixed words."""
    import subprocess
    import sys

    from helpers import EXE, PEAK_RSS_WRAPPER

    cells = [f"row {i}:" + " singing" * 12_500 for i in range(50)]  # 100 kB, 12.5k tokens: one per word
    listing = tmp_path / "empty.txt"
    listing.write_text("")
    runs = {}
    for groups in (1, 10):  # both at once: each wrapper reads the peak of its own command alone
        parquet = tmp_path / f"{groups}.parquet"
        pq.write_table(pa.table({"text": cells * groups}), parquet, row_group_size=len(cells), compression="none")
        assert pq.ParquetFile(parquet).num_row_groups == groups
        # fmt: off
        args = [
            EXE, "text", str(parquet), "--column", "text",
            "--model", str(ROOT / "samples" / "tiny-embeddinggemma"),
            "-o", str(tmp_path / f"{groups}.safetensors"), "--flush-every", "50", "-q",
        ]
        # fmt: on
        runs[groups] = subprocess.Popen(
            [sys.executable, "-c", PEAK_RSS_WRAPPER, str(listing), *args], stdout=subprocess.PIPE, text=True
        )
    peaks = {}
    for groups, proc in runs.items():
        result = json.loads(proc.communicate(timeout=600)[0])
        assert result["code"] == 0, result["stderr"]
        assert len(gemma_embed.load(tmp_path / f"{groups}.safetensors")) == 50 * groups
        peaks[groups] = result["peak"]
    print(f"peak RSS: 1 row group {peaks[1] / 2**20:.0f} MiB, 10 row groups {peaks[10] / 2**20:.0f} MiB")
    assert peaks[10] - peaks[1] < 24 * 2**20, peaks
