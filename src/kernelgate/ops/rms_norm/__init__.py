"""rms_norm: declaration, launchers and the op object ``kernelgate.rms_norm``."""

from __future__ import annotations

import torch

from kernelgate import rowwise
from kernelgate.config import Config
from kernelgate.contract import ScalarArg, TensorArg
from kernelgate.launch import LazyKernel, Rows, as_rows, empty, launch
from kernelgate.library import Backward
from kernelgate.op import Op
from kernelgate.ops.rms_norm.reference import rms_norm_backward_reference, rms_norm_reference

__all__ = ["rms_norm", "rms_norm_backward"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
RMS_NORM_FWD = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_fwd_kernel")
RMS_NORM_FWD_LOOPED = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_fwd_looped_kernel")
RMS_NORM_FWD_PERSISTENT = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_fwd_persistent_kernel")
RMS_NORM_FWD_PERSISTENT_LOOPED = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_fwd_persistent_looped_kernel")
RMS_NORM_FWD_SPLIT = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_fwd_split_kernel")
RMS_NORM_BWD = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_bwd_kernel")
RMS_NORM_BWD_LOOPED = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_bwd_looped_kernel")
RMS_NORM_BWD_STATS = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_bwd_stats_kernel")
RMS_NORM_BWD_COLUMNS = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_bwd_columns_kernel")
RMS_NORM_BWD_SPLIT_ROWS = LazyKernel("kernelgate.ops.rms_norm.kernels", "_rms_norm_bwd_split_rows_kernel")
RMS_NORM_BWD_SPLIT_ROWS_PIPELINED = LazyKernel(
    "kernelgate.ops.rms_norm.kernels", "_rms_norm_bwd_split_rows_pipelined_kernel"
)
# The blocks of a row the pipelined split_rows backward copies ahead: x, dy and the weight, read twice
# (add_rms_norm's grad_s is a fifth).
PIPELINED_BLOCKS = 4
# Programs of the looped and split backwards per multiprocessor: enough to fill the GPU, few enough that the
# partial sums of dweight stay small. The single-block backward's depend on its block
# (rowwise.single_block_backward_programs_per_sm).
BWD_PROGRAMS_PER_SM = 4


def _forward_operands(x: torch.Tensor, weight: torch.Tensor | None) -> tuple[Rows, torch.Tensor, torch.Tensor]:
    """A forward's rows of x, the weight pointer (contiguous; x's rows where there is no weight, which the kernels
    read only with HAS_WEIGHT) and the output, contiguous: rows n_cols apart."""
    rows = as_rows(x, "x")
    w = rows.tensor if weight is None else weight if weight.stride(0) == 1 else weight.contiguous()
    return rows, w, empty(x.shape, dtype=x.dtype, device=x.device)


def _run_rows(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, kernel: LazyKernel, block: int, config: Config
) -> torch.Tensor:
    rows, w, y = _forward_operands(x, weight)
    rowwise.launch_rows(
        kernel, rows.n_rows, (rows.tensor, w, y, rows.stride, rows.n_cols), (rows.n_cols, eps), config=config,
        block=block, HAS_WEIGHT=weight is not None,
        EVEN_N=rows.n_cols % block == 0 and config.get("ROWS", 1) == 1,  # a partial last tile of rows needs masks
    )  # fmt: skip
    return y


def _launch_single_block(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> torch.Tensor:
    return _run_rows(x, weight, eps, RMS_NORM_FWD, rowwise.single_block(x.shape[-1]), config)


def _launch_looped(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config) -> torch.Tensor:
    return _run_rows(x, weight, eps, RMS_NORM_FWD_LOOPED, config["BLOCK_N"], config)


def _launch_persistent(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> torch.Tensor:
    rows, w, y = _forward_operands(x, weight)
    launch(
        RMS_NORM_FWD_PERSISTENT, (rowwise.persistent_programs(x.device, rows.n_rows, config),), rows.tensor, w, y,
        rows.stride, rows.n_cols, rows.n_rows, rows.n_cols, eps, HAS_WEIGHT=weight is not None,
        BLOCK_N=rowwise.single_block(rows.n_cols), NUM_STAGES=config["NUM_STAGES"], num_warps=config["num_warps"],
        EVEN_N=rows.n_cols == rowwise.single_block(rows.n_cols),
    )  # fmt: skip
    return y


def _launch_persistent_looped(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> torch.Tensor:
    rows, w, y = _forward_operands(x, weight)
    block = config["BLOCK_N"]
    programs = rowwise.persistent_looped_programs(x.device, rows.n_rows, rows.n_cols * x.element_size(), config)
    launch(
        RMS_NORM_FWD_PERSISTENT_LOOPED, (programs,), rows.tensor, w, y, rows.stride, rows.n_cols, rows.n_rows,
        rows.n_cols, eps, HAS_WEIGHT=weight is not None, BLOCK_N=block, num_warps=config["num_warps"],
        EVEN_N=rows.n_cols % block == 0,
    )  # fmt: skip
    return y


def _launch_split_rows(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> torch.Tensor:
    rows, w, y = _forward_operands(x, weight)
    rowwise.launch_split_rows(
        RMS_NORM_FWD_SPLIT, rows, (rows.tensor, w, y), (rows.stride, rows.n_cols), (eps,), 1, config=config,
        HAS_WEIGHT=weight is not None, EVEN_N=rows.n_cols % config["BLOCK_N"] == 0,
    )  # fmt: skip
    return y


def _bucket(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[int, int, bool, bool]:
    n = x.shape[-1]
    return (*rowwise.row_bucket(x.numel() // max(n, 1), n), weight is not None)


def _row_length(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> int:
    return int(x.shape[-1])


def _row_count(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> int:
    return x.numel() // max(int(x.shape[-1]), 1)


# The single-block backward's FEW_LIVE order (dw before dx, dx from one number a row, xhat never a vector): always
# for add_rms_norm (with grad_s), and for rms_norm from blocks of FEW_LIVE_MIN_BLOCK. Compiled for sm_90 by Triton
# 3.6.0 it keeps less in local memory where a row spills (add_rms_norm bf16 at 4096x16384: 96 bytes a thread at 8
# warps against 344, none against 88 at 32 warps with WEIGHT_PER_TILE). On the H200, tuned over the same
# configurations (benchmarks/results/h200/norm-backward-9904764-5f9af52/), add_rms_norm's backward took 2 to 19 %
# less time at every shape measured (rows of 512, 8192 and 16384, float32 and bfloat16), rms_norm's 10 to 12 % less
# at rows of 16384, but 5.6 % more at bf16 8192x8192 and 1.6 % more at float32 65536x512.
FEW_LIVE_MIN_BLOCK = 16384


def _make_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, float]:
    return torch.randn(shape, device=device).to(dtype), torch.randn(shape[-1], device=device).to(dtype), 1e-6


def _backward_operands(
    grad: torch.Tensor, grad_s: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor | None
) -> tuple[Rows, Rows, Rows, torch.Tensor | None]:
    """A backward's rows of x, grad and grad_s (x's where there is none: any pointer without HAS_DS), and the
    weight with unit stride."""
    x_rows, g_rows = as_rows(x, "x"), as_rows(grad, "grad")
    ds_rows = as_rows(grad_s, "grad_s") if grad_s is not None else x_rows
    return x_rows, g_rows, ds_rows, weight if weight is None or weight.stride(0) == 1 else weight.contiguous()


def run_backward(
    grad: torch.Tensor,
    grad_s: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    *,
    looped: bool,
    block: int,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dx and dweight of rms_norm(x); with ``grad_s``, add_rms_norm's, where ``x`` is the sum s and
    ``grad_s`` the gradient that reaches s directly (added to dx)."""
    x_rows, g_rows, ds_rows, w = _backward_operands(grad, grad_s, x, weight)
    n_rows, n_cols = x_rows.n_rows, x_rows.n_cols
    per_sm = BWD_PROGRAMS_PER_SM if looped else rowwise.single_block_backward_programs_per_sm(block)
    rows_per_program, programs, meta = rowwise.row_groups(x.device, n_rows, per_sm, config)
    for switch in ("PREFETCH", "WEIGHT_PER_TILE"):  # the single-block kernel's (rowwise.ROW_BLOCK_BACKWARD_CONFIGS)
        if switch in config:
            meta[switch] = bool(config[switch])
    if not looped:
        meta["FEW_LIVE"] = grad_s is not None or block >= FEW_LIVE_MIN_BLOCK
    dx = empty(x.shape, dtype=x.dtype, device=x.device)
    partial = torch.empty((programs, n_cols) if w is not None else (1,), dtype=torch.float32, device=x.device)
    # The looped kernel keeps each row's rstd and mean(g * xhat) here between its two passes.
    stats = (torch.empty((n_rows, 2), dtype=torch.float32, device=x.device),) if looped else ()
    launch(
        RMS_NORM_BWD_LOOPED if looped else RMS_NORM_BWD, (programs,), g_rows.tensor, ds_rows.tensor, x_rows.tensor,
        x_rows.tensor if w is None else w, dx, partial, *stats, g_rows.stride, ds_rows.stride, x_rows.stride, n_cols,
        n_rows, n_cols, eps, rows_per_program, HAS_DS=grad_s is not None, HAS_WEIGHT=w is not None, BLOCK_N=block,
        num_warps=config["num_warps"], **meta,
    )  # fmt: skip
    if w is None:
        return dx, x.new_empty(0)
    return dx, rowwise.sum_partials(partial[None], [w])[0]


def run_backward_split(
    grad: torch.Tensor,
    grad_s: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`run_backward` in two kernels: each row's statistics, then dx and dweight's partial sums by column
    blocks of row groups (:func:`kernelgate.rowwise.column_row_groups`), a few rows of partial sums in all."""
    x_rows, g_rows, ds_rows, w = _backward_operands(grad, grad_s, x, weight)
    w_ptr = x_rows.tensor if w is None else w
    n_rows, n_cols, block, warps = x_rows.n_rows, x_rows.n_cols, config["BLOCK_N"], config["num_warps"]
    stats = torch.empty((n_rows, 2), dtype=torch.float32, device=x.device)
    rows_per_program, programs, _ = rowwise.row_groups(x.device, n_rows, BWD_PROGRAMS_PER_SM, {})
    launch(
        RMS_NORM_BWD_STATS, (programs,), g_rows.tensor, x_rows.tensor, w_ptr, stats, g_rows.stride, x_rows.stride,
        n_rows, n_cols, eps, rows_per_program, HAS_WEIGHT=w is not None, BLOCK_N=block, num_warps=warps,
    )  # fmt: skip
    blocks, rows_per_group, groups = rowwise.column_row_groups(x.device, n_rows, n_cols, block, BWD_PROGRAMS_PER_SM)
    dx = empty(x.shape, dtype=x.dtype, device=x.device)
    partial = torch.empty((groups, n_cols) if w is not None else (1,), dtype=torch.float32, device=x.device)
    launch(
        RMS_NORM_BWD_COLUMNS, (blocks, groups), g_rows.tensor, ds_rows.tensor, x_rows.tensor, w_ptr, dx, partial,
        stats, g_rows.stride, ds_rows.stride, x_rows.stride, n_cols, n_rows, n_cols, rows_per_group,
        HAS_DS=grad_s is not None, HAS_WEIGHT=w is not None, BLOCK_N=block, num_warps=warps,
    )  # fmt: skip
    if w is None:
        return dx, x.new_empty(0)
    return dx, rowwise.sum_partials(partial[None], [w])[0]


def run_backward_split_rows(
    grad: torch.Tensor,
    grad_s: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    config: Config,
    *,
    kernel: LazyKernel = RMS_NORM_BWD_SPLIT_ROWS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`run_backward` in one kernel that reads x and grad once: each row split over programs that exchange its
    sums, in groups that loop over rows (:func:`kernelgate.rowwise.split_rows_groups`), a row of dweight's partial
    sums a group. ``kernel``: one with ``_rms_norm_bwd_split_rows_kernel``'s arguments (its pipelined form, or a
    benchmark's variant)."""
    x_rows, g_rows, ds_rows, w = _backward_operands(grad, grad_s, x, weight)
    n_rows, n_cols, block = x_rows.n_rows, x_rows.n_cols, config["BLOCK_N"]
    groups = rowwise.split_rows_groups(x.device, n_rows, n_cols, block, config["PER_SM"])
    dx = empty(x.shape, dtype=x.dtype, device=x.device)
    partial = torch.empty((groups, n_cols) if w is not None else (1,), dtype=torch.float32, device=x.device)
    rowwise.launch_split_rows(
        kernel, x_rows, (g_rows.tensor, ds_rows.tensor, x_rows.tensor,
        x_rows.tensor if w is None else w, dx, partial), (g_rows.stride, ds_rows.stride, x_rows.stride, n_cols),
        (n_rows, eps), 2, config=config, groups=groups, HAS_DS=grad_s is not None, HAS_WEIGHT=w is not None,
        PREFETCH=bool(config["PREFETCH"]), EVEN_N=n_cols % block == 0,
    )  # fmt: skip
    if w is None:
        return dx, x.new_empty(0)
    return dx, rowwise.sum_partials(partial[None], [w])[0]


def _launch_backward_split(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_backward_split(grad, None, x, weight, eps, config)


def _launch_backward_split_rows(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_backward_split_rows(grad, None, x, weight, eps, config)


def _launch_backward_split_rows_pipelined(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_backward_split_rows(grad, None, x, weight, eps, config, kernel=RMS_NORM_BWD_SPLIT_ROWS_PIPELINED)


def _launch_backward(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    block = rowwise.single_block(x.shape[-1])
    return run_backward(grad, None, x, weight, eps, looped=False, block=block, config=config)


def _launch_backward_looped(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_backward(grad, None, x, weight, eps, looped=True, block=config["BLOCK_N"], config=config)


def _make_backward_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    grad, x, w = (torch.randn(s, device=device).to(dtype) for s in (shape, shape, shape[-1:]))
    return grad, x, w, 1e-6


rms_norm_backward = Op(
    "rms_norm_backward",
    reference=rms_norm_backward_reference,
    args=(
        TensorArg("grad", min_rank=1),
        TensorArg("x", same_shape_as="grad"),
        TensorArg("weight", rank=1, sizes={0: ("x", -1)}, optional=True),
        ScalarArg("eps", kind=float, min=0.0),
    ),
    implementations=(
        rowwise.single_block_impl(
            _launch_backward,
            RMS_NORM_BWD,
            lambda grad, x, *_: x.shape[-1],
            lambda grad, x, *_: _row_count(x, None, 0.0),
            norm_backward=True,
            helpers=(rowwise.PARTIAL_SUMS,),
        ),
        rowwise.looped_impl(
            _launch_backward_looped,
            RMS_NORM_BWD_LOOPED,
            lambda grad, x, *_: x.shape[-1],
            helpers=(rowwise.PARTIAL_SUMS,),
        ),
        rowwise.split_impl(
            _launch_backward_split,
            (RMS_NORM_BWD_STATS, RMS_NORM_BWD_COLUMNS, rowwise.PARTIAL_SUMS),
            lambda grad, x, *_: x.shape[-1],
        ),
        rowwise.split_rows_backward_impl(
            _launch_backward_split_rows,
            (RMS_NORM_BWD_SPLIT_ROWS, rowwise.PARTIAL_SUMS),
            lambda grad, x, *_: x.shape[-1],
        ),
        rowwise.split_rows_backward_impl(
            _launch_backward_split_rows_pipelined,
            (RMS_NORM_BWD_SPLIT_ROWS_PIPELINED, rowwise.PARTIAL_SUMS),
            lambda grad, x, *_: x.shape[-1],
            pipelined_blocks=PIPELINED_BLOCKS,
        ),
    ),
    bucket=lambda grad, x, weight, eps: _bucket(x, weight, eps),
    reduction_length=lambda grad, x, weight, eps: int(x.numel() // max(x.shape[-1], 1)) + int(x.shape[-1]),
    normwise_outputs=(1,),  # dweight: a sum over rows that cancels
    returns="(Tensor, Tensor)",
    make_inputs=_make_backward_inputs,
)


def _rms_norm_grads(saved: tuple[object, ...], grad: torch.Tensor) -> tuple[object, ...]:
    x, weight, eps = saved
    assert isinstance(x, torch.Tensor) and isinstance(eps, float)
    dx, dw = rms_norm_backward(grad, x, weight, eps)
    return dx, (dw if weight is not None else None), None


rms_norm = Op(
    "rms_norm",
    reference=rms_norm_reference,
    args=(
        TensorArg("x", min_rank=1),
        TensorArg("weight", rank=1, sizes={0: ("x", -1)}, optional=True),
        ScalarArg("eps", kind=float, min=0.0),
    ),
    implementations=(
        rowwise.single_block_impl(
            _launch_single_block, RMS_NORM_FWD, _row_length, _row_count, max_block=rowwise.MAX_SINGLE_BLOCK_FORWARD
        ),
        rowwise.looped_impl(
            _launch_looped, RMS_NORM_FWD_LOOPED, lambda x, *_: x.shape[-1], configs=rowwise.LOOPED_CONFIGS_32_WARPS
        ),
        rowwise.persistent_impl(_launch_persistent, RMS_NORM_FWD_PERSISTENT, _row_length, lambda x, *_: x),
        rowwise.persistent_looped_impl(_launch_persistent_looped, RMS_NORM_FWD_PERSISTENT_LOOPED, _row_length),
        rowwise.split_rows_impl(_launch_split_rows, (RMS_NORM_FWD_SPLIT,), _row_length),
    ),
    bucket=_bucket,
    reduction_length=_row_length,
    # The gradient needs x (held by autograd anyway) and the weight; rstd is recomputed in the
    # backward kernel rather than kept, so the forward allocates nothing extra for it.
    backward=Backward(save=lambda inputs, y: tuple(inputs), grads=_rms_norm_grads),
    make_inputs=_make_inputs,
)
