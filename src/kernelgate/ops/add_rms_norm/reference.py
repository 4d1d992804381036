"""Residual add then RMS normalisation in plain PyTorch: the definition every add_rms_norm kernel is checked against."""

from __future__ import annotations

import torch


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add ``residual`` to ``x``, then normalise the sum over its last dimension by its root mean square.

    ``s = x + residual`` as torch adds them (rounded to the promoted dtype of ``x`` and
    ``residual``), and ``y = rms_norm(s, weight, eps)`` computed from that rounded ``s``: exactly
    ``torch.nn.functional.rms_norm(x + residual, (N,), weight, eps)``. Returns ``(y, s)``: the
    normalised sum and the sum itself (the pre-norm residual stream of a transformer block).

    Args:
        x: ``(..., N)``.
        residual: the shape of ``x``.
        weight: ``(N,)`` or ``None``.
        eps: added to the mean square, ``>= 0``.

    >>> y, s = add_rms_norm_reference(torch.tensor([1.0, 2.0]), torch.tensor([2.0, 2.0]), None, eps=0.0)
    >>> y.tolist(), s.tolist()
    ([0.8485281467437744, 1.1313709020614624], [3.0, 4.0])
    """
    s = x + residual
    return torch.nn.functional.rms_norm(s, (s.shape[-1],), weight, eps), s


def add_rms_norm_backward_reference(
    grad: torch.Tensor, grad_s: torch.Tensor | None, s: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`add_rms_norm_reference` with respect to ``x`` (equal to that of ``residual``) and ``weight``.

    ``grad`` is the gradient of ``y``, ``grad_s`` that of ``s`` (``None`` when ``s`` was not used).
    With ``rstd = 1 / sqrt(mean(s**2, -1) + eps)``, ``shat = s * rstd`` and ``g = grad * weight``:
    ``dx = grad_s + rstd * (g - shat * mean(g * shat, -1))`` and ``dweight = sum(grad * shat)`` over
    all rows. Computed in float32 (float64 for float64) and rounded once, to ``s.dtype``. Returns
    ``(dx, dweight)``; ``dweight`` is empty when ``weight`` is ``None``.

    >>> s = torch.tensor([[3.0, 4.0]])
    >>> dx, dw = add_rms_norm_backward_reference(torch.ones(1, 2), torch.ones(1, 2), s, None, 0.0)
    >>> [round(v, 4) for v in dx[0].tolist()], dw.shape
    ([1.0453, 0.9661], torch.Size([0]))
    """
    compute = torch.float64 if s.dtype == torch.float64 else torch.float32
    sc, gc = s.to(compute), grad.to(compute)
    rstd = torch.rsqrt(sc.square().mean(dim=-1, keepdim=True) + eps)
    shat = sc * rstd
    g = gc * weight.to(compute) if weight is not None else gc
    dx = rstd * (g - shat * (g * shat).mean(dim=-1, keepdim=True))
    if grad_s is not None:
        dx = dx + grad_s.to(compute)
    if weight is None:
        return dx.to(s.dtype), s.new_empty(0)
    dw = (gc * shat).reshape(-1, s.shape[-1]).sum(dim=0)
    return dx.to(s.dtype), dw.to(weight.dtype)
