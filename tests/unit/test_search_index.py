"""Search at collection scale without a model: exact search over every layout and kernel equals numpy's brute force
(float64 over the stored rows); the row table changes nothing but speed; faiss IVF/HNSW indexes find what faiss's
own exact flat index finds and report exact scores; an index that no longer matches its output is refused in one
line; an interrupted build leaves the previous index; without faiss the commands say which extra to install."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys

import numpy as np
import pytest
import torch

from gemma_embed import index as ann
from gemma_embed import store
from gemma_embed.errors import UsageError
from gemma_embed.progress import Reporter
from gemma_embed.search import Query, QueryResult, render_results, search, search_many
from gemma_embed.store import EmbeddingWriter
from gemma_embed.store.row_table import table_path

HEADER = {"model": "synthetic", "space": "retrieval", "dim": "", "pooling": "mean", "modality": "text"}


def write(path, rows_per_item, dtype="float16", shard_size=None):
    writer = EmbeddingWriter(path, HEADER, output_dtype=dtype, shard_size=shard_size)
    for position, rows in enumerate(rows_per_item):
        writer.add(f"item{position:05d}", rows, {"path": f"/data/{position}"}, position)
    return writer.close()


def clustered(count, width, seed=0, clusters=16, spread=0.35):
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(clusters, width, generator=generator)
    picks = torch.randint(0, clusters, (count,), generator=generator)
    noise = torch.randn(count, width, generator=generator)
    return torch.nn.functional.normalize(centers[picks] + spread * noise, dim=1)


def brute_force(rows_per_item, dtype, query, k):
    """numpy, float64, over the rows as stored: each item's best row's cosine; top k (key, score)."""
    q = query.double().numpy()
    q = q / np.linalg.norm(q)
    scored = []
    for position, rows in enumerate(rows_per_item):
        stored = rows.to(getattr(torch, dtype)).double().numpy()
        cosines = stored @ q / np.linalg.norm(stored, axis=1)
        scored.append((f"item{position:05d}", float(cosines.max())))
    return sorted(scored, key=lambda entry: (-entry[1], entry[0]))[:k]


def assert_same(hits, expected, tolerance=2e-6):
    assert [h.key for h in hits] == [key for key, _ in expected]
    assert all(abs(h.score - score) < tolerance for h, (_, score) in zip(hits, expected, strict=True))


@pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16"])
@pytest.mark.parametrize("with_table", [False, True])
@pytest.mark.parametrize("count", [1, 3, 9])  # the float16 kernel (up to FAST_QUERIES) and the shared float32 copy
def test_exact_search_equals_numpy_brute_force(tmp_path, dtype, with_table, count):
    items = list(clustered(700, 24).split(1)) + [r * 3 for r in clustered(5, 24, seed=1).split(1)]  # other norms
    output = write(tmp_path / "o.safetensors", items, dtype, shard_size=300)
    if with_table:
        assert ann.build_index(output, "flat")["kind"] == "flat" and table_path(output).exists()
    queries = torch.randn(count, 24, generator=torch.Generator().manual_seed(5))
    found = search_many(output, queries, k=7, block_rows=128)
    for query, hits in zip(queries, found, strict=True):
        assert_same(hits, brute_force(items, dtype, query, 7))


@pytest.mark.parametrize("with_table", [False, True])
def test_items_of_many_rows_score_by_their_best_row(tmp_path, with_table):
    generator = torch.Generator().manual_seed(2)
    items = [torch.randn(1 + (i * 7) % 5, 16, generator=generator) * (1 + i % 3) for i in range(60)]
    output = write(tmp_path / "multi.safetensors", items, "float32", shard_size=25)
    if with_table:
        ann.build_index(output, "flat")
    queries = torch.randn(6, 16, generator=generator)
    for block_rows in (3, 1000):
        for query, hits in zip(queries, search_many(output, queries, k=5, block_rows=block_rows), strict=True):
            assert_same(hits, brute_force(items, "float32", query, 5))
            best = items[int(hits[0].key[4:])].float()
            assert hits[0].row == int((best @ query / best.norm(dim=1)).argmax())


def test_float16_kernel_is_exact_among_near_ties(tmp_path):
    """Rows 1e-4 apart (well inside float16's rounding of a product): the float16 ranking only proposes; the exact
    rescoring orders them as float64 does."""
    base = torch.nn.functional.normalize(torch.randn(1, 64, generator=torch.Generator().manual_seed(3)), dim=1)
    noise = torch.randn(400, 64, generator=torch.Generator().manual_seed(4))
    items = list(torch.nn.functional.normalize(base + 2e-3 * noise, dim=1).split(1))
    output = write(tmp_path / "ties.safetensors", items)
    ann.build_index(output, "flat")
    for seed in range(5):
        query = base[0] + 0.05 * torch.randn(64, generator=torch.Generator().manual_seed(10 + seed))
        assert_same(search(output, query, k=10), brute_force(items, "float16", query, 10), tolerance=1e-6)


def test_hits_metadata_comes_from_the_table_without_parsing_headers(tmp_path, monkeypatch):
    items = list(clustered(50, 8).split(1))
    output = write(tmp_path / "o.safetensors", items)
    ann.build_index(output, "flat")
    monkeypatch.setattr(store, "output_index", lambda *a: pytest.fail("parsed every file's header"))
    hits = search(output, items[7][0], k=2)
    assert hits[0].key == "item00007" and hits[0].path == "/data/7" and hits[0].item["rows"] == 1


faiss = pytest.importorskip("faiss")


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_index_finds_what_faiss_flat_finds_with_exact_scores(tmp_path, kind):
    rows = clustered(4000, 32)
    items = list(rows.split(1))
    output = write(tmp_path / "o.safetensors", items, shard_size=1500)
    record = ann.build_index(output, kind)
    assert record["kind"] == kind and record["recall_at_10"] >= ann.TARGET_RECALL
    assert record["rows"] == 4000 and record["width"] == 32 and (tmp_path / "o.faiss").exists()
    # Queries near the data, as a model's queries are near its documents.
    queries = torch.nn.functional.normalize(rows[::97] + 0.2 * torch.randn(rows[::97].shape), dim=1)
    stored = rows.half().float()
    reference = faiss.IndexFlatIP(32)
    reference.add((stored / stored.norm(dim=1, keepdim=True)).numpy())
    _, truth = reference.search(queries.numpy(), 10)
    found = search_many(output, queries, k=10)
    recall = np.mean([len({int(h.key[4:]) for h in hits} & set(t)) / 10 for hits, t in zip(found, truth, strict=True)])
    assert recall >= 0.9
    exact = search_many(output, queries, k=10, exact=True)
    for query, hits, exact_hits in zip(queries, found, exact, strict=True):  # an indexed hit's score: its exact cosine
        exact_scores = {h.key: h.score for h in exact_hits}
        for hit in hits:
            row = stored[int(hit.key[4:])]
            assert abs(hit.score - float(row @ query / row.norm())) < 2e-6
            assert hit.key not in exact_scores or abs(exact_scores[hit.key] - hit.score) < 2e-6


def test_auto_is_flat_on_small_outputs_and_on_data_without_clusters(tmp_path, monkeypatch):
    small = write(tmp_path / "small.safetensors", list(clustered(300, 16).split(1)))
    assert ann.build_index(small)["kind"] == "flat" and not (tmp_path / "small.faiss").exists()
    monkeypatch.setattr(ann, "FLAT_BELOW_ROWS", 1000)
    grouped = write(tmp_path / "grouped.safetensors", list(clustered(3000, 32, spread=0.2).split(1)))
    record = ann.build_index(grouped)
    assert record["kind"] == "ivf" and record["requested"] == "auto" and (tmp_path / "grouped.faiss").exists()
    noise = torch.nn.functional.normalize(torch.randn(3000, 128, generator=torch.Generator().manual_seed(0)), dim=1)
    scattered = write(tmp_path / "scattered.safetensors", list(noise.split(1)))
    record = ann.build_index(scattered)
    assert record["kind"] == "flat" and "IVF needed nprobe" in record["reason"]
    assert not (tmp_path / "scattered.faiss").exists()


@pytest.fixture
def indexed(tmp_path):
    items = list(clustered(2500, 16).split(1))
    output = write(tmp_path / "o.safetensors", items)
    ann.build_index(output, "ivf")
    return output, items


def test_a_stale_index_is_refused_in_one_line_and_exact_still_answers(indexed):
    output, items = indexed
    query = items[3][0]
    assert search(output, query, k=3)[0].key == "item00003"
    changed = items[:-1] + [torch.nn.functional.normalize(torch.randn(1, 16), dim=1)]
    write(output, changed)  # the output rewritten after indexing (same name, same size)
    with pytest.raises(UsageError) as caught:
        search(output, query, k=3)
    message = str(caught.value)
    assert "\n" not in message and "changed after it was indexed" in message and "--exact" in message
    assert_same(search(output, query, k=3, exact=True), brute_force(changed, "float16", query, 3))
    ann.build_index(output, "ivf")  # indexing again makes it current
    assert search(output, query, k=3)[0].key == "item00003"


def test_an_index_for_another_output_is_refused(indexed, tmp_path):
    output, items = indexed
    other = write(tmp_path / "other.safetensors", items)
    shutil.copy(table_path(output), table_path(other))
    shutil.copy(tmp_path / "o.faiss", tmp_path / "other.faiss")
    with pytest.raises(UsageError, match=r"made for another output \(o.safetensors\), not other.safetensors"):
        search(other, items[0][0])


def test_an_output_touched_after_indexing_is_stale_until_indexed_again(indexed):
    output, items = indexed
    os.utime(output, ns=(1, 1))  # the same bytes, a new time: only reading every row could tell
    with pytest.raises(UsageError, match="o.safetensors was modified after indexing"):
        search(output, items[9][0], k=1)
    assert search(output, items[9][0], k=1, exact=True)[0].key == "item00009"


def test_a_missing_or_replaced_faiss_file_is_refused(indexed, tmp_path):
    output, items = indexed
    (tmp_path / "o.faiss").unlink()
    with pytest.raises(UsageError, match=r"o.faiss: missing \(an interrupted build\?\); ivf indexes have one"):
        search(output, items[0][0])


def test_an_interrupted_build_leaves_the_previous_index_whole(indexed, tmp_path, monkeypatch):
    output, items = indexed
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("o.")}

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ann.row_table, "write_table", stopped)  # Ctrl-C after the faiss file, before the record
    with pytest.raises(KeyboardInterrupt):
        ann.build_index(output, "hnsw")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # The faiss file is new but the record still names the old one: refused until index runs again.
    with pytest.raises(UsageError, match="an interrupted build"):
        search(output, items[0][0])
    monkeypatch.undo()
    ann.build_index(output, "ivf")
    assert search(output, items[0][0], k=1)[0].key == "item00000"
    assert table_path(output).read_bytes() != before["o.search-index"]  # rebuilt, with its own times


def test_build_progress_goes_through_the_reporter(tmp_path):
    output = write(tmp_path / "o.safetensors", list(clustered(2000, 16).split(1)))
    err = io.StringIO()
    ann.build_index(output, "ivf", reporter=Reporter(stderr=err, stdout=io.StringIO(), live=False))
    lines = err.getvalue().splitlines()
    assert lines and all(line.startswith("note: index: ") for line in lines)
    assert any("training IVF" in line for line in lines) and any("recall@10" in line for line in lines)


def test_without_faiss_index_and_search_name_the_extra(indexed, monkeypatch):
    output, items = indexed
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss raises ImportError
    with pytest.raises(UsageError, match=r"pip install 'gemma-embed\[search\]'"):
        ann.build_index(output, "ivf")
    with pytest.raises(UsageError, match=r"needs faiss.*gemma-embed\[search\].*--exact"):
        search(output, items[0][0])
    assert search(output, items[0][0], k=1, exact=True)[0].key == "item00000"  # exact needs no faiss
    from typer.testing import CliRunner

    from gemma_embed.cli import app

    result = CliRunner().invoke(app, ["index", str(output), "--kind", "hnsw"])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("error: gemma-embed index --kind hnsw needs faiss")


def test_many_queries_render_grouped_and_carry_their_query(indexed):
    output, items = indexed
    queries = [Query(text="first"), Query(file="/q/cat.jpg", modality="images")]
    found = search_many(output, torch.cat([items[1], items[2]]), k=2)
    results = [QueryResult(q, n, hits) for n, (q, hits) in enumerate(zip(queries, found, strict=True))]
    records = [json.loads(line) for line in render_results(results, jsonl=True).splitlines()]
    assert [(r["query"], r["query_index"], r["rank"]) for r in records] == [
        ("first", 0, 1),
        ("first", 0, 2),
        ("/q/cat.jpg", 1, 1),
        ("/q/cat.jpg", 1, 2),
    ]
    assert records[0]["key"] == "item00001" and records[2]["query_modality"] == "images"
    table = render_results(results).splitlines()
    assert table[0] == "query 1: first" and table[1].split() == ["rank", "score", "key", "path"]
    assert "query 2: images: /q/cat.jpg" in table
