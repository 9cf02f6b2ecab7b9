"""bench/gpu_check.sh, the script for what only a GPU can show: its dry run says what each section measures, and
its memory section's Python runs (here on the CPU, tiny) so it cannot rot between GPU runs."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import ROOT

SCRIPT = ROOT / "bench" / "gpu_check.sh"


def test_dry_run_says_what_each_section_measures():
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for section in ("[device]", "[equivalence]", "[memory]", "[release]"):
        assert section in proc.stdout
    promises = ("including_emulation=False", "pytest -m gpu", "bit-identical", "chunk the tuner chose", "budget")
    for promise in (*promises, "bare tower"):
        assert promise in proc.stdout, promise
    only = subprocess.run(["bash", str(SCRIPT), "--dry-run", "memory"], capture_output=True, text=True, timeout=60)
    assert "[memory]" in only.stdout and "[device]" not in only.stdout
    unknown = subprocess.run(["bash", str(SCRIPT), "nonsense"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "no section 'nonsense'" in unknown.stderr


def test_memory_section_runs_on_a_tiny_tower():
    command = [sys.executable, "-m", "bench.gpu_memory", "--device", "cpu", "--images", "4", "--budgets", "70"]
    command += ["--vision-hidden", "64", "--vision-layers", "1"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## 70 soft tokens: 4 images" in proc.stdout
    assert "run peak device memory n/a" in proc.stdout  # the CPU keeps no allocator statistics
    assert "every chunk stayed within its planned budget" in proc.stdout
