"""Triton kernels of rms_norm. Rows are contiguous, ``stride_*m`` apart.

The single-block forward kernel runs ``ROWS`` rows per program, the looped one a row per program;
the backward kernels one program per group of rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelgate.ops.split_rows import (
    arrive_at_row_in_asm,
    exchange_then_prefetch,
    leave_row,
    load_block_pair,
    load_row_partials,
    load_row_partials_in_asm,
    row_group_block,
    split_row_block,
    split_row_sum,
    wait_until_arrived_in_asm,
    widen_after_wait,
)
from kernelgate.ops.tiles import load_row_pair, load_tile, store_tile, weighted_gradient


@triton.jit
def _rms_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    stride_xm,
    stride_ym,
    n_rows,
    n_cols,
    eps,
    HAS_WEIGHT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):
    """y[m, :] = x[m, :] * rsqrt(mean(x[m, :]**2) + eps) * w for rows that fit one block.

    x_ptr, y_ptr: (n_rows, n_cols); w_ptr: (n_cols,), unused unless HAS_WEIGHT.
    Grid: (cdiv(n_rows, ROWS),); each program takes ROWS rows. BLOCK_N >= n_cols, a power of two.
    EVEN_N (set by the launcher only for ROWS == 1 and n_cols == BLOCK_N): no masks. Each row is read
    once and written once; arithmetic in float32.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, 0.0, EVEN_N, "").to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None]
    if HAS_WEIGHT:
        y = y * load_tile(w_ptr + cols, cols < n_cols, 0.0, EVEN_N, "").to(tl.float32)[None, :]
    store_tile(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _rms_norm_fwd_persistent_kernel(
    x_ptr, w_ptr, y_ptr, stride_xm, stride_ym, n_rows, n_cols, eps, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """rms_norm of rows that fit one block, by a fixed number of programs each taking every ``num_programs``-th
    row in a software-pipelined loop (NUM_STAGES rows in flight); the weight is read once per program.

    x_ptr, y_ptr: (n_rows, n_cols); w_ptr: (n_cols,), unused unless HAS_WEIGHT. Grid: (programs,), at most
    n_rows. BLOCK_N >= n_cols, a power of two (EVEN_N: equal, so no masks). Each row is read once and written
    once; arithmetic in float32.
    """
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    if HAS_WEIGHT:
        w = load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        x = load_tile(x_ptr + row * stride_xm + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        if HAS_WEIGHT:
            y = y * w
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _rms_norm_looped_row(
    x_row, w_ptr, y_row, n_cols, eps, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr
):  # fmt: skip
    """rms_norm of one row longer than a block: a sum-of-squares pass, then a normalising pass.

    Reads the row twice (the second read mostly from L2). EVEN_N: n_cols is a multiple of BLOCK_N, so no chunk
    needs masks.
    """
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = load_tile(x_row + cols, cols < n_cols, 0.0, EVEN_N, "evict_last").to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        y = load_tile(x_row + cols, mask, 0.0, EVEN_N, "evict_first").to(tl.float32) * rstd
        if HAS_WEIGHT:
            y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
        store_tile(y_row + cols, y.to(y_row.dtype.element_ty), mask, EVEN_N, "evict_first")


@triton.jit
def _rms_norm_fwd_looped_kernel(
    x_ptr, w_ptr, y_ptr, stride_xm, stride_ym, n_cols, eps, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """rms_norm of rows longer than one block, a row per program (:func:`_rms_norm_looped_row`).

    x_ptr, y_ptr: (n_rows, n_cols); w_ptr: (n_cols,). Grid: (n_rows,).
    """
    row = tl.program_id(0)
    _rms_norm_looped_row(
        x_ptr + row * stride_xm, w_ptr, y_ptr + row * stride_ym, n_cols, eps, HAS_WEIGHT, BLOCK_N, EVEN_N
    )


@triton.jit
def _rms_norm_fwd_persistent_looped_kernel(
    x_ptr, w_ptr, y_ptr, stride_xm, stride_ym, n_rows, n_cols, eps, HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """rms_norm of rows longer than one block by a fixed number of programs, each taking every
    ``num_programs``-th row (:func:`_rms_norm_looped_row`), so that the rows in flight can fit L2 for their
    second read (``rowwise.persistent_looped_programs``).

    x_ptr, y_ptr: (n_rows, n_cols); w_ptr: (n_cols,). Grid: (programs,), at most n_rows.
    """
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        _rms_norm_looped_row(
            x_ptr + row * stride_xm, w_ptr, y_ptr + row * stride_ym, n_cols, eps, HAS_WEIGHT, BLOCK_N, EVEN_N
        )


@triton.jit
def _rms_norm_fwd_split_kernel(
    x_ptr, w_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, eps,
    HAS_WEIGHT: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """rms_norm of rows split over ``n_split`` programs of BLOCK_N columns each, held in registers
    (:mod:`kernelgate.ops.split_rows`): each row is read once and written once, however long it is.

    x_ptr, y_ptr: (n_rows, n_cols); w_ptr: (n_cols,), unused unless HAS_WEIGHT. Grid: (n_rows * n_split,).
    partial_ptr: (n_rows, SPLIT_BLOCK) float32; arrived_ptr: (n_rows,) int32, zeros. EVEN_N: n_cols is a multiple
    of BLOCK_N (no masks). Arithmetic in float32.
    """
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    x_in = load_tile(x_ptr + row * stride_xm + cols, mask, 0.0, EVEN_N, "")
    x = x_in.to(tl.float32)
    total = split_row_sum(x * x, partial_ptr + row * SPLIT_BLOCK, arrived_ptr, row, part, n_split, PHASE, SPLIT_BLOCK)
    if PHASE != 1:
        y = widen_after_wait(x_in) * tl.rsqrt(total / n_cols + eps)
        if HAS_WEIGHT:
            # After the wait. Loaded between the arrival and the wait, the weight's block is held across it: on an
            # H100, 1 to 9 % slower (bf16 1024x65536 99.2 -> 107.1 us), as was layer_norm's float32 split forward
            # (79 -> 127 registers a thread; benchmarks/results/h100/ab-split-loads-in-wait-17afc9e-3e1149b).
            y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _rms_norm_bwd_kernel(
    dy_ptr,
    ds_ptr,
    x_ptr,
    w_ptr,
    dx_ptr,
    dw_ptr,
    stride_dym,
    stride_dsm,
    stride_xm,
    stride_dxm,
    n_rows,
    n_cols,
    eps,
    rows_per_program,
    HAS_DS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr = False,
    WEIGHT_PER_TILE: tl.constexpr = False,
    FEW_LIVE: tl.constexpr = False,
):
    """Gradients of rms_norm (and of add_rms_norm, with HAS_DS) for rows that fit one block.

    rstd is recomputed, not saved. With xhat = x * rstd and g = dy * w:
    dx = rstd * (g - xhat * mean(g * xhat)) [+ ds],  dw = sum_rows(dy * xhat).
    For add_rms_norm, x is the sum s = x + residual and ds the gradient that reaches s directly;
    dx is then also the residual's gradient. dy_ptr, ds_ptr, x_ptr, dx_ptr: (n_rows, n_cols),
    ds_ptr read only with HAS_DS; w_ptr: (n_cols,); dw_ptr: (programs, n_cols) float32, one partial
    sum of dw per program (summed on the host: no atomics). Grid: (programs,); each program takes
    rows_per_program consecutive rows, ROWS of them at a time. PREFETCH: the next tile's x and dy are
    loaded before this tile's reductions (the loads after the last tile are masked off). FEW_LIVE: the same
    gradients in an order that keeps fewer whole-tile vectors live at once (dw before dx, xhat never stored), for
    tiles that do not fit a thread's registers (see the launcher's rule).
    """
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    w_kept = 0.0  # the weight's row where the program keeps it (HAS_WEIGHT, not WEIGHT_PER_TILE)
    if HAS_WEIGHT and not WEIGHT_PER_TILE:
        w_kept = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    # Per-row partial sums of dw, reduced over the tile's rows once at the end, not per step.
    dw = tl.zeros([ROWS, BLOCK_N], tl.float32)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    if PREFETCH:
        first_rows = first + tl.arange(0, ROWS)
        x_next, dy_next = load_row_pair(x_ptr, dy_ptr, stride_xm, stride_dym, first_rows, cols, last, col_mask)
    for start in range(first, last, ROWS):
        rows = start + tl.arange(0, ROWS)
        mask = (rows < last)[:, None] & col_mask[None, :]
        if PREFETCH:
            x, dy = x_next.to(tl.float32), dy_next.to(tl.float32)
            x_next, dy_next = load_row_pair(x_ptr, dy_ptr, stride_xm, stride_dym, rows + ROWS, cols, last, col_mask)
        else:
            x, dy = load_row_pair(x_ptr, dy_ptr, stride_xm, stride_dym, rows, cols, last, col_mask)
            x, dy = x.to(tl.float32), dy.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)[:, None]
        if FEW_LIVE:
            # dw first, so that dy's registers can take g; and dx as rstd * g - c * x with c one number a row
            # (c = rstd^3 * mean(g * x)), so xhat is never a vector of its own.
            if HAS_WEIGHT:
                dw += dy * (x * rstd)
            g = weighted_gradient(dy, w_ptr, w_kept, cols, col_mask, HAS_WEIGHT, WEIGHT_PER_TILE)
            dx = rstd * g - rstd * rstd * rstd * (tl.sum(g * x, axis=1) / n_cols)[:, None] * x
        else:
            xhat = x * rstd
            g = weighted_gradient(dy, w_ptr, w_kept, cols, col_mask, HAS_WEIGHT, WEIGHT_PER_TILE)
            dx = (g - xhat * (tl.sum(g * xhat, axis=1) / n_cols)[:, None]) * rstd
            if HAS_WEIGHT:
                dw += dy * xhat
        if HAS_DS:
            dx += tl.load(ds_ptr + rows[:, None] * stride_dsm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if HAS_WEIGHT:
        tl.store(dw_ptr + pid * n_cols + cols, tl.sum(dw, axis=0), mask=col_mask)


@triton.jit
def _rms_norm_bwd_row_stats(
    dy_ptr,
    x_ptr,
    w_ptr,
    stats_ptr,
    row,
    stride_dym,
    stride_xm,
    n_cols,
    eps,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One row's rstd and mean(g * xhat) (g = dy * w), streamed block by block, stored at stats_ptr + 2 * row."""
    sum_xx = tl.zeros([BLOCK_N], tl.float32)
    sum_gx = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(dy_ptr + row * stride_dym + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_WEIGHT:
            g = g * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        sum_xx += x * x
        sum_gx += g * x
    rstd = tl.rsqrt(tl.sum(sum_xx, axis=0) / n_cols + eps)
    tl.store(stats_ptr + 2 * row, rstd)
    tl.store(stats_ptr + 2 * row + 1, tl.sum(sum_gx, axis=0) * rstd / n_cols)


@triton.jit
def _rms_norm_bwd_column_block(
    dy_ptr,
    ds_ptr,
    x_ptr,
    w_ptr,
    dx_ptr,
    dw_ptr,
    stats_ptr,
    stride_dym,
    stride_dsm,
    stride_xm,
    stride_dxm,
    n_cols,
    start,
    first,
    last,
    HAS_DS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dx of rows first..last-1 at columns start..start+BLOCK_N-1, from the rows' statistics; their dw sum
    (dy * xhat over those rows, float32) is stored at dw_ptr + cols."""
    cols = start + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], tl.float32)
    for row in range(first, last):
        rstd = tl.load(stats_ptr + 2 * row)
        mean_gxhat = tl.load(stats_ptr + 2 * row + 1)
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride_dym + cols, mask=mask, other=0.0).to(tl.float32)
        xhat = x * rstd
        g = dy * w if HAS_WEIGHT else dy
        dx = (g - xhat * mean_gxhat) * rstd
        if HAS_DS:
            dx += tl.load(ds_ptr + row * stride_dsm + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + row * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if HAS_WEIGHT:
            dw += dy * xhat
    if HAS_WEIGHT:
        tl.store(dw_ptr + cols, dw, mask=mask)


@triton.jit
def _rms_norm_bwd_looped_kernel(
    dy_ptr,
    ds_ptr,
    x_ptr,
    w_ptr,
    dx_ptr,
    dw_ptr,
    stats_ptr,
    stride_dym,
    stride_dsm,
    stride_xm,
    stride_dxm,
    n_rows,
    n_cols,
    eps,
    rows_per_program,
    HAS_DS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Gradients for rows longer than one block: the formulas of ``_rms_norm_bwd_kernel``.

    Pointers as there, plus stats_ptr: (n_rows, 2) float32 scratch holding each row's rstd and
    mean(g * xhat). Grid: (programs,); each program takes rows_per_program consecutive rows. A
    first pass streams each row for its two sums; a second pass goes column block by column block
    over the program's rows, so the block's dw sum stays in registers and is stored once. dy and x
    are read twice, ds once, dx written once.
    """
    pid = tl.program_id(0)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    for row in range(first, last):
        _rms_norm_bwd_row_stats(
            dy_ptr, x_ptr, w_ptr, stats_ptr, row, stride_dym, stride_xm, n_cols, eps, HAS_WEIGHT, BLOCK_N
        )
    # Every thread of the program reads the statistics stored above.
    tl.debug_barrier()
    for start in range(0, n_cols, BLOCK_N):
        _rms_norm_bwd_column_block(
            dy_ptr, ds_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr + pid * n_cols, stats_ptr, stride_dym, stride_dsm, stride_xm,
            stride_dxm, n_cols, start, first, last, HAS_DS, HAS_WEIGHT, BLOCK_N,
        )  # fmt: skip


@triton.jit
def _rms_norm_bwd_stats_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, stride_dym, stride_xm, n_rows, n_cols, eps, rows_per_program,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The split backward's first kernel: each row's rstd and mean(g * xhat) into stats_ptr ((n_rows, 2) float32).
    Grid: (programs,), each over rows_per_program consecutive rows."""
    pid = tl.program_id(0)
    first = pid * rows_per_program
    for row in range(first, tl.minimum(first + rows_per_program, n_rows)):
        _rms_norm_bwd_row_stats(
            dy_ptr, x_ptr, w_ptr, stats_ptr, row, stride_dym, stride_xm, n_cols, eps, HAS_WEIGHT, BLOCK_N
        )


@triton.jit
def _rms_norm_bwd_columns_kernel(
    dy_ptr,
    ds_ptr,
    x_ptr,
    w_ptr,
    dx_ptr,
    dw_ptr,
    stats_ptr,
    stride_dym,
    stride_dsm,
    stride_xm,
    stride_dxm,
    n_rows,
    n_cols,
    rows_per_group,
    HAS_DS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The split backward's second kernel: dx, and dw's partial sums, from the statistics of the first.

    Grid: (column blocks, row groups). Program (c, r) takes column block c of the rows of group r
    (rows_per_group consecutive rows) and stores their dw sum in row r of dw_ptr ((groups, n_cols)
    float32). With few long rows the looped kernel's partial sums are a row per program, as large as
    an input; split by columns, the row groups, and so the partial sums, can be few.
    """
    group = tl.program_id(1)
    first = group * rows_per_group
    _rms_norm_bwd_column_block(
        dy_ptr, ds_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr + group * n_cols, stats_ptr, stride_dym, stride_dsm, stride_xm,
        stride_dxm, n_cols, tl.program_id(0) * BLOCK_N, first, tl.minimum(first + rows_per_group, n_rows), HAS_DS,
        HAS_WEIGHT, BLOCK_N,
    )  # fmt: skip


@triton.jit
def rms_norm_store_partials(
    x_in, dy_in, w_ptr, partial_row, part, cols, mask, SPLIT_BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    PHASE: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """Store this program's partials of its row in ``partial_row``: its block's sums of x * x and of g * x
    (g = dy * weight), as the split_rows backwards exchange them (not in PHASE 2, which has them)."""
    x = x_in.to(tl.float32)
    g = dy_in.to(tl.float32)
    if HAS_WEIGHT:
        g = g * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
    if PHASE != 2:
        tl.store(partial_row + part, tl.sum(x * x, axis=0))
        tl.store(partial_row + SPLIT_BLOCK + part, tl.sum(g * x, axis=0))


@triton.jit
def rms_norm_write_dx(
    x_in, dy_in, sum_xx, sum_gx, w_ptr, ds_ptr, dx_ptr, dw, row, stride_dsm, stride_dxm, cols, mask, n_cols, eps,
    HAS_DS: tl.constexpr, HAS_WEIGHT: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """Write this program's block of the row's dx from the row's two sums; returns ``dw`` with the block's share of
    the weight gradient added (with HAS_WEIGHT)."""
    rstd = tl.rsqrt(sum_xx / n_cols + eps)
    c = rstd * rstd * rstd * (sum_gx / n_cols)
    x = widen_after_wait(x_in)
    dy = widen_after_wait(dy_in)
    g = dy
    if HAS_WEIGHT:
        g = dy * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
    dx = rstd * g - c * x
    if HAS_DS:
        dx += load_tile(ds_ptr + row * stride_dsm + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
    store_tile(dx_ptr + row * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask, EVEN_N, "")
    if HAS_WEIGHT:
        dw += dy * (x * rstd)
    return dw


@triton.jit
def _rms_norm_bwd_split_rows_kernel(
    dy_ptr, ds_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, partial_ptr, arrived_ptr, stride_dym, stride_dsm, stride_xm,
    stride_dxm, n_cols, n_split, n_rows, eps, HAS_DS: tl.constexpr, HAS_WEIGHT: tl.constexpr, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """Gradients of rms_norm (of add_rms_norm with HAS_DS) with each row split over ``n_split`` programs of BLOCK_N
    columns that hold their blocks of x and dy in registers while they exchange the row's two sums
    (:mod:`kernelgate.ops.split_rows`): x and dy are read once and dx written once, however long the row.

    The formulas of ``_rms_norm_bwd_kernel`` in its FEW_LIVE order: dx = rstd * g - c * x [+ ds] with
    c = rstd**3 * mean(g * x), dw = sum_rows(dy * x * rstd). Grid: (groups * n_split,); program p takes column
    block ``p % n_split`` of the rows ``group, group + groups, ...`` (``group = p // n_split``), so a group's
    programs are consecutive, and stores its block's dw sum over them in row ``group`` of dw_ptr
    ((groups, n_cols) float32): one row of partial sums a group, not a program. PREFETCH: the program's next row
    is loaded while it waits for this row's sums (its last loads its own row again). The weight is read a row at
    a time, from cache, rather than kept. Pointers and strides as in ``_rms_norm_bwd_kernel``; partial_ptr:
    (n_rows, 2 * SPLIT_BLOCK) float32; arrived_ptr: (n_rows,) int32, zeros. EVEN_N: n_cols is a multiple of
    BLOCK_N (no masks).
    """
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    dw = tl.zeros([BLOCK_N], tl.float32)
    x_next, dy_next = load_block_pair(x_ptr, dy_ptr, group, stride_xm, stride_dym, cols, mask, EVEN_N)
    for row in range(group, n_rows, groups):
        if PREFETCH:
            x_in, dy_in = x_next, dy_next
        else:
            x_in, dy_in = load_block_pair(x_ptr, dy_ptr, row, stride_xm, stride_dym, cols, mask, EVEN_N)
        partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
        rms_norm_store_partials(
            x_in, dy_in, w_ptr, partial_row, part, cols, mask, SPLIT_BLOCK, HAS_WEIGHT, PHASE, EVEN_N
        )
        x_next, dy_next = exchange_then_prefetch(
            arrived_ptr, row, n_split, x_ptr, dy_ptr, tl.minimum(row + groups, n_rows - 1), stride_xm, stride_dym,
            cols, mask, x_next, dy_next, PHASE, PREFETCH, EVEN_N,
        )  # fmt: skip
        if PHASE != 1:
            sum_xx = tl.sum(load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
            sum_gx = tl.sum(load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK), axis=0)
            if PHASE == 0:
                leave_row(arrived_ptr, row, part, n_split)
            dw = rms_norm_write_dx(
                x_in, dy_in, sum_xx, sum_gx, w_ptr, ds_ptr, dx_ptr, dw, row, stride_dsm, stride_dxm, cols, mask,
                n_cols, eps, HAS_DS, HAS_WEIGHT, EVEN_N,
            )  # fmt: skip
    if HAS_WEIGHT and PHASE != 1:
        store_tile(dw_ptr + group * n_cols + cols, dw, mask, EVEN_N, "")


@triton.jit
def _rms_norm_bwd_split_rows_pipelined_kernel(
    dy_ptr, ds_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, partial_ptr, arrived_ptr, stride_dym, stride_dsm, stride_xm,
    stride_dxm, n_cols, n_split, n_rows, eps, HAS_DS: tl.constexpr, HAS_WEIGHT: tl.constexpr, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """``_rms_norm_bwd_split_rows_kernel`` (same arguments, grid and results) with its row loop pipelined by Triton:
    with PREFETCH, three ``tl.range`` stages, so the blocks of the row after next are copied into shared memory
    (``cp.async``) while the program works on a row, where the other kernel's PREFETCH holds one row ahead in
    registers. The exchange is :mod:`kernelgate.ops.split_rows`' inline-assembly one (NVIDIA GPUs), which keeps the
    loop one the pipeliner takes and copies nothing ahead that the row's programs have yet to store. On an H100 in
    bfloat16 it took 0.94 and 0.96 of the other kernel's time for rms_norm at rows of 16384 and 32768 and 0.90 to
    0.98 for add_rms_norm (benchmarks/results/h100/norm-backward-split-rows-staged-1d9eadd).
    """
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    dw = tl.zeros([BLOCK_N], tl.float32)
    for row in tl.range(group, n_rows, groups, num_stages=1 + 2 * PREFETCH):
        x_in, dy_in = load_block_pair(x_ptr, dy_ptr, row, stride_xm, stride_dym, cols, mask, EVEN_N)
        partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
        rms_norm_store_partials(
            x_in, dy_in, w_ptr, partial_row, part, cols, mask, SPLIT_BLOCK, HAS_WEIGHT, PHASE, EVEN_N
        )
        if PHASE == 0:
            wait_until_arrived_in_asm(arrived_ptr, row, n_split, arrive_at_row_in_asm(arrived_ptr, row))
            sum_xx = tl.sum(load_row_partials_in_asm(partial_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
            sum_gx = tl.sum(load_row_partials_in_asm(partial_row, 1, n_split, 0.0, SPLIT_BLOCK), axis=0)
            leave_row(arrived_ptr, row, part, n_split)
        elif PHASE == 2:  # the interpreter's second launch, after every program stored its partials
            sum_xx = tl.sum(load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
            sum_gx = tl.sum(load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK), axis=0)
        if PHASE != 1:
            dw = rms_norm_write_dx(
                x_in, dy_in, sum_xx, sum_gx, w_ptr, ds_ptr, dx_ptr, dw, row, stride_dsm, stride_dxm, cols, mask,
                n_cols, eps, HAS_DS, HAS_WEIGHT, EVEN_N,
            )  # fmt: skip
    if HAS_WEIGHT and PHASE != 1:
        store_tile(dw_ptr + group * n_cols + cols, dw, mask, EVEN_N, "")
