"""Shape buckets: which calls share one tuning decision.

An op declares a function of its arguments that returns a tuple of bucketed values; calls with
equal tuples (and equal dtypes, stride classes and device) share a decision, so a new shape in a
known bucket neither re-tunes nor recompiles. The helpers bucket one size each:

>>> pow2(1000), multiple_of(1000, 64), zero_one_many(0), zero_one_many(7), aligned16(1024)
(1024, 1024, 0, 'many', True)
"""

from __future__ import annotations

import torch

__all__ = ["aligned16", "multiple_of", "pow2", "stride_class", "zero_one_many"]


def pow2(n: int) -> int:
    """The least power of two ``>= n`` (0 stays 0)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def multiple_of(n: int, step: int) -> int:
    """``n`` rounded up to a multiple of ``step``."""
    return -(-n // step) * step


def zero_one_many(n: int) -> int | str:
    """0, 1, or ``"many"``."""
    return n if n in (0, 1) else "many"


def aligned16(n: int) -> bool:
    """Whether ``n`` is a multiple of 16, which Triton specialises on (it changes the compiled code)."""
    return n % 16 == 0


def stride_class(t: torch.Tensor) -> str:
    """``"contiguous"``, ``"transposed"`` (the last two dims swapped, else contiguous) or ``"strided"``."""
    if t.is_contiguous():
        return "contiguous"
    if t.dim() >= 2 and t.transpose(-1, -2).is_contiguous():
        return "transposed"
    return "strided"
