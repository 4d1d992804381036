"""rms_norm: declaration, launchers and the op object ``kernelgate.rms_norm``."""

from __future__ import annotations

import torch

from kernelgate.bucket import aligned16, pow2
from kernelgate.config import Config, ConfigSpace
from kernelgate.contract import ScalarArg, TensorArg
from kernelgate.launch import LazyKernel, as_rows, empty, launch, next_power_of_2, num_warps_for
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.rms_norm.reference import rms_norm_reference

__all__ = ["rms_norm"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
RMS_NORM_FWD = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_fwd_kernel")
RMS_NORM_FWD_LOOPED = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_fwd_looped_kernel")

# Rows up to this length are held in registers by one program; longer rows loop.
MAX_SINGLE_BLOCK = 16384
# Elements each thread holds per block: more spills registers.
MAX_PER_THREAD = 64


def _single_block(x: torch.Tensor) -> int:
    return next_power_of_2(max(x.shape[-1], 16))


def _fits_one_block(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> str | None:
    n = x.shape[-1]
    return None if n <= MAX_SINGLE_BLOCK else f"rows of {n} exceed one block of {MAX_SINGLE_BLOCK}"


def _per_thread_ok(block: int, num_warps: int) -> bool:
    """No more elements per thread than registers hold, and no warp without an element (beyond one)."""
    return block // (32 * num_warps) <= MAX_PER_THREAD and (num_warps == 1 or block >= 32 * num_warps)


def _prune_single_block(config: Config, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> bool:
    return _per_thread_ok(_single_block(x), config["num_warps"])


def _prune_looped(config: Config, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> bool:
    block = config["BLOCK_N"]
    return block <= next_power_of_2(x.shape[-1]) and _per_thread_ok(block, config["num_warps"])


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
    return _run_rows(x, weight, eps, RMS_NORM_FWD, _single_block(x), config["num_warps"])


def _launch_looped(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config) -> torch.Tensor:
    return _run_rows(x, weight, eps, RMS_NORM_FWD_LOOPED, config["BLOCK_N"], config["num_warps"])


def _bucket(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[int, int, bool, bool]:
    n = x.shape[-1]
    return pow2(x.numel() // max(n, 1)), pow2(n), aligned16(n), weight is not None


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
            supports=_fits_one_block,
            configs=ConfigSpace(num_warps=(1, 2, 4, 8, 16, 32)),
            default_config=lambda x, weight, eps: {"num_warps": num_warps_for(_single_block(x))},
            prune=_prune_single_block,
        ),
        TritonImpl(
            "looped",
            _launch_looped,
            (RMS_NORM_FWD_LOOPED,),
            configs=ConfigSpace(BLOCK_N=(1024, 2048, 4096, 8192), num_warps=(4, 8, 16)),
            default_config={"BLOCK_N": 4096, "num_warps": 8},
            prune=_prune_looped,
        ),
    ),
    bucket=_bucket,
    reduction_length=_row_length,
    make_inputs=_make_inputs,
)
