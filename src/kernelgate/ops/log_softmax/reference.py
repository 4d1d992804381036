"""Log-softmax in plain PyTorch: the definition every log_softmax kernel is checked against."""

from __future__ import annotations

import torch


def log_softmax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Log-softmax of ``x`` along ``dim``: ``x - max - log(sum(exp(x - max)))``; same shape and dtype as ``x``.

    :func:`torch.log_softmax`, which also makes the fallback path as fast as plain PyTorch; the result
    is contiguous. A row of only ``-inf`` gives NaN, and a row holding ``+inf`` or NaN gives NaN
    throughout, as in torch.

    float16 and bfloat16 tensors on the CPU are computed in float32 and rounded once, as torch's GPU
    kernel computes them: torch's CPU kernel rounds ``max + log(sum)`` to the 16-bit dtype before
    subtracting it, which leaves results near 0 with up to 40 % relative error.

    >>> log_softmax_reference(torch.tensor([0.0, 0.0])).tolist()
    [-0.6931471824645996, -0.6931471824645996]
    """
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
        return torch.log_softmax(x, dim, dtype=torch.float32).to(x.dtype)
    return torch.log_softmax(x, dim)


def log_softmax_backward_reference(grad: torch.Tensor, y: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The gradient of log-softmax with respect to its input, given the output ``y`` and ``grad`` of ``y``.

    ``dx = grad - exp(y) * sum(grad, dim)``, contiguous, in ``grad.dtype``: PyTorch's own log-softmax
    backward (what autograd of :func:`torch.log_softmax` runs; it accumulates half precision in
    float32), so that the reference path of a backward costs what eager autograd's does.

    >>> y = torch.tensor([0.5, 0.5]).log(); log_softmax_backward_reference(torch.tensor([1.0, 0.0]), y).tolist()
    [0.5, -0.5]
    """
    return torch._log_softmax_backward_data(grad, y.to(grad.dtype), dim, grad.dtype).contiguous()
