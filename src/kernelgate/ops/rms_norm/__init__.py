"""rms_norm: declaration, launchers and the op object ``kernelgate.rms_norm``."""

from __future__ import annotations

import torch

from kernelgate.contract import ScalarArg, TensorArg
from kernelgate.launch import LazyKernel, as_rows, launch, next_power_of_2, num_warps_for
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.rms_norm.reference import rms_norm_reference

__all__ = ["rms_norm"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
RMS_NORM_FWD = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_fwd_kernel")
RMS_NORM_FWD_LOOPED = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_fwd_looped_kernel")

# Rows up to this length are held in registers by one program; longer rows loop.
MAX_SINGLE_BLOCK = 16384
LOOP_BLOCK = 4096


def _fits_one_block(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> str | None:
    n = x.shape[-1]
    return None if n <= MAX_SINGLE_BLOCK else f"rows of {n} exceed one block of {MAX_SINGLE_BLOCK}"


def _run_rows(x: torch.Tensor, weight: torch.Tensor | None, eps: float, kernel: object, block: int) -> torch.Tensor:
    rows = as_rows(x, "x")
    w = weight if weight is None or weight.stride(0) == 1 else weight.contiguous()
    y = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    launch(
        kernel,
        (rows.shape[0],),
        rows,
        rows if w is None else w,
        y,
        rows.stride(0),
        y.stride(0),
        rows.shape[1],
        eps,
        HAS_WEIGHT=w is not None,
        BLOCK_N=block,
        num_warps=num_warps_for(block),
    )
    return y.view(x.shape)


def _launch_single_block(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    return _run_rows(x, weight, eps, RMS_NORM_FWD, next_power_of_2(max(x.shape[-1], 16)))


def _launch_looped(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    return _run_rows(x, weight, eps, RMS_NORM_FWD_LOOPED, LOOP_BLOCK)


def _example(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, float]:
    return torch.randn(64, 1000, device=device), torch.randn(1000, device=device), 1e-6


rms_norm = Op(
    "rms_norm",
    reference=rms_norm_reference,
    args=(
        TensorArg("x", min_rank=1),
        TensorArg("weight", rank=1, sizes={0: ("x", -1)}, optional=True),
        ScalarArg("eps", kind=float, min=0.0),
    ),
    implementations=(
        TritonImpl("single_block", _launch_single_block, (RMS_NORM_FWD,), supports=_fits_one_block),
        TritonImpl("looped", _launch_looped, (RMS_NORM_FWD_LOOPED,)),
    ),
    example=_example,
)
