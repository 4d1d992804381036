"""The one tolerance policy: how close a Triton result must be to the reference.

Used by the tests, the demo and (later) the correctness gate. Bounds are per dtype and grow with
the length of the reduction each output depends on, since float32 accumulation error grows about
with its square root:

    |actual - expected| <= atol + rtol * |expected|,
    rtol = RTOL[dtype] + ACCUMULATION_RTOL * sqrt(reduction_length)

``RTOL`` is two units in the last place of the dtype (one rounding in each of the two results
compared); ``ATOL`` covers results near zero, and scales with the largest magnitude in the expected
tensor (when above 1): a result that cancels to near zero, as ``xhat * w + b`` or
``g - p * sum(g)`` can, carries the rounding error of its terms, which are as large as the tensor's
values, not of the small result. An override must carry a written reason.

Where the result suffers cancellation (gradients such as ``y * (dy - sum(dy * y))`` in bfloat16),
no elementwise bound fits both sides; :func:`assert_no_worse` then asks instead that the error
against a float64 computation be no worse than twice plain PyTorch's.

>>> round(tolerance(torch.float16).rtol, 6)
0.001954
"""

from __future__ import annotations

import dataclasses
import math

import torch

__all__ = [
    "Tolerance",
    "assert_close",
    "assert_close_normwise",
    "assert_close_or_no_worse",
    "assert_no_worse",
    "magnitude",
    "tolerance",
]

# Two units in the last place: eps is one ulp at 1.0; each side may be rounded once.
RTOL: dict[torch.dtype, float] = {
    torch.float64: 2 * torch.finfo(torch.float64).eps,
    torch.float32: 2 * torch.finfo(torch.float32).eps,
    torch.float16: 2 * torch.finfo(torch.float16).eps,
    torch.bfloat16: 2 * torch.finfo(torch.bfloat16).eps,
}
ATOL: dict[torch.dtype, float] = {
    torch.float64: 1e-12,
    torch.float32: 1e-6,
    torch.float16: 1e-5,
    torch.bfloat16: 1e-5,
}
# Relative error per sqrt(element) of a float32 accumulation, with headroom for reordering.
ACCUMULATION_RTOL = 4 * torch.finfo(torch.float32).eps


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """An absolute and a relative bound, and why they differ from the policy if they do."""

    atol: float
    rtol: float
    reason: str = ""


def tolerance(dtype: torch.dtype, reduction_length: int = 1) -> Tolerance:
    """The policy's bounds for results of ``dtype`` that each reduce over ``reduction_length`` inputs."""
    if dtype not in RTOL:
        raise ValueError(f"no tolerance is defined for dtype {dtype}; defined for {', '.join(map(str, RTOL))}.")
    accumulation = 0.0 if dtype == torch.float64 else ACCUMULATION_RTOL * math.sqrt(max(1, reduction_length))
    return Tolerance(atol=ATOL[dtype], rtol=RTOL[dtype] + accumulation)


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    reduction_length: int = 1,
    override: Tolerance | None = None,
) -> None:
    """Raise ``AssertionError`` unless ``actual`` matches ``expected`` under the policy.

    Shapes and dtypes must be equal; NaN must sit where the reference has NaN, and infinities match
    exactly. ``override`` replaces the policy's bounds and must say why in its ``reason``.
    """
    if override is not None and not override.reason:
        raise ValueError("a tolerance override must carry a reason (Tolerance(..., reason='why')).")
    bound = override or tolerance(expected.dtype, reduction_length)
    atol = bound.atol if override is not None else bound.atol * magnitude(expected)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=bound.rtol, equal_nan=True)


def assert_close_or_no_worse(
    actual: torch.Tensor, expected: torch.Tensor, truth: torch.Tensor, *, reduction_length: int = 1
) -> None:
    """Raise ``AssertionError`` unless each element of ``actual`` matches ``expected`` under the policy
    (:func:`assert_close`) or is no further from ``truth`` than ``expected`` is, within the policy's bounds:
    ``|a - t| <= |e - t| + atol + rtol * |t|``.

    ``truth`` is the reference evaluated on the inputs in float64. Where the reference rounds before it
    cancels, its own error can exceed the policy's bounds of its result: PyTorch's CUDA softmax backward
    in bfloat16 rounds each ``grad * y`` to bfloat16 before subtracting their sum, and at rows of 100 a
    correct kernel (within 0.62 bf16 ulp of float64) differed from it by more than the bounds on about
    one draw in six, each time nearer the float64 result than the reference. A wrong kernel is no nearer
    the float64 result than the reference, so it still fails. NaN and infinities must match ``expected``.
    """
    try:
        assert_close(actual, expected, reduction_length=reduction_length)
        return
    except AssertionError as err:
        close_error = err
    if truth.shape != expected.shape:
        raise close_error
    special = ~torch.isfinite(expected)
    if not torch.equal(special, ~torch.isfinite(actual)) or not torch.equal(
        actual[special].nan_to_num(0.0), expected[special].nan_to_num(0.0)
    ):
        raise AssertionError("NaN or infinite values differ from the reference")
    bound = tolerance(expected.dtype, reduction_length)
    atol = bound.atol * magnitude(expected)
    a, e, t = actual.double(), expected.double(), truth.double()
    near_reference = (a - e).abs() <= atol + bound.rtol * e.abs()
    no_worse = (a - t).abs() <= (e - t).abs() + atol + bound.rtol * t.abs()
    bad = ~(near_reference | no_worse | special)
    if bool(bad.any()):
        at = tuple(int(i) for i in bad.nonzero()[0].tolist())
        raise AssertionError(
            f"element {list(at)}: {float(a[at]):.6g} is {float((a[at] - t[at]).abs()):.3g} from the float64 result "
            f"{float(t[at]):.6g}, the reference {float(e[at]):.6g} only {float((e[at] - t[at]).abs()):.3g}"
        ) from close_error


def magnitude(expected: torch.Tensor) -> float:
    """The scale of ``ATOL`` for ``expected``: its largest finite magnitude, at least 1."""
    if not expected.dtype.is_floating_point or expected.numel() == 0:
        return 1.0
    finite = expected.detach()[torch.isfinite(expected)]  # a scale, not part of any graph
    return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0


def assert_close_normwise(actual: torch.Tensor, expected: torch.Tensor, *, reduction_length: int = 1) -> None:
    """Raise ``AssertionError`` unless ``||actual - expected|| <= atol * sqrt(n) + rtol * ||expected||``.

    For outputs that are sums of many terms of both signs (a weight gradient summed over rows):
    a correct kernel that adds in another order moves an element that cancels to near zero by far
    more than a bound relative to that element, so elementwise bounds reject correct kernels. The
    norm of the whole error still catches a wrong column or row. The bounds are the policy's
    (:func:`tolerance`); NaN must sit where ``expected`` has NaN, and infinities match exactly.
    """
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise AssertionError(
            f"shapes or dtypes differ: {actual.shape} {actual.dtype} vs {expected.shape} {expected.dtype}"
        )
    special = ~torch.isfinite(expected)
    if not torch.equal(special, ~torch.isfinite(actual)) or not torch.equal(
        actual[special].nan_to_num(0.0), expected[special].nan_to_num(0.0)
    ):
        raise AssertionError("NaN or infinite values differ from the reference")
    bound = tolerance(expected.dtype, reduction_length)
    a, e = actual[~special].double(), expected[~special].double()
    error, allowed = float((a - e).norm()), bound.atol * math.sqrt(max(e.numel(), 1)) + bound.rtol * float(e.norm())
    if error > allowed:
        raise AssertionError(
            f"error norm {error:.3g} exceeds {allowed:.3g} (atol * sqrt(n) + rtol * norm of the reference)"
        )


def assert_no_worse(actual: torch.Tensor, baseline: torch.Tensor, truth: torch.Tensor, *, factor: float = 2.0) -> None:
    """Raise ``AssertionError`` unless ``actual`` is at most ``factor`` times as far from ``truth`` as ``baseline``.

    ``baseline`` is plain PyTorch's result in the same dtype, ``truth`` the same computation in
    float64. Distances are norms of the whole error (``||a - t|| / ||t||``), which unlike a maximum
    do not swing with one unlucky rounding; ``ATOL`` is added for all-zero results. NaN must sit
    where ``truth`` has NaN.
    """
    if actual.shape != truth.shape or actual.dtype != baseline.dtype:
        raise AssertionError(
            f"shapes or dtypes differ: {actual.shape} {actual.dtype} vs {truth.shape} {baseline.dtype}"
        )
    if not torch.equal(actual.isnan(), truth.isnan()):
        raise AssertionError("NaN positions differ from the float64 result")
    finite = ~truth.isnan()
    t = truth.double()[finite]
    scale = max(float(t.norm()), 1e-300)
    error = float((actual.double()[finite] - t).norm()) / scale
    allowed = factor * float((baseline.double()[finite] - t).norm()) / scale + ATOL[actual.dtype]
    if error > allowed:
        raise AssertionError(
            f"relative error {error:.3g} against float64 exceeds {factor:g} x plain PyTorch's ({allowed:.3g} with atol)"
        )
