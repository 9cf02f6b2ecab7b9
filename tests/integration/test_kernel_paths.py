"""The same bytes at any thread count and batch size under each CPU kernel path this machine can take, forced the
way the libraries allow, so that one machine proves the paths other CPUs take (issue 46):

- this CPU's own kernels;
- an Intel Xeon with AVX-512 but no bf16 instructions: oneDNN capped at AVX512_CORE, so bf16 products take the
  emulating kernel (`gemm:jit:bf16`), which splits sums between threads;
- a CPU with AVX2 only: ATen's AVX2 kernels, oneDNN capped at AVX2, MKL's strict AVX2 branch;
- no vector unit ATen knows: ATen's DEFAULT kernels, oneDNN at SSE4.1, MKL's strict AVX2 branch (its lowest).

Each path runs `tests/kernel_path_probe.py` in a fresh process (the libraries read their controls once, at their
first call): images through a Gemma 4 tower 96 wide (a 200-wide MLP: MKL's default kernels split its sums at 8
threads) and texts through an EmbeddingGemma 2 text model 768 wide (where oneDNN's emulated bf16 splits sums at 2
threads), float32 and bfloat16, at 1 thread with the tuned batches against 8 threads one item a batch. Before
numerics.py used the libraries' controls, the Gemma 4 images differed at 8 threads on every path and the bf16
texts on the AVX-512-without-bf16 path (measured on the AMD EPYC below).

MKL itself cannot be made to take another maker's kernels: on an AMD CPU it runs its AUTO branch whatever branch is
named (MKL_VERBOSE: `CNR:AUTO,STRICT`), and `MKL_ENABLE_INSTRUCTIONS` changes no byte there. Intel's strict mode is
Intel's documented guarantee on its CPUs; the AUTO branch's gap (narrow products at many threads) is closed by
numerics' thread cap, which these runs cover.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

from gemma_embed.device import cpu_capabilities

PROBE = ROOT / "tests" / "kernel_path_probe.py"
HAS = {name for name, present in cpu_capabilities().items() if present}
# name: (the environment that forces the path, what numerics.kernels() must then report, what the CPU must have)
PATHS = {
    "own": ({}, {}, set()),
    "avx512-without-bf16": (
        {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
        {"aten": "AVX512", "bfloat16": "float32 GEMM, rounded"},
        {"avx512_f", "avx512_bw", "avx512_vl", "avx512_dq"},
    ),
    "avx2": (
        {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2,STRICT"},
        {"aten": "AVX2", "bfloat16": "float32 GEMM, rounded"},
        {"avx2"},
    ),
    "default": (
        {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "AVX2,STRICT"},
        {"aten": "DEFAULT", "bfloat16": "float32 GEMM, rounded"},
        {"avx2"},
    ),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "samples"))
    from make_tiny_checkpoint import build_embeddinggemma2, build_gemma4

    folder = tmp_path_factory.mktemp("kernel-paths")
    images = build_gemma4(folder / "g4", seed=2, audio=False, vision_hidden=96, vision_intermediate=200)
    text = build_embeddinggemma2(folder / "eg2", seed=0, vision=False, audio=False, text_hidden=768, text_layers=1)
    return images, text


def probe(path: str, *arguments) -> dict:
    """The probe's findings in a fresh process under `path`'s forced kernels."""
    forced, _, needs = PATHS[path]
    if not needs <= HAS:
        pytest.skip(f"this CPU lacks {', '.join(sorted(needs - HAS))}: the libraries cannot run the {path} path here")
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR")}
    proc = subprocess.run(
        [sys.executable, str(PROBE), *map(str, arguments)],
        env={**env, **forced},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", list(PATHS))
def test_thread_count_and_batch_change_no_byte_under_each_kernel_path(checkpoints, path):
    images, text = checkpoints
    found = probe(path, images, text, ROOT / "samples" / "media" / "images")
    reported = PATHS[path][1]
    kernels = found["kernels"]
    assert kernels["thread_count_invariant"] and kernels["mkl"].endswith(",STRICT"), kernels
    assert {name: kernels[name] for name in reported} == reported, kernels
    differing = [case for case, digests in found["cases"].items() if len(set(digests)) != 1]
    assert not differing, f"{path}: 1 thread against 8 threads one item a batch differ in {differing} ({kernels})"


@pytest.mark.parametrize("path", ["own"])
def test_every_family_and_modality_of_the_samples_at_1_and_8_threads(path):
    """Gemma 4 images, video and audio, Gemma 3 images (its projector is a matmul), Gemma 3n images (MobileNet's
    convolutions and RMSNorm2d's rsqrt) and audio, EmbeddingGemma text, EmbeddingGemma 2 images and audio."""
    found = probe(path, "--samples", ROOT / "samples")
    differing = [case for case, digests in found["cases"].items() if len(set(digests)) != 1]
    assert len(found["cases"]) == 18 and not differing, f"{path}: {differing} ({found['kernels']})"
