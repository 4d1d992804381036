"""RMS normalisation in plain PyTorch: the definition every rms_norm kernel is checked against."""

from __future__ import annotations

import torch


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    """Normalise ``x`` over its last dimension by its root mean square, then scale by ``weight``.

    ``y = x / sqrt(mean(x**2, -1) + eps) * weight``: exactly
    :func:`torch.nn.functional.rms_norm` with ``normalized_shape=(x.shape[-1],)``, returned in
    ``x.dtype``.

    Args:
        x: ``(..., N)``.
        weight: ``(N,)`` or ``None``.
        eps: added to the mean square, ``>= 0``.

    >>> rms_norm_reference(torch.tensor([3.0, 4.0]), None, eps=0.0).tolist()
    [0.8485281467437744, 1.1313709020614624]
    """
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def rms_norm_backward_reference(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`rms_norm_reference` with respect to ``x`` and ``weight``.

    With ``rstd = 1 / sqrt(mean(x**2, -1) + eps)``, ``xhat = x * rstd`` and ``g = grad * weight``:
    ``dx = rstd * (g - xhat * mean(g * xhat, -1))`` and ``dweight = sum(grad * xhat)`` over all rows.
    Computed in float32 (float64 for float64). Returns ``(dx, dweight)``; ``dweight`` is empty
    when ``weight`` is ``None``.

    >>> dx, dw = rms_norm_backward_reference(torch.ones(1, 2), torch.tensor([[3.0, 4.0]]), None, 0.0)
    >>> [round(v, 4) for v in dx[0].tolist()], dw.shape
    ([0.0453, -0.0339], torch.Size([0]))
    """
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xc, gc = x.to(compute), grad.to(compute)
    rstd = torch.rsqrt(xc.square().mean(dim=-1, keepdim=True) + eps)
    xhat = xc * rstd
    g = gc * weight.to(compute) if weight is not None else gc
    dx = rstd * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    if weight is None:
        return dx.to(x.dtype), x.new_empty(0)
    dw = (gc * xhat).reshape(-1, x.shape[-1]).sum(dim=0)
    return dx.to(x.dtype), dw.to(weight.dtype)
