"""Layer normalisation in plain PyTorch: the definition every layer_norm kernel is checked against."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kernelgate.errors import InputValueError


def check_affine(
    op: str, normalized_shape: Sequence[int], weight: torch.Tensor | None, bias: torch.Tensor | None
) -> None:
    """Raise :class:`~kernelgate.InputValueError` unless ``weight`` and ``bias`` (when given) have ``normalized_shape``.

    The contract checks ``normalized_shape`` against ``x``; this is the part it cannot express (a
    tensor's whole shape equal to a list argument). Reads shapes only.
    """
    want = tuple(normalized_shape)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != want:
            raise InputValueError(
                f"{op}(): argument {name!r} must have the shape normalized_shape = {want}; got {tuple(t.shape)}. "
                f"Pass a {name} of that shape (torch.nn.LayerNorm(normalized_shape) holds one), or None."
            )


def layer_norm_reference(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Normalise ``x`` to zero mean and unit variance over its trailing ``normalized_shape`` dims, then scale and shift.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias``, mean and (biased) variance taken over the
    last ``len(normalized_shape)`` dimensions together: exactly
    :func:`torch.nn.functional.layer_norm`, returned in ``x.dtype``.

    Args:
        x: ``(..., *normalized_shape)``.
        normalized_shape: the trailing sizes of ``x`` to normalise over, e.g. ``(N,)``.
        weight, bias: of shape ``normalized_shape``, or ``None``.
        eps: added to the variance, ``>= 0``.

    >>> layer_norm_reference(torch.tensor([1.0, 3.0]), (2,), eps=0.0).tolist()
    [-1.0, 1.0]
    """
    check_affine("layer_norm", normalized_shape, weight, bias)
    return torch.nn.functional.layer_norm(x, list(normalized_shape), weight, bias, eps)


def layer_norm_backward_reference(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`layer_norm_reference` with respect to ``x``, ``weight`` and ``bias``.

    Over the normalised dims, with ``rstd = 1 / sqrt(var(x) + eps)``, ``xhat = (x - mean(x)) * rstd``
    and ``g = grad * weight``: ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``; over all
    leading positions, ``dweight = sum(grad * xhat)`` and ``dbias = sum(grad)``. Computed in float32
    (float64 for float64). Returns ``(dx, dweight, dbias)``; ``dweight`` (``dbias``) is empty when
    ``weight`` (``bias``) is ``None``. ``bias`` is read for its presence and dtype only.

    >>> dx, dw, db = layer_norm_backward_reference(
    ...     torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 3.0]]), (2,), None, torch.zeros(2), 0.0)
    >>> dx.tolist(), dw.shape, db.tolist()
    ([[0.0, 0.0]], torch.Size([0]), [1.0, 0.0])
    """
    check_affine("layer_norm_backward", normalized_shape, weight, bias)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    dims = tuple(range(-len(normalized_shape), 0))
    xc, gc = x.to(compute), grad.to(compute)
    mean = xc.mean(dim=dims, keepdim=True)
    rstd = torch.rsqrt((xc - mean).square().mean(dim=dims, keepdim=True) + eps)
    xhat = (xc - mean) * rstd
    g = gc * weight.to(compute) if weight is not None else gc
    dx = rstd * (g - g.mean(dim=dims, keepdim=True) - xhat * (g * xhat).mean(dim=dims, keepdim=True))
    # Rows of the normalised shape (an explicit count: -1 is ambiguous for an empty normalised shape).
    per_row = (math.prod(x.shape[: x.dim() - len(normalized_shape)]), *normalized_shape)
    dw = (gc * xhat).reshape(per_row).sum(dim=0).to(weight.dtype) if weight is not None else x.new_empty(0)
    db = gc.reshape(per_row).sum(dim=0).to(bias.dtype) if bias is not None else x.new_empty(0)
    return dx.to(x.dtype), dw, db
