"""Triton kernels of add_rms_norm. Rows are contiguous, ``stride_*m`` apart.

The single-block forward kernel runs ``ROWS`` rows per program, the looped one a row per program;
the backward kernels one program per group of rows. The sum
``s`` is rounded to its dtype before it is normalised, so ``y`` is the rms_norm of the stored ``s``.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
):
    """s[m, :] = x[m, :] + r[m, :];  y[m, :] = s[m, :] * rsqrt(mean(s[m, :]**2) + eps) * w, rows in one block.

    x_ptr, r_ptr, y_ptr, s_ptr: (n_rows, n_cols); w_ptr: (n_cols,), unused unless HAS_WEIGHT.
    Grid: (cdiv(n_rows, ROWS),); each program takes ROWS rows. BLOCK_N >= n_cols, a power of two.
    x and r are read once, y and s written once.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(s_ptr.dtype.element_ty)
    tl.store(s_ptr + rows[:, None] * stride_sm + cols[None, :], s, mask=mask)
    s = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s * s, axis=1) / n_cols + eps)
    y = s * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


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
):
    """add_rms_norm of a row longer than one block: an add-and-sum-of-squares pass that stores s,
    then a normalising pass that reads s back.

    x_ptr, r_ptr, y_ptr, s_ptr: (n_rows, n_cols); w_ptr: (n_cols,). Grid: (n_rows,). x and r are
    read once, s written once and read once, y written once.
    """
    row = tl.program_id(0)
    s_row = s_ptr + row * stride_sm
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + row * stride_rm + cols, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(s_ptr.dtype.element_ty)
        tl.store(s_row + cols, s, mask=mask)
        s = s.to(tl.float32)
        acc += s * s
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    # The second pass reads s as other threads of this program stored it.
    tl.debug_barrier()
    y_row = y_ptr + row * stride_ym
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        y = tl.load(s_row + cols, mask=mask, other=0.0).to(tl.float32) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_rms_norm_bwd_kernel(
    dy_ptr,
    ds_ptr,
    s_ptr,
    w_ptr,
    dx_ptr,
    dw_ptr,
    stride_dym,
    stride_dsm,
    stride_sm,
    stride_dxm,
    n_rows,
    n_cols,
    eps,
    rows_per_program,
    HAS_DS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Gradients of add_rms_norm for rows that fit one block; rstd is recomputed from s, not saved.

    With shat = s * rstd and g = dy * w:  dx = ds + rstd * (g - shat * mean(g * shat)) (also the
    gradient of the residual), dw = sum_rows(dy * shat). dy_ptr, ds_ptr, s_ptr, dx_ptr:
    (n_rows, n_cols), ds_ptr unused unless HAS_DS; w_ptr: (n_cols,); dw_ptr: (programs, n_cols)
    float32, one partial sum of dw per program (summed on the host: no atomics). Grid: (programs,);
    each program takes rows_per_program consecutive rows, ROWS of them at a time.
    """
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    # Per-row partial sums of dw, reduced over the tile's rows once at the end, not per step.
    dw = tl.zeros([ROWS, BLOCK_N], tl.float32)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    for start in range(first, last, ROWS):
        rows = start + tl.arange(0, ROWS)
        mask = (rows < last)[:, None] & col_mask[None, :]
        s = tl.load(s_ptr + rows[:, None] * stride_sm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(s * s, axis=1) / n_cols + eps)[:, None]
        shat = s * rstd
        g = dy * w if HAS_WEIGHT else dy
        dx = (g - shat * (tl.sum(g * shat, axis=1) / n_cols)[:, None]) * rstd
        if HAS_DS:
            dx += tl.load(ds_ptr + rows[:, None] * stride_dsm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if HAS_WEIGHT:
            dw += dy * shat
    if HAS_WEIGHT:
        tl.store(dw_ptr + pid * n_cols + cols, tl.sum(dw, axis=0), mask=col_mask)


@triton.jit
def _add_rms_norm_bwd_looped_kernel(
    dy_ptr,
    ds_ptr,
    s_ptr,
    w_ptr,
    dx_ptr,
    dw_ptr,
    stats_ptr,
    stride_dym,
    stride_dsm,
    stride_sm,
    stride_dxm,
    n_rows,
    n_cols,
    eps,
    rows_per_program,
    HAS_DS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Gradients of add_rms_norm for rows longer than one block: the formulas of ``_add_rms_norm_bwd_kernel``.

    Pointers as there, plus stats_ptr: (n_rows, 2) float32 scratch holding each row's rstd and
    mean(g * shat). Grid: (programs,); each program takes rows_per_program consecutive rows. A
    first pass streams each row for its two sums; a second pass goes column block by column block
    over the program's rows, so the block's dw sum stays in registers and is stored once. dy and s
    are read twice, ds once, dx written once.
    """
    pid = tl.program_id(0)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    for row in range(first, last):
        sum_ss = tl.zeros([BLOCK_N], tl.float32)
        sum_gs = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            s = tl.load(s_ptr + row * stride_sm + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(dy_ptr + row * stride_dym + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_WEIGHT:
                g = g * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            sum_ss += s * s
            sum_gs += g * s
        rstd = tl.rsqrt(tl.sum(sum_ss, axis=0) / n_cols + eps)
        tl.store(stats_ptr + 2 * row, rstd)
        tl.store(stats_ptr + 2 * row + 1, tl.sum(sum_gs, axis=0) * rstd / n_cols)
    # Every thread of the program reads the statistics stored above.
    tl.debug_barrier()
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK_N], tl.float32)
        for row in range(first, last):
            rstd = tl.load(stats_ptr + 2 * row)
            mean_gshat = tl.load(stats_ptr + 2 * row + 1)
            s = tl.load(s_ptr + row * stride_sm + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + row * stride_dym + cols, mask=mask, other=0.0).to(tl.float32)
            shat = s * rstd
            g = dy * w if HAS_WEIGHT else dy
            dx = (g - shat * mean_gshat) * rstd
            if HAS_DS:
                dx += tl.load(ds_ptr + row * stride_dsm + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(dx_ptr + row * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            if HAS_WEIGHT:
                dw += dy * shat
        if HAS_WEIGHT:
            tl.store(dw_ptr + pid * n_cols + cols, dw, mask=mask)
