"""The built-in ops, listed explicitly: each one's folder holds its reference, kernels and declaration."""

from __future__ import annotations

from kernelgate.op import Op
from kernelgate.ops.rms_norm import rms_norm
from kernelgate.ops.softmax import softmax

__all__ = ["BUILTIN_OPS", "rms_norm", "softmax"]

BUILTIN_OPS: tuple[Op, ...] = (softmax, rms_norm)
