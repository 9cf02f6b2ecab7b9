"""What a command imports before it answers (issue 34, goal 3): `--help`, `models` and `inspect` answer without
torch, transformers or sentence-transformers (each of them seconds of a 2-core machine's start), and the
checkpoint safety check decides without transformers' image and video processing registry. Asserted on the
modules a fresh interpreter holds after the real command ran in it, not on seconds: the times are in
bench/README.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT

EG2 = ROOT / "samples" / "tiny-embeddinggemma2"
HEAVY = ("torch", "transformers", "sentence_transformers", "torchvision", "PIL", "av", "pyarrow")

# The console script's `main`, run in this interpreter; at exit, the modules imported (a name mapped to None is one
# the command marked as not installed: not imported), as JSON, to the file argv[1].
_RUN = textwrap.dedent("""
    import json, sys
    report = sys.argv.pop(1)
    from gemma_embed.cli import main
    sys.argv[0] = "gemma-embed"
    try:
        main()
    except SystemExit as stop:
        code = stop.code
    else:
        code = 0
    with open(report, "w") as out:
        json.dump({"code": code, "modules": sorted(n for n, m in sys.modules.items() if m is not None)}, out)
""")


def modules_after(tmp_path, *args: str) -> tuple[int, set[str]]:
    report = tmp_path / "modules.json"
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(report), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"},
        timeout=120,
    )
    assert report.exists(), proc.stderr.decode()
    said = json.loads(report.read_text())
    return said["code"], set(said["modules"])


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    import gemma_embed

    folder = tmp_path_factory.mktemp("start-up")
    lines = folder / "lines.txt"
    lines.write_text("a cat on a mat\nthe sea at night\n")
    out = folder / "out.safetensors"
    gemma_embed.run(gemma_embed.RunConfig(modality="text", inputs=[str(lines)], model=str(EG2), output=out))
    return out


@pytest.mark.parametrize(
    "args", [["--help"], ["images", "--help"], ["models"], ["models", "--json"], ["dedup", "--help"], ["map", "--help"]]
)
def test_help_and_models_import_none_of_the_heavy_packages(args, tmp_path):
    code, modules = modules_after(tmp_path, *args)
    assert code == 0
    assert not {name for name in modules if name.split(".")[0] in HEAVY}, args


def test_inspect_reads_an_output_without_torch(output, tmp_path):
    code, modules = modules_after(tmp_path, "inspect", str(output))
    assert code == 0
    assert not {name.split(".")[0] for name in modules} & {"torch", "transformers", "sentence_transformers"}


def test_the_safety_check_decides_without_the_processing_registry(tmp_path):
    """`refuse_checkpoint_code` on the EmbeddingGemma 2 sample (its processor and tokenizer files name classes):
    it accepts them from transformers' import tables, never importing the image or video processing modules."""
    probe = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from gemma_embed.models.loading import refuse_checkpoint_code
        refuse_checkpoint_code(Path({str(EG2)!r}), "sample")
        heavy = [m for m in sys.modules if m.startswith(("transformers.image_processing", "transformers.video",
                                                          "transformers.models.auto.image_processing",
                                                          "transformers.models.auto.video_processing", "torchvision"))]
        print(",".join(heavy))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


@pytest.mark.parametrize("command", ["text", "images"])
def test_a_run_imports_no_scipy_which_transformers_would_import_for_nothing(command, output, tmp_path):
    """transformers imports SciPy when it is installed (for object-detection losses no path of this tool reaches):
    0.5-0.7 s of CPU each start. A real run of the command (text on EmbeddingGemma 2, images on Gemma 4) ends
    without it, and writes its output; that the rows still equal transformers' own is every equivalence test's."""
    import importlib.util

    if importlib.util.find_spec("scipy") is None:
        pytest.skip("SciPy is not installed here: nothing to keep out")
    folder = output.parent
    if command == "text":
        args = ["text", str(folder / "lines.txt"), "--model", str(EG2)]
    else:
        args = ["images", str(ROOT / "samples" / "media" / "images"), "--model", str(ROOT / "samples" / "tiny-gemma4")]
    out = tmp_path / "run.safetensors"
    code, modules = modules_after(tmp_path, *args, "-o", str(out), "-q")
    assert code == 0 and out.exists()
    assert "transformers.modeling_utils" in modules  # the run did build a model with transformers
    assert not {name for name in modules if name.split(".")[0] == "scipy"}
