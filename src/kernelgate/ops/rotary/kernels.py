"""Triton kernels of rotary_embedding. One program per (position, block of heads), q's and k's heads in one launch."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rotary_embedding_heads(
    x_ptr,
    y_ptr,
    stride_xh,
    first_head,
    n_heads,
    half,
    cos,
    sin,
    INTERLEAVED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """Rotate heads [first_head, first_head + BLOCK_H) of one position by the angles ``cos``, ``sin``.

    x_ptr: (n_heads, 2 * half), heads ``stride_xh`` apart, features contiguous; y_ptr: (n_heads,
    2 * half), contiguous; cos, sin: (BLOCK_HALF,) float32 values, one per pair. Pairs are
    (i, i + half), or (2i, 2i + 1) with INTERLEAVED. Each element is read once and written once.
    """
    heads = first_head + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads < n_heads)[:, None] & (cols < half)[None, :]
    x_rows = x_ptr + heads[:, None] * stride_xh
    y_rows = y_ptr + heads[:, None] * (2 * half)
    c = cos[None, :]
    s = sin[None, :]
    if INTERLEAVED:
        # A (heads, pairs, 2) tile: each pair is adjacent in memory, so the load stays contiguous.
        pair = tl.arange(0, 2)
        offsets = (2 * cols)[None, :, None] + pair[None, None, :]
        mask3 = mask[:, :, None] & (pair < 2)[None, None, :]
        x = tl.load(x_rows[:, :, None] + offsets, mask=mask3, other=0.0).to(tl.float32)
        x1, x2 = tl.split(x)
        y = tl.join(x1 * c - x2 * s, x2 * c + x1 * s)
        tl.store(y_rows[:, :, None] + offsets, y.to(y_ptr.dtype.element_ty), mask=mask3)
    else:
        x1 = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_rows + half + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(y_rows + cols[None, :], (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_rows + half + cols[None, :], (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_embedding_fwd_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    seq_len,
    n_q_heads,
    n_k_heads,
    half,
    n_q_blocks,
    n_blocks,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_cb,
    stride_cs,
    stride_sb,
    stride_ss,
    INTERLEAVED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """(x1, x2) -> (x1 * cos - x2 * sin, x2 * cos + x1 * sin) for every pair of every head of q and k.

    q_ptr: (batch, seq, n_q_heads, 2 * half), k_ptr: (batch, seq, n_k_heads, 2 * half), any strides
    but a unit feature stride; q_out_ptr, k_out_ptr: the same shapes, contiguous; cos_ptr, sin_ptr:
    (batch, seq, half) with unit last stride (``stride_cb = 0`` for angles shared by the batch).
    Grid: (batch * seq * n_blocks,), n_blocks = n_q_blocks + cdiv(n_k_heads, BLOCK_H): program
    ``pos * n_blocks + block`` takes position ``pos``; blocks below n_q_blocks take BLOCK_H heads of q
    each, the others BLOCK_H heads of k. Consecutive programs thus read consecutive memory of
    contiguous q and k and share one row of angles. Arithmetic in float32, without fused
    multiply-adds (the reference rounds each product).
    """
    pid = tl.program_id(0)
    pos = pid // n_blocks
    block = pid - pos * n_blocks
    b = pos // seq_len
    s = pos - b * seq_len
    cols = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_ptr + b * stride_cb + s * stride_cs + cols, mask=cols < half, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + b * stride_sb + s * stride_ss + cols, mask=cols < half, other=0.0).to(tl.float32)
    if block < n_q_blocks:
        _rotary_embedding_heads(
            q_ptr + b * stride_qb + s * stride_qs, q_out_ptr + pos * n_q_heads * 2 * half, stride_qh,
            block * BLOCK_H, n_q_heads, half, cos, sin, INTERLEAVED, BLOCK_H, BLOCK_HALF,
        )  # fmt: skip
    else:
        _rotary_embedding_heads(
            k_ptr + b * stride_kb + s * stride_ks, k_out_ptr + pos * n_k_heads * 2 * half, stride_kh,
            (block - n_q_blocks) * BLOCK_H, n_k_heads, half, cos, sin, INTERLEAVED, BLOCK_H, BLOCK_HALF,
        )  # fmt: skip
