"""The built-in ops, listed explicitly: each one's folder holds its reference, kernels and declaration."""

from __future__ import annotations

from kernelgate.op import Op
from kernelgate.ops.add_rms_norm import add_rms_norm, add_rms_norm_backward
from kernelgate.ops.cross_entropy import (
    cross_entropy,
    cross_entropy_backward,
    cross_entropy_backward_into,
    cross_entropy_with_grad,
    cross_entropy_with_stats,
)
from kernelgate.ops.glu import geglu, geglu_backward, swiglu, swiglu_backward
from kernelgate.ops.layer_norm import layer_norm, layer_norm_backward
from kernelgate.ops.log_softmax import log_softmax, log_softmax_backward
from kernelgate.ops.rms_norm import rms_norm, rms_norm_backward
from kernelgate.ops.rotary import rotary_embedding
from kernelgate.ops.softmax import softmax, softmax_backward

__all__ = [
    "BUILTIN_OPS",
    "add_rms_norm",
    "add_rms_norm_backward",
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_backward_into",
    "cross_entropy_with_grad",
    "cross_entropy_with_stats",
    "geglu",
    "geglu_backward",
    "layer_norm",
    "layer_norm_backward",
    "log_softmax",
    "log_softmax_backward",
    "rms_norm",
    "rms_norm_backward",
    "rotary_embedding",
    "softmax",
    "softmax_backward",
    "swiglu",
    "swiglu_backward",
]

BUILTIN_OPS: tuple[Op, ...] = (
    softmax,
    softmax_backward,
    rms_norm,
    rms_norm_backward,
    add_rms_norm,
    add_rms_norm_backward,
    layer_norm,
    layer_norm_backward,
    log_softmax,
    log_softmax_backward,
    swiglu,
    swiglu_backward,
    geglu,
    geglu_backward,
    cross_entropy,
    cross_entropy_with_stats,
    cross_entropy_with_grad,
    cross_entropy_backward,
    cross_entropy_backward_into,
    rotary_embedding,
)
