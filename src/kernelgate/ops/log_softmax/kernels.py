"""Triton kernels of log_softmax. Rows are contiguous, ``stride_*m`` apart.

Single-block kernels take ``ROWS`` rows per program; looped kernels one row per program.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelgate.ops.softmax.kernels import online_max_and_sum, split_looped_segment
from kernelgate.ops.split_rows import split_row_block, split_row_exp_and_sum, split_row_sum, widen_after_wait
from kernelgate.ops.tiles import exp_below_max, load_tile, store_tile


@triton.jit
def _log_softmax_fwd_kernel(
    x_ptr, y_ptr, stride_xm, stride_ym, n_rows, n_cols, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """y[m, :] = (x[m, :] - max) - log(sum(exp(x[m, :] - max))) for rows that fit one block.

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (cdiv(n_rows, ROWS),); each program takes ROWS rows.
    BLOCK_N >= n_cols, a power of two. Each row is read once and written once; arithmetic in
    float32. The max is subtracted before the log of the sum is, so rows of large magnitude (1e4)
    keep full precision. A row of only -inf gives -inf - -inf = NaN, and +inf or NaN make the sum
    NaN, as in torch. EVEN_N (set by the launcher only for ROWS == 1 and n_cols == BLOCK_N): no masks.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, -float("inf"), EVEN_N, "").to(tl.float32)
    m = tl.max(x, axis=1)[:, None]
    y = (x - m) - tl.log(tl.sum(exp_below_max(x, m), axis=1))[:, None]
    store_tile(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _log_softmax_fwd_persistent_kernel(
    x_ptr, y_ptr, stride_xm, stride_ym, n_rows, n_cols, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """Log-softmax of rows that fit one block, by a fixed number of programs each taking every
    ``num_programs``-th row in a software-pipelined loop (as softmax's persistent kernel; the arithmetic as
    :func:`_log_softmax_fwd_kernel`'s).

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (programs,), at most n_rows. BLOCK_N >= n_cols, a power of two
    (EVEN_N: equal, so no masks).
    """
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        x = load_tile(x_ptr + row * stride_xm + cols, mask, -float("inf"), EVEN_N, "").to(tl.float32)
        m = tl.max(x, axis=0)
        y = (x - m) - tl.log(tl.sum(exp_below_max(x, m), axis=0))
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _log_softmax_looped_row(x_row, y_row, n_cols, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
    """Log-softmax of one row longer than a block: an online max-and-sum pass, then a writing pass.

    Reads the row twice, writes it once. EVEN_N: n_cols is a multiple of BLOCK_N, so no chunk needs masks.
    """
    row_max, total = online_max_and_sum(x_row, n_cols, BLOCK_N, EVEN_N)
    # A row of only -inf has total 0, log(total) = -inf, and y = -inf - -inf - -inf = NaN, as in torch.
    log_total = tl.log(total)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = load_tile(x_row + cols, mask, -float("inf"), EVEN_N, "evict_first").to(tl.float32)
        y = (x - row_max) - log_total
        store_tile(y_row + cols, y.to(y_row.dtype.element_ty), mask, EVEN_N, "evict_first")


@triton.jit
def _log_softmax_fwd_looped_kernel(
    x_ptr, y_ptr, stride_xm, stride_ym, n_cols, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False
):  # fmt: skip
    """Log-softmax of rows longer than one block, a row per program (:func:`_log_softmax_looped_row`).

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (n_rows,).
    """
    row = tl.program_id(0)
    _log_softmax_looped_row(x_ptr + row * stride_xm, y_ptr + row * stride_ym, n_cols, BLOCK_N, EVEN_N)


@triton.jit
def _log_softmax_fwd_persistent_looped_kernel(
    x_ptr, y_ptr, stride_xm, stride_ym, n_rows, n_cols, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False
):  # fmt: skip
    """Log-softmax of rows longer than one block by a fixed number of programs, each taking every
    ``num_programs``-th row (:func:`_log_softmax_looped_row`), so that the rows in flight can fit L2 for their
    second read (``rowwise.persistent_looped_programs``).

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (programs,), at most n_rows.
    """
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        _log_softmax_looped_row(x_ptr + row * stride_xm, y_ptr + row * stride_ym, n_cols, BLOCK_N, EVEN_N)


@triton.jit
def _log_softmax_fwd_split_kernel(
    x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """Log-softmax of rows split over ``n_split`` programs of BLOCK_N columns each, held in registers
    (:mod:`kernelgate.ops.split_rows`): each row is read once and written once, however long it is.

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (n_rows * n_split,). partial_ptr: (n_rows, 2 * SPLIT_BLOCK) float32;
    arrived_ptr: (n_rows,) int32, zeros. EVEN_N: n_cols is a multiple of BLOCK_N (no masks). A row of only -inf
    gives NaN, as in torch.
    """
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    x_in = load_tile(x_ptr + row * stride_xm + cols, mask, -float("inf"), EVEN_N, "")
    _, _, m, s = split_row_exp_and_sum(x_in.to(tl.float32), partial_ptr + row * (2 * SPLIT_BLOCK), arrived_ptr, row,
                                       part, n_split, PHASE, SPLIT_BLOCK, x_in.dtype != tl.float32)  # fmt: skip
    if PHASE != 1:
        y = (widen_after_wait(x_in) - m) - tl.log(s)
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _log_softmax_fwd_split_looped_kernel(
    x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, STREAM_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """log_softmax of rows split over programs that each stream a segment of BLOCK_N columns twice
    (softmax's :func:`~kernelgate.ops.softmax.kernels.split_looped_segment`). Grid: (n_rows * n_split,)."""
    split_looped_segment(x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, PHASE,
                         SPLIT_BLOCK, BLOCK_N, STREAM_N, True, EVEN_N)  # fmt: skip


@triton.jit
def _log_softmax_bwd_kernel(
    dy_ptr, y_ptr, dx_ptr, stride_dym, stride_ym, stride_dxm, n_rows, n_cols, ROWS: tl.constexpr, BLOCK_N: tl.constexpr
):  # fmt: skip
    """dx[m, :] = dy[m, :] - exp(y[m, :]) * sum(dy[m, :]) for rows that fit one block.

    dy_ptr, y_ptr, dx_ptr: (n_rows, n_cols). Grid: (cdiv(n_rows, ROWS),). Arithmetic in float32.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + rows[:, None] * stride_ym + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dx = dy - exp_below_max(y, 0.0) * tl.sum(dy, axis=1)[:, None]
    tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _log_softmax_bwd_looped_kernel(
    dy_ptr, y_ptr, dx_ptr, stride_dym, stride_ym, stride_dxm, n_cols, BLOCK_N: tl.constexpr
):  # fmt: skip
    """The log-softmax gradient for rows longer than one block: a pass for sum(dy), then one writing dx.

    dy_ptr, y_ptr, dx_ptr: (n_rows, n_cols). Grid: (n_rows,). Reads dy twice and y once.
    """
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        acc += tl.load(
            dy_ptr + row * stride_dym + cols, mask=cols < n_cols, other=0.0, eviction_policy="evict_last"
        ).to(tl.float32)
    total = tl.sum(acc, axis=0)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        dy = tl.load(dy_ptr + row * stride_dym + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(
            tl.float32
        )
        y = tl.load(y_ptr + row * stride_ym + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dx = dy - exp_below_max(y, 0.0) * total
        tl.store(dx_ptr + row * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _log_softmax_bwd_split_kernel(
    dy_ptr, y_ptr, dx_ptr, partial_ptr, arrived_ptr, stride_dym, stride_ym, stride_dxm, n_cols, n_split,
    PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """The log-softmax gradient of rows split over ``n_split`` programs of BLOCK_N columns each
    (:mod:`kernelgate.ops.split_rows`): dy and y are read once, however long the rows are.

    dy_ptr, y_ptr, dx_ptr: (n_rows, n_cols). Grid: (n_rows * n_split,). partial_ptr: (n_rows, SPLIT_BLOCK)
    float32; arrived_ptr: (n_rows,) int32, zeros. EVEN_N: n_cols is a multiple of BLOCK_N (no masks).
    """
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    dy_in = load_tile(dy_ptr + row * stride_dym + cols, mask, 0.0, EVEN_N, "")
    # y is read before the wait too, so that its load overlaps it.
    y_in = load_tile(y_ptr + row * stride_ym + cols, mask, 0.0, EVEN_N, "")
    total = split_row_sum(dy_in.to(tl.float32), partial_ptr + row * SPLIT_BLOCK, arrived_ptr, row, part, n_split, PHASE,
                          SPLIT_BLOCK)  # fmt: skip
    if PHASE != 1:
        dx = widen_after_wait(dy_in) - exp_below_max(widen_after_wait(y_in), 0.0) * total
        store_tile(dx_ptr + row * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask, EVEN_N, "")
