"""``@triton.jit`` helpers shared by the row-wise kernels: loads and stores that drop their mask when told
at compile time that every lane is in bounds, the backward kernels' loads of a tile of two tensors, and the
shifted exponential of the softmax and log_softmax kernels.

A kernel passes ``UNMASKED`` as a compile-time flag (``EVEN_N``: the blocks tile the row exactly, set by
the launcher). Masked, a float32 single-block rms_norm at rows of 32768 ran at 0.84 of copy on the H200,
unmasked at 0.94 (benchmarks/results/h200/rows32k-2678cb6); the unused mask is dead code either way.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # log2(e)


@triton.jit
def load_tile(ptrs, mask, other, UNMASKED: tl.constexpr, EVICTION: tl.constexpr):
    """``tl.load(ptrs, mask=mask, other=other, eviction_policy=EVICTION)`` (``""``: the default policy), or
    without the mask where ``UNMASKED``."""
    if UNMASKED:
        value = tl.load(ptrs, eviction_policy=EVICTION)
    else:
        value = tl.load(ptrs, mask=mask, other=other, eviction_policy=EVICTION)
    return value


@triton.jit
def store_tile(ptrs, value, mask, UNMASKED: tl.constexpr, EVICTION: tl.constexpr):
    """``tl.store(ptrs, value, mask=mask, eviction_policy=EVICTION)`` (``""``: the default policy), or without
    the mask where ``UNMASKED``.

    The second pass of a looped kernel stores with ``"evict_first"``, so the output's lines do not push out of
    L2 the input lines of rows still to be read again: on the H200, a looped softmax at float32 rows of 65536
    went from 87.5 to 83.8 us (benchmarks/results/h200/long-rows-c8ca3e4.txt); in the bench, kernelgate's looped
    forwards at rows of 16384 to 131072 moved by -0.01 to +0.04 of copy with it and 32 warps
    (long-forward-c8ca3e4-ffb60c5).
    """
    if UNMASKED:
        tl.store(ptrs, value, eviction_policy=EVICTION)
    else:
        tl.store(ptrs, value, mask=mask, eviction_policy=EVICTION)


@triton.jit
def load_row_pair(a_ptr, b_ptr, stride_a, stride_b, rows, cols, last, col_mask):
    """A tile of two tensors' rows, ``rows`` by ``cols`` (rows from ``last`` on and columns outside ``col_mask``
    read as 0), in their own dtype: what a backward kernel loads per step (x and dy), or a step ahead."""
    mask = (rows < last)[:, None] & col_mask[None, :]
    a = tl.load(a_ptr + rows[:, None] * stride_a + cols[None, :], mask=mask, other=0.0)
    b = tl.load(b_ptr + rows[:, None] * stride_b + cols[None, :], mask=mask, other=0.0)
    return a, b


@triton.jit
def weighted_gradient(dy, w_ptr, w_kept, cols, col_mask, HAS_WEIGHT: tl.constexpr, WEIGHT_PER_TILE: tl.constexpr):
    """A norm backward's g = dy * w for a tile of rows (dy itself without a weight): w as kept by the program
    (``w_kept``, a ``[1, BLOCK_N]`` float32 row), or with WEIGHT_PER_TILE loaded now, from cache, so that the
    program need not keep it live across its row loop."""
    g = dy
    if HAS_WEIGHT:
        if WEIGHT_PER_TILE:
            g = dy * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        else:
            g = dy * w_kept
    return g


@triton.jit
def exp_below_max(x, m):
    """``exp(x - m)`` where ``m`` is the max of the ``x``, or a bound above them such as 0 for log-probabilities
    (a scalar or broadcast; -inf where the x all are), as ``exp2((x - m) * log2(e))``: 0 where x is -inf, also
    when m is -inf (m is read as 0 there, where ``exp(x - m)`` would be NaN); a NaN in x stays NaN, as in torch.

    ``tl.exp`` compiles to an ``ex2.approx.f32`` that keeps denormals, so ptxas wraps each element's exponential
    in a compare and two predicated multiplies, and guarding -inf in x took a select an element more. Here a term
    below 2**-126 is flushed to 0 instead: next to the max's term of 1 in a sum it is lost anyway, and as a factor
    (log_softmax's gradient, ``exp(y) * sum(dy)``) it moves the result by less than 2**-126 times the other. On the
    H200 a bfloat16 looped softmax at 1024x65536 went from 93.9 to 82.3 us, the split one from 99.3 to 95.2
    (benchmarks/results/h200/split-rows-exp2-0e3534d); compiled for sm_90, softmax's bf16 split kernel at 8192
    columns and 8 warps went from 648 to 496 instructions.
    """
    return tl.exp2((x - tl.where(m == -float("inf"), 0.0, m)) * LOG2E)
