"""rms_norm: declaration, launchers and the op object ``kernelgate.rms_norm``."""

from __future__ import annotations

import torch

from kernelgate import rowwise
from kernelgate.config import Config
from kernelgate.contract import ScalarArg, TensorArg
from kernelgate.launch import LazyKernel, as_rows, empty, launch
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.rms_norm.reference import rms_norm_reference

__all__ = ["rms_norm"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
RMS_NORM_FWD = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_fwd_kernel")
RMS_NORM_FWD_LOOPED = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_fwd_looped_kernel")


def _run_rows(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, kernel: LazyKernel, block: int, num_warps: int
) -> torch.Tensor:
    rows = as_rows(x, "x")
    w = weight if weight is None or weight.stride(0) == 1 else weight.contiguous()
    y = empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous: rows n_cols apart
    launch(
        kernel,
        (rows.n_rows,),
        rows.tensor,
        rows.tensor if w is None else w,  # any pointer: the kernel reads no weight without HAS_WEIGHT
        y,
        rows.stride,
        rows.n_cols,
        rows.n_cols,
        eps,
        HAS_WEIGHT=w is not None,
        BLOCK_N=block,
        num_warps=num_warps,
    )
    return y


def _launch_single_block(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> torch.Tensor:
    return _run_rows(x, weight, eps, RMS_NORM_FWD, rowwise.single_block(x.shape[-1]), config["num_warps"])


def _launch_looped(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config) -> torch.Tensor:
    return _run_rows(x, weight, eps, RMS_NORM_FWD_LOOPED, config["BLOCK_N"], config["num_warps"])


def _bucket(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[int, int, bool, bool]:
    n = x.shape[-1]
    return (*rowwise.row_bucket(x.numel() // max(n, 1), n), weight is not None)


def _row_length(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> int:
    return int(x.shape[-1])


def _make_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, float]:
    return torch.randn(shape, device=device).to(dtype), torch.randn(shape[-1], device=device).to(dtype), 1e-6


rms_norm = Op(
    "rms_norm",
    reference=rms_norm_reference,
    args=(
        TensorArg("x", min_rank=1),
        TensorArg("weight", rank=1, sizes={0: ("x", -1)}, optional=True),
        ScalarArg("eps", kind=float, min=0.0),
    ),
    implementations=(
        TritonImpl(
            "single_block",
            _launch_single_block,
            (RMS_NORM_FWD,),
            supports=lambda x, weight, eps: rowwise.fits_one_block(x.shape[-1]),
            configs=rowwise.SINGLE_BLOCK_CONFIGS,
            default_config=lambda x, weight, eps: rowwise.single_block_default(x.shape[-1]),
            prune=lambda config, x, weight, eps: rowwise.prune_single_block(config, x.shape[-1]),
        ),
        TritonImpl(
            "looped",
            _launch_looped,
            (RMS_NORM_FWD_LOOPED,),
            configs=rowwise.LOOPED_CONFIGS,
            default_config=rowwise.LOOPED_DEFAULT,
            prune=lambda config, x, weight, eps: rowwise.prune_looped(config, x.shape[-1]),
        ),
    ),
    bucket=_bucket,
    reduction_length=_row_length,
    make_inputs=_make_inputs,
)
