"""Triton kernels of add_rms_norm. Rows are contiguous, ``stride_*m`` apart.

The single-block forward kernel runs ``ROWS`` rows per program, the looped one a row per program, the
split_rows one a block of a row per program; the backward kernels are rms_norm's. The sum
``s`` is rounded to its dtype before it is normalised, so ``y`` is the rms_norm of the stored ``s``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelgate.ops.split_rows import split_row_block, split_row_sum, widen_after_wait
from kernelgate.ops.tiles import load_tile, store_tile


@triton.jit
def _add_rms_norm_fwd_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    s_ptr,
    stride_xm,
    stride_rm,
    stride_ym,
    stride_sm,
    n_rows,
    n_cols,
    eps,
    HAS_WEIGHT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):
    """s[m, :] = x[m, :] + r[m, :];  y[m, :] = s[m, :] * rsqrt(mean(s[m, :]**2) + eps) * w, rows in one block.

    x_ptr, r_ptr, y_ptr, s_ptr: (n_rows, n_cols); w_ptr: (n_cols,), unused unless HAS_WEIGHT.
    Grid: (cdiv(n_rows, ROWS),); each program takes ROWS rows. BLOCK_N >= n_cols, a power of two.
    EVEN_N (set by the launcher only for ROWS == 1 and n_cols == BLOCK_N): no masks. x and r are read
    once, y and s written once.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, 0.0, EVEN_N, "").to(tl.float32)
    r = load_tile(r_ptr + rows[:, None] * stride_rm + cols[None, :], mask, 0.0, EVEN_N, "").to(tl.float32)
    s = (x + r).to(s_ptr.dtype.element_ty)
    store_tile(s_ptr + rows[:, None] * stride_sm + cols[None, :], s, mask, EVEN_N, "")
    s = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s * s, axis=1) / n_cols + eps)
    y = s * rstd[:, None]
    if HAS_WEIGHT:
        y = y * load_tile(w_ptr + cols, col_mask, 0.0, EVEN_N, "").to(tl.float32)[None, :]
    store_tile(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _add_rms_norm_fwd_looped_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    s_ptr,
    stride_xm,
    stride_rm,
    stride_ym,
    stride_sm,
    n_cols,
    eps,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):
    """add_rms_norm of a row longer than one block: an add-and-sum-of-squares pass that stores s,
    then a normalising pass that reads s back.

    x_ptr, r_ptr, y_ptr, s_ptr: (n_rows, n_cols); w_ptr: (n_cols,). Grid: (n_rows,). x and r are
    read once, s written once and read once, y written once. EVEN_N: n_cols is a multiple of BLOCK_N, so
    the loads and stores need no masks.
    """
    row = tl.program_id(0)
    s_row = s_ptr + row * stride_sm
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        # x and r are read once: their lines may leave L2 first. s is read back by the second pass: it stays.
        x = load_tile(x_ptr + row * stride_xm + cols, mask, 0.0, EVEN_N, "evict_first").to(tl.float32)
        r = load_tile(r_ptr + row * stride_rm + cols, mask, 0.0, EVEN_N, "evict_first").to(tl.float32)
        s = (x + r).to(s_ptr.dtype.element_ty)
        store_tile(s_row + cols, s, mask, EVEN_N, "evict_last")
        s = s.to(tl.float32)
        acc += s * s
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    # The second pass reads s as other threads of this program stored it.
    tl.debug_barrier()
    y_row = y_ptr + row * stride_ym
    # In reverse: the blocks of s stored last, the likeliest still in L2, are read first.
    n_blocks = tl.cdiv(n_cols, BLOCK_N)
    for i in range(0, n_blocks):
        cols = (n_blocks - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        y = load_tile(s_row + cols, mask, 0.0, EVEN_N, "evict_first").to(tl.float32) * rstd
        if HAS_WEIGHT:
            y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
        store_tile(y_row + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "evict_first")


@triton.jit
def _add_rms_norm_fwd_split_kernel(
    x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, partial_ptr, arrived_ptr, stride_xm, stride_rm, stride_ym, stride_sm, n_cols,
    n_split, eps, HAS_WEIGHT: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """add_rms_norm of rows split over ``n_split`` programs of BLOCK_N columns each, held in registers
    (:mod:`kernelgate.ops.split_rows`): x and r are read once and y and s written once, however long the row, where
    the looped kernel reads s back.

    x_ptr, r_ptr, y_ptr, s_ptr: (n_rows, n_cols); w_ptr: (n_cols,), unused unless HAS_WEIGHT. Grid:
    (n_rows * n_split,). partial_ptr: (n_rows, SPLIT_BLOCK) float32; arrived_ptr: (n_rows,) int32, zeros. s is
    stored before the wait for the row's other programs, so that its stores overlap the wait. EVEN_N: n_cols is a
    multiple of BLOCK_N (no masks). Arithmetic in float32.
    """
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    x = load_tile(x_ptr + row * stride_xm + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
    r = load_tile(r_ptr + row * stride_rm + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
    s_out = (x + r).to(s_ptr.dtype.element_ty)
    if PHASE != 2:
        store_tile(s_ptr + row * stride_sm + cols, s_out, mask, EVEN_N, "")
    s = s_out.to(tl.float32)
    total = split_row_sum(s * s, partial_ptr + row * SPLIT_BLOCK, arrived_ptr, row, part, n_split, PHASE, SPLIT_BLOCK)
    if PHASE != 1:
        y = widen_after_wait(s_out) * tl.rsqrt(total / n_cols + eps)
        if HAS_WEIGHT:
            y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")
