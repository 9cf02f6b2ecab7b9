"""Device and dtype choice, with fake GPUs: bf16 only where this GPU computes it natively; one GPU per rank."""

from __future__ import annotations

import contextlib

import pytest
import torch

from gemma_embed.device import resolve_device, resolve_dtype, use_device
from gemma_embed.errors import UsageError


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two fake CUDA devices: 0 is a T4 (compute 7.5: bf16 only emulated), 1 an A100 (compute 8.0). Records which
    device is current when torch asks, and every set_device."""
    state = {"current": 0, "asked": [], "set": []}

    @contextlib.contextmanager
    def device(dev):
        previous, state["current"] = state["current"], torch.device(dev).index
        try:
            yield
        finally:
            state["current"] = previous

    def is_bf16_supported(including_emulation: bool = True):
        state["asked"].append((state["current"], including_emulation))
        return state["current"] == 1 or including_emulation  # torch's own answer for these two GPUs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: state["set"].append(torch.device(dev)))
    return state


def test_auto_dtype_is_bf16_only_where_the_chosen_gpu_computes_it_natively(fake_gpus):
    assert resolve_dtype("auto", torch.device("cuda", 0)) == torch.float32  # the T4 only emulates bf16
    assert resolve_dtype("auto", torch.device("cuda", 1)) == torch.bfloat16
    # Asked about each chosen device (not whichever is current), never counting emulation.
    assert fake_gpus["asked"] == [(0, False), (1, False)]
    assert resolve_dtype("bfloat16", torch.device("cuda", 0)) == torch.bfloat16  # an explicit choice is obeyed
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32


def test_each_rank_gets_and_activates_its_own_gpu(fake_gpus):
    assert resolve_device("auto", local_rank=0) == torch.device("cuda", 0)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("auto", local_rank=3) == torch.device("cuda", 1)  # more ranks than GPUs: shared
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda:0", local_rank=1) == torch.device("cuda", 0)  # an explicit index is obeyed
    with pytest.raises(UsageError, match="only 2 CUDA device"):
        resolve_device("cuda:2")
    use_device(resolve_device("auto", local_rank=1))
    use_device(torch.device("cpu"))  # nothing to activate
    assert fake_gpus["set"] == [torch.device("cuda", 1)]
