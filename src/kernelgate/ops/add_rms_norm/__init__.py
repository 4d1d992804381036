"""add_rms_norm: declaration, launchers and the op object ``kernelgate.add_rms_norm``.

The residual add of a transformer block fused with the RMS normalisation after it: one pass reads
``x`` and ``residual`` and writes the normalised sum ``y`` and the sum ``s``, where unfused PyTorch
writes ``s``, reads it back, and reads and writes again inside rms_norm.
"""

from __future__ import annotations

import torch

from kernelgate import rowwise
from kernelgate.config import Config
from kernelgate.contract import ScalarArg, TensorArg
from kernelgate.launch import LazyKernel, as_rows, empty
from kernelgate.library import Backward
from kernelgate.op import Op
from kernelgate.ops.add_rms_norm.reference import add_rms_norm_backward_reference, add_rms_norm_reference
from kernelgate.ops.rms_norm import (
    PIPELINED_BLOCKS,
    RMS_NORM_BWD,
    RMS_NORM_BWD_COLUMNS,
    RMS_NORM_BWD_LOOPED,
    RMS_NORM_BWD_SPLIT_ROWS,
    RMS_NORM_BWD_SPLIT_ROWS_PIPELINED,
    RMS_NORM_BWD_STATS,
    run_backward,
    run_backward_split,
    run_backward_split_rows,
)

__all__ = ["add_rms_norm", "add_rms_norm_backward"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
_KERNELS = "kernelgate.ops.add_rms_norm.kernels"
ADD_RMS_NORM_FWD = LazyKernel(_KERNELS, "_add_rms_norm_fwd_kernel")
ADD_RMS_NORM_FWD_LOOPED = LazyKernel(_KERNELS, "_add_rms_norm_fwd_looped_kernel")
ADD_RMS_NORM_FWD_SPLIT = LazyKernel(_KERNELS, "_add_rms_norm_fwd_split_kernel")
# The backward is rms_norm's, with the gradient that reaches s directly added to dx.


def _contiguous_weight(weight: torch.Tensor | None) -> torch.Tensor | None:
    return weight if weight is None or weight.stride(0) == 1 else weight.contiguous()


def _run_rows(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    kernel: LazyKernel,
    block: int,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    x_rows, r_rows = as_rows(x, "x"), as_rows(residual, "residual")
    w = _contiguous_weight(weight)
    # s has the dtype torch gives x + residual; y has s's dtype, as rms_norm(s) has.
    dtype = torch.result_type(x, residual)
    y = empty(x.shape, dtype=dtype, device=x.device)  # contiguous: rows n_cols apart
    s = empty(x.shape, dtype=dtype, device=x.device)
    n_cols = x_rows.n_cols
    any_pointer = x_rows.tensor  # the kernel reads no weight without HAS_WEIGHT
    operands = (x_rows.tensor, r_rows.tensor, any_pointer if w is None else w, y, s, x_rows.stride, r_rows.stride)
    rowwise.launch_rows(
        kernel, x_rows.n_rows, (*operands, n_cols, n_cols), (n_cols, eps), config=config, block=block,
        HAS_WEIGHT=w is not None,
        EVEN_N=n_cols % block == 0 and config.get("ROWS", 1) == 1,  # a partial last tile of rows needs masks
    )  # fmt: skip
    return y, s


def _launch_single_block(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    block = rowwise.single_block(x.shape[-1])
    return _run_rows(x, residual, weight, eps, ADD_RMS_NORM_FWD, block, config)


def _launch_looped(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    return _run_rows(x, residual, weight, eps, ADD_RMS_NORM_FWD_LOOPED, config["BLOCK_N"], config)


def _launch_split_rows(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    x_rows, r_rows = as_rows(x, "x"), as_rows(residual, "residual")
    w = _contiguous_weight(weight)
    dtype = torch.result_type(x, residual)  # as _run_rows
    y = empty(x.shape, dtype=dtype, device=x.device)
    s = empty(x.shape, dtype=dtype, device=x.device)
    n_cols = x_rows.n_cols
    rowwise.launch_split_rows(
        ADD_RMS_NORM_FWD_SPLIT, x_rows, (x_rows.tensor, r_rows.tensor, x_rows.tensor if w is None else w, y, s),
        (x_rows.stride, r_rows.stride, n_cols, n_cols), (eps,), 1, config=config, HAS_WEIGHT=w is not None,
        EVEN_N=n_cols % config["BLOCK_N"] == 0,
    )  # fmt: skip
    return y, s


def _bucket(x: torch.Tensor, weight: torch.Tensor | None) -> tuple[int, int, bool, bool]:
    n = x.shape[-1]
    return (*rowwise.row_bucket(x.numel() // max(n, 1), n), weight is not None)


def _make_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    x, residual, w = (torch.randn(s, device=device).to(dtype) for s in (shape, shape, shape[-1:]))
    return x, residual, w, 1e-6


def _launch_backward(
    grad: torch.Tensor,
    grad_s: torch.Tensor | None,
    s: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    block = rowwise.single_block(s.shape[-1])
    return run_backward(grad, grad_s, s, weight, eps, looped=False, block=block, config=config)


def _launch_backward_looped(
    grad: torch.Tensor,
    grad_s: torch.Tensor | None,
    s: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_backward(grad, grad_s, s, weight, eps, looped=True, block=config["BLOCK_N"], config=config)


def _launch_backward_split(
    grad: torch.Tensor,
    grad_s: torch.Tensor | None,
    s: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_backward_split(grad, grad_s, s, weight, eps, config)


def _launch_backward_split_rows(
    grad: torch.Tensor,
    grad_s: torch.Tensor | None,
    s: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_backward_split_rows(grad, grad_s, s, weight, eps, config)


def _launch_backward_split_rows_pipelined(
    grad: torch.Tensor,
    grad_s: torch.Tensor | None,
    s: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_backward_split_rows(grad, grad_s, s, weight, eps, config, kernel=RMS_NORM_BWD_SPLIT_ROWS_PIPELINED)


def _make_backward_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]:
    grad, grad_s, s, w = (torch.randn(n, device=device).to(dtype) for n in (shape, shape, shape, shape[-1:]))
    return grad, grad_s, s, w, 1e-6


def _backward_row_count(grad: torch.Tensor, *_: object) -> int:
    return grad.numel() // max(grad.shape[-1], 1)


def _backward_row_length(grad: torch.Tensor, grad_s: torch.Tensor | None, s: torch.Tensor, *_: object) -> int:
    return int(s.shape[-1])


add_rms_norm_backward = Op(
    "add_rms_norm_backward",
    reference=add_rms_norm_backward_reference,
    args=(
        TensorArg("grad", min_rank=1),
        TensorArg("grad_s", same_shape_as="grad", optional=True),
        TensorArg("s", same_shape_as="grad"),
        TensorArg("weight", rank=1, sizes={0: ("s", -1)}, optional=True),
        ScalarArg("eps", kind=float, min=0.0),
    ),
    implementations=(
        rowwise.single_block_impl(
            _launch_backward,
            RMS_NORM_BWD,
            _backward_row_length,
            _backward_row_count,
            norm_backward=True,
            helpers=(rowwise.PARTIAL_SUMS,),
        ),
        rowwise.looped_impl(
            _launch_backward_looped, RMS_NORM_BWD_LOOPED, _backward_row_length, helpers=(rowwise.PARTIAL_SUMS,)
        ),
        rowwise.split_impl(
            _launch_backward_split,
            (RMS_NORM_BWD_STATS, RMS_NORM_BWD_COLUMNS, rowwise.PARTIAL_SUMS),
            _backward_row_length,
        ),
        rowwise.split_rows_backward_impl(
            _launch_backward_split_rows, (RMS_NORM_BWD_SPLIT_ROWS, rowwise.PARTIAL_SUMS), _backward_row_length
        ),
        rowwise.split_rows_backward_impl(
            _launch_backward_split_rows_pipelined,
            (RMS_NORM_BWD_SPLIT_ROWS_PIPELINED, rowwise.PARTIAL_SUMS),
            _backward_row_length,
            pipelined_blocks=PIPELINED_BLOCKS + 1,  # and grad_s
        ),
    ),
    bucket=lambda grad, grad_s, s, weight, eps: (*_bucket(s, weight), grad_s is not None),
    # dx reduces over its row; dweight over every row.
    reduction_length=lambda grad, grad_s, s, weight, eps: int(s.numel() // max(s.shape[-1], 1)) + int(s.shape[-1]),
    normwise_outputs=(1,),  # dweight: a sum over rows that cancels
    returns="(Tensor, Tensor)",
    make_inputs=_make_backward_inputs,
)


def _add_rms_norm_grads(saved: tuple[object, ...], grads: tuple[torch.Tensor | None, ...]) -> tuple[object, ...]:
    s, weight, eps = saved
    assert isinstance(s, torch.Tensor) and isinstance(eps, float)
    grad_y, grad_s = grads
    if grad_y is None:  # y was not used: s's gradient passes straight to x and residual
        return grad_s, grad_s, None, None
    dx, dw = add_rms_norm_backward(grad_y, grad_s, s, weight, eps)
    # d(x + residual)/dx = d(x + residual)/dresidual = 1: both receive the gradient of s.
    return dx, dx, (dw if weight is not None else None), None


add_rms_norm = Op(
    "add_rms_norm",
    reference=add_rms_norm_reference,
    args=(
        TensorArg("x", min_rank=1),
        TensorArg("residual", same_shape_as="x"),
        TensorArg("weight", rank=1, sizes={0: ("x", -1)}, optional=True),
        ScalarArg("eps", kind=float, min=0.0),
    ),
    implementations=(
        rowwise.single_block_impl(
            _launch_single_block,
            ADD_RMS_NORM_FWD,
            lambda x, *_: x.shape[-1],
            lambda x, *_: x.numel() // max(x.shape[-1], 1),
            max_block=rowwise.MAX_SINGLE_BLOCK_FORWARD,
        ),
        rowwise.looped_impl(
            _launch_looped, ADD_RMS_NORM_FWD_LOOPED, lambda x, *_: x.shape[-1], configs=rowwise.LOOPED_CONFIGS_32_WARPS
        ),
        rowwise.split_rows_impl(_launch_split_rows, (ADD_RMS_NORM_FWD_SPLIT,), lambda x, *_: x.shape[-1]),
    ),
    bucket=lambda x, residual, weight, eps: _bucket(x, weight),
    reduction_length=lambda x, residual, weight, eps: int(x.shape[-1]),
    # The gradient needs only the sum s (an output), the weight and eps: neither x nor residual is
    # kept, and rstd is recomputed in the backward kernel rather than stored.
    backward=Backward(save=lambda inputs, outputs: (outputs[1], inputs[2], inputs[3]), grads=_add_rms_norm_grads),
    returns="(Tensor, Tensor)",
    make_inputs=_make_inputs,
)
