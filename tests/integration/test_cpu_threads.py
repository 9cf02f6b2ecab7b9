"""The CPU forwards' thread count on the real machine: a busy process beside the run is measured in /proc/stat and
takes a thread away; the count changes no bit of any vector; the caller's count comes back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers.models.embedding_gemma2.modeling_embedding_gemma2 import EmbeddingGemma2TextModel

import gemma_embed
from gemma_embed.cpu_threads import PROC_STAT, CpuThreads

pytestmark = pytest.mark.skipif(not PROC_STAT.exists(), reason="/proc/stat is Linux's")

# Mixed lengths, enough tokens that every matmul is large enough to be split between threads.
TEXTS = [" ".join(["the sea and the red car"] * (1 + i % 13)) + f" line {i}" for i in range(96)]


@pytest.fixture(scope="module")
def wide_text_model(tmp_path_factory) -> Path:
    """A random EmbeddingGemma 2 text model of hidden 256 (the samples' 32 leaves most matmuls too small to split)."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "samples"))
    from make_tiny_checkpoint import build_embeddinggemma2

    folder = tmp_path_factory.mktemp("eg2-wide")
    return build_embeddinggemma2(folder, seed=0, vision=False, audio=False, text_hidden=256, text_layers=2)


@pytest.fixture
def threads_seen(monkeypatch) -> list[int]:
    """torch's intra-op thread count in every forward of the text model."""
    seen: list[int] = []
    original = EmbeddingGemma2TextModel.forward

    def spy(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(EmbeddingGemma2TextModel, "forward", spy)
    return seen


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_thread_and_two_give_the_same_bits(wide_text_model, threads_seen, dtype):
    caller = torch.get_num_threads()
    vectors = {}
    for threads in (1, 2):
        threads_seen.clear()
        embedder = gemma_embed.Embedder(wide_text_model, device="cpu", dtype=dtype, cpu_threads=threads, batch_size=16)
        vectors[threads] = embedder.encode(TEXTS)
        assert set(threads_seen) == {threads} and len(threads_seen) > 1
        assert torch.get_num_threads() == caller  # the caller's count is back after each call
    assert (vectors[1] == vectors[2]).all()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: no thread to take away")
def test_a_busy_process_beside_the_run_takes_a_thread_away():
    cpus = os.sched_getaffinity(0)
    counts: list[int] = []
    # The busy process says when its loop begins; the span measured starts after that (at CpuThreads()).
    hog = subprocess.Popen(
        [sys.executable, "-c", "print('busy', flush=True)\nwhile True: pass"], stdout=subprocess.PIPE
    )
    try:
        os.sched_setaffinity(hog.pid, cpus)
        assert hog.stdout.readline() == b"busy\n"
        # The caller's count is every CPU of the affinity, so that one busy process must show as one fewer.
        threads = CpuThreads(get=lambda: counts[-1] if counts else len(cpus), set_=counts.append)
        with threads.running():
            threads.before_batch()  # nothing measured from a span this short
            # The measured span: at least min_span_s, this process idle, the busy one on a core of its own.
            time.sleep(2 * threads.min_span_s)
            chosen = threads.before_batch()
    finally:
        hog.kill()
        hog.wait()
    assert threads.others is not None and threads.others >= 0.8, threads.report()
    assert chosen <= len(cpus) - 1, threads.report()
    assert counts == [chosen, len(cpus)]  # set for the batch, then the caller's count given back
    assert f"of this process's {len(cpus)} CPUs" in threads.report()["reason"]
