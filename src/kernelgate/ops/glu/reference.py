"""Gated linear units in plain PyTorch: the definitions every swiglu and geglu kernel is checked against.

``swiglu(gate, up) = silu(gate) * up`` (Llama, Mistral, Qwen) and ``geglu(gate, up) = gelu(gate) * up``
(Gemma, T5 v1.1), elementwise. With ``up=None``, ``gate`` holds both halves of a fused projection on
its last dimension, ``[gate | up]`` (the first half gates, the second is gated), and the result has
half that last dimension. The halves are strided views, never copies.

Both ops accept gate and up of different float dtypes: the result has their promoted dtype, as
``F.silu(gate) * up`` has. Results are contiguous, whatever the inputs' layout (the kernels write
them so, and torch.compile plans with the reference's layout).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernelgate.errors import InputValueError

__all__ = [
    "check_glu_shapes",
    "geglu_backward_reference",
    "geglu_reference",
    "output_shape",
    "split_packed",
    "swiglu_backward_reference",
    "swiglu_reference",
]

# sqrt(2 / pi) and the cubic coefficient of the tanh approximation of GELU.
GELU_TANH_BETA = math.sqrt(2.0 / math.pi)
GELU_TANH_KAPPA = 0.044715


def check_glu_shapes(op: str, gate: torch.Tensor, up: torch.Tensor | None, grad: torch.Tensor | None = None) -> None:
    """Raise :class:`~kernelgate.errors.InputValueError` for the shape rules the op's contract cannot state.

    The contract already checks that ``up``, when given, has ``gate``'s shape. Here: a packed
    ``gate`` (``up=None``) has an even last dimension, and a backward's ``grad`` has the output's shape.

    >>> check_glu_shapes("swiglu", torch.zeros(2, 7), None)
    Traceback (most recent call last):
    ...
    kernelgate.errors.InputValueError: swiglu(): argument 'gate' must have an even last dimension ...
    """
    if up is None:
        if gate.dim() == 0:
            raise InputValueError(
                f"{op}(): argument 'gate' must have at least one dimension when 'up' is None (gate and up packed "
                f"on the last dimension); got a 0-dim tensor. Pass up separately, e.g. {op}(gate, up)."
            )
        if gate.shape[-1] % 2:
            raise InputValueError(
                f"{op}(): argument 'gate' must have an even last dimension when 'up' is None (the first half "
                f"gates, the second half is gated); got {gate.shape[-1]} (shape {tuple(gate.shape)}). Make the fused "
                f"projection's width even, or pass gate and up as two tensors of one shape: {op}(gate, up)."
            )
    if grad is not None:
        want = output_shape(gate, up)
        if grad.shape != want:
            raise InputValueError(
                f"{op}(): argument 'grad' must have the shape of the forward output, {tuple(want)}; got "
                f"{tuple(grad.shape)} (gate shape {tuple(gate.shape)}, up {'packed' if up is None else 'separate'}). "
                f"Pass the gradient of {op.removesuffix('_backward')}(gate, up)."
            )


def output_shape(gate: torch.Tensor, up: torch.Tensor | None) -> torch.Size:
    """The shape of ``swiglu(gate, up)`` and ``geglu(gate, up)``: ``gate``'s, halved in the last dim if packed."""
    if up is not None:
        return gate.shape
    return torch.Size((*gate.shape[:-1], gate.shape[-1] // 2))


def split_packed(gate: torch.Tensor, up: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gate, up)``; for a packed ``gate`` (``up=None``) its two halves, as views."""
    if up is not None:
        return gate, up
    half = gate.shape[-1] // 2
    return gate[..., :half], gate[..., half:]


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up``, elementwise; ``up=None`` takes both from ``gate = [gate | up]`` (last dim halved).

    Args:
        gate: ``(..., H)``, or ``(..., 2H)`` packed.
        up: ``(..., H)`` or ``None``.

    >>> swiglu_reference(torch.tensor([[1.0, 0.0, 2.0, 3.0]])).tolist()
    [[1.4621171951293945, 0.0]]
    """
    check_glu_shapes("swiglu", gate, up)
    g, u = split_packed(gate, up)
    return (F.silu(g) * u).contiguous()


def geglu_reference(gate: torch.Tensor, up: torch.Tensor | None = None, approximate: str = "none") -> torch.Tensor:
    """``gelu(gate, approximate) * up``, elementwise; ``up=None`` takes both from ``gate = [gate | up]``.

    ``approximate`` is ``"none"`` (the erf form) or ``"tanh"``, as in :func:`torch.nn.functional.gelu`.

    On the CPU, float32 and 16-bit tensors are computed in float64 and rounded once: torch's
    vectorised CPU gelu gives NaN at ``+inf`` (its GPU kernel and float64 give ``+inf``), and its
    float32 erf differs from the GPU's in the last bit, which ``1 + erf(x / sqrt(2))`` magnifies for
    negative ``x`` beyond the tolerance policy. On the GPU this is exactly ``F.gelu(gate) * up``.

    >>> geglu_reference(torch.tensor([1.0, 2.0]), torch.tensor([2.0, 1.0])).tolist()
    [1.6826895475387573, 1.9544997215270996]
    """
    check_glu_shapes("geglu", gate, up)
    g, u = split_packed(gate, up)
    if g.device.type == "cpu" and g.dtype != torch.float64 and u.dtype != torch.float64:
        y = F.gelu(g.double(), approximate=approximate) * u.double()
        return y.to(torch.promote_types(g.dtype, u.dtype)).contiguous()
    return (F.gelu(g, approximate=approximate) * u).contiguous()


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _glu_grads(
    gate: torch.Tensor,
    up: torch.Tensor | None,
    act: torch.Tensor,
    dact: torch.Tensor,
    dy: torch.Tensor,
    u: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dgate = dy * u * dact`` and ``dup = dy * act`` in the dtypes of ``gate`` and ``up``; packed: one tensor."""
    dgate, dup = dy * u * dact, dy * act
    if up is None:
        return torch.cat([dgate, dup], dim=-1).to(gate.dtype), gate.new_empty(0)
    return dgate.to(gate.dtype).contiguous(), dup.to(up.dtype).contiguous()


def swiglu_backward_reference(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`swiglu_reference` with respect to ``gate`` and ``up``.

    With ``s = sigmoid(gate)``: ``dgate = grad * up * s * (1 + gate * (1 - s))`` and
    ``dup = grad * gate * s``; ``1 - s`` is taken as ``sigmoid(-gate)``, which keeps its precision
    where ``s`` rounds to 1. Computed in float32 (float64 if an input is float64). Returns
    ``(dgate, dup)`` in the dtypes of ``gate`` and ``up``; for a packed ``gate`` (``up=None``)
    ``(d, empty)``, where ``d`` holds ``[dgate | dup]`` in ``gate``'s shape.

    >>> dg, du = swiglu_backward_reference(torch.ones(1), torch.zeros(1), torch.ones(1)); dg.tolist(), du.tolist()
    ([0.5], [0.0])
    """
    check_glu_shapes("swiglu_backward", gate, up, grad)
    g, u = split_packed(gate, up)
    compute = _compute_dtype(grad, gate, *([] if up is None else [up]))
    dc, x, uc = grad.to(compute), g.to(compute), u.to(compute)
    s = torch.sigmoid(x)
    return _glu_grads(gate, up, x * s, s * (1 + x * torch.sigmoid(-x)), dc, uc)


def geglu_backward_reference(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor | None = None, approximate: str = "none"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`geglu_reference` with respect to ``gate`` and ``up``.

    ``dgate = grad * up * gelu'(gate)`` and ``dup = grad * gelu(gate)``. For ``"none"``,
    ``gelu'(x) = Phi(x) + x * exp(-x**2 / 2) / sqrt(2 pi)`` (torch's gelu_backward). For ``"tanh"``,
    ``gelu(x) = x * (1 + tanh(z)) / 2`` with ``z = sqrt(2 / pi) * (x + 0.044715 x**3)``, whose
    derivative is written through ``s = sigmoid(2 z) = (1 + tanh(z)) / 2``:
    ``gelu'(x) = s * (1 + 2 x (1 - s) sqrt(2 / pi) (1 + 3 * 0.044715 x**2))``, with ``1 - s = sigmoid(-2 z)``;
    equal to torch's ``(1 + t) / 2 + x / 2 (1 - t**2) ...`` but without the cancellation of
    ``1 - t**2`` in float32. Computed in float32 (float64 if an input is float64); returned as by
    :func:`swiglu_backward_reference`.

    >>> dg, du = geglu_backward_reference(torch.ones(1), torch.zeros(1), torch.ones(1)); dg.tolist(), du.tolist()
    ([0.5], [0.0])
    """
    check_glu_shapes("geglu_backward", gate, up, grad)
    g, u = split_packed(gate, up)
    compute = _compute_dtype(grad, gate, *([] if up is None else [up]))
    dc, x, uc = grad.to(compute), g.to(compute), u.to(compute)
    if approximate == "tanh":
        z = GELU_TANH_BETA * (x + GELU_TANH_KAPPA * x * x * x)
        s = torch.sigmoid(2 * z)
        slope = 2 * x * torch.sigmoid(-2 * z) * GELU_TANH_BETA * (1 + 3 * GELU_TANH_KAPPA * x * x)
        act, dact = x * s, s * (1 + slope)
    else:
        cdf = 0.5 * (1 + torch.erf(x * math.sqrt(0.5)))
        act, dact = x * cdf, cdf + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return _glu_grads(gate, up, act, dact, dc, uc)
