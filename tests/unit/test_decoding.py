"""The decode stage's threads: torch ops they run use one intra-op thread, and the caller's count is untouched."""

from __future__ import annotations

import threading

import torch

from gemma_embed.decoding import prepared_stream
from gemma_embed.sources import Source


class CountingModality:
    """Records how many intra-op threads torch gives the thread that decodes, then fails the item (a record)."""

    def __init__(self):
        self.seen: list[int] = []
        self.preparer = None

    def decode(self, content):
        self.seen.append(torch.get_num_threads())
        raise ValueError("not media")


def test_decode_threads_run_torch_on_one_thread_and_the_encoders_count_is_kept():
    before = torch.get_num_threads()
    modality = CountingModality()
    sources = [Source(key=f"k{i}", path="", data=b"x") for i in range(6)]
    windows = list(prepared_stream(modality, sources, workers=2, window_items=4, overlap=False))
    assert sum(len(w) for w in windows) == 6 and all(p.error is not None for w in windows for p in w)
    assert modality.seen == [1] * 6  # OpenMP teams per decode thread slowed CPU forwards by ~40% (decoding.py)
    assert torch.get_num_threads() == before
    later: list[int] = []
    thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert later == [before]  # the default a new thread takes is the process's again
