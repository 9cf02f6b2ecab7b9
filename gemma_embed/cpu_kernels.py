"""The CPU's matrix-product libraries and their reproducibility controls, asked for before the first product.

torch's float32 GEMMs on x86 are MKL's. MKL's default kernels change the last bits of a product with the thread
count (they may split the sum over K between threads) and, on another maker's CPU, with the rules its dispatcher
applies there: a row-padding rule measured on one AMD EPYC held there and failed on an Intel Xeon (issue 46).
MKL's own control for this is its *strict conditional numerical reproducibility* mode, `MKL_CBWR=<branch>,STRICT`:
?gemm gives the same bytes at any thread count on the AVX2 and AVX-512 branches (Intel's oneMKL developer guide,
"Reproducibility Conditions"). On an Intel CPU the branch is the one named; on another maker's MKL takes its AUTO
branch for either name and keeps STRICT. Measured with torch 2.14.1's MKL 2024.2:
- AMD EPYC (Zen 4, avx512_bf16), `MKL_CBWR=AVX512,STRICT` (MKL_VERBOSE: `CNR:AUTO,STRICT`): every row of 29 row
  counts x 5 shapes the same at 1, 2, 3, 4, 8 and 16 threads; without it rows 5-7 and 9-11 differed at 2 threads;
- Intel Xeon (AVX-512 VNNI, no AMX, no avx512_bf16), from the issue: threads 1 and 2 the same on the samples with
  `AVX512,STRICT` and with `AVX2,STRICT`; 73 of 1810 rows differed without; `COMPATIBLE` (no strict branch) did not
  help (1298 rows).
The variable is read at MKL's first call, so `request_reproducible_gemm` sets it when `gemma_embed` is imported
(before a caller's model does any product), unless the caller set it: their choice stands, and the output's
header says which mode ran (`numerics.kernels`). A CPU without AVX2 has no strict branch: its products may change
with the thread count, and the header says so.

bf16 and float16 products go to oneDNN (not MKL), which has no such control on the CPU (torch's
`backends.mkldnn.deterministic` reaches only Intel GPUs' primitives: measured, no change). With bf16 instructions
(avx512_bf16, amx_bf16) its brgemm kernels gave the same bytes at 1-16 threads here; without them (oneDNN's
`gemm:jit:bf16`, an Intel Xeon with AVX-512 but no bf16, forced here with `ONEDNN_MAX_CPU_ISA=AVX512_CORE`) rows
differed at 2 threads. There `numerics` computes such a product in float32 through MKL's strict GEMM, which is also
faster than the emulation (bench/README.md). `half_gemm_native` decides which.

Nothing here imports torch: `import gemma_embed` stays instant.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

PROC_CPUINFO = Path("/proc/cpuinfo")
MKL_CBWR = "MKL_CBWR"
# The flags of MKL's AVX-512 branch (Skylake-X and later: F, BW, VL and DQ, as oneDNN's avx512_core).
AVX512_CORE_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
# oneDNN's CPU ISAs in order (`ONEDNN_MAX_CPU_ISA`'s values); bf16 runs in hardware from AVX512_CORE_BF16 on, fp16
# from AVX512_CORE_FP16 (AVX10_1_512) on. A cap below that makes oneDNN emulate the type, as a CPU without it does.
ONEDNN_ISAS = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX512_CORE_FP16",
    "AVX10_1_512_AMX",
    "AVX512_CORE_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX512_CORE_AMX_FP16",
    "AVX10_2_512",
    "AVX10_2_512_AMX_2",
)
HALF_NATIVE = {
    # dtype name: (the CPU flags that compute it in hardware, the lowest oneDNN ISA that uses them)
    "bfloat16": (("avx512_bf16", "amx_bf16"), "AVX512_CORE_BF16"),
    "float16": (("avx512_fp16", "amx_fp16"), "AVX10_1_512"),
}


def cpuinfo_flags(text: str) -> set[str]:
    """The flags /proc/cpuinfo lists for its first processor (x86 `flags`, Arm `Features`)."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def proc_cpuinfo_flags() -> set[str]:
    """The kernel's flags for the first processor; none where /proc/cpuinfo is missing."""
    try:
        with PROC_CPUINFO.open(errors="replace") as fh:
            head = []
            for line in fh:  # the first processor's block only (a large machine lists hundreds)
                if not line.strip():
                    break
                head.append(line)
    except OSError:
        return set()
    return cpuinfo_flags("".join(head))


def mkl_strict_branch(flags: set[str] | frozenset[str]) -> str | None:
    """The `MKL_CBWR` value that makes MKL's GEMMs independent of the thread count on a CPU with these flags:
    the widest branch with a strict mode (AVX-512, else AVX2); None without AVX2 (no branch has one)."""
    if AVX512_CORE_FLAGS <= flags:
        return "AVX512,STRICT"
    if "avx2" in flags and "fma" in flags:
        return "AVX2,STRICT"
    return None


def request_reproducible_gemm(environ: MutableMapping[str, str] | None = None, flags: set[str] | None = None) -> None:
    """Ask MKL for its strict mode (`mkl_strict_branch`) unless `MKL_CBWR` is set already; only on x86-64, where
    torch's GEMMs are MKL's. Takes effect only where MKL has not run yet in this process."""
    environ = os.environ if environ is None else environ
    if MKL_CBWR in environ or _machine().lower() not in ("x86_64", "amd64"):
        return
    branch = mkl_strict_branch(proc_cpuinfo_flags() if flags is None else flags)
    if branch is not None:
        environ[MKL_CBWR] = branch


def _machine() -> str:
    """The processor architecture (`platform.machine()`'s answer without importing platform: 1.5 ms)."""
    uname = getattr(os, "uname", None)
    return uname().machine if uname is not None else os.environ.get("PROCESSOR_ARCHITECTURE", "")


def half_gemm_native(dtype_name: str, flags: set[str] | frozenset[str], onednn_cap: str | None) -> bool:
    """Whether oneDNN computes a `dtype_name` (bfloat16, float16) product with the CPU's own instructions for it,
    given the CPU's flags and `ONEDNN_MAX_CPU_ISA` (None: no cap). False for float32 and other types."""
    if dtype_name not in HALF_NATIVE:
        return False
    units, lowest = HALF_NATIVE[dtype_name]
    if not any(unit in flags for unit in units):
        return False
    cap = (onednn_cap or "").upper()
    if cap in ("", "ALL", "DEFAULT") or cap not in ONEDNN_ISAS:
        return True
    return ONEDNN_ISAS.index(cap) >= ONEDNN_ISAS.index(lowest)
