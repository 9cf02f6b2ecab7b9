"""A usage error names options the way its caller writes them: flags on the command line, RunConfig fields (and
Embedder keywords) from Python."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import ROOT, SAMPLE_MODEL, run_images

import gemma_embed
from gemma_embed import errors
from gemma_embed.errors import UsageError

IMAGES = ROOT / "samples" / "media" / "images"


def test_a_second_run_from_python_names_overwrite_true(tmp_path):
    out = tmp_path / "o.safetensors"
    config = gemma_embed.RunConfig(modality="images", inputs=[IMAGES], model=str(SAMPLE_MODEL), output=out)
    gemma_embed.run(config)
    with pytest.raises(UsageError) as caught:
        gemma_embed.run(config)
    assert str(caught.value) == f"{out}: exists; pass overwrite=True to replace it or resume=True to add to it"
    # The command line's own words for the same refusal:
    with pytest.raises(UsageError, match="pass --overwrite to replace it or --resume to add to it"):
        run_images([IMAGES], SAMPLE_MODEL, out, overwrite=False)


def test_a_damaged_output_from_python_is_a_damaged_file_naming_overwrite_true(tmp_path):
    """Every kind of usage error is reworded for Python, keeping its type (a DamagedFile is built from its parts:
    rewording it by its constructor raised a TypeError instead)."""
    from gemma_embed.store.damage import DamagedFile

    out = tmp_path / "o.safetensors"
    out.write_bytes(b"not an output at all")
    config = gemma_embed.RunConfig(modality="images", inputs=[IMAGES], model=str(SAMPLE_MODEL), output=out, resume=True)
    with pytest.raises(DamagedFile) as caught:
        gemma_embed.run(config)
    assert str(caught.value).startswith(f"{out}: not a gemma-embed output (")  # random bytes: nobody's output
    assert str(caught.value).endswith("; remove it or run with overwrite=True")
    assert caught.value.file == out and caught.value.error_kind is errors.NOT_OURS


def test_the_embedder_names_its_keywords():
    with pytest.raises(UsageError) as caught:
        gemma_embed.Embedder(SAMPLE_MODEL, device="cpu", memory_budget="1%", dim=8).embed([str(IMAGES / "tall.png")])
    assert str(caught.value) == (
        "dim, prompt and prompt_name apply to retrieval vectors only (EmbeddingGemma 2 checkpoints)"
    )


def test_a_resumed_run_counts_its_rate_over_computed_items(tmp_path):
    out = tmp_path / "o.safetensors"
    first = sorted(IMAGES.iterdir())[:2]
    code, _, _ = run_images(first, SAMPLE_MODEL, out)
    assert code == 0
    code, records, err = run_images(sorted(IMAGES.iterdir())[:3], SAMPLE_MODEL, out, overwrite=False, resume=True)
    summary = records[-1]
    assert (summary["ok"], summary["resumed"]) == (3, 2)
    # One computed item: the rate is 1/seconds, not 3/seconds (seconds is rounded to 1 ms in the record, the rate
    # to 0.001 items/s: on a slow machine, over a second, the rate's own rounding is the larger one).
    expected = pytest.approx(1 / summary["seconds"], rel=0.0006 / summary["seconds"] + 1e-3, abs=0.0005)
    assert summary["items_per_s"] == expected
    (line,) = [line for line in err.splitlines() if " ok" in line]
    assert line.startswith("3 ok (2 reused), 0 failed in ")
    code, records, err = run_images(sorted(IMAGES.iterdir())[:3], SAMPLE_MODEL, out, overwrite=False, resume=True)
    (line,) = [line for line in err.splitlines() if " ok" in line]
    assert line.startswith("3 ok (3 reused), 0 failed in ") and "(nothing computed)" in line
    assert records[-1]["items_per_s"] == 0.0


EMBEDDINGGEMMA2 = ROOT / "samples" / "tiny-embeddinggemma2"


@pytest.fixture(scope="module")
def text_embedder():
    return gemma_embed.Embedder(EMBEDDINGGEMMA2, device="cpu")  # loaded once for every keyword below


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        ({"truncate_dim": -1}, "truncate_dim"),  # sentence-transformers' word for RunConfig's dim
        ({"truncate_dim": 100_000}, "truncate_dim"),
        ({"dim": 0}, "dim"),
        ({"batch_size": -3}, "batch_size"),
        ({"device": "bogus"}, "device"),
        ({"device": "cuda:99"}, "device"),  # no such CUDA device here, or none at all
        ({"precision": "int4"}, "precision"),
    ],
)
def test_encode_errors_name_the_keyword_the_caller_wrote_never_a_flag(text_embedder, keywords, named):
    """Every bad keyword of `encode` (the sentence-transformers face) is a UsageError that starts with the keyword as
    the caller wrote it, and names no command-line flag."""
    with pytest.raises(UsageError) as caught:
        text_embedder.encode("a cat", **keywords)
    message = str(caught.value)
    assert message.startswith(named), message
    assert "--" not in message, message


@pytest.mark.parametrize(
    ("field", "value"),
    [("batch_size", -3), ("workers", 0), ("memory_budget", "lots"), ("dim", 0), ("shard_size", -1)],
)
def test_run_config_errors_name_the_field(tmp_path, field, value):
    """A RunConfig is checked when it runs: the error names the field as the caller wrote it, never a flag."""
    out = tmp_path / "o.safetensors"
    config = gemma_embed.RunConfig(modality="images", inputs=[IMAGES], model=str(SAMPLE_MODEL), output=out)
    with pytest.raises((UsageError, ValueError)) as caught:
        gemma_embed.run(dataclasses.replace(config, **{field: value}))
    assert str(caught.value).startswith(f"{field}: ") and "--" not in str(caught.value), str(caught.value)
    assert not out.exists()
