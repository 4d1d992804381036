"""softmax: kernels, declaration and the op object ``kernelgate.softmax`` (launchers from rowwise)."""

from __future__ import annotations

import torch

from kernelgate import rowwise
from kernelgate.contract import DimArg, TensorArg
from kernelgate.launch import LazyKernel
from kernelgate.library import Backward
from kernelgate.op import Op
from kernelgate.ops.softmax.reference import softmax_backward_reference, softmax_reference

__all__ = ["softmax", "softmax_backward"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
SOFTMAX_FWD = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_kernel")
SOFTMAX_FWD_LOOPED = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_looped_kernel")
SOFTMAX_FWD_PERSISTENT = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_persistent_kernel")
SOFTMAX_FWD_PERSISTENT_LOOPED = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_persistent_looped_kernel")
SOFTMAX_FWD_SPLIT = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_split_kernel")
SOFTMAX_FWD_SPLIT_LOOPED = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_split_looped_kernel")
SOFTMAX_BWD = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_bwd_kernel")
SOFTMAX_BWD_LOOPED = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_bwd_looped_kernel")
SOFTMAX_BWD_SPLIT = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_bwd_split_kernel")


def _make_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, int]:
    return torch.randn(shape, device=device).to(dtype), -1


def _make_backward_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    y = torch.softmax(torch.randn(shape, device=device), -1).to(dtype)
    return torch.randn(shape, device=device).to(dtype), y, -1


softmax_backward = Op(
    "softmax_backward",
    reference=softmax_backward_reference,
    args=(TensorArg("grad"), TensorArg("y", same_shape_as="grad"), DimArg("dim", of="y")),
    implementations=rowwise.along_dim_backward_impls(SOFTMAX_BWD, SOFTMAX_BWD_LOOPED, split=SOFTMAX_BWD_SPLIT),
    bucket=lambda grad, y, dim: rowwise.along_dim_bucket(y, dim),
    reduction_length=lambda grad, y, dim: rowwise.along_dim_length(y, dim),
    make_inputs=_make_backward_inputs,
)

softmax = Op(
    "softmax",
    reference=softmax_reference,
    args=(TensorArg("x"), DimArg("dim", of="x")),
    implementations=rowwise.along_dim_impls(
        SOFTMAX_FWD,
        SOFTMAX_FWD_LOOPED,
        SOFTMAX_FWD_PERSISTENT,
        SOFTMAX_FWD_PERSISTENT_LOOPED,
        split=SOFTMAX_FWD_SPLIT,
        split_looped=SOFTMAX_FWD_SPLIT_LOOPED,
    ),
    bucket=rowwise.along_dim_bucket,
    reduction_length=rowwise.along_dim_length,
    # The gradient needs only the output: dx = y * (dy - sum(dy * y)).
    backward=Backward(
        save=lambda inputs, y: (y, inputs[1]),
        grads=lambda saved, grad: (softmax_backward(grad, saved[0], saved[1]), None),
    ),
    make_inputs=_make_inputs,
)
