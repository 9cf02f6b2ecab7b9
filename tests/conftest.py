"""Shared fixtures: tiny random checkpoints saved with save_pretrained, real image files, the reference model.

Helpers live in `helpers.py`; torch is imported inside the fixtures that need it, so a test file of pure
functions runs without importing it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# Two test workers share two cores, and each worker (and each command it starts) computes with two threads: an
# OpenMP thread that waits for its partner spins on a core the other worker needs. Waiting threads sleep instead
# (GNU OpenMP reads this when torch loads it, so before any import of torch): the suite went from 475 s to 392 s
# (687 s to 525 s of user CPU). It changes no number a test compares (the threads' work is the same), only who
# holds the core while waiting. The command itself needs no such setting: --cpu-threads auto drops to one thread
# when other work holds the cores (two runs side by side took 11.5 s either way, 30.6 s against 12.3 s at a fixed
# --cpu-threads 2).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# scikit-learn and joblib set these two with setdefault when imported (sentence-transformers imports scikit-learn).
# A test that imports it after the warm command server started (tests/warm_cli.py) would give every later run an
# environment that differs from the server's in variables it compares, and every run would start anew. The full
# suite hid this while test_sentence_transformers_face.py imported it at collection (it now does so in a fixture).
# A subset without that file did not hide it: test_text_limits.py then test_warm_cli.py failed 5 tests. So the
# session sets them first, to the same values.
os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "True")
os.environ.setdefault("KMP_INIT_AT_FORK", "FALSE")

import pytest  # noqa: E402
from helpers import IMAGE_SIZES, write_image  # noqa: E402
from suite_order import suite_order  # noqa: E402

# The user's cache folder (XDG_CACHE_HOME) is one of the session's own: the tuner keeps its state there between
# runs (--tuning-cache auto), and a test must neither read what another session kept nor leave anything behind.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="gemma-embed-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: the files in `suite_order`'s order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Long test files first (`suite_order`). Tests marked `gpu` need a CUDA device: skipped without one
    (bench/gpu_check.sh runs them where there is)."""
    items[:] = suite_order(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device (run bench/gpu_check.sh on a GPU machine)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def warm_cli(request, tmp_path_factory):
    """One server per pytest process that forks the command for the tests' `EXE` (tests/warm_cli.py), started
    when the session runs a test outside tests/unit (the unit subset starts no command). Its socket listens from
    here on: a run while the server still imports waits for it."""
    from warm_cli import NO_SERVER_VARIABLE, SOCKET_VARIABLE, warm_server

    if os.environ.get(NO_SERVER_VARIABLE) or all(
        Path(str(item.fspath)).parent.name == "unit" for item in request.session.items
    ):
        yield
        return
    with warm_server(tmp_path_factory.mktemp("warm-cli")) as socket_path:
        os.environ[SOCKET_VARIABLE] = str(socket_path)
        yield
        os.environ.pop(SOCKET_VARIABLE, None)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """The device an equivalence test runs the tool and transformers' reference on: the CPU always, CUDA as the
    `gpu`-marked variant (`pytest -m gpu`)."""
    return request.param


@pytest.fixture
def fake_tower():
    """Makes towers with no weights (helpers.FakeTower), for engine and batching tests:
    `fake_tower()`, `fake_tower(grouping="ragged")`, `fake_tower(device_memory=fake_cuda, actual=2.5)`."""
    from helpers import FakeTower

    return FakeTower


@pytest.fixture(scope="session")
def gemma4_dir(tmp_path_factory) -> Path:
    """A single-file Gemma 4 checkpoint (vision + audio) with processor_config.json, seed 1."""
    from make_tiny_checkpoint import build_gemma4

    return build_gemma4(tmp_path_factory.mktemp("ckpt") / "g4", seed=1)


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    for seed, (name, (w, h)) in enumerate(IMAGE_SIZES.items()):
        write_image(folder / name, w, h, seed)
    return folder


@pytest.fixture(scope="session")
def reference_model(gemma4_dir):
    import torch
    from transformers import Gemma4ForConditionalGeneration

    return Gemma4ForConditionalGeneration.from_pretrained(gemma4_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def reference_processor(gemma4_dir):
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(gemma4_dir)
