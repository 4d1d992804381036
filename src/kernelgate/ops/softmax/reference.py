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

    ``dx = y * (grad - sum(grad * y, dim))``, in ``grad.dtype``: PyTorch's own softmax backward (what
    autograd of :func:`torch.softmax` runs; it accumulates half precision in float32), so that the
    reference path of a backward costs what eager autograd's does: one native kernel, not five.

    >>> y = torch.tensor([0.5, 0.5]); softmax_backward_reference(torch.tensor([1.0, 0.0]), y).tolist()
    [0.25, -0.25]
    """
    return torch._softmax_backward_data(grad, y.to(grad.dtype), dim, grad.dtype)
