"""softmax: declaration, launchers and the op object ``kernelgate.softmax``."""

from __future__ import annotations

import torch

from kernelgate.contract import DimArg, TensorArg
from kernelgate.launch import LazyKernel, as_rows, launch, next_power_of_2, num_warps_for
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.softmax.reference import softmax_reference

__all__ = ["softmax"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
SOFTMAX_FWD = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_kernel")
SOFTMAX_FWD_LOOPED = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_looped_kernel")

# Rows up to this length are held in registers by one program; longer rows loop.
MAX_SINGLE_BLOCK = 16384
LOOP_BLOCK = 4096


def _fits_one_block(x: torch.Tensor, dim: int) -> str | None:
    n = x.shape[dim] if x.dim() else 1
    return None if n <= MAX_SINGLE_BLOCK else f"rows of {n} exceed one block of {MAX_SINGLE_BLOCK}"


def _run_rows(x: torch.Tensor, dim: int, kernel: object, block: int) -> torch.Tensor:
    moved = x.movedim(dim, -1) if x.dim() else x
    rows = as_rows(moved, "x")
    y = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    launch(
        kernel,
        (rows.shape[0],),
        rows,
        y,
        rows.stride(0),
        y.stride(0),
        rows.shape[1],
        BLOCK_N=block,
        num_warps=num_warps_for(block),
    )
    y = y.view(moved.shape)
    return y.movedim(-1, dim) if x.dim() else y


def _launch_single_block(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    n = x.shape[dim] if x.dim() else 1
    return _run_rows(x, dim, SOFTMAX_FWD, next_power_of_2(max(n, 16)))


def _launch_looped(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return _run_rows(x, dim, SOFTMAX_FWD_LOOPED, LOOP_BLOCK)


def _example(device: torch.device) -> tuple[torch.Tensor, int]:
    return torch.randn(64, 1000, device=device), -1


softmax = Op(
    "softmax",
    reference=softmax_reference,
    args=(TensorArg("x"), DimArg("dim", of="x")),
    implementations=(
        TritonImpl("single_block", _launch_single_block, (SOFTMAX_FWD,), supports=_fits_one_block),
        TritonImpl("looped", _launch_looped, (SOFTMAX_FWD_LOOPED,)),
    ),
    example=_example,
)
