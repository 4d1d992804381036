"""Triton kernels of softmax. Rows are contiguous, ``stride_*m`` apart.

Single-block kernels take ``ROWS`` rows per program; looped kernels one row per program.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelgate.ops.split_rows import (
    leave_row,
    load_row_partials,
    merge_max_and_sum,
    split_row_block,
    split_row_exp_and_sum,
    split_row_segment,
    split_row_sum,
    wait_for_row,
    widen_after_wait,
)
from kernelgate.ops.tiles import exp_below_max, load_tile, store_tile


@triton.jit
def _softmax_fwd_kernel(
    x_ptr, y_ptr, stride_xm, stride_ym, n_rows, n_cols, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """y[m, :] = exp(x[m, :] - max) / sum(exp(x[m, :] - max)) for rows that fit one block.

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (cdiv(n_rows, ROWS),); each program takes ROWS rows.
    BLOCK_N >= n_cols, a power of two. EVEN_N (set by the launcher only for ROWS == 1 and n_cols == BLOCK_N):
    no masks.
    Each row is read once and written once; arithmetic in float32.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, -float("inf"), EVEN_N, "").to(tl.float32)
    e = exp_below_max(x, tl.max(x, axis=1)[:, None])
    y = e / tl.sum(e, axis=1)[:, None]
    store_tile(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _softmax_fwd_persistent_kernel(
    x_ptr, y_ptr, stride_xm, stride_ym, n_rows, n_cols, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """Softmax of rows that fit one block, by a fixed number of programs each taking every ``num_programs``-th row.

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (programs,), at most n_rows. BLOCK_N >= n_cols, a power of two.
    The row loop is software-pipelined over NUM_STAGES rows: the loads of the next rows are in flight (staged
    in shared memory) while a row is reduced and stored, where a program of :func:`_softmax_fwd_kernel`
    waits for its one row. EVEN_N: BLOCK_N == n_cols (no masks). Each row is read once and written once;
    arithmetic in float32.
    """
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        x = load_tile(x_ptr + row * stride_xm + cols, mask, -float("inf"), EVEN_N, "").to(tl.float32)
        e = exp_below_max(x, tl.max(x, axis=0))
        y = e / tl.sum(e, axis=0)
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def online_max_and_sum(x_row, n_cols, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
    """The max of a row longer than one block and the sum of ``exp(x - max)``, in one pass over it.

    The running max ``m`` is the row's so far, one number: each block takes its own max first, so each element
    costs one exponential, and the sums ``s`` (one a lane) are rescaled by one ``exp(m_old - m)`` a block. With a
    running max a lane each element had cost two, three with the second pass: at bfloat16 1024x65536, 48 us of
    the H200's exponential unit (16 a clock on each of 132 multiprocessors) against a copy's 63 us. Softmax
    there went from 0.63 to 0.66 of copy (benchmarks/results/h200/long-forward-6893e72-blockmax). The row is loaded with
    ``evict_last``, so the caller's second pass may find it in L2. Shared by the looped softmax and log_softmax
    kernels. EVEN_N: n_cols is a multiple of BLOCK_N (no masks). The terms are :func:`exp_below_max`'s (bfloat16
    1024x65536: 93.9 to 82.3 us on the H200; float32 level).

    The next block's load is issued before a block's arithmetic, so that it is in flight while the
    exponentials run: left to itself, ptxas issued a block's later loads only after the first part's
    exponentials (benchmarks/results/compile-sm90/looped-prefetch-registers.txt); softmax float32 512x65536
    went from 0.67 to 0.77 of copy (benchmarks/results/h200/long-forward-8c5b863-6893e72). The last block's
    "next" load is clamped to the last block again, so every load stays inside the row; it is served
    from L2 and its value is not used.
    """
    m = tl.full([], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    offsets = tl.arange(0, BLOCK_N)
    last_start = (n_cols - 1) // BLOCK_N * BLOCK_N
    x_next = load_tile(x_row + offsets, offsets < n_cols, -float("inf"), EVEN_N, "evict_last")
    for start in range(0, n_cols, BLOCK_N):
        x = x_next.to(tl.float32)
        next_cols = tl.minimum(start + BLOCK_N, last_start) + offsets
        x_next = load_tile(x_row + next_cols, next_cols < n_cols, -float("inf"), EVEN_N, "evict_last")
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # exp(-inf - -inf) would be NaN: the rescale from an all -inf start is 0, and exp_below_max's terms
        # at -inf are 0. A NaN input propagates into s, as it does in torch, whether or not max() ignored it.
        alpha = tl.where(m == -float("inf"), 0.0, tl.exp(m - m_new))
        s = s * alpha + exp_below_max(x, m_new)
        m = m_new
    row_max = m
    total = tl.sum(s, axis=0)
    return row_max, total


@triton.jit
def _softmax_looped_row(x_row, y_row, n_cols, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
    """Softmax of one row longer than a block: an online max-and-sum pass, then a normalising pass.

    Reads the row twice, writes it once. EVEN_N: n_cols is a multiple of BLOCK_N, so no chunk needs masks.
    """
    row_max, total = online_max_and_sum(x_row, n_cols, BLOCK_N, EVEN_N)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = load_tile(x_row + cols, mask, -float("inf"), EVEN_N, "evict_first").to(tl.float32)
        y = exp_below_max(x, row_max) / total
        store_tile(y_row + cols, y.to(y_row.dtype.element_ty), mask, EVEN_N, "evict_first")


@triton.jit
def _softmax_fwd_looped_kernel(
    x_ptr, y_ptr, stride_xm, stride_ym, n_cols, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False
):  # fmt: skip
    """Softmax of rows longer than one block, a row per program (:func:`_softmax_looped_row`).

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (n_rows,).
    """
    row = tl.program_id(0)
    _softmax_looped_row(x_ptr + row * stride_xm, y_ptr + row * stride_ym, n_cols, BLOCK_N, EVEN_N)


@triton.jit
def _softmax_fwd_persistent_looped_kernel(
    x_ptr, y_ptr, stride_xm, stride_ym, n_rows, n_cols, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False
):  # fmt: skip
    """Softmax of rows longer than one block by a fixed number of programs, each taking every
    ``num_programs``-th row (:func:`_softmax_looped_row`), so that the rows in flight can fit L2 for their second
    read (``rowwise.persistent_looped_programs``).

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (programs,), at most n_rows.
    """
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        _softmax_looped_row(x_ptr + row * stride_xm, y_ptr + row * stride_ym, n_cols, BLOCK_N, EVEN_N)


@triton.jit
def _softmax_fwd_split_kernel(
    x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """Softmax of rows split over ``n_split`` programs of BLOCK_N columns each, held in registers
    (:mod:`kernelgate.ops.split_rows`): each row is read once and written once, however long it is.

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (n_rows * n_split,). partial_ptr: (n_rows, 2 * SPLIT_BLOCK) float32;
    arrived_ptr: (n_rows,) int32, zeros. EVEN_N: n_cols is a multiple of BLOCK_N (no masks).
    """
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    x_in = load_tile(x_ptr + row * stride_xm + cols, mask, -float("inf"), EVEN_N, "")
    narrow = x_in.dtype != tl.float32
    e, m_block, m, s = split_row_exp_and_sum(x_in.to(tl.float32), partial_ptr + row * (2 * SPLIT_BLOCK), arrived_ptr,
                                             row, part, n_split, PHASE, SPLIT_BLOCK, narrow)  # fmt: skip
    if PHASE != 1:
        # In bfloat16 too. A second exponential after the wait instead, with x kept narrow across it and not e, ran
        # slower on the H200 (split_rows at bf16 512x131072 98.9 us at 6e9f805, 109.5 at ae7fd03, which also differ
        # by the counts' reuse; benchmarks/results/h200/default-*) and freed 2 registers a thread of 64.
        y = e * (tl.exp(m_block - m) / s)
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def split_looped_segment(
    x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, STREAM_N: tl.constexpr, LOG: tl.constexpr,
    EVEN_N: tl.constexpr,
):  # fmt: skip
    """This program's segment of a softmax (log_softmax with LOG) of rows split over ``n_split`` programs of BLOCK_N
    columns each, streamed STREAM_N at a time: the segment's max and sum from a first read (:func:`online_max_and_sum`,
    loads kept in L2 with ``evict_last``), the row's from every program's once they have all stored theirs
    (:mod:`kernelgate.ops.split_rows`), then the segment's result from a second read, back to front, so that its
    first loads find the columns read last. Between its two reads only a segment a program is in flight, which L2
    holds, where a looped kernel has a whole row; split_rows holds its block in registers instead, and at rows of
    131072 its programs, waiting on a row's others with their blocks held, kept fewer reads in flight (bf16 on an
    H100: benchmarks/results/h100/split-looped-forwards-f2df623). Shared by the softmax and log_softmax kernels.

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (n_rows * n_split,). partial_ptr: (n_rows, 2 * SPLIT_BLOCK) float32;
    arrived_ptr: (n_rows,) int32, zeros. EVEN_N: n_cols is a multiple of BLOCK_N (no masks; STREAM_N divides
    BLOCK_N).
    """
    row, part, start, seg_len = split_row_segment(n_split, n_cols, BLOCK_N)
    x_seg = x_ptr + row * stride_xm + start
    y_seg = y_ptr + row * stride_ym + start
    partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
    if PHASE != 2:
        m_part, s_part = online_max_and_sum(x_seg, seg_len, STREAM_N, EVEN_N)
        tl.store(partial_row + part, m_part)
        tl.store(partial_row + SPLIT_BLOCK + part, s_part)
    if PHASE == 0:
        wait_for_row(arrived_ptr, row, n_split)
    if PHASE != 1:
        m_parts = load_row_partials(partial_row, 0, n_split, -float("inf"), SPLIT_BLOCK)
        s_parts = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
        if PHASE == 0:
            leave_row(arrived_ptr, row, part, n_split)
        m, total = merge_max_and_sum(m_parts, s_parts)
        # A row of only -inf has total 0: softmax 0 * inf, log_softmax -inf - -inf - -inf, both NaN, as in torch.
        inverse = 1.0 / total
        log_total = tl.log(total)
        n_blocks = tl.cdiv(seg_len, STREAM_N)
        for i in range(0, n_blocks):
            cols = (n_blocks - 1 - i) * STREAM_N + tl.arange(0, STREAM_N)
            mask = cols < seg_len
            x = load_tile(x_seg + cols, mask, -float("inf"), EVEN_N, "evict_first").to(tl.float32)
            y = (x - m) - log_total if LOG else exp_below_max(x, m) * inverse
            store_tile(y_seg + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "evict_first")


@triton.jit
def _softmax_fwd_split_looped_kernel(
    x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, STREAM_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """Softmax of rows split over programs that each stream a segment of BLOCK_N columns twice
    (:func:`split_looped_segment`). Grid: (n_rows * n_split,)."""
    split_looped_segment(x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, PHASE,
                         SPLIT_BLOCK, BLOCK_N, STREAM_N, False, EVEN_N)  # fmt: skip


@triton.jit
def _softmax_bwd_kernel(
    dy_ptr, y_ptr, dx_ptr, stride_dym, stride_ym, stride_dxm, n_rows, n_cols, ROWS: tl.constexpr, BLOCK_N: tl.constexpr
):  # fmt: skip
    """dx[m, :] = y[m, :] * (dy[m, :] - sum(dy[m, :] * y[m, :])) for rows that fit one block.

    dy_ptr, y_ptr, dx_ptr: (n_rows, n_cols). Grid: (cdiv(n_rows, ROWS),). Arithmetic in float32.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + rows[:, None] * stride_ym + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(dy * y, axis=1)[:, None]
    dx = y * (dy - dot)
    tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_looped_kernel(dy_ptr, y_ptr, dx_ptr, stride_dym, stride_ym, stride_dxm, n_cols, BLOCK_N: tl.constexpr):
    """The softmax gradient for rows longer than one block: a pass for sum(dy * y), then one writing dx.

    dy_ptr, y_ptr, dx_ptr: (n_rows, n_cols). Grid: (n_rows,). Reads dy and y twice.
    """
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        dy = tl.load(dy_ptr + row * stride_dym + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(
            tl.float32
        )
        y = tl.load(y_ptr + row * stride_ym + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        acc += dy * y
    dot = tl.sum(acc, axis=0)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        dy = tl.load(dy_ptr + row * stride_dym + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(
            tl.float32
        )
        y = tl.load(y_ptr + row * stride_ym + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        tl.store(dx_ptr + row * stride_dxm + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_split_kernel(
    dy_ptr, y_ptr, dx_ptr, partial_ptr, arrived_ptr, stride_dym, stride_ym, stride_dxm, n_cols, n_split,
    PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """The softmax gradient of rows split over ``n_split`` programs of BLOCK_N columns each
    (:mod:`kernelgate.ops.split_rows`): dy and y are read once, however long the rows are.

    dy_ptr, y_ptr, dx_ptr: (n_rows, n_cols). Grid: (n_rows * n_split,). partial_ptr: (n_rows, SPLIT_BLOCK)
    float32; arrived_ptr: (n_rows,) int32, zeros. EVEN_N: n_cols is a multiple of BLOCK_N (no masks).
    """
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    dy_in = load_tile(dy_ptr + row * stride_dym + cols, mask, 0.0, EVEN_N, "")
    y_in = load_tile(y_ptr + row * stride_ym + cols, mask, 0.0, EVEN_N, "")
    dot = split_row_sum(dy_in.to(tl.float32) * y_in.to(tl.float32), partial_ptr + row * SPLIT_BLOCK, arrived_ptr, row,
                        part, n_split, PHASE, SPLIT_BLOCK)  # fmt: skip
    if PHASE != 1:
        dx = widen_after_wait(y_in) * (widen_after_wait(dy_in) - dot)
        store_tile(dx_ptr + row * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask, EVEN_N, "")
