"""log_softmax: declaration, launchers and the op object ``kernelgate.log_softmax``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernelgate import rowwise
from kernelgate.config import Config
from kernelgate.contract import DimArg, TensorArg
from kernelgate.launch import LazyKernel, as_rows, empty, launch
from kernelgate.library import Backward
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.log_softmax.reference import log_softmax_backward_reference, log_softmax_reference

__all__ = ["log_softmax", "log_softmax_backward"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
_KERNELS = "kernelgate.ops.log_softmax.kernels"
LOG_SOFTMAX_FWD = LazyKernel(_KERNELS, "_log_softmax_fwd_kernel")
LOG_SOFTMAX_FWD_LOOPED = LazyKernel(_KERNELS, "_log_softmax_fwd_looped_kernel")
LOG_SOFTMAX_BWD = LazyKernel(_KERNELS, "_log_softmax_bwd_kernel")
LOG_SOFTMAX_BWD_LOOPED = LazyKernel(_KERNELS, "_log_softmax_bwd_looped_kernel")


def _row_length(x: torch.Tensor, dim: int) -> int:
    return x.shape[dim] if x.dim() else 1


def _is_last(x: torch.Tensor, dim: int) -> bool:
    return x.dim() == 0 or dim in (-1, x.dim() - 1)


def _run_rows(x: torch.Tensor, dim: int, kernel: LazyKernel, block: int, num_warps: int) -> torch.Tensor:
    last = _is_last(x, dim)
    moved = x if last else x.movedim(dim, -1)
    rows = as_rows(moved, "x")
    y = empty(moved.shape, dtype=x.dtype, device=x.device)  # contiguous: rows n_cols apart
    launch(
        kernel, (rows.n_rows,), rows.tensor, y, rows.stride, rows.n_cols, rows.n_cols,
        BLOCK_N=block, num_warps=num_warps,
    )  # fmt: skip
    # torch's result is contiguous, and so is the fake tensor torch.compile plans with: match it.
    return y if last else y.movedim(-1, dim).contiguous()


def _launch_single_block(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
    return _run_rows(x, dim, LOG_SOFTMAX_FWD, rowwise.single_block(_row_length(x, dim)), config["num_warps"])


def _launch_looped(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
    return _run_rows(x, dim, LOG_SOFTMAX_FWD_LOOPED, config["BLOCK_N"], config["num_warps"])


def _bucket(x: torch.Tensor, dim: int) -> tuple[int, int, bool]:
    n = _row_length(x, dim)
    return rowwise.row_bucket(x.numel() // max(n, 1), n)


def _make_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, int]:
    return torch.randn(shape, device=device).to(dtype), -1


def _row_impls(
    launch_single: Callable[..., Any], launch_looped: Callable[..., Any], kernels: tuple[LazyKernel, LazyKernel]
) -> tuple[TritonImpl, ...]:
    """Single-block and looped implementations of a row-wise op whose last two arguments are (tensor, dim)."""

    def n_cols(*args: Any) -> int:
        return _row_length(args[-2], args[-1])

    return rowwise.single_block_impl(launch_single, kernels[0], n_cols), rowwise.looped_impl(
        launch_looped, kernels[1], n_cols
    )


def _run_backward_rows(
    grad: torch.Tensor, y: torch.Tensor, dim: int, kernel: LazyKernel, block: int, num_warps: int
) -> torch.Tensor:
    last = _is_last(y, dim)
    moved_g, moved_y = (grad, y) if last else (grad.movedim(dim, -1), y.movedim(dim, -1))
    g_rows, y_rows = as_rows(moved_g, "grad"), as_rows(moved_y, "y")
    dx = empty(moved_y.shape, dtype=grad.dtype, device=grad.device)
    launch(
        kernel, (y_rows.n_rows,), g_rows.tensor, y_rows.tensor, dx, g_rows.stride, y_rows.stride, y_rows.n_cols,
        y_rows.n_cols, BLOCK_N=block, num_warps=num_warps,
    )  # fmt: skip
    return dx if last else dx.movedim(-1, dim).contiguous()


def _launch_backward_single_block(
    grad: torch.Tensor, y: torch.Tensor, dim: int = -1, *, config: Config
) -> torch.Tensor:
    block = rowwise.single_block(_row_length(y, dim))
    return _run_backward_rows(grad, y, dim, LOG_SOFTMAX_BWD, block, config["num_warps"])


def _launch_backward_looped(grad: torch.Tensor, y: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
    return _run_backward_rows(grad, y, dim, LOG_SOFTMAX_BWD_LOOPED, config["BLOCK_N"], config["num_warps"])


def _make_backward_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    y = torch.log_softmax(torch.randn(shape, device=device), -1).to(dtype)
    return torch.randn(shape, device=device).to(dtype), y, -1


log_softmax_backward = Op(
    "log_softmax_backward",
    reference=log_softmax_backward_reference,
    args=(TensorArg("grad"), TensorArg("y", same_shape_as="grad"), DimArg("dim", of="y")),
    implementations=_row_impls(
        _launch_backward_single_block, _launch_backward_looped, (LOG_SOFTMAX_BWD, LOG_SOFTMAX_BWD_LOOPED)
    ),
    bucket=lambda grad, y, dim: _bucket(y, dim),
    reduction_length=lambda grad, y, dim: _row_length(y, dim),
    make_inputs=_make_backward_inputs,
)

log_softmax = Op(
    "log_softmax",
    reference=log_softmax_reference,
    args=(TensorArg("x"), DimArg("dim", of="x")),
    implementations=_row_impls(_launch_single_block, _launch_looped, (LOG_SOFTMAX_FWD, LOG_SOFTMAX_FWD_LOOPED)),
    bucket=_bucket,
    reduction_length=_row_length,
    # The gradient needs only the output: dx = dy - exp(y) * sum(dy).
    backward=Backward(
        save=lambda inputs, y: (y, inputs[1]),
        grads=lambda saved, grad: (log_softmax_backward(grad, saved[0], saved[1]), None),
    ),
    make_inputs=_make_inputs,
)
