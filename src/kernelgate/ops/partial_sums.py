"""The ``@triton.jit`` kernel that sums a row-wise backward's float32 partial sums of a weight gradient over their
rows (:func:`kernelgate.rowwise.sum_partials` launches it).

A norm's backward writes a row of ``n_cols`` partial sums a program (or a row group) instead of adding into one row
with atomics, so that its gradients are the same on every run. Those rows must then be summed. torch's
``sum(dim=0)`` keeps a thread on a column and walks its rows one after another: on the H200 it took 22 to 26 us
for 528 rows at every row length measured (``benchmarks/results/h200/backward-programs-0910a89/``), about a fifth of
a float32 4096x8192 layer_norm backward's kernel. Here each program sums a block of columns over a tile of rows at a
time, and casts to the parameter's dtype as it stores, in one launch for a weight and a bias together.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _partial_sums_kernel(
    partial_ptr,
    out0_ptr,
    out1_ptr,
    n_rows,
    n_cols,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """out_k[c] = sum over r of partial[k, r, c], summed in float32 and stored in out_k's dtype.

    partial_ptr: (outputs, n_rows, n_cols) float32, contiguous; out0_ptr, out1_ptr: (n_cols,) each, the sums of
    partial[0] and partial[1] (with one output, both point at it). Grid: (cdiv(n_cols, BLOCK_C), outputs); each
    program sums its BLOCK_C columns over every row, BLOCK_R rows at a time, in a fixed order.
    """
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    which = tl.program_id(1)
    col_mask = cols < n_cols
    base = partial_ptr + which.to(tl.int64) * n_rows * n_cols
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    for start in range(0, n_rows, BLOCK_R):
        rows = start + tl.arange(0, BLOCK_R)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        acc += tl.load(base + rows[:, None].to(tl.int64) * n_cols + cols[None, :], mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    if which == 0:
        tl.store(out0_ptr + cols, total.to(out0_ptr.dtype.element_ty), mask=col_mask)
    else:
        tl.store(out1_ptr + cols, total.to(out1_ptr.dtype.element_ty), mask=col_mask)
