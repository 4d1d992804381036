"""Softmax in plain PyTorch: the definition every softmax kernel is checked against."""

from __future__ import annotations

import torch


def softmax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``: ``exp(x - max) / sum(exp(x - max))``; same shape and dtype as ``x``.

    Exactly :func:`torch.softmax`, which also makes the fallback path as fast as plain PyTorch.

    >>> softmax_reference(torch.tensor([0.0, 0.0])).tolist()
    [0.5, 0.5]
    """
    return torch.softmax(x, dim)


def softmax_backward_reference(grad: torch.Tensor, y: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The gradient of softmax with respect to its input, given the output ``y`` and ``grad`` of ``y``.

    ``dx = y * (grad - sum(grad * y, dim))``, computed in float32 (float64 for float64), returned in
    ``grad.dtype``.

    >>> y = torch.tensor([0.5, 0.5]); softmax_backward_reference(torch.tensor([1.0, 0.0]), y).tolist()
    [0.25, -0.25]
    """
    compute = torch.float64 if grad.dtype == torch.float64 else torch.float32
    g, yc = grad.to(compute), y.to(compute)
    return (yc * (g - (g * yc).sum(dim=dim, keepdim=True))).to(grad.dtype)
