"""softmax: declaration, launchers and the op object ``kernelgate.softmax``."""

from __future__ import annotations

import torch

from kernelgate.bucket import aligned16, pow2
from kernelgate.config import Config, ConfigSpace
from kernelgate.contract import DimArg, TensorArg
from kernelgate.launch import LazyKernel, as_rows, empty, launch, next_power_of_2, num_warps_for
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.softmax.reference import softmax_reference

__all__ = ["softmax"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
SOFTMAX_FWD = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_kernel")
SOFTMAX_FWD_LOOPED = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_looped_kernel")

# Rows up to this length are held in registers by one program; longer rows loop.
MAX_SINGLE_BLOCK = 16384
# Elements each thread holds per block: more spills registers.
MAX_PER_THREAD = 64


def _row_length(x: torch.Tensor, dim: int) -> int:
    return x.shape[dim] if x.dim() else 1


def _single_block(x: torch.Tensor, dim: int) -> int:
    return next_power_of_2(max(_row_length(x, dim), 16))


def _fits_one_block(x: torch.Tensor, dim: int) -> str | None:
    n = _row_length(x, dim)
    return None if n <= MAX_SINGLE_BLOCK else f"rows of {n} exceed one block of {MAX_SINGLE_BLOCK}"


def _per_thread_ok(block: int, num_warps: int) -> bool:
    """No more elements per thread than registers hold, and no warp without an element (beyond one)."""
    return block // (32 * num_warps) <= MAX_PER_THREAD and (num_warps == 1 or block >= 32 * num_warps)


def _prune_single_block(config: Config, x: torch.Tensor, dim: int) -> bool:
    return _per_thread_ok(_single_block(x, dim), config["num_warps"])


def _prune_looped(config: Config, x: torch.Tensor, dim: int) -> bool:
    block = config["BLOCK_N"]
    return block <= next_power_of_2(_row_length(x, dim)) and _per_thread_ok(block, config["num_warps"])


def _run_rows(x: torch.Tensor, dim: int, kernel: LazyKernel, block: int, num_warps: int) -> torch.Tensor:
    last = x.dim() == 0 or dim in (-1, x.dim() - 1)
    moved = x if last else x.movedim(dim, -1)
    rows = as_rows(moved, "x")
    y = empty(moved.shape, dtype=x.dtype, device=x.device)  # contiguous: rows n_cols apart
    launch(
        kernel,
        (rows.n_rows,),
        rows.tensor,
        y,
        rows.stride,
        rows.n_cols,
        rows.n_cols,
        BLOCK_N=block,
        num_warps=num_warps,
    )
    return y if last else y.movedim(-1, dim)


def _launch_single_block(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
    return _run_rows(x, dim, SOFTMAX_FWD, _single_block(x, dim), config["num_warps"])


def _launch_looped(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
    return _run_rows(x, dim, SOFTMAX_FWD_LOOPED, config["BLOCK_N"], config["num_warps"])


def _bucket(x: torch.Tensor, dim: int) -> tuple[int, int, bool]:
    n = _row_length(x, dim)
    return pow2(x.numel() // max(n, 1)), pow2(n), aligned16(n)


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
            supports=_fits_one_block,
            configs=ConfigSpace(num_warps=(1, 2, 4, 8, 16, 32)),
            default_config=lambda x, dim: {"num_warps": num_warps_for(_single_block(x, dim))},
            prune=_prune_single_block,
        ),
        TritonImpl(
            "looped",
            _launch_looped,
            (SOFTMAX_FWD_LOOPED,),
            configs=ConfigSpace(BLOCK_N=(1024, 2048, 4096, 8192), num_warps=(4, 8, 16)),
            default_config={"BLOCK_N": 4096, "num_warps": 8},
            prune=_prune_looped,
        ),
    ),
    bucket=_bucket,
    reduction_length=_row_length,
    make_inputs=_make_inputs,
)
