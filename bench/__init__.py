"""Benchmarks, run as `python -m bench.NAME` from the repository root (see bench/README.md).

The samples' and tests' helper modules (checkpoint builders, media writers) are importable by every bench.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for folder in ("samples", "tests"):
    if str(ROOT / folder) not in sys.path:
        sys.path.insert(0, str(ROOT / folder))
