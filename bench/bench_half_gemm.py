"""What a bf16 product costs by each route on this CPU, at a release-size MLP shape (768 -> 3072), 2 threads:
oneDNN's own kernel (bf16 instructions where the CPU has them, else its emulation), the route numerics.py takes
where the CPU has none (float32 through MKL's strict GEMM, rounded once), and ATen's own bf16 GEMM (oneDNN off).

    python -m bench.bench_half_gemm [--rows 16,256,2048]

Each route runs in a fresh process under `ONEDNN_MAX_CPU_ISA` as given (AVX512_CORE: an Intel Xeon without bf16,
as the tests force it), with MKL's strict mode as gemma_embed asks for it; the best of 3 timings of 10 calls each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench.common import cpu_name, emit

CHILD = r"""
import json, sys, time
import gemma_embed  # MKL's strict mode, as a run has it
import torch
import torch.nn.functional as F
torch.set_num_threads(2)
rows = [int(r) for r in sys.argv[1].split(",")]

def best(fn, n=10):
    fn(); fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n)
    return round(min(times) * 1e3, 2)

out = {}
w = torch.randn(3072, 768).bfloat16()
for m in rows:
    x = torch.randn(m, 768).bfloat16()
    found = {"oneDNN": best(lambda: F.linear(x, w))}
    found["float32 route"] = best(lambda: F.linear(x.float(), w.float()).bfloat16())
    with torch.backends.mkldnn.flags(enabled=False):
        found["ATen (oneDNN off)"] = best(lambda: F.linear(x, w), n=2)
    out[m] = found
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="16,256,2048")
    args = parser.parse_args()
    emit({"cpu": cpu_name(), "shape": "rows x 768 -> 3072, bf16, 2 threads", "unit": "ms a call"})
    for cap in ("", "AVX512_CORE"):
        env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "MKL_CBWR")}
        if cap:
            env["ONEDNN_MAX_CPU_ISA"] = cap
        proc = subprocess.run([sys.executable, "-c", CHILD, args.rows], env=env, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-2000:])
        emit({"ONEDNN_MAX_CPU_ISA": cap or "(this CPU's)", "ms": json.loads(proc.stdout.strip().splitlines()[-1])})


if __name__ == "__main__":
    main()
