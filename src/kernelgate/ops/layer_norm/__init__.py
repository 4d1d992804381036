"""layer_norm: declaration, launchers and the op object ``kernelgate.layer_norm``.

A normalised shape of several dims, ``(3, 4)``, is one row of 12 elements to the kernels: ``x``
is seen as rows of ``prod(normalized_shape)`` and ``weight`` and ``bias`` as flat vectors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from kernelgate import rowwise
from kernelgate.config import Config, ConfigSpace
from kernelgate.contract import ScalarArg, ShapeArg, TensorArg
from kernelgate.launch import LazyKernel, Rows, as_contiguous, as_rows, empty, launch, num_warps_for
from kernelgate.library import Backward
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.layer_norm.reference import check_affine, layer_norm_backward_reference, layer_norm_reference

__all__ = ["layer_norm", "layer_norm_backward"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
LAYER_NORM_FWD = LazyKernel("kernelgate.ops.layer_norm.kernels", "_layer_norm_fwd_kernel")
LAYER_NORM_FWD_LOOPED = LazyKernel("kernelgate.ops.layer_norm.kernels", "_layer_norm_fwd_looped_kernel")
LAYER_NORM_FWD_SPLIT = LazyKernel("kernelgate.ops.layer_norm.kernels", "_layer_norm_fwd_split_kernel")
LAYER_NORM_FWD_SPLIT_LOOPED = LazyKernel("kernelgate.ops.layer_norm.kernels", "_layer_norm_fwd_split_looped_kernel")
LAYER_NORM_BWD = LazyKernel("kernelgate.ops.layer_norm.kernels", "_layer_norm_bwd_kernel")
LAYER_NORM_BWD_LOOPED = LazyKernel("kernelgate.ops.layer_norm.kernels", "_layer_norm_bwd_looped_kernel")
LAYER_NORM_BWD_STATS = LazyKernel("kernelgate.ops.layer_norm.kernels", "_layer_norm_bwd_stats_kernel")
LAYER_NORM_BWD_COLUMNS = LazyKernel("kernelgate.ops.layer_norm.kernels", "_layer_norm_bwd_columns_kernel")
LAYER_NORM_BWD_SPLIT_ROWS = LazyKernel("kernelgate.ops.layer_norm.kernels", "_layer_norm_bwd_split_rows_kernel")
LAYER_NORM_BWD_SPLIT_ROWS_PIPELINED = LazyKernel(
    "kernelgate.ops.layer_norm.kernels", "_layer_norm_bwd_split_rows_pipelined_kernel"
)
# The blocks of a row the pipelined split_rows backward copies ahead: x, dy and the weight, read twice.
PIPELINED_BLOCKS = 4

# The looped backward keeps four running sums per lane, the looped forward a block of x and (with
# PREFETCH) the next, and the single-block backward holds x, dy, w and the dw and db sums: fewer elements
# per thread than rowwise.MAX_PER_THREAD keep them in registers.
FWD_LOOPED_PER_THREAD = 32
BWD_PER_THREAD = 16
# 32 warps let one program of a few long rows keep enough loads in flight.
LOOPED_CONFIGS = ConfigSpace(BLOCK_N=(1024, 2048, 4096, 8192), num_warps=(4, 8, 16, 32))
# The looped forward may issue each block's load a block ahead (PREFETCH): faster at rows of 32768 and more, slower
# at some shorter ones (benchmarks/results/h200/layer-norm-variants-80b1374), so the tuner picks. Blocks of 4096
# and 8192 were the fastest at every row length measured there, so only they try it.
FWD_LOOPED_CONFIGS = ConfigSpace(**LOOPED_CONFIGS.params, PREFETCH=(0, 1))
PREFETCH_MIN_BLOCK = 4096
FWD_LOOPED_DEFAULT: Config = {"BLOCK_N": 4096, "num_warps": 8, "PREFETCH": 0}
BWD_LOOPED_DEFAULT: Config = {"BLOCK_N": 4096, "num_warps": 16}
# Programs of the split backward per multiprocessor: enough to fill the GPU, few enough that the partial
# sums of dweight and dbias (programs x row length, float32) stay small against the data. The
# looped backward's rows are long, so its partial sums are long too: half as many programs. The
# single-block backward's depend on its block (rowwise.single_block_backward_programs_per_sm).
BWD_PROGRAMS_PER_SM = 4
BWD_LOOPED_PROGRAMS_PER_SM = 2
# Per-row statistics the looped backward keeps between its passes: k_x, mean(x) - k_x, rstd, mean(g), mean(g * xhat).
STATS_PER_ROW = 5


def _n_cols(normalized_shape: Sequence[int]) -> int:
    return math.prod(normalized_shape)


def _rows(t: torch.Tensor, k: int, name: str) -> Rows:
    """``t`` as rows of its last ``k`` dims flattened (a view where the strides allow)."""
    if k > 1:
        lead = t.shape[: t.dim() - k]
        try:
            t = t.view(*lead, -1)
        except RuntimeError:
            t = as_contiguous(t, name).view(*lead, -1)
    return as_rows(t, name)


def _flat(t: torch.Tensor | None) -> torch.Tensor | None:
    """A weight or bias as a vector of unit stride."""
    if t is None or (t.dim() == 1 and t.stride(0) == 1):
        return t
    return t.reshape(-1).contiguous()


def _run_forward(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    kernel: LazyKernel,
    block: int,
    config: Config,
    **meta: Any,
) -> torch.Tensor:
    """Launch a forward ``kernel`` over the rows of ``x``; ``meta``: further compile-time arguments of the kernel."""
    rows, pointers, y = _forward_operands(x, normalized_shape, weight, bias)
    rowwise.launch_rows(
        kernel, rows.n_rows, (*pointers, rows.stride, rows.n_cols), (rows.n_cols, float(eps)), config=config,
        block=block, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
        EVEN_N=rows.n_cols % block == 0 and config.get("ROWS", 1) == 1,  # a partial last tile of rows needs masks
        **meta,
    )  # fmt: skip
    return y


def _forward_operands(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None, bias: torch.Tensor | None
) -> tuple[Rows, tuple[torch.Tensor, ...], torch.Tensor]:
    """A forward's rows of x, its pointers (x, the weight, the bias, y; x's rows stand in for an absent weight or
    bias, which the kernels read only with HAS_WEIGHT or HAS_BIAS) and its output y, contiguous: rows n_cols
    apart."""
    check_affine("layer_norm", normalized_shape, weight, bias)
    rows = _rows(x, len(normalized_shape), "x")
    w, b = _flat(weight), _flat(bias)
    y = empty(x.shape, dtype=x.dtype, device=x.device)
    return rows, (rows.tensor, rows.tensor if w is None else w, rows.tensor if b is None else b, y), y


def _launch_single_block(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    config: Config,
) -> torch.Tensor:
    block = rowwise.single_block(_n_cols(normalized_shape))
    return _run_forward(x, normalized_shape, weight, bias, eps, LAYER_NORM_FWD, block, config)


def _launch_looped(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    config: Config,
) -> torch.Tensor:
    block, prefetch = config["BLOCK_N"], bool(config.get("PREFETCH", 0))
    return _run_forward(x, normalized_shape, weight, bias, eps, LAYER_NORM_FWD_LOOPED, block, config, PREFETCH=prefetch)


def _launch_split_rows(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    config: Config,
) -> torch.Tensor:
    return _run_split(LAYER_NORM_FWD_SPLIT, x, normalized_shape, weight, bias, eps, config)


def _launch_split_looped(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    config: Config,
) -> torch.Tensor:
    return _run_split(
        LAYER_NORM_FWD_SPLIT_LOOPED, x, normalized_shape, weight, bias, eps, config, STREAM_N=config["STREAM_N"]
    )


def _run_split(
    kernel: LazyKernel,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    config: Config,
    **meta: Any,
) -> torch.Tensor:
    """A forward whose rows are split over programs (split_rows' and split_looped's kernels)."""
    rows, pointers, y = _forward_operands(x, normalized_shape, weight, bias)
    rowwise.launch_split_rows(
        kernel, rows, pointers, (rows.stride, rows.n_cols), (float(eps),), 2, config=config,
        HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, EVEN_N=rows.n_cols % config["BLOCK_N"] == 0, **meta,
    )  # fmt: skip
    return y


def _backward_operands(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> tuple[Rows, Rows, torch.Tensor | None]:
    """A backward's rows of x and of grad, and the weight as a vector of unit stride (``None`` without one)."""
    check_affine("layer_norm_backward", normalized_shape, weight, bias)
    k = len(normalized_shape)
    return _rows(x, k, "x"), _rows(grad, k, "grad"), _flat(weight)


def _run_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    *,
    looped: bool,
    block: int,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x_rows, g_rows, w = _backward_operands(grad, x, normalized_shape, weight, bias)
    n_rows, n_cols = x_rows.n_rows, x_rows.n_cols
    per_sm = BWD_LOOPED_PROGRAMS_PER_SM if looped else rowwise.single_block_backward_programs_per_sm(block)
    rows_per_program, programs, meta = rowwise.row_groups(x.device, n_rows, per_sm, config)
    for switch in ("PREFETCH", "WEIGHT_PER_TILE"):  # the single-block kernel's (rowwise.ROW_BLOCK_BACKWARD_CONFIGS)
        if switch in config and not looped:
            meta[switch] = bool(config[switch])
    dx = empty(x.shape, dtype=x.dtype, device=x.device)
    # One buffer of partial sums: dweight's first, then dbias's.
    sums = int(w is not None) + int(bias is not None)
    partial = torch.empty((sums, programs, n_cols) if sums else (1, 1, 1), dtype=torch.float32, device=x.device)
    # The looped kernel keeps each row's statistics here between its two passes.
    stats = (torch.empty((n_rows, STATS_PER_ROW), dtype=torch.float32, device=x.device),) if looped else ()
    launch(
        LAYER_NORM_BWD_LOOPED if looped else LAYER_NORM_BWD, (programs,), g_rows.tensor, x_rows.tensor,
        x_rows.tensor if w is None else w, dx, partial[0], partial[sums - 1], *stats,
        g_rows.stride, x_rows.stride, n_cols, n_rows, n_cols, float(eps), rows_per_program,
        HAS_WEIGHT=w is not None, HAS_BIAS=bias is not None, BLOCK_N=block, num_warps=config["num_warps"], **meta,
    )  # fmt: skip
    return (dx, *_affine_grads(partial, sums, x, weight, bias))


def _affine_grads(
    partial: torch.Tensor, sums: int, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """dweight and dbias from their partial sums (``partial``: dweight's rows first, then dbias's, ``sums`` of
    them), each in its parameter's dtype and shape; empty where the parameter is absent. One launch sums both
    (:func:`kernelgate.rowwise.sum_partials`), each into memory of its own."""
    params = [p for p in (weight, bias) if p is not None]
    if not params:
        return x.new_empty(0), x.new_empty(0)
    grads = rowwise.sum_partials(partial, params)
    return (grads[0] if weight is not None else x.new_empty(0)), (grads[-1] if bias is not None else x.new_empty(0))


def _launch_backward_split(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward in two kernels: each row's statistics, then dx and the partial sums of dweight and dbias by
    column blocks of row groups (:func:`kernelgate.rowwise.column_row_groups`), a few rows of partial sums."""
    x_rows, g_rows, w = _backward_operands(grad, x, normalized_shape, weight, bias)
    w_ptr = x_rows.tensor if w is None else w
    n_rows, n_cols, block, warps = x_rows.n_rows, x_rows.n_cols, config["BLOCK_N"], config["num_warps"]
    stats = torch.empty((n_rows, STATS_PER_ROW), dtype=torch.float32, device=x.device)
    rows_per_program, programs, _ = rowwise.row_groups(x.device, n_rows, BWD_PROGRAMS_PER_SM, {})
    launch(
        LAYER_NORM_BWD_STATS, (programs,), g_rows.tensor, x_rows.tensor, w_ptr, stats, g_rows.stride, x_rows.stride,
        n_rows, n_cols, float(eps), rows_per_program, HAS_WEIGHT=w is not None, BLOCK_N=block, num_warps=warps,
    )  # fmt: skip
    blocks, rows_per_group, groups = rowwise.column_row_groups(x.device, n_rows, n_cols, block, BWD_PROGRAMS_PER_SM)
    dx = empty(x.shape, dtype=x.dtype, device=x.device)
    sums = int(w is not None) + int(bias is not None)
    partial = torch.empty((sums, groups, n_cols) if sums else (1, 1, 1), dtype=torch.float32, device=x.device)
    launch(
        LAYER_NORM_BWD_COLUMNS, (blocks, groups), g_rows.tensor, x_rows.tensor, w_ptr, dx, partial[0],
        partial[sums - 1], stats, g_rows.stride, x_rows.stride, n_cols, n_rows, n_cols, rows_per_group,
        HAS_WEIGHT=w is not None, HAS_BIAS=bias is not None, BLOCK_N=block, num_warps=warps,
    )  # fmt: skip
    return (dx, *_affine_grads(partial, sums, x, weight, bias))


def _launch_backward_split_rows(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return run_backward_split_rows(grad, x, normalized_shape, weight, bias, eps, config)


def _launch_backward_split_rows_pipelined(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return run_backward_split_rows(
        grad, x, normalized_shape, weight, bias, eps, config, kernel=LAYER_NORM_BWD_SPLIT_ROWS_PIPELINED
    )


def run_backward_split_rows(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    config: Config,
    *,
    kernel: LazyKernel = LAYER_NORM_BWD_SPLIT_ROWS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward in one kernel that reads x and grad once: each row split over programs that exchange its
    statistics, in groups that loop over rows (:func:`kernelgate.rowwise.split_rows_groups`), a row of partial sums
    of dweight and of dbias a group. ``kernel``: one with ``_layer_norm_bwd_split_rows_kernel``'s arguments (its
    pipelined form, or a benchmark's variant)."""
    x_rows, g_rows, w = _backward_operands(grad, x, normalized_shape, weight, bias)
    n_rows, n_cols, block = x_rows.n_rows, x_rows.n_cols, config["BLOCK_N"]
    groups = rowwise.split_rows_groups(x.device, n_rows, n_cols, block, config["PER_SM"])
    dx = empty(x.shape, dtype=x.dtype, device=x.device)
    sums = int(w is not None) + int(bias is not None)
    partial = torch.empty((sums, groups, n_cols) if sums else (1, 1, 1), dtype=torch.float32, device=x.device)
    rowwise.launch_split_rows(
        kernel, x_rows, (g_rows.tensor, x_rows.tensor, x_rows.tensor if w is None else w, dx,
        partial[0], partial[sums - 1]), (g_rows.stride, x_rows.stride, n_cols), (n_rows, float(eps)), 4,
        config=config, groups=groups, HAS_WEIGHT=w is not None, HAS_BIAS=bias is not None,
        PREFETCH=bool(config["PREFETCH"]), EVEN_N=n_cols % block == 0,
    )  # fmt: skip
    return (dx, *_affine_grads(partial, sums, x, weight, bias))


def _launch_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    block = rowwise.single_block(_n_cols(normalized_shape))
    return _run_backward(grad, x, normalized_shape, weight, bias, eps, looped=False, block=block, config=config)


def _launch_backward_looped(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_backward(
        grad, x, normalized_shape, weight, bias, eps, looped=True, block=config["BLOCK_N"], config=config
    )


def _fits(block: int, num_warps: int, per_thread: int) -> bool:
    return rowwise.per_thread_ok(block, num_warps) and block // (32 * num_warps) <= per_thread


def _looped_impl(
    launcher: Any,
    kernels: tuple[LazyKernel, ...],
    n_cols: Any,
    configs: ConfigSpace,
    default: Config,
    per_thread: int,
) -> TritonImpl:
    """A looped implementation: any row length, blocks no longer than the row, ``per_thread`` elements at most, and
    a PREFETCH (where ``configs`` has it) only with blocks of PREFETCH_MIN_BLOCK or more."""

    def prune(config: Config, *args: Any) -> bool:
        block = config["BLOCK_N"]
        if config.get("PREFETCH") and block < PREFETCH_MIN_BLOCK:
            return False
        return block <= rowwise.single_block(n_cols(*args)) and _fits(block, config["num_warps"], per_thread)

    return TritonImpl("looped", launcher, kernels, configs=configs, default_config=default, prune=prune)


def _bwd_single_block_impl(n_cols: Any, n_rows: Any) -> TritonImpl:
    """The single-block backward: rows up to rowwise.MAX_SINGLE_BLOCK, ``ROWS`` of them per step, at most
    BWD_PER_THREAD elements of a tile per thread."""

    def default(*args: Any) -> Config:
        rows = rowwise.row_block_default(n_cols(*args), n_rows(*args))["ROWS"]
        tile = rows * rowwise.single_block(n_cols(*args))
        warps = num_warps_for(tile, elements_per_thread=8, hi=32)
        return {"ROWS": rows, "num_warps": warps, "PREFETCH": 0, "WEIGHT_PER_TILE": 0}

    def prune(config: Config, *args: Any) -> bool:
        tile = config["ROWS"] * rowwise.single_block(n_cols(*args))
        fits = _fits(tile, config["num_warps"], BWD_PER_THREAD)
        return (
            fits
            and rowwise.prune_backward_switches(config, n_cols(*args))
            and rowwise.prune_row_block(config, n_cols(*args), n_rows(*args))
        )

    return TritonImpl(
        "single_block",
        _launch_backward,
        (LAYER_NORM_BWD, rowwise.PARTIAL_SUMS),
        supports=lambda *args: rowwise.fits_one_block(n_cols(*args)),
        configs=rowwise.ROW_BLOCK_BACKWARD_CONFIGS,
        default_config=default,
        prune=prune,
    )


def _bucket(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None, bias: torch.Tensor | None
) -> tuple[int, int, bool, bool, bool]:
    n = _n_cols(normalized_shape)
    return (*rowwise.row_bucket(x.numel() // max(n, 1), n), weight is not None, bias is not None)


def _make_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, tuple[int, ...], torch.Tensor, torch.Tensor, float]:
    x, w, b = (torch.randn(s, device=device).to(dtype) for s in (shape, shape[-1:], shape[-1:]))
    return x, tuple(shape[-1:]), w, b, 1e-5


def _make_backward_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...], torch.Tensor, torch.Tensor, float]:
    grad, x, w, b = (torch.randn(s, device=device).to(dtype) for s in (shape, shape, shape[-1:], shape[-1:]))
    return grad, x, tuple(shape[-1:]), w, b, 1e-5


def _bwd_n_rows(grad: torch.Tensor, x: torch.Tensor, normalized_shape: Sequence[int], *_: Any) -> int:
    return x.numel() // max(_n_cols(normalized_shape), 1)


def _bwd_n_cols(grad: torch.Tensor, x: torch.Tensor, normalized_shape: Sequence[int], *_: Any) -> int:
    return _n_cols(normalized_shape)


def _fwd_n_rows(x: torch.Tensor, normalized_shape: Sequence[int], *_: Any) -> int:
    return x.numel() // max(_n_cols(normalized_shape), 1)


def _fwd_n_cols(x: torch.Tensor, normalized_shape: Sequence[int], *_: Any) -> int:
    return _n_cols(normalized_shape)


layer_norm_backward = Op(
    "layer_norm_backward",
    reference=layer_norm_backward_reference,
    args=(
        TensorArg("grad", min_rank=1),
        TensorArg("x", same_shape_as="grad"),
        ShapeArg("normalized_shape", of="x"),
        # Their shape must equal normalized_shape, which the launchers and the reference check.
        TensorArg("weight", optional=True, param_of="x"),
        TensorArg("bias", optional=True, param_of="x"),
        ScalarArg("eps", kind=float, min=0.0),
    ),
    implementations=(
        _bwd_single_block_impl(_bwd_n_cols, _bwd_n_rows),
        _looped_impl(
            _launch_backward_looped,
            (LAYER_NORM_BWD_LOOPED, rowwise.PARTIAL_SUMS),
            _bwd_n_cols,
            LOOPED_CONFIGS,
            BWD_LOOPED_DEFAULT,
            BWD_PER_THREAD,
        ),
        rowwise.split_impl(
            _launch_backward_split,
            (LAYER_NORM_BWD_STATS, LAYER_NORM_BWD_COLUMNS, rowwise.PARTIAL_SUMS),
            _bwd_n_cols,
        ),
        rowwise.split_rows_backward_impl(
            _launch_backward_split_rows, (LAYER_NORM_BWD_SPLIT_ROWS, rowwise.PARTIAL_SUMS), _bwd_n_cols
        ),
        rowwise.split_rows_backward_impl(
            _launch_backward_split_rows_pipelined,
            (LAYER_NORM_BWD_SPLIT_ROWS_PIPELINED, rowwise.PARTIAL_SUMS),
            _bwd_n_cols,
            pipelined_blocks=PIPELINED_BLOCKS,
        ),
    ),
    bucket=lambda grad, x, normalized_shape, weight, bias, eps: _bucket(x, normalized_shape, weight, bias),
    # dx reduces over a row, dweight and dbias over all rows.
    reduction_length=lambda grad, x, normalized_shape, weight, bias, eps: (
        x.numel() // max(_n_cols(normalized_shape), 1) + _n_cols(normalized_shape)
    ),
    normwise_outputs=(1, 2),  # dweight and dbias: sums over rows that cancel
    returns="(Tensor, Tensor, Tensor)",
    make_inputs=_make_backward_inputs,
)


def _layer_norm_grads(saved: tuple[Any, ...], grad: torch.Tensor) -> tuple[Any, ...]:
    x, normalized_shape, weight, bias, eps = saved
    dx, dw, db = layer_norm_backward(grad, x, tuple(normalized_shape), weight, bias, eps)
    return dx, None, (dw if weight is not None else None), (db if bias is not None else None), None


layer_norm = Op(
    "layer_norm",
    reference=layer_norm_reference,
    args=(
        TensorArg("x", min_rank=1),
        ShapeArg("normalized_shape", of="x"),
        # Their shape must equal normalized_shape, which the launchers and the reference check.
        TensorArg("weight", optional=True, param_of="x"),
        TensorArg("bias", optional=True, param_of="x"),
        ScalarArg("eps", kind=float, min=0.0),
    ),
    implementations=(
        rowwise.single_block_impl(
            _launch_single_block, LAYER_NORM_FWD, _fwd_n_cols, _fwd_n_rows, max_block=rowwise.MAX_SINGLE_BLOCK_FORWARD
        ),
        _looped_impl(
            _launch_looped,
            (LAYER_NORM_FWD_LOOPED,),
            _fwd_n_cols,
            FWD_LOOPED_CONFIGS,
            FWD_LOOPED_DEFAULT,
            FWD_LOOPED_PER_THREAD,
        ),
        rowwise.split_rows_impl(_launch_split_rows, (LAYER_NORM_FWD_SPLIT,), _fwd_n_cols),
        rowwise.split_looped_impl(_launch_split_looped, (LAYER_NORM_FWD_SPLIT_LOOPED,), _fwd_n_cols),
    ),
    bucket=lambda x, normalized_shape, weight, bias, eps: _bucket(x, normalized_shape, weight, bias),
    reduction_length=lambda x, normalized_shape, weight, bias, eps: _n_cols(normalized_shape),
    # The gradient needs x (held by autograd anyway), the weight, and the bias's presence and
    # dtype; mean and rstd are recomputed in the backward kernels rather than kept, so the forward
    # allocates nothing extra for them.
    backward=Backward(save=lambda inputs, y: tuple(inputs), grads=_layer_norm_grads),
    make_inputs=_make_inputs,
)
