"""The similarity functions of sentence-transformers (`SimilarityFunction`: cosine, dot, euclidean, manhattan), for
`Embedder.similarity` and `Embedder.similarity_pairwise`: the same inputs (numpy arrays, tensors, lists of either;
a 1-D vector is one row), the same float32 torch results, computed as `sentence_transformers.util` computes them
(tests/integration/test_sentence_transformers_face.py compares them)."""

from __future__ import annotations

from typing import Any

import torch

NAMES = ("cosine", "dot", "euclidean", "manhattan")
DEFAULT = "cosine"  # what a checkpoint that names none gets, as in sentence-transformers


def check_name(name: Any) -> str:
    """`name` as one of NAMES (an enum's value too); ValueError naming the choices otherwise."""
    value = getattr(name, "value", name)
    if value not in NAMES:
        raise ValueError(f"similarity_fn_name={value!r}: choose one of {', '.join(NAMES)}")
    return str(value)


def _tensor(values: Any) -> torch.Tensor:
    if isinstance(values, (list, tuple)):
        values = torch.stack([torch.as_tensor(v) for v in values]) if values else torch.zeros(0)
    tensor = torch.as_tensor(values)
    if tensor.is_floating_point() and torch.finfo(tensor.dtype).bits < 32:
        tensor = tensor.float()  # a float16 matmul would round scores into ties
    return tensor


def _rows(values: Any) -> torch.Tensor:
    tensor = _tensor(values)
    return tensor.unsqueeze(0) if tensor.dim() == 1 else tensor


def similarity(name: str, a: Any, b: Any) -> torch.Tensor:
    """[len(a), len(b)] scores of every vector of `a` against every vector of `b`."""
    a, b = _rows(a), _rows(b)
    if name == "cosine":
        a, b = torch.nn.functional.normalize(a, p=2, dim=-1), torch.nn.functional.normalize(b, p=2, dim=-1)
    if name in ("cosine", "dot"):
        return torch.mm(a, b.transpose(0, 1))
    return -torch.cdist(a, b, p=2.0 if name == "euclidean" else 1.0)


def similarity_pairwise(name: str, a: Any, b: Any) -> torch.Tensor:
    """[len(a)] scores of `a[i]` against `b[i]`."""
    a, b = _tensor(a), _tensor(b)
    if name == "cosine":
        a, b = torch.nn.functional.normalize(a, p=2, dim=-1), torch.nn.functional.normalize(b, p=2, dim=-1)
    if name in ("cosine", "dot"):
        return (a * b).sum(dim=-1)
    if name == "euclidean":
        return -torch.linalg.vector_norm(a - b, dim=-1)
    return -torch.sum(torch.abs(a - b), dim=-1)
