"""Softmax in plain PyTorch: the definition every softmax kernel is checked against."""

from __future__ import annotations

import torch


def softmax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``, as :func:`torch.softmax`; same shape and dtype as ``x``.

    Computed in float32 (float64 for float64 inputs): ``exp(x - max) / sum(exp(x - max))``.

    >>> softmax_reference(torch.tensor([0.0, 0.0])).tolist()
    [0.5, 0.5]
    """
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    shifted = x.to(compute) - x.to(compute).amax(dim=dim, keepdim=True)
    exp = shifted.exp()
    return (exp / exp.sum(dim=dim, keepdim=True)).to(x.dtype)
