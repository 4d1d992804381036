"""The one tolerance policy: how close a Triton result must be to the reference.

Used by the tests, the demo and (later) the correctness gate. Bounds are per dtype and grow with
the length of the reduction each output depends on, since float32 accumulation error grows about
with its square root:

    |actual - expected| <= atol + rtol * |expected|,
    rtol = RTOL[dtype] + ACCUMULATION_RTOL * sqrt(reduction_length)

``RTOL`` is two units in the last place of the dtype (one rounding in each of the two results
compared); ``ATOL`` covers results near zero. An override must carry a written reason.

>>> round(tolerance(torch.float16).rtol, 6)
0.001954
"""

from __future__ import annotations

import dataclasses
import math

import torch

__all__ = ["Tolerance", "assert_close", "tolerance"]

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
    torch.testing.assert_close(actual, expected, atol=bound.atol, rtol=bound.rtol, equal_nan=True)
