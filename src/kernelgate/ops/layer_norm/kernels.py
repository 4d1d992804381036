"""Triton kernels of layer_norm. Rows are contiguous, ``stride_*m`` apart; a row is the flattened
normalised shape (``n_cols`` elements).

The single-block forward kernel runs ``ROWS`` rows per program, the looped one a row per program;
the backward kernels one program per group of rows. All
arithmetic is in float32, and no statistic suffers cancellation from a row's offset from zero,
however large. The single-block kernels hold the row in registers: an estimate ``m0`` of the mean, then the
deviations ``d = x - m0`` (exact for x near m0), their mean ``shift`` and mean square; ``x - mean``
is formed as ``d - shift``, never through a rounded mean. The looped kernels subtract ``k``, the
mean of the row's first block: the forward keeps per lane the sums of ``x - k`` and of its square
(no reduction inside the loop; ``k`` bounds their difference's cancellation); the backward keeps per
lane running means and co-moments (Welford's update), combined across lanes at the end in two
steps."""

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
    split_row_pair,
    split_row_segment,
    wait_until_arrived_in_asm,
    widen_after_wait,
)
from kernelgate.ops.tiles import load_row_pair, load_tile, store_tile, weighted_gradient


@triton.jit
def _add_pair(a, b, c, d):
    """Combines two pairs of partial sums: ``(a + c, b + d)``."""
    return a + c, b + d


@triton.jit
def _row_means(u, v, n_cols):
    """The means of ``u`` and ``v`` along each row of a (ROWS, BLOCK_N) tile, in one reduction: one exchange
    between warps instead of two, while the tile waits in registers."""
    u_sum, v_sum = tl.reduce((u, v), 1, _add_pair)
    return u_sum / n_cols, v_sum / n_cols


@triton.jit
def _deviation_moments(d, n_cols):
    """``shift``, the mean of the deviations ``d`` (0 off the row), and the variance ``mean(d * d) - shift**2``."""
    shift, mean_d2 = _row_means(d, d * d, n_cols)
    return shift, tl.maximum(mean_d2 - shift * shift, 0.0)


@triton.jit
def _layer_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    stride_xm,
    stride_ym,
    n_rows,
    n_cols,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):
    """y[m, :] = (x[m, :] - mean) * rsqrt(var + eps) * w + b for rows that fit one block.

    x_ptr, y_ptr: (n_rows, n_cols); w_ptr, b_ptr: (n_cols,), read only if HAS_WEIGHT / HAS_BIAS.
    Grid: (cdiv(n_rows, ROWS),); each program takes ROWS rows. BLOCK_N >= n_cols, a power of two.
    EVEN_N (set by the launcher only for ROWS == 1 and n_cols == BLOCK_N): no masks. Each row is read
    once and written once.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, 0.0, EVEN_N, "").to(tl.float32)
    d = x - (tl.sum(x, axis=1) / n_cols)[:, None]
    if not EVEN_N:
        d = tl.where(mask, d, 0.0)
    # Two reductions, not one of the pair (as the backward takes them): on the H200 the pair made this kernel
    # 1.7 to 5 % slower at rows of 4096 to 16384 (float32 2048x16384: 72.7 -> 76.4 us).
    shift = tl.sum(d, axis=1) / n_cols
    var = tl.maximum(tl.sum(d * d, axis=1) / n_cols - shift * shift, 0.0)
    y = (d - shift[:, None]) * tl.rsqrt(var + eps)[:, None]
    if HAS_WEIGHT:
        y = y * load_tile(w_ptr + cols, col_mask, 0.0, EVEN_N, "").to(tl.float32)[None, :]
    if HAS_BIAS:
        y = y + load_tile(b_ptr + cols, col_mask, 0.0, EVEN_N, "").to(tl.float32)[None, :]
    store_tile(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _block_stats(x, mask, k, n_block, UNMASKED: tl.constexpr):
    """The mean of ``d = x - k`` over a block's ``n_block`` valid lanes, and the sum of its squared deviations.

    UNMASKED: every lane is valid, and ``mask`` is not applied. The selects it saves are not free where a whole row
    block is held live: compiled for sm_90 by Triton 3.6.0, the split forward at float32 with weight and bias took
    96 registers a thread with them and 66 without (BLOCK_N 4096, 4 warps), 63 and 44 (8192, 16 warps)
    (benchmarks/results/cpu/kernel-resources-layer-norm-unmasked/).
    """
    if UNMASKED:
        d = x - k
        mean = tl.sum(d, axis=0) / n_block
        return mean, tl.sum((d - mean) * (d - mean), axis=0)
    d = tl.where(mask, x - k, 0.0)
    mean = tl.sum(d, axis=0) / n_block
    return mean, tl.sum(tl.where(mask, (d - mean) * (d - mean), 0.0), axis=0)


@triton.jit
def _shifted_sums(x_row, n_cols, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr, PREFETCH: tl.constexpr):
    """A looped forward's statistics pass over ``n_cols`` columns from ``x_row``: ``k``, the mean of the first block,
    and the sums of ``d = x - k`` and of ``d * d``, kept per lane through the loop and reduced at its end. Loads ask L2
    to keep x for the second pass. EVEN_N: n_cols is a multiple of BLOCK_N (no masks). PREFETCH: each block's load is
    issued before the previous block's sums (the load after the last block reads the last block again)."""
    lanes = tl.arange(0, BLOCK_N)
    mask = lanes < n_cols
    x = load_tile(x_row + lanes, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
    k = tl.sum(x, axis=0) / tl.minimum(n_cols, BLOCK_N)
    d = tl.where(mask, x - k, 0.0)
    sum_d = d
    sum_dd = d * d
    if PREFETCH:
        last_start = (n_cols - 1) // BLOCK_N * BLOCK_N
        ahead = tl.minimum(BLOCK_N, last_start) + lanes
        x_ahead = load_tile(x_row + ahead, ahead < n_cols, 0.0, EVEN_N, "evict_last")
    for start in range(BLOCK_N, n_cols, BLOCK_N):
        cols = start + lanes
        mask = cols < n_cols
        if PREFETCH:
            x = x_ahead.to(tl.float32)
            ahead = tl.minimum(start + BLOCK_N, last_start) + lanes
            x_ahead = load_tile(x_row + ahead, ahead < n_cols, 0.0, EVEN_N, "evict_last")
        else:
            x = load_tile(x_row + cols, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
        d = x - k if EVEN_N else tl.where(mask, x - k, 0.0)
        sum_d += d
        sum_dd += d * d
    total_d, total_dd = tl.reduce((sum_d, sum_dd), 0, _add_pair)
    return k, total_d, total_dd


@triton.jit
def _merge_block_stats(means, m2s, n_cols, BLOCK_N: tl.constexpr, SPLIT_BLOCK: tl.constexpr):
    """The row's mean of ``x - k`` and variance from its programs' means and sums of squared deviations over their
    BLOCK_N columns each (0 past the programs): Chan's update, over all of them at once."""
    parts = tl.arange(0, SPLIT_BLOCK)
    counts = tl.minimum(tl.maximum(n_cols - parts * BLOCK_N, 0), BLOCK_N).to(tl.float32)
    mean = tl.sum(counts * means, axis=0) / n_cols
    spread = means - mean
    return mean, (tl.sum(m2s, axis=0) + tl.sum(counts * spread * spread, axis=0)) / n_cols


@triton.jit
def _layer_norm_fwd_split_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """layer_norm of rows split over ``n_split`` programs of BLOCK_N columns each, held in registers
    (:mod:`kernelgate.ops.split_rows`): each row is read once and written once, however long it is.

    The statistics are of ``d = x - k``, ``k`` the row's first element (read by every program: values near zero,
    whose means keep their low bits, as in the looped kernel): each program takes its block's mean of d and sum of
    squared deviations from it (:func:`_block_stats`), and the row's merge the row's blocks (Chan's update, over
    all of them at once).
    x_ptr, y_ptr: (n_rows, n_cols); w_ptr, b_ptr: (n_cols,), read only if HAS_WEIGHT / HAS_BIAS. Grid:
    (n_rows * n_split,). partial_ptr: (n_rows, 2 * SPLIT_BLOCK) float32; arrived_ptr: (n_rows,) int32, zeros.
    EVEN_N: n_cols is a multiple of BLOCK_N (no masks).
    """
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    x_row = x_ptr + row * stride_xm
    x_in = load_tile(x_row + cols, mask, 0.0, EVEN_N, "")
    k = tl.load(x_row).to(tl.float32)
    count = tl.minimum(n_cols - part * BLOCK_N, BLOCK_N).to(tl.float32)
    mean_part, m2_part = _block_stats(x_in.to(tl.float32), mask, k, count, EVEN_N)
    means, m2s = split_row_pair(mean_part, m2_part, partial_ptr + row * (2 * SPLIT_BLOCK), arrived_ptr, row, part,
                                n_split, PHASE, SPLIT_BLOCK)  # fmt: skip
    if PHASE != 1:
        mean, var = _merge_block_stats(means, m2s, n_cols, BLOCK_N, SPLIT_BLOCK)
        y = ((widen_after_wait(x_in) - k) - mean) * tl.rsqrt(var + eps)
        # The weight and bias after the wait: loaded before it, they are held across it (float32, BLOCK_N 8192 and
        # 8 warps: 79 -> 127 registers a thread, 7 % slower on an H100; results/h100/ab-split-loads-in-wait-*).
        if HAS_WEIGHT:
            y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        if HAS_BIAS:
            y = y + load_tile(b_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _layer_norm_fwd_split_looped_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr, STREAM_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """layer_norm of rows split over ``n_split`` programs of a BLOCK_N-column segment each, streamed STREAM_N at a
    time: the segment's statistics from a first read (the looped kernel's :func:`_shifted_sums`, shifted by ``k_s``,
    the mean of its first STREAM_N columns), the row's merged from every program's once they have all stored theirs
    (:func:`_merge_block_stats`, as the split kernel merges its blocks), then the segment's result from a second read,
    back to front (:func:`normalise_row`). Between its two reads only a segment a program is in flight, which L2 holds;
    at bf16 rows of 131072 this was 12 % faster than the looped and split kernels on an H100
    (benchmarks/results/h100/split-looped-forwards-f2df623).

    Each segment's mean is stored as that of ``x - k``, ``k`` the row's first element, as the split kernel's blocks
    store theirs. x_ptr, y_ptr: (n_rows, n_cols); w_ptr, b_ptr: (n_cols,), read only if HAS_WEIGHT / HAS_BIAS. Grid:
    (n_rows * n_split,). partial_ptr: (n_rows, 2 * SPLIT_BLOCK) float32; arrived_ptr: (n_rows,) int32, zeros. EVEN_N:
    n_cols is a multiple of BLOCK_N (no masks; STREAM_N divides BLOCK_N).
    """
    row, part, start, seg_len = split_row_segment(n_split, n_cols, BLOCK_N)
    x_row = x_ptr + row * stride_xm
    k = tl.load(x_row).to(tl.float32)
    mean_part = tl.zeros([], tl.float32)
    m2_part = tl.zeros([], tl.float32)
    if PHASE != 2:
        k_s, total_d, total_dd = _shifted_sums(x_row + start, seg_len, STREAM_N, EVEN_N, False)
        centre = total_d / seg_len  # the segment's mean of x - k_s
        mean_part = (k_s - k) + centre
        m2_part = tl.maximum(total_dd - total_d * centre, 0.0)
    means, m2s = split_row_pair(mean_part, m2_part, partial_ptr + row * (2 * SPLIT_BLOCK), arrived_ptr, row, part,
                                n_split, PHASE, SPLIT_BLOCK)  # fmt: skip
    if PHASE != 1:
        mean, var = _merge_block_stats(means, m2s, n_cols, BLOCK_N, SPLIT_BLOCK)
        normalise_row(
            x_row + start, w_ptr + start, b_ptr + start, y_ptr + row * stride_ym + start, seg_len, k, mean,
            tl.rsqrt(var + eps), HAS_WEIGHT, HAS_BIAS, STREAM_N, EVEN_N,
        )  # fmt: skip


@triton.jit
def _layer_norm_fwd_looped_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    stride_xm,
    stride_ym,
    n_cols,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
    PREFETCH: tl.constexpr = False,
):
    """layer_norm of a row longer than one block: a statistics pass, then a normalising pass.

    x_ptr, y_ptr: (n_rows, n_cols); w_ptr, b_ptr: (n_cols,). Grid: (n_rows,). The first pass
    streams the row once and asks L2 to keep x; the second is :func:`normalise_row`. EVEN_N:
    n_cols is a multiple of BLOCK_N, so the loads and stores need no masks. PREFETCH: each
    block's load is issued before the previous block's reductions (the load after the last block
    reads the last block again).

    The statistics are of ``d = x - k``, ``k`` the mean of the first block (values near zero, whose
    means keep their low bits): sums of d and of d * d kept per lane, as rms_norm's looped kernel keeps its
    sum of squares (no reduction inside the loop), and the variance as ``mean(d * d) - mean(d) ** 2``. That
    difference cannot cancel far: the first block's share of the row's squared deviations bounds how far its
    mean lies from the row's, ``(mean(x) - k) ** 2 <= var * n_cols / BLOCK_N``, so ``mean(d * d)`` is at most
    ``1 + n_cols / BLOCK_N`` times the variance.
    """
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    k, total_d, total_dd = _shifted_sums(x_row, n_cols, BLOCK_N, EVEN_N, PREFETCH)
    centre = total_d / n_cols  # mean(x) - k
    rstd = tl.rsqrt(tl.maximum(total_dd / n_cols - centre * centre, 0.0) + eps)
    y_row = y_ptr + row * stride_ym
    normalise_row(x_row, w_ptr, b_ptr, y_row, n_cols, k, centre, rstd, HAS_WEIGHT, HAS_BIAS, BLOCK_N, EVEN_N)


@triton.jit
def normalise_row(
    x_row, w_ptr, b_ptr, y_row, n_cols, k, centre, rstd, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """The looped forward's second pass: y = ((x - k) - centre) * rstd * w + b over a row, block by block.

    Goes over the blocks in reverse, so the blocks the first pass read last, the likeliest still in L2, are read
    again first. It asks L2 to drop x and y. EVEN_N: n_cols is a multiple of BLOCK_N (no masks).
    """
    lanes = tl.arange(0, BLOCK_N)
    n_blocks = tl.cdiv(n_cols, BLOCK_N)
    for i in range(0, n_blocks):
        cols = (n_blocks - 1 - i) * BLOCK_N + lanes
        mask = cols < n_cols
        x = load_tile(x_row + cols, mask, 0.0, EVEN_N, "evict_first").to(tl.float32)
        y = ((x - k) - centre) * rstd
        if HAS_WEIGHT:
            y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        if HAS_BIAS:
            y = y + load_tile(b_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        store_tile(y_row + cols, y.to(y_row.dtype.element_ty), mask, EVEN_N, "evict_first")


@triton.jit
def _layer_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    dx_ptr,
    dw_ptr,
    db_ptr,
    stride_dym,
    stride_xm,
    stride_dxm,
    n_rows,
    n_cols,
    eps,
    rows_per_program,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr = False,
    WEIGHT_PER_TILE: tl.constexpr = False,
):
    """Gradients of layer_norm for rows that fit one block; mean and rstd are recomputed, not saved.

    With xhat = (x - mean) * rstd and g = dy * w:  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
    dw = sum_rows(dy * xhat),  db = sum_rows(dy).
    dy_ptr, x_ptr, dx_ptr: (n_rows, n_cols); w_ptr: (n_cols,); dw_ptr, db_ptr: (programs, n_cols)
    float32, one partial sum per program (summed on the host: no atomics), written only if
    HAS_WEIGHT / HAS_BIAS. Grid: (programs,); each program takes rows_per_program consecutive rows,
    ROWS of them at a time, each read once. PREFETCH: the next tile's x and dy are loaded before this
    tile's reductions (the loads after the last tile are masked off). WEIGHT_PER_TILE: w is loaded with each tile
    (from cache) rather than once, so that it is not live across the loop; where a row needs most of a thread's
    registers, that keeps less of the tile in local memory.
    """
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    w_kept = 0.0  # the weight's row where the program keeps it (HAS_WEIGHT, not WEIGHT_PER_TILE)
    if HAS_WEIGHT and not WEIGHT_PER_TILE:
        w_kept = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    # Per-row partial sums of dw and db, reduced over the tile's rows once at the end.
    dw = tl.zeros([ROWS, BLOCK_N], tl.float32)
    db = tl.zeros([ROWS, BLOCK_N], tl.float32)
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
        d = tl.where(mask, x - (tl.sum(x, axis=1) / n_cols)[:, None], 0.0)
        shift, var = _deviation_moments(d, n_cols)
        rstd = tl.rsqrt(var + eps)[:, None]
        xhat = tl.where(mask, (d - shift[:, None]) * rstd, 0.0)
        g = weighted_gradient(dy, w_ptr, w_kept, cols, col_mask, HAS_WEIGHT, WEIGHT_PER_TILE)
        mean_g, mean_gxhat = _row_means(g, g * xhat, n_cols)
        dx = (g - mean_g[:, None] - xhat * mean_gxhat[:, None]) * rstd
        tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if HAS_WEIGHT:
            dw += dy * xhat
        if HAS_BIAS:
            db += dy
    if HAS_WEIGHT:
        tl.store(dw_ptr + pid * n_cols + cols, tl.sum(dw, axis=0), mask=col_mask)
    if HAS_BIAS:
        tl.store(db_ptr + pid * n_cols + cols, tl.sum(db, axis=0), mask=col_mask)


@triton.jit
def _layer_norm_bwd_row_stats(
    dy_ptr, x_ptr, w_ptr, stats_ptr, row, stride_dym, stride_xm, n_cols, eps, HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One row's statistics, streamed once, stored at stats_ptr + 5 * row: k_x, mean(x) - k_x, rstd, mean(g) and
    mean(g * xhat) (g = dy * w).

    Since xhat needs the mean before it is known, it keeps per lane running means of x - k_x and g - k_g (k the
    means of the row's first block, as in the forward), the sum of squared deviations of x and the co-moment
    sum((x - mean_x) * (g - mean_g)) (Welford's updates); sum(g * xhat) = rstd * co-moment.
    """
    lanes = tl.arange(0, BLOCK_N)
    # How many elements of a row each lane sees.
    count = tl.where(lanes < n_cols, (n_cols - lanes + BLOCK_N - 1) // BLOCK_N, 0).to(tl.float32)
    mask = lanes < n_cols
    x = tl.load(x_ptr + row * stride_xm + lanes, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(dy_ptr + row * stride_dym + lanes, mask=mask, other=0.0).to(tl.float32)
    if HAS_WEIGHT:
        g = g * tl.load(w_ptr + lanes, mask=mask, other=0.0).to(tl.float32)
    k_x = tl.sum(x, axis=0) / tl.minimum(n_cols, BLOCK_N)
    k_g = tl.sum(g, axis=0) / tl.minimum(n_cols, BLOCK_N)
    mean_x = tl.where(mask, x - k_x, 0.0)
    mean_g = tl.where(mask, g - k_g, 0.0)
    m2 = tl.zeros([BLOCK_N], tl.float32)
    co = tl.zeros([BLOCK_N], tl.float32)
    for start in range(BLOCK_N, n_cols, BLOCK_N):
        cols = start + lanes
        mask = cols < n_cols
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32) - k_x
        g = tl.load(dy_ptr + row * stride_dym + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_WEIGHT:
            g = g * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        g = g - k_g
        inv = 1.0 / (start // BLOCK_N + 1)
        delta = tl.where(mask, x - mean_x, 0.0)
        mean_x += delta * inv
        mean_g += tl.where(mask, g - mean_g, 0.0) * inv
        m2 += delta * (x - mean_x)
        co += delta * (g - mean_g)
    m0 = tl.sum(count * mean_x, axis=0) / n_cols
    dev_x = tl.where(count > 0, mean_x - m0, 0.0)
    shift = tl.sum(count * dev_x, axis=0) / n_cols
    g0 = tl.sum(count * mean_g, axis=0) / n_cols
    dev_g = tl.where(count > 0, mean_g - g0, 0.0)
    shift_g = tl.sum(count * dev_g, axis=0) / n_cols
    var = (tl.sum(m2, axis=0) + tl.sum(count * dev_x * dev_x, axis=0)) / n_cols - shift * shift
    cov = (tl.sum(co, axis=0) + tl.sum(count * dev_x * dev_g, axis=0)) / n_cols - shift * shift_g
    rstd = tl.rsqrt(tl.maximum(var, 0.0) + eps)
    tl.store(stats_ptr + 5 * row, k_x)
    tl.store(stats_ptr + 5 * row + 1, m0 + shift)
    tl.store(stats_ptr + 5 * row + 2, rstd)
    tl.store(stats_ptr + 5 * row + 3, k_g + (g0 + shift_g))
    tl.store(stats_ptr + 5 * row + 4, cov * rstd)


@triton.jit
def _layer_norm_bwd_column_block(
    dy_ptr,
    x_ptr,
    w_ptr,
    dx_ptr,
    dw_ptr,
    db_ptr,
    stats_ptr,
    stride_dym,
    stride_xm,
    stride_dxm,
    n_cols,
    start,
    first,
    last,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dx of rows first..last-1 (in reverse, to meet what L2 still holds of the statistics pass) at columns
    start..start+BLOCK_N-1, from the rows' statistics; their dw and db sums (float32) stored at dw_ptr + cols
    and db_ptr + cols."""
    cols = start + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], tl.float32)
    db = tl.zeros([BLOCK_N], tl.float32)
    for j in range(0, last - first):
        row = last - 1 - j
        k_x = tl.load(stats_ptr + 5 * row)
        centre = tl.load(stats_ptr + 5 * row + 1)
        rstd = tl.load(stats_ptr + 5 * row + 2)
        mean_g = tl.load(stats_ptr + 5 * row + 3)
        mean_gxhat = tl.load(stats_ptr + 5 * row + 4)
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride_dym + cols, mask=mask, other=0.0).to(tl.float32)
        xhat = tl.where(mask, ((x - k_x) - centre) * rstd, 0.0)
        g = dy * w if HAS_WEIGHT else dy
        dx = (g - mean_g - xhat * mean_gxhat) * rstd
        tl.store(dx_ptr + row * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if HAS_WEIGHT:
            dw += dy * xhat
        if HAS_BIAS:
            db += dy
    if HAS_WEIGHT:
        tl.store(dw_ptr + cols, dw, mask=mask)
    if HAS_BIAS:
        tl.store(db_ptr + cols, db, mask=mask)


@triton.jit
def _layer_norm_bwd_looped_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    dx_ptr,
    dw_ptr,
    db_ptr,
    stats_ptr,
    stride_dym,
    stride_xm,
    stride_dxm,
    n_rows,
    n_cols,
    eps,
    rows_per_program,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Gradients of layer_norm for rows longer than one block: the formulas of ``_layer_norm_bwd_kernel``.

    dy_ptr, x_ptr, dx_ptr: (n_rows, n_cols); w_ptr: (n_cols,); dw_ptr, db_ptr: (programs, n_cols)
    float32 partial sums, one row per program; stats_ptr: (n_rows, 5) float32 scratch holding each
    row's k_x, mean(x) - k_x, rstd, mean(g) and mean(g * xhat). Grid: (programs,); each program takes
    rows_per_program consecutive rows.

    A first pass streams each row once (``_layer_norm_bwd_row_stats``). A second pass goes column block by column
    block over the program's rows (in reverse, to meet what L2 still holds), so each block's dw and db sums stay
    in registers and are stored once. dy and x are read twice, dx written once.
    """
    pid = tl.program_id(0)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    for row in range(first, last):
        _layer_norm_bwd_row_stats(
            dy_ptr, x_ptr, w_ptr, stats_ptr, row, stride_dym, stride_xm, n_cols, eps, HAS_WEIGHT, BLOCK_N
        )  # fmt: skip
    # Every thread of the program reads the statistics stored above.
    tl.debug_barrier()
    n_blocks = tl.cdiv(n_cols, BLOCK_N)
    for i in range(0, n_blocks):
        _layer_norm_bwd_column_block(
            dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr + pid * n_cols, db_ptr + pid * n_cols, stats_ptr, stride_dym,
            stride_xm, stride_dxm, n_cols, (n_blocks - 1 - i) * BLOCK_N, first, last, HAS_WEIGHT, HAS_BIAS, BLOCK_N,
        )  # fmt: skip


@triton.jit
def _layer_norm_bwd_stats_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, stride_dym, stride_xm, n_rows, n_cols, eps, rows_per_program,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The split backward's first kernel: each row's statistics into stats_ptr ((n_rows, 5) float32, as the looped
    kernel's). Grid: (programs,), each over rows_per_program consecutive rows."""
    pid = tl.program_id(0)
    first = pid * rows_per_program
    for row in range(first, tl.minimum(first + rows_per_program, n_rows)):
        _layer_norm_bwd_row_stats(
            dy_ptr, x_ptr, w_ptr, stats_ptr, row, stride_dym, stride_xm, n_cols, eps, HAS_WEIGHT, BLOCK_N
        )  # fmt: skip


@triton.jit
def _layer_norm_bwd_columns_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    dx_ptr,
    dw_ptr,
    db_ptr,
    stats_ptr,
    stride_dym,
    stride_xm,
    stride_dxm,
    n_rows,
    n_cols,
    rows_per_group,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The split backward's second kernel: dx, and the partial sums of dw and db ((groups, n_cols) float32 each),
    from the statistics of the first. Grid: (column blocks, row groups); program (c, r) takes column block c of
    the rows of group r (rows_per_group consecutive rows) and stores its sums in row r."""
    group = tl.program_id(1)
    first = group * rows_per_group
    _layer_norm_bwd_column_block(
        dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr + group * n_cols, db_ptr + group * n_cols, stats_ptr, stride_dym,
        stride_xm, stride_dxm, n_cols, tl.program_id(0) * BLOCK_N, first, tl.minimum(first + rows_per_group, n_rows),
        HAS_WEIGHT, HAS_BIAS, BLOCK_N,
    )  # fmt: skip


@triton.jit
def layer_norm_store_partials(
    x_in, dy_in, k, w_ptr, partial_row, part, cols, mask, count, SPLIT_BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    PHASE: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """Store this program's four partials of its row in ``partial_row`` (not in PHASE 2, which has them): its
    block's mean of d = x - k and sum of squared deviations (:func:`_block_stats`, ``count`` columns), the sum of
    g = dy * w, and sum(g * (d - the block's mean))."""
    g = dy_in.to(tl.float32)
    if HAS_WEIGHT:
        g = g * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
    if PHASE != 2:
        x = x_in.to(tl.float32)
        mean_part, m2_part = _block_stats(x, mask, k, count, EVEN_N)
        tl.store(partial_row + part, mean_part)
        tl.store(partial_row + SPLIT_BLOCK + part, m2_part)
        tl.store(partial_row + 2 * SPLIT_BLOCK + part, tl.sum(g, axis=0))
        tl.store(partial_row + 3 * SPLIT_BLOCK + part, tl.sum(g * ((x - k) - mean_part), axis=0))


@triton.jit
def layer_norm_write_dx(
    x_in, dy_in, k, means, m2s, g_sums, g_devs, counts, w_ptr, dx_ptr, dw, db, row, stride_dxm, cols, mask, n_cols,
    eps, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """Write this program's block of the row's dx from the row's blocks' partials (their ``counts`` columns each):
    the row's mean and variance merge the blocks' (Chan's update), and sum(g * (x - mean)) is the blocks' last
    partials plus each block's sum of g times its mean's offset from the row's. Returns ``dw`` and ``db`` with the
    block's shares added (with HAS_WEIGHT, HAS_BIAS)."""
    mean = tl.sum(counts * means, axis=0) / n_cols
    spread = means - mean
    rstd = tl.rsqrt((tl.sum(m2s, axis=0) + tl.sum(counts * spread * spread, axis=0)) / n_cols + eps)
    mean_g = tl.sum(g_sums, axis=0) / n_cols
    mean_gxhat = rstd * (tl.sum(g_devs, axis=0) + tl.sum(g_sums * spread, axis=0)) / n_cols
    dy = widen_after_wait(dy_in)
    g = dy
    if HAS_WEIGHT:
        g = dy * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
    xhat = ((widen_after_wait(x_in) - k) - mean) * rstd
    dx = (g - mean_g - xhat * mean_gxhat) * rstd
    store_tile(dx_ptr + row * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask, EVEN_N, "")
    if HAS_WEIGHT:
        dw += dy * xhat
    if HAS_BIAS:
        db += dy
    return dw, db


@triton.jit
def _layer_norm_bwd_split_rows_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, db_ptr, partial_ptr, arrived_ptr, stride_dym, stride_xm, stride_dxm,
    n_cols, n_split, n_rows, eps, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """Gradients of layer_norm with each row split over ``n_split`` programs of BLOCK_N columns that hold their
    blocks of x and dy in registers while they exchange the row's statistics (:mod:`kernelgate.ops.split_rows`): x
    and dy are read once and dx written once, however long the row. The formulas of ``_layer_norm_bwd_kernel``.

    The statistics are of ``d = x - k``, ``k`` the row's first element (as in the split forward). Each program
    stores four partials of its block: the mean of d and the sum of its squared deviations (:func:`_block_stats`),
    the sum of g = dy * w, and sum(g * (d - the block's mean)); the row's mean and variance merge the blocks'
    (Chan's update), and sum(g * (x - mean)) is the blocks' last partials plus each block's sum of g times its
    mean's offset from the row's, so nothing cancels however far the row sits from zero.
    Grid: (groups * n_split,); program p takes column block ``p % n_split`` of the rows ``group, group + groups,
    ...`` (``group = p // n_split``) and stores its block's dw and db sums over them in row ``group`` of dw_ptr and
    db_ptr ((groups, n_cols) float32, written only if HAS_WEIGHT / HAS_BIAS). PREFETCH: the program's next row is
    loaded while it waits (its last loads its own row again). partial_ptr: (n_rows, 4 * SPLIT_BLOCK) float32;
    arrived_ptr: (n_rows,) int32, zeros. EVEN_N: n_cols is a multiple of BLOCK_N (no masks).
    """
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    count = tl.minimum(n_cols - part * BLOCK_N, BLOCK_N).to(tl.float32)
    parts = tl.arange(0, SPLIT_BLOCK)
    counts = tl.minimum(tl.maximum(n_cols - parts * BLOCK_N, 0), BLOCK_N).to(tl.float32)
    dw = tl.zeros([BLOCK_N], tl.float32)
    db = tl.zeros([BLOCK_N], tl.float32)
    x_next, dy_next = load_block_pair(x_ptr, dy_ptr, group, stride_xm, stride_dym, cols, mask, EVEN_N)
    for row in range(group, n_rows, groups):
        if PREFETCH:
            x_in, dy_in = x_next, dy_next
        else:
            x_in, dy_in = load_block_pair(x_ptr, dy_ptr, row, stride_xm, stride_dym, cols, mask, EVEN_N)
        k = tl.load(x_ptr + row * stride_xm).to(tl.float32)
        partial_row = partial_ptr + row * (4 * SPLIT_BLOCK)
        layer_norm_store_partials(
            x_in, dy_in, k, w_ptr, partial_row, part, cols, mask, count, SPLIT_BLOCK, HAS_WEIGHT, PHASE, EVEN_N
        )
        x_next, dy_next = exchange_then_prefetch(
            arrived_ptr, row, n_split, x_ptr, dy_ptr, tl.minimum(row + groups, n_rows - 1), stride_xm, stride_dym,
            cols, mask, x_next, dy_next, PHASE, PREFETCH, EVEN_N,
        )  # fmt: skip
        if PHASE != 1:
            means = load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK)
            m2s = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
            g_sums = load_row_partials(partial_row, 2, n_split, 0.0, SPLIT_BLOCK)
            g_devs = load_row_partials(partial_row, 3, n_split, 0.0, SPLIT_BLOCK)
            if PHASE == 0:
                leave_row(arrived_ptr, row, part, n_split)
            dw, db = layer_norm_write_dx(
                x_in, dy_in, k, means, m2s, g_sums, g_devs, counts, w_ptr, dx_ptr, dw, db, row, stride_dxm, cols, mask,
                n_cols, eps, HAS_WEIGHT, HAS_BIAS, EVEN_N,
            )  # fmt: skip
    if PHASE != 1:
        if HAS_WEIGHT:
            store_tile(dw_ptr + group * n_cols + cols, dw, mask, EVEN_N, "")
        if HAS_BIAS:
            store_tile(db_ptr + group * n_cols + cols, db, mask, EVEN_N, "")


@triton.jit
def _layer_norm_bwd_split_rows_pipelined_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, db_ptr, partial_ptr, arrived_ptr, stride_dym, stride_xm, stride_dxm,
    n_cols, n_split, n_rows, eps, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """``_layer_norm_bwd_split_rows_kernel`` (same arguments, grid and results) pipelined as rms_norm's
    ``_rms_norm_bwd_split_rows_pipelined_kernel`` is: with PREFETCH, three ``tl.range`` stages of the row loop, so
    the blocks of the row after next are copied into shared memory (``cp.async``) while the program works on a row,
    and the exchange in inline assembly (:mod:`kernelgate.ops.split_rows`' ``*_in_asm``, NVIDIA GPUs)."""
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    count = tl.minimum(n_cols - part * BLOCK_N, BLOCK_N).to(tl.float32)
    parts = tl.arange(0, SPLIT_BLOCK)
    counts = tl.minimum(tl.maximum(n_cols - parts * BLOCK_N, 0), BLOCK_N).to(tl.float32)
    dw = tl.zeros([BLOCK_N], tl.float32)
    db = tl.zeros([BLOCK_N], tl.float32)
    for row in tl.range(group, n_rows, groups, num_stages=1 + 2 * PREFETCH):
        x_in, dy_in = load_block_pair(x_ptr, dy_ptr, row, stride_xm, stride_dym, cols, mask, EVEN_N)
        k = tl.load(x_ptr + row * stride_xm).to(tl.float32)
        partial_row = partial_ptr + row * (4 * SPLIT_BLOCK)
        layer_norm_store_partials(
            x_in, dy_in, k, w_ptr, partial_row, part, cols, mask, count, SPLIT_BLOCK, HAS_WEIGHT, PHASE, EVEN_N
        )
        if PHASE == 0:
            wait_until_arrived_in_asm(arrived_ptr, row, n_split, arrive_at_row_in_asm(arrived_ptr, row))
            means = load_row_partials_in_asm(partial_row, 0, n_split, 0.0, SPLIT_BLOCK)
            m2s = load_row_partials_in_asm(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
            g_sums = load_row_partials_in_asm(partial_row, 2, n_split, 0.0, SPLIT_BLOCK)
            g_devs = load_row_partials_in_asm(partial_row, 3, n_split, 0.0, SPLIT_BLOCK)
            leave_row(arrived_ptr, row, part, n_split)
        elif PHASE == 2:  # the interpreter's second launch, after every program stored its partials
            means = load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK)
            m2s = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
            g_sums = load_row_partials(partial_row, 2, n_split, 0.0, SPLIT_BLOCK)
            g_devs = load_row_partials(partial_row, 3, n_split, 0.0, SPLIT_BLOCK)
        if PHASE != 1:
            dw, db = layer_norm_write_dx(
                x_in, dy_in, k, means, m2s, g_sums, g_devs, counts, w_ptr, dx_ptr, dw, db, row, stride_dxm, cols, mask,
                n_cols, eps, HAS_WEIGHT, HAS_BIAS, EVEN_N,
            )  # fmt: skip
    if PHASE != 1:
        if HAS_WEIGHT:
            store_tile(dw_ptr + group * n_cols + cols, dw, mask, EVEN_N, "")
        if HAS_BIAS:
            store_tile(db_ptr + group * n_cols + cols, db, mask, EVEN_N, "")
