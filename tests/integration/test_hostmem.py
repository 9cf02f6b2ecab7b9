"""memory.allocator: the CLI's allocator settings keep a CPU forward's activations out of fresh, page-faulted mmaps."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# In a fresh process (mallopt is process-wide): eight 64 MiB "activations" allocated, written and freed, as a
# forward's are, counted in minor page faults with the threshold pinned, outside and inside heap_only().
SCRIPT = """
import json, resource
import numpy as np
from gemma_embed.memory import allocator

np._core.multiarray._set_madvise_hugepage(False)  # 4 KiB pages, as torch allocates them

def faults(scope):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with scope():
        for _ in range(8):
            activation = np.ones(16 * 2**20, dtype=np.float32)
            del activation
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

import contextlib
import gemma_embed
configured = gemma_embed.configure_for_long_runs()  # the public name a Python caller uses
pinned, heap_only = faults(contextlib.nullcontext), faults(allocator.heap_only)

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

# Two forwards in a row, each trimmed at its end, then two inside one window (heap_kept), trimmed when it closes.
trimmed = faults(allocator.heap_only) + faults(allocator.heap_only)
with allocator.heap_kept():
    kept = faults(allocator.heap_only) + faults(allocator.heap_only)
    held = rss()
returned = held - rss()
print(json.dumps({"configured": configured, "pinned": pinned, "heap_only": heap_only, "trimmed": trimmed,
                  "kept": kept, "returned": returned}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_heap_only_reuses_freed_activations_instead_of_faulting_in_fresh_pages():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    counts = json.loads(proc.stdout)
    if not counts["configured"]:
        pytest.skip("no glibc mallopt here (e.g. musl)")
    block = 64 * 2**20 // 4096
    # Pinned, every 64 MiB block is a fresh mmap whose every page faults in.
    assert counts["pinned"] > 0.9 * 8 * block, counts
    # Inside heap_only() the first block grows the heap and the seven after it reuse it.
    assert counts["heap_only"] < 1.5 * block, counts


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_a_window_keeps_the_heap_its_forwards_grew_and_hands_it_back_when_done():
    """heap_kept() (a decode window): the second forward reuses the first one's pages instead of faulting them in
    again after a trim, and the pages go back to the OS when the window closes (peak RSS flat from window to window)."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    counts = json.loads(proc.stdout)
    if not counts["configured"]:
        pytest.skip("no glibc mallopt here (e.g. musl)")
    block = 64 * 2**20 // 4096
    # Trimmed after each forward, each forward grows the heap again: two blocks of faults.
    assert counts["trimmed"] > 1.8 * block, counts
    # Kept, the second forward faults nothing new.
    assert counts["kept"] < 1.2 * block, counts
    # Closing the window hands the block's pages back.
    assert counts["returned"] > 0.9 * 64 * 2**20, counts
