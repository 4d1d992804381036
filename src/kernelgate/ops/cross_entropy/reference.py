"""Cross-entropy in plain PyTorch: the definition every cross_entropy kernel is checked against.

The loss of row ``i`` with target class ``t``, class weights ``w`` (all ones without ``weight``),
``C`` classes, ``lse = logsumexp(x[i])`` and smoothing ``eps`` is, as in
:func:`torch.nn.functional.cross_entropy`::

    loss[i] = (1 - eps) * w[t] * (lse - x[i, t]) + eps / C * sum_c w[c] * (lse - x[i, c])

(the second term only when ``eps > 0``), 0 for a row whose target is ``ignore_index``. ``"mean"``
divides the sum of the rows by the sum of ``w[t]`` over the rows not ignored (NaN when every row
is ignored, or there are none); ``"sum"`` adds the rows.

A target outside ``[0, C)`` that is not ``ignore_index`` is an error torch raises on the CPU and
asserts on inside a GPU kernel (which kills the CUDA context). Checking a GPU tensor's values here
would synchronise the device, so the check runs only on CPU tensors (an :class:`InputValueError`);
on a GPU the row's loss, and its gradient row, are NaN instead, so ``"mean"`` and ``"sum"`` are NaN
too and no kernel reads outside the logits.
"""

from __future__ import annotations

import math

import torch

from kernelgate.errors import InputTypeError, InputValueError

__all__ = [
    "check_cross_entropy_inputs",
    "cross_entropy_backward_into_reference",
    "cross_entropy_backward_reference",
    "cross_entropy_reference",
    "cross_entropy_with_grad_reference",
    "cross_entropy_with_stats_reference",
]


def check_cross_entropy_inputs(
    op: str,
    logits: torch.Tensor,
    target: torch.Tensor,
    reduction: str,
    grad: torch.Tensor | None = None,
    stats: torch.Tensor | None = None,
) -> None:
    """Raise unless the shapes and the target's dtype are ones :func:`cross_entropy_reference` accepts.

    Reads only shapes and dtypes (never values), so it costs no GPU synchronisation; the contract
    has already checked each argument on its own.
    """
    shape = tuple(logits.shape)
    if logits.dim() > 2:
        raise InputValueError(
            f"{op}(): argument 'logits' must have shape (N, C) or (C,); got {shape}. For class scores along "
            f"dim 1 of (N, C, d1, ...), move them last and flatten: logits.movedim(1, -1).reshape(-1, C) and "
            f"target.reshape(-1)."
        )
    if target.dtype.is_floating_point:
        dtype = str(target.dtype).removeprefix("torch.")
        if target.shape == logits.shape:
            raise InputTypeError(
                f"{op}(): argument 'target' must hold class indices (int64); got {dtype} of the logits' "
                f"shape {shape}, which are class probabilities. kernelgate's cross_entropy takes class indices "
                f"only: call torch.nn.functional.cross_entropy(logits, target) for class probabilities, or pass "
                f"target.argmax(-1) for one-hot targets."
            )
        raise InputTypeError(
            f"{op}(): argument 'target' must hold class indices of dtype int64; got {dtype}. Convert it "
            f"first, e.g. target.long()."
        )
    want = shape[:1] if logits.dim() == 2 else ()
    if tuple(target.shape) != want:
        raise InputValueError(
            f"{op}(): argument 'target' must have shape {want} (one class index per row of logits of shape "
            f"{shape}); got {tuple(target.shape)}. Pass one int64 class index per row."
        )
    if grad is not None:
        grad_shape = want if reduction == "none" else ()
        if tuple(grad.shape) != grad_shape:
            raise InputValueError(
                f"{op}(): argument 'grad' must have the loss's shape {grad_shape} for reduction={reduction!r}; "
                f"got {tuple(grad.shape)}. Pass the gradient of the loss this call computes."
            )
    if stats is not None and tuple(stats.shape) != (*want, 2):
        raise InputValueError(
            f"{op}(): argument 'stats' must have shape {(*want, 2)} (each row's maximum and log-sum, as "
            f"cross_entropy_with_stats returns them for these logits); got {tuple(stats.shape)}. Pass the stats "
            f"of the same logits, or None to recompute them."
        )


def _out_of_range(target: torch.Tensor, n_classes: int, ignore_index: int) -> torch.Tensor:
    """Where ``target`` (flat) is neither a class index nor ``ignore_index``; raises for plain CPU tensors."""
    bad = (target != ignore_index) & ((target < 0) | (target >= n_classes))
    # Only a plain CPU tensor can be checked for free: a GPU's would synchronise, a fake one has no values.
    if type(target) is torch.Tensor and target.device.type == "cpu" and bool(bad.any()):
        position = int(bad.nonzero()[0, 0])
        raise InputValueError(
            f"cross_entropy(): argument 'target' holds {int(target[position])} at position {position}, which "
            f"is neither a class index in [0, {n_classes}) nor ignore_index ({ignore_index}). Pass class "
            f"indices in [0, {n_classes}), or set ignore_index to the value that marks rows to skip."
        )
    return bad


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def cross_entropy_reference(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of ``logits`` against class indices ``target``: :func:`torch.nn.functional.cross_entropy`.

    Computed in float32 (float64 for float64) and returned in ``logits.dtype``, as the kernels do;
    float16 and bfloat16 results may differ from torch's, which rounds the log-softmax to the
    input's dtype first. ``weight`` may have any float dtype (torch requires the logits').

    Args:
        logits: ``(N, C)``, or ``(C,)`` for one row.
        target: ``(N,)`` int64 class indices (``()`` for ``(C,)`` logits); ``ignore_index`` marks rows to skip.
        weight: ``(C,)`` class weights, or ``None``.
        ignore_index: the target value whose rows add nothing, to the loss nor to the mean's divisor.
        label_smoothing: in ``[0, 1]``: the share of each target spread over all classes.
        reduction: ``"none"`` (a loss per row), ``"mean"`` or ``"sum"``.

    >>> x = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    >>> round(cross_entropy_reference(x, torch.tensor([0, -100])).item(), 4)
    0.6931
    """
    check_cross_entropy_inputs("cross_entropy", logits, target, reduction)
    n_classes = logits.shape[-1]
    x = logits.to(_compute_dtype(logits.dtype)).reshape(-1, n_classes)
    flat = target.reshape(-1)
    w = None if weight is None else weight.to(x.dtype)
    bad = _out_of_range(flat, n_classes, ignore_index)
    # Rows with a bad target are computed as ignored (nothing reads out of bounds), then made NaN.
    safe = flat.masked_fill(bad, ignore_index)
    rows = torch.nn.functional.cross_entropy(
        x, safe, w, ignore_index=ignore_index, reduction="none", label_smoothing=label_smoothing
    ).masked_fill(bad, float("nan"))
    if reduction == "none":
        return rows.reshape(target.shape).to(logits.dtype)
    total = rows.sum()
    if reduction == "sum":
        return total.to(logits.dtype)
    counted = safe != ignore_index
    if w is None or n_classes == 0:
        divisor = counted.sum().to(x.dtype)
    else:
        divisor = torch.where(counted, w[safe.masked_fill(~counted, 0)], 0.0).sum()
    return (total / divisor).to(logits.dtype)


def _row_stats(x: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """Per row of ``x`` (float): ``(m, log(s))`` with ``m`` the maximum (NaN ignored) and ``s`` the sum of
    ``exp(x - m)``, both -inf for a row not ``counted``; shape ``(rows, 2)``."""
    m = x.masked_fill(x.isnan(), float("-inf")).amax(dim=-1) if x.shape[-1] else x.new_full(x.shape[:1], -math.inf)
    # A row of only -inf has s = 0 (log(s) = -inf), not NaN: subtract 0 there.
    log_s = (x - torch.where(m == float("-inf"), 0.0, m).unsqueeze(-1)).exp().sum(dim=-1).log()
    stats = torch.stack([m, log_s], dim=-1)
    return stats.masked_fill(~counted.unsqueeze(-1), float("-inf"))


def cross_entropy_with_stats_reference(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss of :func:`cross_entropy_reference`, and each row's statistics for the backward.

    ``stats[i] = (m, log(s))``: ``m`` the row's maximum (ignoring NaN), ``s = sum_c exp(x[i, c] - m)``,
    so that ``logsumexp(x[i]) = m + log(s)`` and ``softmax(x[i]) = exp((x[i] - m) - log(s))``.
    Float32, shape ``(N, 2)`` (``(2,)`` for ``(C,)`` logits); both -inf for a row whose target is
    ``ignore_index`` or out of range, which the kernels do not read.

    >>> loss, stats = cross_entropy_with_stats_reference(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
    >>> round(loss.item(), 4), [round(v, 4) for v in stats[0].tolist()]
    (0.6931, [0.0, 0.6931])
    """
    loss = cross_entropy_reference(logits, target, weight, ignore_index, label_smoothing, reduction)
    n_classes = logits.shape[-1]
    x = logits.to(_compute_dtype(logits.dtype)).reshape(-1, n_classes)
    flat = target.reshape(-1)
    counted = (flat != ignore_index) & (flat >= 0) & (flat < n_classes)
    stats = _row_stats(x, counted).to(torch.float32)
    return loss, stats.reshape(*target.shape, 2)


def cross_entropy_backward_reference(
    grad: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    stats: torch.Tensor | None = None,
) -> torch.Tensor:
    """The gradient of :func:`cross_entropy_reference` with respect to ``logits``, given ``grad`` of the loss.

    With ``p = softmax(x[i])``, ``eps = label_smoothing``, ``W = sum(w)`` and ``s[i]`` the row's
    share of ``grad`` (``grad[i]`` for ``"none"``, ``grad`` for ``"sum"``, ``grad`` divided by the
    sum of the target weights for ``"mean"``; 0 for an ignored row)::

        dx[i, c] = s[i] * (p[c] * ((1 - eps) * w[t] + eps / C * W) - (1 - eps) * w[t] * [c == t] - eps / C * w[c])

    An ignored row is ``0 * (...)``: zero, or NaN where its softmax is NaN, as torch's. Computed in
    float32 (float64 for float64), returned in ``logits.dtype``. With ``stats`` (the forward's, see
    :func:`cross_entropy_with_stats_reference`), a counted row's ``p`` is ``exp((x - m) - log(s))``
    from them; other rows compute their softmax.

    >>> x = torch.tensor([[0.0, 0.0]])
    >>> cross_entropy_backward_reference(torch.tensor(1.0), x, torch.tensor([0])).tolist()
    [[-0.5, 0.5]]
    """
    check_cross_entropy_inputs("cross_entropy_backward", logits, target, reduction, grad, stats)
    n_classes = logits.shape[-1]
    x = logits.to(_compute_dtype(logits.dtype)).reshape(-1, n_classes)
    flat = target.reshape(-1)
    bad = _out_of_range(flat, n_classes, ignore_index)
    counted = (flat != ignore_index) & ~bad
    safe = flat.masked_fill(~counted, 0)
    w = torch.ones(n_classes, dtype=x.dtype, device=x.device) if weight is None else weight.to(x.dtype)
    w_target = torch.where(counted, w[safe], 0.0) if n_classes else torch.zeros_like(safe, dtype=x.dtype)
    g = grad.to(x.dtype).reshape(-1)
    if reduction == "mean":
        g = g / w_target.sum()
    share = torch.where(counted, g.expand(flat.shape), 0.0)
    eps, smooth = label_smoothing, label_smoothing / max(n_classes, 1)
    p = torch.softmax(x, dim=-1)
    if stats is not None:
        m, log_s = stats.reshape(-1, 2).to(x.dtype).unbind(-1)
        p = torch.where(counted.unsqueeze(-1), ((x - m.unsqueeze(-1)) - log_s.unsqueeze(-1)).exp(), p)
    k = (1 - eps) * w_target + smooth * w.sum()
    one_hot = torch.arange(n_classes, device=x.device) == safe.unsqueeze(-1)
    dx = p * k.unsqueeze(-1) - ((1 - eps) * w_target).unsqueeze(-1) * one_hot - smooth * w
    dx = (share.unsqueeze(-1) * dx).masked_fill(bad.unsqueeze(-1), float("nan"))
    return dx.reshape(logits.shape).to(logits.dtype)


def cross_entropy_with_grad_reference(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss of :func:`cross_entropy_reference`, and its gradient with respect to ``logits`` for an incoming
    gradient of 1 (ones of the loss's shape for ``"none"``): :func:`cross_entropy_backward_reference`'s.

    The gradient has the logits' shape and dtype and is contiguous.

    >>> loss, dx = cross_entropy_with_grad_reference(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
    >>> round(loss.item(), 4), dx.tolist()
    (0.6931, [[-0.5, 0.5]])
    """
    loss = cross_entropy_reference(logits, target, weight, ignore_index, label_smoothing, reduction)
    ones = torch.ones(loss.shape, dtype=logits.dtype, device=logits.device)
    dx = cross_entropy_backward_reference(ones, logits, target, weight, ignore_index, label_smoothing, reduction)
    return loss, dx.contiguous()


def cross_entropy_backward_into_reference(
    grad: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
    dlogits: torch.Tensor,
) -> torch.Tensor:
    """:func:`cross_entropy_backward_reference`'s gradient for ``grad``, written into ``dlogits`` and returned.

    ``dlogits`` holds the gradient for an incoming gradient of 1 (as
    :func:`cross_entropy_with_grad_reference` returns it), so where ``grad`` is 1 it already is the
    result: the kernels then write nothing (checked on the device, no synchronisation); for another
    ``grad`` they compute it from the logits. This reference always computes and writes it.

    >>> dx = torch.tensor([[-0.5, 0.5]])
    >>> cross_entropy_backward_into_reference(torch.tensor(3.0), torch.zeros(1, 2), torch.tensor([0]), None,
    ...                                       -100, 0.0, "mean", dx).tolist()
    [[-1.5, 1.5]]
    """
    dx = cross_entropy_backward_reference(grad, logits, target, weight, ignore_index, label_smoothing, reduction)
    return dlogits.copy_(dx)
