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
