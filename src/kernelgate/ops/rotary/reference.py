"""Rotary position embedding in plain PyTorch: the definition every rotary_embedding kernel is checked against.

Layout, for ``q`` and ``k`` alike: ``(batch, seq, heads, head_dim)`` (the layout of flash-attention
and of the q/k/v projections before the heads are moved; a ``(batch, heads, seq, head_dim)`` tensor
is passed as ``x.transpose(1, 2)``, a strided view, without a copy). ``cos`` and ``sin`` hold one
angle per rotated pair: ``(seq, head_dim // 2)``, or ``(batch, seq, head_dim // 2)`` for positions
that differ per sequence (``batch`` may also be 1). The pairs are

- ``interleaved=False`` (rotate-half; Llama, NeoX, Hugging Face transformers): ``(i, i + head_dim // 2)``;
- ``interleaved=True`` (GPT-J, Meta's original Llama code): ``(2 * i, 2 * i + 1)``;

and pair ``i`` at position ``s`` is rotated by the angle whose cosine is ``cos[s, i]``:
``(x1, x2) -> (x1 * cos - x2 * sin, x2 * cos + x1 * sin)``. Hugging Face's ``cos``/``sin`` of shape
``(..., seq, head_dim)`` repeat the half: pass ``cos[..., : head_dim // 2]``.
"""

from __future__ import annotations

import torch

from kernelgate.errors import InputValueError

__all__ = ["check_rotary_shapes", "rotary_embedding_reference"]


def check_rotary_shapes(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Raise :class:`~kernelgate.errors.InputValueError` for the shape rules the op's contract cannot state.

    The contract already checks the ranks of ``q`` and ``k``, that ``k`` has ``q``'s batch, seq and
    head_dim, that ``cos`` has ``q``'s seq length in dimension -2, and that ``sin`` has ``cos``'s shape.

    >>> check_rotary_shapes(torch.zeros(1, 2, 3, 5), torch.zeros(1, 2, 1, 5), torch.zeros(2, 2), torch.zeros(2, 2))
    Traceback (most recent call last):
    ...
    kernelgate.errors.InputValueError: rotary_embedding(): argument 'q' must have an even head_dim ...
    """
    head_dim = q.shape[-1]
    if head_dim % 2:
        raise InputValueError(
            f"rotary_embedding(): argument 'q' must have an even head_dim (last dimension), since features are "
            f"rotated in pairs; got {head_dim} (shape {tuple(q.shape)}). Rotate an even number of features, e.g. "
            f"pass q[..., :{head_dim - 1}] and concatenate the rest back."
        )
    if cos.dim() > 3:
        raise InputValueError(
            f"rotary_embedding(): argument 'cos' must have 2 dimensions (seq, head_dim // 2) or 3 "
            f"(batch, seq, head_dim // 2); got {cos.dim()} (shape {tuple(cos.shape)}). Remove the broadcast "
            f"dimensions, e.g. cos.squeeze(1) for a (batch, 1, seq, head_dim // 2) tensor."
        )
    half = head_dim // 2
    if cos.shape[-1] != half:
        hint = (
            f"It looks like the Hugging Face layout, which repeats the half: pass cos[..., :{half}] and "
            f"sin[..., :{half}]."
            if cos.shape[-1] == head_dim
            else f"Pass one angle per rotated pair: cos[s, i] = cos(s * inv_freq[i]) for i < {half}."
        )
        raise InputValueError(
            f"rotary_embedding(): argument 'cos' must have head_dim // 2 = {half} entries in its last dimension "
            f"(one angle per rotated pair); got {cos.shape[-1]} (shape {tuple(cos.shape)}, q shape "
            f"{tuple(q.shape)}). {hint}"
        )
    if cos.dim() == 3 and cos.shape[0] not in (1, q.shape[0]):
        raise InputValueError(
            f"rotary_embedding(): argument 'cos' with 3 dimensions must have batch size 1 or q's batch size "
            f"{q.shape[0]} in dimension 0; got {cos.shape[0]} (shape {tuple(cos.shape)}). Pass one row of angles "
            f"per sequence of q, or a 2-dimensional (seq, head_dim // 2) tensor shared by all."
        )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    # (seq, half) or (batch, seq, half) -> broadcast over heads: (..., seq, 1, half).
    c, s = cos.to(compute).unsqueeze(-2), sin.to(compute).unsqueeze(-2)
    xc = x.to(compute)
    half = x.shape[-1] // 2
    if interleaved:
        x1, x2 = xc[..., 0::2], xc[..., 1::2]
    else:
        x1, x2 = xc[..., :half], xc[..., half:]
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    y = torch.stack((y1, y2), dim=-1).flatten(-2) if interleaved else torch.cat((y1, y2), dim=-1)
    return y.to(x.dtype)


def rotary_embedding_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate each pair of features of ``q`` and ``k`` by the angle of its position; return ``(q_rot, k_rot)``.

    For pair ``(x1, x2)`` of a head at position ``s``:
    ``(x1 * cos[s, i] - x2 * sin[s, i], x2 * cos[s, i] + x1 * sin[s, i])``, computed in float32
    (float64 for float64) and returned as new tensors in ``q.dtype`` and ``k.dtype``.

    Args:
        q: ``(batch, seq, n_q_heads, head_dim)``, ``head_dim`` even, any strides (views of a fused
            qkv projection, or ``x.transpose(1, 2)`` of a ``(batch, heads, seq, head_dim)`` tensor).
        k: ``(batch, seq, n_k_heads, head_dim)``; ``n_k_heads`` may differ from ``n_q_heads``
            (grouped-query attention).
        cos, sin: ``(seq, head_dim // 2)`` or ``(batch or 1, seq, head_dim // 2)``: one angle per
            pair (Hugging Face's repeated ``(..., seq, head_dim)`` tables: pass ``cos[..., :head_dim // 2]``).
        interleaved: ``False``: pairs ``(i, i + head_dim // 2)`` (rotate-half, Llama/NeoX);
            ``True``: pairs ``(2i, 2i + 1)`` (GPT-J).

    >>> q = torch.tensor([[[[1.0, 0.0]]]])  # batch 1, seq 1, 1 head, head_dim 2
    >>> q_rot, k_rot = rotary_embedding_reference(q, q, torch.tensor([[0.6]]), torch.tensor([[0.8]]))
    >>> [round(v, 4) for v in q_rot.flatten().tolist()]
    [0.6, 0.8]
    """
    check_rotary_shapes(q, k, cos, sin)
    return _rotate(q, cos, sin, interleaved), _rotate(k, cos, sin, interleaved)
