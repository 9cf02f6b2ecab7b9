"""`--ray`: the same runs as Ray Data jobs, on one local Ray cluster this module starts (2 CPUs, no dashboard, no
network), against the single-process run of the same command: the same items, bit for bit, in input order.

One cluster for the whole module (starting one takes seconds); inputs are a few small samples. The images run
also holds a file that cannot be decoded and an item on which the encode actor kills itself once: Ray restarts
it, retries the batch, and the output holds every item once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from helpers import ROOT, invoke, start_ray, summary

import gemma_embed
from gemma_embed import RunConfig, load
from gemma_embed.ray_data import Embed, RayRunner
from gemma_embed.store import read_metadata
from gemma_embed.store.layout import errors_path

pytestmark = pytest.mark.slow

MEDIA = ROOT / "samples" / "media"
GEMMA4 = ROOT / "samples" / "tiny-gemma4"
EMBEDDING_GEMMA = ROOT / "samples" / "tiny-embeddinggemma2"
MARKER = "portrait.png"  # the item whose batch kills the encode actor (once)


@pytest.fixture(scope="module")
def cluster() -> str:
    """A local Ray cluster for this module's runs; its GCS address is what `--ray ADDRESS` takes."""
    context = start_ray()
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # DyingEmbed travels to the actors
    try:
        yield context.address_info["gcs_address"]
    finally:
        ray.shutdown()


class DyingEmbed(Embed):
    """The encode actor, which exits hard (os._exit, as a killed process) on the batch holding MARKER the first
    time it meets it: the flag file beside the output says it did."""

    flag: str = ""

    def __call__(self, batch):
        if MARKER in list(batch["key"]) and not os.path.exists(self.flag):
            Path(self.flag).touch()
            os._exit(1)
        return super().__call__(batch)


def run(output: Path, **options) -> gemma_embed.RunResult:
    return gemma_embed.run(RunConfig(output=output, overwrite=True, **options))


def same_output(ours: Path, reference: Path) -> None:
    """Items equal bit for bit, in the same order, with the same metadata."""
    mine, theirs = read_metadata(ours), read_metadata(reference)
    assert mine["keys"] == theirs["keys"]
    assert mine["items"] == theirs["items"]
    rows, expected = load(ours), load(reference)
    assert list(rows) == list(expected)
    for key, tensor in expected.items():
        assert rows[key].dtype == tensor.dtype and rows[key].shape == tensor.shape, key
        assert rows[key].view(-1).view(torch_int(tensor)).equal(tensor.view(-1).view(torch_int(tensor))), key


def torch_int(tensor):
    """The integer type of the tensor's width: rows compared as bits, so -0.0 and 0.0 or NaNs differ too."""
    import torch

    return {4: torch.int32, 2: torch.int16}[tensor.element_size()]


# ------------------------------------------------------------------------------------------ images


@pytest.fixture(scope="module")
def images(cluster, tmp_path_factory):
    """Four sample images and a file that is no image; the reference run and the Ray run (whose actor dies once)."""
    folder = tmp_path_factory.mktemp("images")
    for name in ("landscape.jpg", MARKER, "square.webp", "tall.png"):
        shutil.copy(MEDIA / "images" / name, folder / name)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    out = tmp_path_factory.mktemp("out")
    options = {"modality": "images", "inputs": [str(folder)], "model": str(GEMMA4), "flush_every": 2}
    reference = run(out / "single.safetensors", **options)
    flag = out / "actor-died"
    original = RayRunner.embed_class
    RayRunner.embed_class = type("DyingEmbedHere", (DyingEmbed,), {"flag": str(flag)})
    try:
        ours = run(out / "ray.safetensors", ray=cluster, **options)
    finally:
        RayRunner.embed_class = original
    return reference, ours, flag


def test_images_equal_the_single_process_run(images):
    reference, ours, _ = images
    assert reference.ok == 4 and ours.ok == 4
    same_output(ours.output, reference.output)


def test_a_file_that_does_not_decode_is_a_failure_record_and_the_job_ends_normally(images):
    reference, ours, _ = images
    assert ours.interrupted is None and ours.output is not None and ours.output.exists()
    assert [f["key"] for f in ours.failures] == ["broken.jpg"]
    assert ours.failures[0]["stage"] == "decode"
    assert ours.failures == reference.failures  # the same record: stage, error type and message
    errors = [json.loads(line) for line in errors_path(ours.output).read_text().splitlines()]
    assert [e["key"] for e in errors] == ["broken.jpg"]


def test_an_actor_killed_mid_run_is_retried_and_every_item_is_written_once(images):
    reference, ours, flag = images
    assert flag.exists()  # the actor did die, on the batch holding MARKER
    assert ours.ok == reference.ok == 4 and ours.failed == 1  # counted once each: no batch came back twice
    keys = read_metadata(ours.output)["keys"]
    assert len(keys) == len(set(keys)) == 4 and MARKER in keys


def test_on_error_stop_ends_at_the_first_failure_as_the_single_process_run(cluster, tmp_path):
    """--on-error stop: the sink's stop ends the Ray run as it ends a single process (the items before the bad one
    written, the failure recorded), not as a failed Ray job."""
    folder = tmp_path / "images"
    folder.mkdir()
    shutil.copy(MEDIA / "images" / "landscape.jpg", folder / "1.jpg")
    (folder / "2.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    shutil.copy(MEDIA / "images" / "tall.png", folder / "3.png")
    options = {"modality": "images", "inputs": [str(folder)], "model": str(GEMMA4), "on_error": "stop"}
    reference = run(tmp_path / "single.safetensors", **options)
    ours = run(tmp_path / "ray.safetensors", ray=cluster, **options)
    assert reference.stopped_at_first_failure and ours.stopped_at_first_failure
    assert ours.failures == reference.failures and [f["key"] for f in ours.failures] == ["2.jpg"]
    same_output(ours.output, reference.output)


# ------------------------------------------------------------------------------------------ video, audio, text


def test_video_equals_the_single_process_run(cluster, tmp_path):
    folder = tmp_path / "video"
    folder.mkdir()
    for name in ("one-frame.avi", "short-vp9.webm"):
        shutil.copy(MEDIA / "video" / name, folder / name)
    options = {"modality": "video", "inputs": [str(folder)], "model": str(GEMMA4), "max_frames": 4}
    reference = run(tmp_path / "single.safetensors", **options)
    ours = run(tmp_path / "ray.safetensors", ray=cluster, **options)
    assert reference.ok == ours.ok == 2
    same_output(ours.output, reference.output)


def test_audio_through_the_command_line_equals_the_single_process_run(cluster, tmp_path):
    """`gemma-embed audio ... --ray ADDRESS`, the command itself (in this process: the cluster is already joined)."""
    folder = tmp_path / "audio"
    folder.mkdir()
    for name in ("chirp-16k.wav", "stereo-44k.flac"):
        shutil.copy(MEDIA / "audio" / name, folder / name)
    reference = run(tmp_path / "single.safetensors", modality="audio", inputs=[str(folder)], model=str(GEMMA4))
    out = tmp_path / "ray.safetensors"
    result = invoke("audio", folder, "--model", GEMMA4, "-o", out, "--ray", cluster)
    assert result.exit_code == 0, result.output
    record = summary(result.stdout)
    assert record["ok"] == 2 and record["failed"] == 0
    assert record["chunking"] == {"ray": {"actors": 1, "batch_size": "auto (per actor)"}}
    same_output(out, reference.output)


def test_text_resumed_on_ray_equals_the_single_process_run(cluster, tmp_path):
    """Two lines embedded by one process, two more added: `--resume --ray` reuses the two written items (by
    content, as any --resume) and computes only the new lines, on the cluster, as the single process does."""
    texts = tmp_path / "texts.txt"
    texts.write_text("a photo of a cat\na tall building at night\n")
    options = {"modality": "text", "inputs": [str(texts)], "model": str(EMBEDDING_GEMMA)}
    first = run(tmp_path / "single.safetensors", **options)
    shutil.copy(first.output, tmp_path / "ray.safetensors")
    with texts.open("a") as more:
        more.write("\nthe sound of rain\na dog on a beach\n")
    reference = gemma_embed.run(RunConfig(output=first.output, resume=True, **options))
    ours = gemma_embed.run(RunConfig(output=tmp_path / "ray.safetensors", resume=True, ray=cluster, **options))
    assert reference.resumed == ours.resumed == 2 and reference.ok == ours.ok == 4 and ours.computed == 2
    same_output(ours.output, reference.output)


# ------------------------------------------------------------------------------------------ without ray

CHECK_IMPORTS = """
import sys
{setup}
from gemma_embed.cli import main
sys.argv = ["gemma-embed", *{args!r}]
try:
    main()
except SystemExit as exc:
    code = exc.code
print("RAY_IMPORTED" if "ray" in sys.modules and sys.modules["ray"] is not None else "NO_RAY", code)
"""


def check(args: list[str], setup: str = "") -> subprocess.CompletedProcess:
    script = CHECK_IMPORTS.format(setup=setup, args=args)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_import_and_help_do_not_import_ray():
    proc = check(["--help"], setup="import gemma_embed, gemma_embed.config")
    assert proc.stdout.split()[-2:] == ["NO_RAY", "0"], proc.stderr
    proc = check(["images", "--help"])
    assert "--ray" in proc.stdout and proc.stdout.split()[-2:] == ["NO_RAY", "0"], proc.stderr


def test_without_ray_the_option_is_one_error_line_naming_the_extra(tmp_path):
    """Ray missing (an import of it fails): --ray is one `error:` line, exit 2, before any model is loaded."""
    out = tmp_path / "out.safetensors"
    args = ["images", str(MEDIA / "images"), "--model", str(GEMMA4), "-o", str(out), "--ray"]
    proc = check(args, setup="sys.modules['ray'] = None")
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:") and "pip install 'gemma-embed[ray]'" in lines[0]
    assert proc.stdout.split()[-1] == "2"
    assert not out.exists()


# ------------------------------------------------------------------------------------------ the map_batches stages


def test_the_stages_turn_a_column_of_bytes_into_embedding_rows_with_keys_and_errors():
    """`decode_batch` then `Embed` on a batch of a user's rows (no cluster: the functions map_batches calls): each
    row's embedding is `Embedder.embed`'s rows for those bytes, bit for bit; a row that is no image is an error."""
    import numpy as np

    from gemma_embed.ray_data import decode_batch

    names = ["tall.png", "square.webp"]
    cells = [(MEDIA / "images" / n).read_bytes() for n in names] + [b"not an image"]
    batch = {"image": np.array(cells, dtype=object), "id": np.array([*names, "bad"], dtype=object)}
    config = RunConfig(model=str(GEMMA4), modality="images")
    decoded = decode_batch(batch, config, column="image", key_column="id")
    embed = Embed(config=config)  # what each actor holds
    table = embed(decoded)
    assert table.column("key").to_pylist() == [*names, "bad"]
    expected = embed.embedder.embed(cells[:2], modality="images")  # the library's in-memory path, same model
    for index, rows in enumerate(expected):
        got = np.array(table.column("embedding")[index].as_py(), dtype=np.float32)  # a list of vectors
        assert got.shape == tuple(rows.shape) and np.array_equal(got.view(np.int32), rows.numpy().view(np.int32))
        assert json.loads(table.column("meta")[index].as_py())["width"] > 0
    assert table.column("embedding")[2].as_py() is None
    error = json.loads(table.column("error")[2].as_py())
    assert error["key"] == "bad" and error["stage"] == "decode"
    assert table.column("error").null_count == 2
