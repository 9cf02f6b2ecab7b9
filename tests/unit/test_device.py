"""Device and dtype choice, with fake hardware: --dtype auto is the checkpoint's dtype where the device computes it
natively (GPUs asked through torch, CPUs by their bf16 instruction flags), else float32; one GPU per rank."""

from __future__ import annotations

import contextlib

import pytest
import torch

from gemma_embed import device as device_module
from gemma_embed.cpu_kernels import cpuinfo_flags
from gemma_embed.device import (
    choose_dtype,
    cpu_bf16_units,
    cpu_capabilities,
    resolve_device,
    resolve_dtype,
    use_device,
)
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
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev: ("Tesla T4", "NVIDIA A100")[torch.device(dev).index])
    return state


def test_auto_dtype_is_bf16_only_where_the_chosen_gpu_computes_it_natively(fake_gpus):
    bf16 = torch.bfloat16
    assert resolve_dtype("auto", torch.device("cuda", 0), bf16) == torch.float32  # the T4 only emulates bf16
    assert resolve_dtype("auto", torch.device("cuda", 1), bf16) == torch.bfloat16
    # Asked about each chosen device (not whichever is current), never counting emulation.
    assert fake_gpus["asked"] == [(0, False), (1, False)]
    assert resolve_dtype("bfloat16", torch.device("cuda", 0)) == torch.bfloat16  # an explicit choice is obeyed
    assert resolve_dtype("auto", torch.device("cuda", 1), torch.float32) == torch.float32  # a float32 checkpoint
    t4, a100 = choose_dtype("auto", torch.device("cuda", 0), bf16), choose_dtype("auto", torch.device("cuda", 1), bf16)
    assert "Tesla T4 only emulates bf16, so float32" in t4.reason
    assert "NVIDIA A100 computes bf16 natively" in a100.reason


AMX_CPU = {"avx512_f": True, "amx_tile": True, "amx_bf16": True, "avx512_bf16": True, "architecture": "x86_64"}
AVX512_CPU = {"avx512_f": True, "amx_tile": False, "amx_bf16": False, "avx512_bf16": False, "architecture": "x86_64"}


@pytest.fixture
def cpu_reports(monkeypatch):
    """Make torch's CPU query answer with the given flags."""

    def report(capabilities):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: dict(capabilities))

    return report


def test_cpu_bf16_units_are_read_from_torchs_hardware_query(cpu_reports):
    cpu_reports(AMX_CPU)
    assert cpu_bf16_units() == ("amx_bf16", "avx512_bf16")
    cpu_reports({**AVX512_CPU, "avx512_bf16": True})  # Cooper Lake, Zen 4: bf16 dot products without AMX
    assert cpu_bf16_units() == ("avx512_bf16",)
    cpu_reports(AVX512_CPU)  # AVX-512 alone computes bf16 by converting to float32 and back
    assert cpu_bf16_units() == ()


def test_cpu_bf16_units_fall_back_to_proc_cpuinfo(monkeypatch, tmp_path):
    """Where torch has no CPU query, the kernel's flags: both answers, and none without the file."""
    monkeypatch.delattr(torch.cpu, "get_capabilities")
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(device_module, "PROC_CPUINFO", cpuinfo)
    head = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n"
    cpuinfo.write_text(head + "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n\nprocessor\t: 1\n")
    assert cpu_bf16_units() == ("amx_bf16", "avx512_bf16")
    cpuinfo.write_text(head + "flags\t\t: fpu sse avx2 avx512f avx512bw\n")
    assert cpu_bf16_units() == ()
    cpuinfo.unlink()
    assert cpu_capabilities() == {} and cpu_bf16_units() == ()
    assert cpuinfo_flags("Features\t: fp asimd bf16 i8mm\n") == {"fp", "asimd", "bf16", "i8mm"}  # Arm's name


@pytest.mark.parametrize(
    ("cpu", "stored", "requested", "expected", "says"),
    [
        (AMX_CPU, torch.bfloat16, "auto", torch.bfloat16, "stores bfloat16 (config) and this CPU has bf16 matrix"),
        (AVX512_CPU, torch.bfloat16, "auto", torch.float32, "this CPU has no bf16 matrix instructions"),
        (AMX_CPU, torch.float32, "auto", torch.float32, "stores float32 (config), so float32"),
        (AMX_CPU, torch.float16, "auto", torch.float32, "float16 is opt-in (--dtype float16), so float32"),
        (AMX_CPU, None, "auto", torch.float32, "names no dtype, so float32"),
        (AVX512_CPU, torch.bfloat16, "bfloat16", torch.bfloat16, "--dtype bfloat16"),
        (AMX_CPU, torch.bfloat16, "float32", torch.float32, "--dtype float32"),
        (AMX_CPU, torch.bfloat16, "float16", torch.float16, "--dtype float16"),
    ],
)
def test_dtype_policy_on_the_cpu(cpu_reports, cpu, stored, requested, expected, says):
    cpu_reports(cpu)
    choice = choose_dtype(requested, torch.device("cpu"), stored, "config" if stored else "")
    assert choice.dtype == expected and says in choice.reason, choice
    assert choice.name == str(expected).removeprefix("torch.")


def test_auto_dtype_elsewhere_is_float32():
    assert choose_dtype("auto", torch.device("mps"), torch.bfloat16).dtype == torch.float32


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
