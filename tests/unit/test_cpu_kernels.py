"""The reproducibility controls asked for before the first product: which MKL branch has a strict mode for a CPU's
flags, a caller's own MKL_CBWR standing, and when oneDNN computes a half type in hardware (cpu_kernels.py)."""

from __future__ import annotations

import pytest

from gemma_embed import cpu_kernels
from gemma_embed.cpu_kernels import half_gemm_native, mkl_strict_branch, request_reproducible_gemm

AVX512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}


@pytest.mark.parametrize(
    ("flags", "branch"),
    [
        (AVX512 | {"avx512_bf16", "amx_bf16"}, "AVX512,STRICT"),
        (AVX512, "AVX512,STRICT"),
        ({"avx2", "fma", "avx512f"}, "AVX2,STRICT"),  # AVX-512 F alone (Knights Landing) is not MKL's AVX512 branch
        ({"avx2", "fma"}, "AVX2,STRICT"),
        ({"avx", "sse4_2"}, None),  # no branch with a strict mode
        (set(), None),
    ],
)
def test_the_widest_branch_with_a_strict_mode(flags, branch):
    assert mkl_strict_branch(flags) == branch


def test_a_callers_own_setting_stands_and_only_x86_is_asked(monkeypatch):
    environ = {"MKL_CBWR": "COMPATIBLE"}
    request_reproducible_gemm(environ, flags=AVX512)
    assert environ == {"MKL_CBWR": "COMPATIBLE"}
    monkeypatch.setattr(cpu_kernels, "_machine", lambda: "x86_64")
    environ = {}
    request_reproducible_gemm(environ, flags={"avx2", "fma"})
    assert environ == {"MKL_CBWR": "AVX2,STRICT"}
    monkeypatch.setattr(cpu_kernels, "_machine", lambda: "aarch64")
    environ = {}
    request_reproducible_gemm(environ, flags=AVX512)
    assert environ == {}


def test_the_first_processors_flags_are_read(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu avx512f\n")
    monkeypatch.setattr(cpu_kernels, "PROC_CPUINFO", cpuinfo)
    assert cpu_kernels.proc_cpuinfo_flags() == {"fpu", "avx2", "fma"}
    monkeypatch.setattr(cpu_kernels, "PROC_CPUINFO", tmp_path / "missing")
    assert cpu_kernels.proc_cpuinfo_flags() == set()


@pytest.mark.parametrize(
    ("dtype", "flags", "cap", "native"),
    [
        ("bfloat16", {"avx512_bf16"}, None, True),
        ("bfloat16", {"amx_bf16"}, "ALL", True),
        ("bfloat16", {"avx512_bf16"}, "AVX512_CORE", False),  # an Intel Xeon without bf16, as forced in tests
        ("bfloat16", {"avx512_bf16"}, "avx512_core_bf16", True),
        ("bfloat16", {"avx512_bf16"}, "AVX2", False),
        ("bfloat16", AVX512, None, False),  # emulated
        ("float16", {"avx512_bf16"}, None, False),
        ("float16", {"avx512_fp16"}, "AVX10_1_512", True),
        ("float16", {"avx512_fp16"}, "AVX512_CORE_BF16", False),
        ("float32", AVX512, None, False),
    ],
)
def test_a_half_type_is_native_only_with_its_instructions_under_onednns_cap(dtype, flags, cap, native):
    assert half_gemm_native(dtype, flags, cap) is native
