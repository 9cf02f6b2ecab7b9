"""`gemma-embed search --queries FILE` and repeated media queries: every query embedded through one Embedder (the
model loads once), answered together, each answer equal to a single-query run; `index` then `search` uses the
index, `--exact` sets it aside; a query that cannot be embedded is named in one line and the others answered."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import ROOT

from gemma_embed import embedder as embedder_module
from gemma_embed.search import Query, query_index, query_many

EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
MEDIA = ROOT / "samples" / "media"
TEXTS = [
    "a cat sleeps on a warm windowsill",
    "stock markets fell sharply on tuesday",
    "how do I bake sourdough bread",
    "the quick brown fox",
    "embeddings map text, images and audio into one space for search",
]


def _cli(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    from typer.testing import CliRunner

    from gemma_embed.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args], input=stdin)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


@pytest.fixture(scope="module")
def text_index(tmp_path_factory):
    folder = tmp_path_factory.mktemp("texts")
    index = folder / "texts.safetensors"
    lines = [f"{text} (document {n})" for n in range(4) for text in TEXTS]
    made = _cli("text", "-", "--model", EG2, "-o", index, "-q", "--device", "cpu", stdin="\n".join(lines))
    assert made.returncode == 0, made.stderr
    return index


def test_a_hundred_queries_load_the_model_once_and_equal_single_query_runs(text_index, tmp_path, monkeypatch):
    setups, loads = [], []
    real_setup, real_load = embedder_module.Embedder._setup, embedder_module.Embedder.load

    def counting_setup(self, *args, **kwargs):
        setups.append(1)
        return real_setup(self, *args, **kwargs)

    def counting_load(self, modality, **options):
        if not self.command(modality, **options).loaded:  # this call reads the towers' weights
            loads.append(modality)
        return real_load(self, modality, **options)

    monkeypatch.setattr(embedder_module.Embedder, "_setup", counting_setup)
    monkeypatch.setattr(embedder_module.Embedder, "load", counting_load)
    queries = [Query(text=TEXTS[n % len(TEXTS)] + "?") for n in range(100)]
    results = query_many(text_index, queries, k=4, device="cpu")
    assert len(setups) == 1 and len(loads) == 1  # one Embedder, its text tower read once
    assert [r.position for r in results] == list(range(100)) and all(r.error is None for r in results)
    monkeypatch.undo()
    # A single query's answer depends on its text only: each distinct text asked alone, as one CLI call would.
    alone = {text: query_index(text_index, Query(text=text), k=4, device="cpu") for text in {q.text for q in queries}}
    for query, result in zip(queries, results, strict=True):
        single = alone[query.text]
        assert [h.key for h in result.hits] == [h.key for h in single]
        assert all(abs(a.score - b.score) < 1e-5 for a, b in zip(result.hits, single, strict=True))


def test_queries_file_through_the_command_with_an_index_and_exact(text_index, tmp_path):
    queries = tmp_path / "queries.txt"
    queries.write_text(f"{TEXTS[2]} (document 1)\n\n{TEXTS[0]} (document 3)\n")  # a blank line: no query
    built = _cli("index", text_index, "-q")
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout)["kind"] == "flat"  # 20 rows: below auto's flat threshold
    answers = []
    for extra in ([], ["--exact"]):
        run = _cli("search", text_index, "--queries", queries, "--jsonl", "-k", "2", "--device", "cpu", *extra)
        assert run.returncode == 0, run.stderr
        records = [json.loads(line) for line in run.stdout.splitlines()]
        assert [(r["query_index"], r["rank"]) for r in records] == [(0, 1), (0, 2), (1, 1), (1, 2)]
        assert records[0]["query"] == f"{TEXTS[2]} (document 1)" and records[2]["query"].startswith(TEXTS[0])
        answers.append([(r["key"], round(r["score"], 5)) for r in records])
    assert answers[0] == answers[1]  # a flat index is the exact search
    single = query_index(text_index, Query(text=f"{TEXTS[0]} (document 3)"), k=2, device="cpu")
    assert answers[0][2:] == [(h.key, round(h.score, 5)) for h in single]
    table = _cli("search", text_index, "--queries", queries, "-k", "1", "--device", "cpu").stdout.splitlines()
    assert table[0] == (  # for every query
        "queries embedded with the query prompt, items with no prompt; score: cosine similarity of the vectors"
    )
    assert table[1] == f"query 1: {TEXTS[2]} (document 1)" and table[2].split() == [
        "rank",
        "score",
        "key",
        "path",
        "text",
    ]
    assert f"query 2: {TEXTS[0]} (document 3)" in table


def test_repeated_and_folder_media_queries_name_the_one_that_fails(tmp_path):
    index = tmp_path / "images.safetensors"
    assert _cli("images", MEDIA / "images", "--model", EG2, "-o", index, "-q", "--device", "cpu").returncode == 0
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    run = _cli("search", index, "--image", MEDIA / "images", "--image", broken, "--jsonl", "-k", "1", "--device", "cpu")
    assert run.returncode == 1
    assert run.stderr.splitlines() == [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert len(run.stderr.splitlines()) == 1 and "broken.png" in run.stderr
    records = [json.loads(line) for line in run.stdout.splitlines()]
    images = sorted(p for p in (MEDIA / "images").iterdir())
    assert [r["query"] for r in records] == [str(p) for p in images]
    assert all(r["key"] == (MEDIA / "images" / r["key"]).name for r in records)
    assert [r["key"] for r in records] == [p.name for p in images]  # each image finds itself first
