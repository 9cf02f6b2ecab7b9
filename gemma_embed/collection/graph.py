"""Connected components of a graph given as a stream of edges, in bounded memory (scipy's `connected_components`).

A scan of a collection can find far more pairs than items (a thousand copies of one image are half a million
pairs), so edges are not all kept: when the buffer holds `limit` of them, the components so far are computed and
the buffer is replaced by one edge per item to its component's first item, which joins the same items.
"""

from __future__ import annotations

import numpy as np

EDGE_LIMIT = 8_000_000  # 128 MB of int64 pairs before the buffer is folded into components


class Components:
    """Items 0..n-1 joined by the edges `add`ed; `labels()` numbers each item's component by its first item."""

    def __init__(self, count: int, limit: int = EDGE_LIMIT):
        self.count = count
        self.limit = limit
        self._first = np.arange(count, dtype=np.int64)  # each item's component's first item, as of the last fold
        self._left: list[np.ndarray] = []
        self._right: list[np.ndarray] = []
        self._held = 0

    def add(self, left: np.ndarray, right: np.ndarray) -> None:
        if not len(left):
            return
        self._left.append(np.asarray(left, np.int64))
        self._right.append(np.asarray(right, np.int64))
        self._held += len(left)
        if self._held >= self.limit:
            self._fold()

    def _fold(self) -> None:
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        moved = np.flatnonzero(self._first != np.arange(self.count))
        left = np.concatenate([*self._left, moved])
        right = np.concatenate([*self._right, self._first[moved]])
        self._left, self._right, self._held = [], [], 0
        graph = coo_matrix((np.ones(len(left), np.int8), (left, right)), shape=(self.count, self.count))
        _, labels = connected_components(graph, directed=False)
        # a component's number -> its first item (the smallest index with that label)
        first = np.full(labels.max() + 1 if len(labels) else 0, self.count, np.int64)
        np.minimum.at(first, labels, np.arange(self.count, dtype=np.int64))
        self._first = first[labels]

    def labels(self) -> np.ndarray:
        """int64 [n]: each item's component, as the index of its first item."""
        if self._held or not self.count:
            self._fold()
        return self._first
