"""log_softmax: kernels, declaration and the op object ``kernelgate.log_softmax`` (launchers from rowwise)."""

from __future__ import annotations

import torch

from kernelgate import rowwise
from kernelgate.contract import DimArg, TensorArg
from kernelgate.launch import LazyKernel
from kernelgate.library import Backward
from kernelgate.op import Op
from kernelgate.ops.log_softmax.reference import log_softmax_backward_reference, log_softmax_reference

__all__ = ["log_softmax", "log_softmax_backward"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
_KERNELS = "kernelgate.ops.log_softmax.kernels"
LOG_SOFTMAX_FWD = LazyKernel(_KERNELS, "_log_softmax_fwd_kernel")
LOG_SOFTMAX_FWD_LOOPED = LazyKernel(_KERNELS, "_log_softmax_fwd_looped_kernel")
LOG_SOFTMAX_FWD_PERSISTENT = LazyKernel(_KERNELS, "_log_softmax_fwd_persistent_kernel")
LOG_SOFTMAX_FWD_PERSISTENT_LOOPED = LazyKernel(_KERNELS, "_log_softmax_fwd_persistent_looped_kernel")
LOG_SOFTMAX_FWD_SPLIT = LazyKernel(_KERNELS, "_log_softmax_fwd_split_kernel")
LOG_SOFTMAX_FWD_SPLIT_LOOPED = LazyKernel(_KERNELS, "_log_softmax_fwd_split_looped_kernel")
LOG_SOFTMAX_BWD = LazyKernel(_KERNELS, "_log_softmax_bwd_kernel")
LOG_SOFTMAX_BWD_LOOPED = LazyKernel(_KERNELS, "_log_softmax_bwd_looped_kernel")
LOG_SOFTMAX_BWD_SPLIT = LazyKernel(_KERNELS, "_log_softmax_bwd_split_kernel")


def _make_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, int]:
    return torch.randn(shape, device=device).to(dtype), -1


def _make_backward_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    y = torch.log_softmax(torch.randn(shape, device=device), -1).to(dtype)
    return torch.randn(shape, device=device).to(dtype), y, -1


log_softmax_backward = Op(
    "log_softmax_backward",
    reference=log_softmax_backward_reference,
    args=(TensorArg("grad"), TensorArg("y", same_shape_as="grad"), DimArg("dim", of="y")),
    implementations=rowwise.along_dim_backward_impls(
        LOG_SOFTMAX_BWD, LOG_SOFTMAX_BWD_LOOPED, split=LOG_SOFTMAX_BWD_SPLIT
    ),
    bucket=lambda grad, y, dim: rowwise.along_dim_bucket(y, dim),
    reduction_length=lambda grad, y, dim: rowwise.along_dim_length(y, dim),
    make_inputs=_make_backward_inputs,
)

log_softmax = Op(
    "log_softmax",
    reference=log_softmax_reference,
    args=(TensorArg("x"), DimArg("dim", of="x")),
    implementations=rowwise.along_dim_impls(
        LOG_SOFTMAX_FWD,
        LOG_SOFTMAX_FWD_LOOPED,
        LOG_SOFTMAX_FWD_PERSISTENT,
        LOG_SOFTMAX_FWD_PERSISTENT_LOOPED,
        split=LOG_SOFTMAX_FWD_SPLIT,
        split_looped=LOG_SOFTMAX_FWD_SPLIT_LOOPED,
    ),
    bucket=rowwise.along_dim_bucket,
    reduction_length=rowwise.along_dim_length,
    # The gradient needs only the output: dx = dy - exp(y) * sum(dy).
    backward=Backward(
        save=lambda inputs, y: (y, inputs[1]),
        grads=lambda saved, grad: (log_softmax_backward(grad, saved[0], saved[1]), None),
    ),
    make_inputs=_make_inputs,
)
