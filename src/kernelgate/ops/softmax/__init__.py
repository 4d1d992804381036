"""softmax: declaration, launchers and the op object ``kernelgate.softmax``."""

from __future__ import annotations

import torch

from kernelgate import rowwise
from kernelgate.config import Config
from kernelgate.contract import DimArg, TensorArg
from kernelgate.launch import LazyKernel, as_rows, empty, launch
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.softmax.reference import softmax_reference

__all__ = ["softmax"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
SOFTMAX_FWD = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_kernel")
SOFTMAX_FWD_LOOPED = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_looped_kernel")


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
    return y if last else y.movedim(-1, dim)


def _launch_single_block(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
    return _run_rows(x, dim, SOFTMAX_FWD, rowwise.single_block(_row_length(x, dim)), config["num_warps"])


def _launch_looped(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
    return _run_rows(x, dim, SOFTMAX_FWD_LOOPED, config["BLOCK_N"], config["num_warps"])


def _bucket(x: torch.Tensor, dim: int) -> tuple[int, int, bool]:
    n = _row_length(x, dim)
    return rowwise.row_bucket(x.numel() // max(n, 1), n)


def _make_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, int]:
    return torch.randn(shape, device=device).to(dtype), -1


softmax = Op(
    "softmax",
    reference=softmax_reference,
    args=(TensorArg("x"), DimArg("dim", of="x")),
    implementations=(
        TritonImpl(
            "single_block",
            _launch_single_block,
            (SOFTMAX_FWD,),
            supports=lambda x, dim: rowwise.fits_one_block(_row_length(x, dim)),
            configs=rowwise.SINGLE_BLOCK_CONFIGS,
            default_config=lambda x, dim: rowwise.single_block_default(_row_length(x, dim)),
            prune=lambda config, x, dim: rowwise.prune_single_block(config, _row_length(x, dim)),
        ),
        TritonImpl(
            "looped",
            _launch_looped,
            (SOFTMAX_FWD_LOOPED,),
            configs=rowwise.LOOPED_CONFIGS,
            default_config=rowwise.LOOPED_DEFAULT,
            prune=lambda config, x, dim: rowwise.prune_looped(config, _row_length(x, dim)),
        ),
    ),
    bucket=_bucket,
    reduction_length=_row_length,
    make_inputs=_make_inputs,
)
