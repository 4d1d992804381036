"""softmax: declaration, launchers and the op object ``kernelgate.softmax``."""

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
from kernelgate.ops.softmax.reference import softmax_backward_reference, softmax_reference

__all__ = ["softmax", "softmax_backward"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
SOFTMAX_FWD = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_kernel")
SOFTMAX_FWD_LOOPED = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_looped_kernel")
SOFTMAX_BWD = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_bwd_kernel")
SOFTMAX_BWD_LOOPED = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_bwd_looped_kernel")


def _row_length(x: torch.Tensor, dim: int) -> int:
    return x.shape[dim] if x.dim() else 1


def _run_rows(x: torch.Tensor, dim: int, kernel: LazyKernel, block: int, num_warps: int) -> torch.Tensor:
    last = x.dim() == 0 or dim in (-1, x.dim() - 1)
    moved = x if last else x.movedim(dim, -1)
    rows = as_rows(moved, "x")
    y = empty(moved.shape, dtype=x.dtype, device=x.device)  # contiguous: rows n_cols apart
    launch(
        kernel, (rows.n_rows,), rows.tensor, y, rows.stride, rows.n_cols, rows.n_cols,
        BLOCK_N=block, num_warps=num_warps,
    )  # fmt: skip
    # Contiguous in x's layout, as the reference's result (the fake tensor torch.compile plans with).
    return y if last else y.movedim(-1, dim).contiguous()


def _launch_single_block(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
    return _run_rows(x, dim, SOFTMAX_FWD, rowwise.single_block(_row_length(x, dim)), config["num_warps"])


def _launch_looped(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
    return _run_rows(x, dim, SOFTMAX_FWD_LOOPED, config["BLOCK_N"], config["num_warps"])


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
    last = y.dim() == 0 or dim in (-1, y.dim() - 1)
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
    return _run_backward_rows(grad, y, dim, SOFTMAX_BWD, rowwise.single_block(_row_length(y, dim)), config["num_warps"])


def _launch_backward_looped(grad: torch.Tensor, y: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
    return _run_backward_rows(grad, y, dim, SOFTMAX_BWD_LOOPED, config["BLOCK_N"], config["num_warps"])


def _make_backward_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    y = torch.softmax(torch.randn(shape, device=device), -1).to(dtype)
    return torch.randn(shape, device=device).to(dtype), y, -1


softmax_backward = Op(
    "softmax_backward",
    reference=softmax_backward_reference,
    args=(TensorArg("grad"), TensorArg("y", same_shape_as="grad"), DimArg("dim", of="y")),
    implementations=_row_impls(
        _launch_backward_single_block, _launch_backward_looped, (SOFTMAX_BWD, SOFTMAX_BWD_LOOPED)
    ),
    bucket=lambda grad, y, dim: _bucket(y, dim),
    reduction_length=lambda grad, y, dim: _row_length(y, dim),
    make_inputs=_make_backward_inputs,
)

softmax = Op(
    "softmax",
    reference=softmax_reference,
    args=(TensorArg("x"), DimArg("dim", of="x")),
    implementations=_row_impls(_launch_single_block, _launch_looped, (SOFTMAX_FWD, SOFTMAX_FWD_LOOPED)),
    bucket=_bucket,
    reduction_length=_row_length,
    # The gradient needs only the output: dx = y * (dy - sum(dy * y)).
    backward=Backward(
        save=lambda inputs, y: (y, inputs[1]),
        grads=lambda saved, grad: (softmax_backward(grad, saved[0], saved[1]), None),
    ),
    make_inputs=_make_inputs,
)
