"""softmax's, rms_norm's and layer_norm's long-row forwards against variants of their kernels, on a GPU
(or interpreted on the CPU).

At 72566ba the split_rows forwards reached 0.74 to 0.80 of copy in float32 at rows of 65536 and 131072 and lost to
the looped kernels (which read x twice) in bfloat16, and the single-block softmax forward at float32 1024x32768 0.88.
softmax's kernels there take, per element, an exponential and a division (``exp(x - m) / s``), and the split_rows
kernel a second exponential (the block's partial sum, before the row's max is known): on the H200, each of those
on 33.5 M elements (float32 256x131072) costs about 8 us of the multiprocessors' special function units (16
a clock each), against 63 us for the copy. The variants:

- ``split_rows``, ``single_block``, ``persistent``: the package's kernels, every configuration.
- ``split_one_exp``: split_rows keeping each block's ``exp(x - m_block)`` in place of x and scaling it by one
  number a program, ``exp(m_block - m) / s``, once the row's max and sum are known: one exponential and one
  multiplication an element.
- ``split_one_exp_last``: that, with the program whose arrival completes its row's count skipping the poll (its
  release-acquire add returns the count).
- ``split_one_exp_volatile``: that, polling with a volatile load and acquiring once the count is complete.
- ``single_block_reciprocal``, ``persistent_reciprocal``: the package's single-block and persistent kernels with
  ``e * (1 / s)`` for ``e / s``.
- for rms_norm, ``split_rows`` (the package's), ``split_last`` and ``split_volatile``: the waits above.
- ``split_grouped`` (softmax and rms_norm): the package's split_rows kernel with a row's programs in groups that loop
  over every ``groups``-th row, as the norms' split_rows backwards do (``rowwise.split_rows_groups``: PER_SM programs
  a multiprocessor), and PREFETCH, the group's next row loaded between this row's arrival and its wait, so that a
  program's wait overlaps its next read rather than only other programs' reads. On an H100 at 137b566
  (``benchmarks/results/h100/split-rows-grouped-forward-137b566/``) it was slower at every long row: softmax 1.6 to
  5.3 %, rms_norm 5.8 to 14.3 %, and PREFETCH slower still; the package kept its one-row-a-program grids.
- ``split_pipelined`` (softmax, rms_norm and layer_norm): ``split_grouped`` (for layer_norm, its split_rows kernel
  grouped so) with the row loop pipelined by Triton, as the norms' ``split_rows_pipelined`` backwards are (three
  ``tl.range`` stages: the blocks of the group's row after next are copied into shared memory while a program works
  on a row; the exchange in inline PTX), at the grouped configurations with PREFETCH whose copies fit
  ``rowwise.PIPELINED_SHARED_BYTES``. The register prefetch above holds the next row through the wait; this one
  holds it in shared memory, where it takes no registers from the programs a multiprocessor fits. Not yet run on a
  GPU.
- ``split_tagged`` (softmax and rms_norm): the package's split_rows forward with the row's partials exchanged
  through tagged slots (``tagged_exchange.py`` beside this script: each value stored beside the launch's tag in one
  relaxed 64-bit store, read until every tag of the row is current) instead of partials and an arrival count, whose
  release and atomics it leaves out. Not yet run on a GPU.

The results at 3296d94 (``benchmarks/results/h200/split-rows-variants-3296d94/``) made the package's split_rows
kernels wait as ``split_one_exp_last`` does, and its softmax forward take one exponential an element: from then
on ``split_rows`` here is that kernel, and ``split_one_exp`` and ``split_last`` measure the waits it replaced
only in name (they keep the old poll: ``WAIT_PACKAGE`` below is the wait of 3296d94).

Two more variants, timed at 0e3534d (``benchmarks/results/h200/split-rows-exp2-0e3534d/``), took each element's
``exp(x - m)`` as ``exp2((x - m) * log2(e))`` with m read as 0 where it is -inf: in the split kernel's blocks
(``split_exp2``) and in both passes of the looped one (``looped_exp2``). The package's kernels took them from then
on (``kernelgate.ops.tiles.exp_below_max``: the looped forwards in every dtype, the split forwards' blocks in 16-bit
ones), and the copies left this script.

layer_norm's split forward in bfloat16 held 80 registers a thread at BLOCK_N 8192 and 8 warps (37.5 % occupancy,
42 % of DRAM: ``benchmarks/results/h200/counters-split-rows-722d46b/``), and lost to the looped kernel. Its block
statistics take two reductions in turn, the mean of ``d = x - k`` and then the squared deviations from it, so the
float32 ``d`` stays live through the first beside the loaded block. The variants (the package's ``split_rows``,
``looped`` and ``single_block`` beside them):

- ``split_recompute``: in bfloat16, the second reduction forms ``d`` again from the loaded block by another route
  (``widen_after_wait``'s shift), and the work after the wait by a third (an inline-assembly move of the bfloat16
  into a word's high half), so only the loaded block stays live through either: 64 registers at 8192 and 8 warps,
  40 at 8192 and 16 (64 in the package's). float32 keeps the package's statistics.
- ``split_recompute_zext_after``: that, with the third route a zero-extending shift instead of the assembly (which
  Triton's interpreter cannot run): 67 and 40.
  Until 8ae2238 it took that shift in float32 too, where it is no widening (all its float32 configurations failed
  the reference check).
- ``split_pair_unsafe``: one reduction of the pair (sum of d, sum of d * d), the block's squared deviations taken
  as their difference: its speed only, since that difference cancels where ``k`` lies far from the row's mean.
- ``split_recompute_zero``: in float32, the deviations formed again for the second reduction from x plus a zero the
  compiler cannot fold (``k * 0.0``), and after the wait from x plus another; in bfloat16 it is
  ``split_recompute_zext_after``. Compiled for sm_90 by Triton 3.6.0 its float32 kernel keeps 80 registers a thread
  at BLOCK_N 8192 and 8 warps, the package's 79: ptxas, not the deviations, holds them there. Not yet timed.
- the package's ``split_looped`` (bfloat16 rows longer than 32768), which tuning chose over split_rows at bfloat16
  rows of 65536 and 131072.

At 8ae2238 (``benchmarks/results/h200/layer-norm-split-stats-8ae2238/``) forming the deviations again cut the bfloat16
split kernel's time by 2 to 13 %, still behind the looped kernel, which the pair only tied at 512x131072: the
package's kernel was left as it was.

For each dtype and row length (rows chosen so that x is about 128 MiB), each runs at every configuration that
suits the row, compiled ahead in worker processes; each is checked against the reference (the package's
tolerance) before it is timed (``do_bench``: L2 flushed, median). Results are fractions of a device-to-device copy
measured in the same run (bytes: x read, y written). With ``--interpret`` the kernels run on the CPU through
Triton's interpreter and are only checked.

    python benchmarks/split_rows_variants.py --out results.json
    python benchmarks/split_rows_variants.py --op softmax --only split_rows --only split_grouped --out results.json
    python benchmarks/split_rows_variants.py --interpret --rows 3 --lengths 20000 --out check.json
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from tagged_exchange import publish_tagged, read_plainly, read_tagged, slot_bits, tagged_split  # beside this script
from variant_timing import argument_parser, check_and_time, package_impl, run_cases

import kernelgate
from kernelgate import rowwise
from kernelgate.config import ConfigSpace
from kernelgate.launch import LazyKernel
from kernelgate.launch import launch as launch_kernel
from kernelgate.op import TritonImpl
from kernelgate.ops.layer_norm.kernels import _add_pair, _block_stats, _merge_block_stats
from kernelgate.ops.split_rows import (
    arrive_at_row,
    arrive_at_row_in_asm,
    leave_row,
    load_row_partials,
    load_row_partials_in_asm,
    merge_max_and_sum,
    row_group_block,
    split_row_block,
    split_row_pair,
    wait_until_arrived,
    wait_until_arrived_in_asm,
    widen_after_wait,
)
from kernelgate.ops.tiles import exp_below_max, load_tile, store_tile

rms_norm_module = importlib.import_module("kernelgate.ops.rms_norm")
layer_norm_module = importlib.import_module("kernelgate.ops.layer_norm")

DEFAULT_LENGTHS = (32768, 65536, 131072)
EPS = 1e-6
# The ways a program waits for its row's others: the package's at 3296d94 (an acquire poll by atomic add), the last
# arriver skipping the poll, and a volatile-load poll with one acquire at its end.
WAIT_PACKAGE, WAIT_LAST, WAIT_VOLATILE = 0, 1, 2


@triton.jit
def _wait(arrived_ptr, row, n_split, WAIT: tl.constexpr):
    tl.debug_barrier()  # every thread's partials are stored before the count says so
    if WAIT == 0:
        tl.atomic_add(arrived_ptr + row, 1, sem="release")
        while tl.atomic_add(arrived_ptr + row, 0, sem="acquire") < n_split:
            pass
    elif WAIT == 1:
        seen = tl.atomic_add(arrived_ptr + row, 1, sem="acq_rel") + 1
        while seen < n_split:
            seen = tl.atomic_add(arrived_ptr + row, 0, sem="acquire")
    else:
        seen = tl.atomic_add(arrived_ptr + row, 1, sem="acq_rel") + 1
        if seen < n_split:
            while tl.load(arrived_ptr + row, volatile=True) < n_split:
                pass
            tl.atomic_add(arrived_ptr + row, 0, sem="acquire")


@triton.jit
def _softmax_one_exp_kernel(
    x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False, WAIT: tl.constexpr = 0,
):  # fmt: skip
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
    x = load_tile(x_ptr + row * stride_xm + cols, mask, -float("inf"), EVEN_N, "").to(tl.float32)
    m_part = tl.max(x, axis=0) if PHASE != 2 else tl.load(partial_row + part)
    e = tl.where(x == -float("inf"), 0.0, tl.exp(x - m_part))
    if PHASE != 2:
        tl.store(partial_row + part, m_part)
        tl.store(partial_row + SPLIT_BLOCK + part, tl.sum(e, axis=0))
    if PHASE == 0:
        _wait(arrived_ptr, row, n_split, WAIT)
    if PHASE != 1:
        m_parts = load_row_partials(partial_row, 0, n_split, -float("inf"), SPLIT_BLOCK)
        s_parts = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
        m = tl.max(m_parts, axis=0)
        rescale = tl.where(m_parts == -float("inf"), 0.0, tl.exp(m_parts - tl.where(m == -float("inf"), 0.0, m)))
        s = tl.sum(s_parts * rescale, axis=0)
        y = e * (tl.exp(m_part - m) / s)
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _softmax_reciprocal_kernel(
    x_ptr, y_ptr, stride_xm, stride_ym, n_rows, n_cols, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, -float("inf"), EVEN_N, "").to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=1)[:, None])
    y = e * (1.0 / tl.sum(e, axis=1))[:, None]
    store_tile(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _softmax_persistent_reciprocal_kernel(
    x_ptr, y_ptr, stride_xm, stride_ym, n_rows, n_cols, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        x = load_tile(x_ptr + row * stride_xm + cols, mask, -float("inf"), EVEN_N, "").to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))
        y = e * (1.0 / tl.sum(e, axis=0))
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _rms_norm_wait_kernel(
    x_ptr, w_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, eps,
    HAS_WEIGHT: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False, WAIT: tl.constexpr = 0,
):  # fmt: skip
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    x = load_tile(x_ptr + row * stride_xm + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
    partial_row = partial_ptr + row * SPLIT_BLOCK
    if PHASE != 2:
        tl.store(partial_row + part, tl.sum(x * x, axis=0))
    if PHASE == 0:
        _wait(arrived_ptr, row, n_split, WAIT)
    if PHASE != 1:
        total = tl.sum(load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
        y = x * tl.rsqrt(total / n_cols + eps)
        if HAS_WEIGHT:
            y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _softmax_tagged_kernel(
    x_ptr, y_ptr, slot_ptr, tag, stride_xm, stride_ym, n_cols, n_split, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """The package's ``_softmax_fwd_split_kernel`` (same grid and results) with the row's maxima and sums exchanged
    through tagged slots (``tagged_exchange``: slot_ptr (n_rows, 2 * SPLIT_BLOCK) int64) instead of partials and a
    count. Under the interpreter's second launch the block's max and exponentials are formed again."""
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    x_in = load_tile(x_ptr + row * stride_xm + cols, mask, -float("inf"), EVEN_N, "")
    x = x_in.to(tl.float32)
    m_block = tl.max(x, axis=0)
    if x_in.dtype != tl.float32:
        e = exp_below_max(x, m_block)
    else:
        e = tl.where(x == -float("inf"), 0.0, tl.exp(x - m_block))
    slot_row = slot_ptr + row * (2 * SPLIT_BLOCK)
    m = tl.zeros([], tl.float32)
    s = tl.zeros([], tl.float32)
    if PHASE == 0:
        publish_tagged(slot_row + part, m_block, tag)
        publish_tagged(slot_row + SPLIT_BLOCK + part, tl.sum(e, axis=0), tag)
        m_parts = read_tagged(slot_row, 0, n_split, tag, -float("inf"), SPLIT_BLOCK)
        m, s = merge_max_and_sum(m_parts, read_tagged(slot_row, 1, n_split, tag, 0.0, SPLIT_BLOCK))
    elif PHASE == 1:  # the interpreter's first launch: the slots only
        tl.store(slot_row + part, slot_bits(m_block))
        tl.store(slot_row + SPLIT_BLOCK + part, slot_bits(tl.sum(e, axis=0)))
    else:
        m_parts = read_plainly(slot_row, 0, n_split, -float("inf"), SPLIT_BLOCK)
        m, s = merge_max_and_sum(m_parts, read_plainly(slot_row, 1, n_split, 0.0, SPLIT_BLOCK))
    if PHASE != 1:
        y = e * (tl.exp(m_block - m) / s)
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _rms_norm_tagged_kernel(
    x_ptr, w_ptr, y_ptr, slot_ptr, tag, stride_xm, stride_ym, n_cols, n_split, eps, HAS_WEIGHT: tl.constexpr,
    PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """The package's ``_rms_norm_fwd_split_kernel`` (same grid and results) with the row's sum exchanged through
    tagged slots (``tagged_exchange``: slot_ptr (n_rows, SPLIT_BLOCK) int64) instead of partials and a count."""
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    x_in = load_tile(x_ptr + row * stride_xm + cols, mask, 0.0, EVEN_N, "")
    x = x_in.to(tl.float32)
    slot_row = slot_ptr + row * SPLIT_BLOCK
    total = tl.zeros([], tl.float32)
    if PHASE == 0:
        publish_tagged(slot_row + part, tl.sum(x * x, axis=0), tag)
        total = tl.sum(read_tagged(slot_row, 0, n_split, tag, 0.0, SPLIT_BLOCK), axis=0)
    elif PHASE == 1:  # the interpreter's first launch: the slots only
        tl.store(slot_row + part, slot_bits(tl.sum(x * x, axis=0)))
    else:
        total = tl.sum(read_plainly(slot_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
    if PHASE != 1:
        y = widen_after_wait(x_in) * tl.rsqrt(total / n_cols + eps)
        if HAS_WEIGHT:
            y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _widen_by_halves(narrow):
    """A bfloat16 block in float32 by a third route (a 32-bit word of zero low half and the bfloat16 as its high
    half), which the compiler merges with neither ``.to(tl.float32)`` nor ``widen_after_wait``'s shift."""
    return tl.inline_asm_elementwise(
        "mov.b32 $0, {0, $1};", "=r,h", [narrow.to(tl.int16, bitcast=True)], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _layer_norm_stats_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False, STATS: tl.constexpr = 0,
):  # fmt: skip
    row, part, cols, mask = split_row_block(n_split, n_cols, BLOCK_N)
    x_row = x_ptr + row * stride_xm
    x_in = load_tile(x_row + cols, mask, 0.0, EVEN_N, "")
    k = tl.load(x_row).to(tl.float32)
    count = tl.minimum(n_cols - part * BLOCK_N, BLOCK_N).to(tl.float32)
    if STATS == 2:
        # One reduction of the pair (sum d, sum d*d) about the row's first element: the speed it would have, not
        # a safe form (the block's squared deviations come out of a difference).
        d = x_in.to(tl.float32) - k
        if not EVEN_N:
            d = tl.where(mask, d, 0.0)
        s1, s2 = tl.reduce((d, d * d), 0, _add_pair)
        mean_part = s1 / count
        m2_part = tl.maximum(s2 - s1 * mean_part, 0.0)
    elif STATS == 5 and x_in.dtype == tl.float32:
        # The package's statistics with the deviations formed again for the second reduction: from x plus a zero
        # the compiler cannot fold (k * 0.0; adding a zero changes at most a zero's sign, which the square and the
        # subtraction of k lose), so that only the loaded block, not the deviations beside it, stays live.
        d = x_in - k
        if not EVEN_N:
            d = tl.where(mask, d, 0.0)
        mean_part = tl.sum(d, axis=0) / count
        e = ((x_in + k * 0.0) - k) - mean_part
        if not EVEN_N:
            e = tl.where(mask, e, 0.0)
        m2_part = tl.sum(e * e, axis=0)
    elif STATS >= 1 and x_in.dtype == tl.bfloat16:  # STATS 5 in bfloat16 is STATS 4
        # The package's statistics, with the deviations formed again for the second reduction by a route the
        # compiler does not merge with the first's, so only the loaded block stays live across the first.
        d = x_in.to(tl.float32) - k
        if not EVEN_N:
            d = tl.where(mask, d, 0.0)
        mean_part = tl.sum(d, axis=0) / count
        e = (widen_after_wait(x_in) - k) - mean_part
        if not EVEN_N:
            e = tl.where(mask, e, 0.0)
        m2_part = tl.sum(e * e, axis=0)
    else:
        mean_part, m2_part = _block_stats(x_in.to(tl.float32), mask, k, count, EVEN_N)
    means, m2s = split_row_pair(mean_part, m2_part, partial_ptr + row * (2 * SPLIT_BLOCK), arrived_ptr, row, part,
                                n_split, PHASE, SPLIT_BLOCK)  # fmt: skip
    if PHASE != 1:
        parts = tl.arange(0, SPLIT_BLOCK)
        counts = tl.minimum(tl.maximum(n_cols - parts * BLOCK_N, 0), BLOCK_N).to(tl.float32)
        mean = tl.sum(counts * means, axis=0) / n_cols
        spread = means - mean
        var = (tl.sum(m2s, axis=0) + tl.sum(counts * spread * spread, axis=0)) / n_cols
        if STATS == 1 and x_in.dtype == tl.bfloat16:
            x = _widen_by_halves(x_in)
        elif STATS == 3:
            x = x_in.to(tl.float32)
        elif STATS == 4 and x_in.dtype == tl.bfloat16:
            x = (x_in.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        elif STATS == 5 and x_in.dtype == tl.float32:
            x = x_in + k * 0.5 * 0.0  # a third route: the second reduction's is not kept across the wait either
        elif STATS == 5 and x_in.dtype == tl.bfloat16:
            x = (x_in.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        else:
            x = widen_after_wait(x_in)
        y = ((x - k) - mean) * tl.rsqrt(var + eps)
        if HAS_WEIGHT:
            y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        if HAS_BIAS:
            y = y + load_tile(b_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _softmax_grouped_kernel(
    x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, n_rows, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """The package's split_rows softmax with a row's programs in groups that loop over every ``groups``-th row (as
    the norms' split_rows backwards do); PREFETCH: the block of the group's next row is loaded between this row's
    arrival and its wait."""
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    x_next = load_tile(x_ptr + group * stride_xm + cols, mask, -float("inf"), EVEN_N, "")
    for row in range(group, n_rows, groups):
        x_in = x_next if PREFETCH else load_tile(x_ptr + row * stride_xm + cols, mask, -float("inf"), EVEN_N, "")
        x = x_in.to(tl.float32)
        partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
        m_block = tl.max(x, axis=0) if PHASE != 2 else tl.load(partial_row + part)
        if x_in.dtype != tl.float32:
            e = exp_below_max(x, m_block)
        else:
            e = tl.where(x == -float("inf"), 0.0, tl.exp(x - m_block))
        if PHASE != 2:
            tl.store(partial_row + part, m_block)
            tl.store(partial_row + SPLIT_BLOCK + part, tl.sum(e, axis=0))
        seen = 0
        if PHASE == 0:
            seen = arrive_at_row(arrived_ptr, row)
        if PREFETCH:
            following = tl.minimum(row + groups, n_rows - 1)
            x_next = load_tile(x_ptr + following * stride_xm + cols, mask, -float("inf"), EVEN_N, "")
        if PHASE == 0:
            wait_until_arrived(arrived_ptr, row, n_split, seen)
        if PHASE != 1:
            m_parts = load_row_partials(partial_row, 0, n_split, -float("inf"), SPLIT_BLOCK)
            s_parts = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
            if PHASE == 0:
                leave_row(arrived_ptr, row, part, n_split)
            m, s = merge_max_and_sum(m_parts, s_parts)
            y = e * (tl.exp(m_block - m) / s)
            store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _rms_norm_grouped_kernel(
    x_ptr, w_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, n_rows, eps,
    HAS_WEIGHT: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """The package's split_rows rms_norm with a row's programs in groups that loop over rows (as
    ``_softmax_grouped_kernel``)."""
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    x_next = load_tile(x_ptr + group * stride_xm + cols, mask, 0.0, EVEN_N, "")
    for row in range(group, n_rows, groups):
        x_in = x_next if PREFETCH else load_tile(x_ptr + row * stride_xm + cols, mask, 0.0, EVEN_N, "")
        x = x_in.to(tl.float32)
        partial_row = partial_ptr + row * SPLIT_BLOCK
        if PHASE != 2:
            tl.store(partial_row + part, tl.sum(x * x, axis=0))
        seen = 0
        if PHASE == 0:
            seen = arrive_at_row(arrived_ptr, row)
        if PREFETCH:
            following = tl.minimum(row + groups, n_rows - 1)
            x_next = load_tile(x_ptr + following * stride_xm + cols, mask, 0.0, EVEN_N, "")
        if PHASE == 0:
            wait_until_arrived(arrived_ptr, row, n_split, seen)
        if PHASE != 1:
            total = tl.sum(load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
            if PHASE == 0:
                leave_row(arrived_ptr, row, part, n_split)
            y = widen_after_wait(x_in) * tl.rsqrt(total / n_cols + eps)
            if HAS_WEIGHT:
                y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
            store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _softmax_pipelined_kernel(
    x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, n_rows, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """``_softmax_grouped_kernel`` with its row loop pipelined by Triton, as the norms' ``split_rows_pipelined``
    backwards are: with PREFETCH, three ``tl.range`` stages, so the block of the group's row after next is copied
    into shared memory (``cp.async``) while the program works on a row, and the exchange in inline assembly
    (:mod:`kernelgate.ops.split_rows`' ``*_in_asm``, NVIDIA GPUs)."""
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    for row in tl.range(group, n_rows, groups, num_stages=1 + 2 * PREFETCH):
        x_in = load_tile(x_ptr + row * stride_xm + cols, mask, -float("inf"), EVEN_N, "")
        x = x_in.to(tl.float32)
        partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
        m_block = tl.max(x, axis=0) if PHASE != 2 else tl.load(partial_row + part)
        if x_in.dtype != tl.float32:
            e = exp_below_max(x, m_block)
        else:
            e = tl.where(x == -float("inf"), 0.0, tl.exp(x - m_block))
        if PHASE != 2:
            tl.store(partial_row + part, m_block)
            tl.store(partial_row + SPLIT_BLOCK + part, tl.sum(e, axis=0))
        if PHASE == 0:
            wait_until_arrived_in_asm(arrived_ptr, row, n_split, arrive_at_row_in_asm(arrived_ptr, row))
            m_parts = load_row_partials_in_asm(partial_row, 0, n_split, -float("inf"), SPLIT_BLOCK)
            s_parts = load_row_partials_in_asm(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
            leave_row(arrived_ptr, row, part, n_split)
        elif PHASE == 2:  # the interpreter's second launch, after every program stored its partials
            m_parts = load_row_partials(partial_row, 0, n_split, -float("inf"), SPLIT_BLOCK)
            s_parts = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
        if PHASE != 1:
            m, s = merge_max_and_sum(m_parts, s_parts)
            y = e * (tl.exp(m_block - m) / s)
            store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _rms_norm_pipelined_kernel(
    x_ptr, w_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, n_rows, eps,
    HAS_WEIGHT: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """``_rms_norm_grouped_kernel`` with its row loop pipelined by Triton (as ``_softmax_pipelined_kernel``)."""
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    for row in tl.range(group, n_rows, groups, num_stages=1 + 2 * PREFETCH):
        x_in = load_tile(x_ptr + row * stride_xm + cols, mask, 0.0, EVEN_N, "")
        x = x_in.to(tl.float32)
        partial_row = partial_ptr + row * SPLIT_BLOCK
        if PHASE != 2:
            tl.store(partial_row + part, tl.sum(x * x, axis=0))
        if PHASE == 0:
            wait_until_arrived_in_asm(arrived_ptr, row, n_split, arrive_at_row_in_asm(arrived_ptr, row))
            total = tl.sum(load_row_partials_in_asm(partial_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
            leave_row(arrived_ptr, row, part, n_split)
        elif PHASE == 2:
            total = tl.sum(load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
        if PHASE != 1:
            y = widen_after_wait(x_in) * tl.rsqrt(total / n_cols + eps)
            if HAS_WEIGHT:
                y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
            store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


@triton.jit
def _layer_norm_pipelined_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, n_rows, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """The package's split_rows layer_norm (its statistics and formulas) with a row's programs in groups that loop
    over rows, the loop pipelined by Triton as ``_softmax_pipelined_kernel``'s is (x, the weight and the bias copied
    ahead)."""
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    count = tl.minimum(n_cols - part * BLOCK_N, BLOCK_N).to(tl.float32)
    for row in tl.range(group, n_rows, groups, num_stages=1 + 2 * PREFETCH):
        x_row = x_ptr + row * stride_xm
        x_in = load_tile(x_row + cols, mask, 0.0, EVEN_N, "")
        k = tl.load(x_row).to(tl.float32)
        partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
        if PHASE != 2:
            mean_part, m2_part = _block_stats(x_in.to(tl.float32), mask, k, count, EVEN_N)
            tl.store(partial_row + part, mean_part)
            tl.store(partial_row + SPLIT_BLOCK + part, m2_part)
        if PHASE == 0:
            wait_until_arrived_in_asm(arrived_ptr, row, n_split, arrive_at_row_in_asm(arrived_ptr, row))
            means = load_row_partials_in_asm(partial_row, 0, n_split, 0.0, SPLIT_BLOCK)
            m2s = load_row_partials_in_asm(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
            leave_row(arrived_ptr, row, part, n_split)
        elif PHASE == 2:
            means = load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK)
            m2s = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
        if PHASE != 1:
            mean, var = _merge_block_stats(means, m2s, n_cols, BLOCK_N, SPLIT_BLOCK)
            y = ((widen_after_wait(x_in) - k) - mean) * tl.rsqrt(var + eps)
            if HAS_WEIGHT:
                y = y * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
            if HAS_BIAS:
                y = y + load_tile(b_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
            store_tile(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "")


_STEM = Path(__file__).stem
SOFTMAX_ONE_EXP = LazyKernel(_STEM, "_softmax_one_exp_kernel")
SOFTMAX_RECIPROCAL = LazyKernel(_STEM, "_softmax_reciprocal_kernel")
SOFTMAX_PERSISTENT_RECIPROCAL = LazyKernel(_STEM, "_softmax_persistent_reciprocal_kernel")
RMS_NORM_WAIT = LazyKernel(_STEM, "_rms_norm_wait_kernel")
LAYER_NORM_STATS = LazyKernel(_STEM, "_layer_norm_stats_kernel")
SOFTMAX_GROUPED = LazyKernel(_STEM, "_softmax_grouped_kernel")
RMS_NORM_GROUPED = LazyKernel(_STEM, "_rms_norm_grouped_kernel")
SOFTMAX_PIPELINED = LazyKernel(_STEM, "_softmax_pipelined_kernel")
RMS_NORM_PIPELINED = LazyKernel(_STEM, "_rms_norm_pipelined_kernel")
LAYER_NORM_PIPELINED = LazyKernel(_STEM, "_layer_norm_pipelined_kernel")
RMS_NORM_TAGGED = LazyKernel(_STEM, "_rms_norm_tagged_kernel")
SOFTMAX_TAGGED = LazyKernel(_STEM, "_softmax_tagged_kernel")
# The grouped variants' configurations: blocks of 8192 and 16384 columns at 16 or 32 elements a thread, with or without
# the next row's block loaded during the wait, and 2 to 5 programs a multiprocessor.
GROUPED_CONFIGS = ConfigSpace(BLOCK_N=(8192, 16384), num_warps=(8, 16), PER_SM=(2, 3, 4, 5), PREFETCH=(0, 1))


def _grouped_prune(config: Any, x: torch.Tensor, *args: Any) -> bool:
    per_thread = config["BLOCK_N"] // (32 * config["num_warps"])
    return 16 <= per_thread <= 32 and config["BLOCK_N"] < x.shape[-1]


def _pipelined_prune(blocks: int) -> Any:
    """The grouped configurations with PREFETCH whose copies ahead, two rows of ``blocks`` blocks (x, and the norms'
    weight and bias), fit the shared memory the package's pipelined backwards may take."""

    def prune(config: Any, x: torch.Tensor, *args: Any) -> bool:
        copies = 2 * blocks * config["BLOCK_N"] * x.element_size()
        return _grouped_prune(config, x) and bool(config["PREFETCH"]) and copies <= rowwise.PIPELINED_SHARED_BYTES

    return prune


def _softmax_split_variant(name: str, wait: int) -> TritonImpl:
    package = package_impl(kernelgate.softmax, "split_rows")

    def launch(x: torch.Tensor, dim: int = -1, *, config: Any) -> torch.Tensor:
        rows = rowwise.as_rows(x, "x")
        y = torch.empty_like(x)
        rowwise.launch_split_rows(
            SOFTMAX_ONE_EXP, rows, (rows.tensor, y), (rows.stride, rows.n_cols), (), 2, config=config,
            fresh_counts=True, EVEN_N=rows.n_cols % config["BLOCK_N"] == 0, WAIT=wait,
        )  # fmt: skip
        return y

    return dataclasses.replace(package, name=name, launcher=launch, kernels=(SOFTMAX_ONE_EXP,))


def _softmax_reciprocal_variants() -> list[TritonImpl]:
    """The single-block and persistent implementations built on the reciprocal kernels (the looped one unused)."""
    looped = SOFTMAX_RECIPROCAL  # never selected: along_dim_impls needs one
    built = rowwise.along_dim_impls(SOFTMAX_RECIPROCAL, looped, SOFTMAX_PERSISTENT_RECIPROCAL)
    return [
        dataclasses.replace(i, name=f"{i.name}_reciprocal") for i in built if i.name in ("single_block", "persistent")
    ]


def _rms_norm_split_variant(name: str, wait: int) -> TritonImpl:
    package = package_impl(kernelgate.rms_norm, "split_rows")

    def launch(x: torch.Tensor, weight: torch.Tensor | None, eps: float = EPS, *, config: Any) -> torch.Tensor:
        rows, w, y = rms_norm_module._forward_operands(x, weight)
        rowwise.launch_split_rows(
            RMS_NORM_WAIT, rows, (rows.tensor, w, y), (rows.stride, rows.n_cols), (eps,), 1, config=config,
            fresh_counts=True, HAS_WEIGHT=weight is not None, EVEN_N=rows.n_cols % config["BLOCK_N"] == 0, WAIT=wait,
        )  # fmt: skip
        return y

    return dataclasses.replace(package, name=name, launcher=launch, kernels=(RMS_NORM_WAIT,))


def _softmax_tagged_variant() -> TritonImpl:
    """``split_tagged``: the package's split_rows forward with the tagged kernel, at the same configurations."""
    package = package_impl(kernelgate.softmax, "split_rows")

    def launch_tagged(x: torch.Tensor, dim: int = -1, *, config: Any) -> torch.Tensor:
        rows = rowwise.as_rows(x, "x")
        y = torch.empty_like(x)
        block = config["BLOCK_N"]
        n_split, split_block, slots, tag = tagged_split(x.device, rows.n_rows, rows.n_cols, block, 2)
        options = rowwise.with_launch_options({"num_warps": config["num_warps"]}, config)
        for phase in rowwise.split_rows_phases():
            launch_kernel(
                SOFTMAX_TAGGED, (rows.n_rows * n_split,), rows.tensor, y, slots, tag, rows.stride, rows.n_cols,
                rows.n_cols, n_split, PHASE=phase, SPLIT_BLOCK=split_block, BLOCK_N=block,
                EVEN_N=rows.n_cols % block == 0, **options,
            )  # fmt: skip
        return y

    return dataclasses.replace(package, name="split_tagged", launcher=launch_tagged, kernels=(SOFTMAX_TAGGED,))


def _rms_norm_tagged_variant() -> TritonImpl:
    """``split_tagged``: the package's split_rows forward with the tagged kernel, at the same configurations."""
    package = package_impl(kernelgate.rms_norm, "split_rows")

    def launch_tagged(x: torch.Tensor, weight: torch.Tensor | None, eps: float = EPS, *, config: Any) -> torch.Tensor:
        rows, w, y = rms_norm_module._forward_operands(x, weight)
        block = config["BLOCK_N"]
        n_split, split_block, slots, tag = tagged_split(x.device, rows.n_rows, rows.n_cols, block, 1)
        options = rowwise.with_launch_options({"num_warps": config["num_warps"]}, config)
        for phase in rowwise.split_rows_phases():
            launch_kernel(
                RMS_NORM_TAGGED, (rows.n_rows * n_split,), rows.tensor, w, y, slots, tag, rows.stride, rows.n_cols,
                rows.n_cols, n_split, eps, HAS_WEIGHT=weight is not None, PHASE=phase, SPLIT_BLOCK=split_block,
                BLOCK_N=block, EVEN_N=rows.n_cols % block == 0, **options,
            )  # fmt: skip
        return y

    return dataclasses.replace(package, name="split_tagged", launcher=launch_tagged, kernels=(RMS_NORM_TAGGED,))


def _layer_norm_split_variant(name: str, stats: int) -> TritonImpl:
    package = package_impl(kernelgate.layer_norm, "split_rows")

    def launch(
        x: torch.Tensor,
        normalized_shape: Sequence[int],
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        eps: float = EPS,
        *,
        config: Any,
    ) -> torch.Tensor:
        rows, pointers, y = layer_norm_module._forward_operands(x, normalized_shape, weight, bias)
        rowwise.launch_split_rows(
            LAYER_NORM_STATS, rows, pointers, (rows.stride, rows.n_cols), (float(eps),), 2, config=config,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, EVEN_N=rows.n_cols % config["BLOCK_N"] == 0,
            STATS=stats,
        )  # fmt: skip
        return y

    return dataclasses.replace(package, name=name, launcher=launch, kernels=(LAYER_NORM_STATS,))


def _layer_norm_pipelined_variant() -> TritonImpl:
    package = package_impl(kernelgate.layer_norm, "split_rows")

    def launch(
        x: torch.Tensor,
        normalized_shape: Sequence[int],
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        eps: float = EPS,
        *,
        config: Any,
    ) -> torch.Tensor:
        rows, pointers, y = layer_norm_module._forward_operands(x, normalized_shape, weight, bias)
        groups = rowwise.split_rows_groups(x.device, rows.n_rows, rows.n_cols, config["BLOCK_N"], config["PER_SM"])
        rowwise.launch_split_rows(
            LAYER_NORM_PIPELINED, rows, pointers, (rows.stride, rows.n_cols), (rows.n_rows, float(eps)), 2,
            config=config, groups=groups, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            PREFETCH=bool(config["PREFETCH"]), EVEN_N=rows.n_cols % config["BLOCK_N"] == 0,
        )  # fmt: skip
        return y

    return dataclasses.replace(
        package, name="split_pipelined", launcher=launch, kernels=(LAYER_NORM_PIPELINED,), configs=GROUPED_CONFIGS,
        default_config=None, prune=_pipelined_prune(3),
    )  # fmt: skip


def _softmax_grouped_variant(name: str = "split_grouped", kernel: LazyKernel = SOFTMAX_GROUPED) -> TritonImpl:
    """softmax's grouped variant, or (``kernel``) its pipelined form."""
    package = package_impl(kernelgate.softmax, "split_rows")

    def launch(x: torch.Tensor, dim: int = -1, *, config: Any) -> torch.Tensor:
        rows = rowwise.as_rows(x, "x")
        y = torch.empty_like(x)
        groups = rowwise.split_rows_groups(x.device, rows.n_rows, rows.n_cols, config["BLOCK_N"], config["PER_SM"])
        rowwise.launch_split_rows(
            kernel, rows, (rows.tensor, y), (rows.stride, rows.n_cols), (rows.n_rows,), 2, config=config,
            groups=groups, PREFETCH=bool(config["PREFETCH"]), EVEN_N=rows.n_cols % config["BLOCK_N"] == 0,
        )  # fmt: skip
        return y

    prune = _grouped_prune if kernel is SOFTMAX_GROUPED else _pipelined_prune(1)
    return dataclasses.replace(
        package, name=name, launcher=launch, kernels=(kernel,), configs=GROUPED_CONFIGS, default_config=None,
        prune=prune,
    )  # fmt: skip


def _rms_norm_grouped_variant(name: str = "split_grouped", kernel: LazyKernel = RMS_NORM_GROUPED) -> TritonImpl:
    """rms_norm's grouped variant, or (``kernel``) its pipelined form."""
    package = package_impl(kernelgate.rms_norm, "split_rows")

    def launch(x: torch.Tensor, weight: torch.Tensor | None, eps: float = EPS, *, config: Any) -> torch.Tensor:
        rows, w, y = rms_norm_module._forward_operands(x, weight)
        groups = rowwise.split_rows_groups(x.device, rows.n_rows, rows.n_cols, config["BLOCK_N"], config["PER_SM"])
        rowwise.launch_split_rows(
            kernel, rows, (rows.tensor, w, y), (rows.stride, rows.n_cols), (rows.n_rows, eps), 1,
            config=config, groups=groups, HAS_WEIGHT=weight is not None, PREFETCH=bool(config["PREFETCH"]),
            EVEN_N=rows.n_cols % config["BLOCK_N"] == 0,
        )  # fmt: skip
        return y

    prune = _grouped_prune if kernel is RMS_NORM_GROUPED else _pipelined_prune(2)
    return dataclasses.replace(
        package, name=name, launcher=launch, kernels=(kernel,), configs=GROUPED_CONFIGS, default_config=None,
        prune=prune,
    )  # fmt: skip


def variants(op_name: str) -> list[TritonImpl]:
    if op_name == "softmax":
        return [
            package_impl(kernelgate.softmax, "split_rows"),
            _softmax_grouped_variant(),
            _softmax_grouped_variant("split_pipelined", SOFTMAX_PIPELINED),
            _softmax_tagged_variant(),
            _softmax_split_variant("split_one_exp", WAIT_PACKAGE),
            _softmax_split_variant("split_one_exp_last", WAIT_LAST),
            _softmax_split_variant("split_one_exp_volatile", WAIT_VOLATILE),
            package_impl(kernelgate.softmax, "looped"),
            package_impl(kernelgate.softmax, "single_block"),
            package_impl(kernelgate.softmax, "persistent"),
            *_softmax_reciprocal_variants(),
        ]
    if op_name == "layer_norm":
        return [
            package_impl(kernelgate.layer_norm, "split_rows"),
            _layer_norm_split_variant("split_recompute", 1),
            _layer_norm_split_variant("split_pair_unsafe", 2),
            _layer_norm_split_variant("split_recompute_zext_after", 4),
            _layer_norm_split_variant("split_recompute_zero", 5),
            _layer_norm_pipelined_variant(),
            package_impl(kernelgate.layer_norm, "split_looped"),
            package_impl(kernelgate.layer_norm, "looped"),
            package_impl(kernelgate.layer_norm, "single_block"),
        ]
    return [
        package_impl(kernelgate.rms_norm, "split_rows"),
        _rms_norm_grouped_variant(),
        _rms_norm_grouped_variant("split_pipelined", RMS_NORM_PIPELINED),
        _rms_norm_tagged_variant(),
        _rms_norm_split_variant("split_last", WAIT_LAST),
        _rms_norm_split_variant("split_volatile", WAIT_VOLATILE),
    ]


def measure_case(
    op_name: str,
    only: Sequence[str] | None,
    dtype: torch.dtype,
    rows: int,
    n: int,
    device: torch.device,
    interpret: bool,
) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of each variant of ``op_name`` (of those named in ``only``,
    when given) at a ``rows`` x ``n`` input."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(rows, n, generator=gen) * 3).to(device=device, dtype=dtype)
    if op_name == "softmax":
        op, values = kernelgate.softmax, (x, -1)
    elif op_name == "layer_norm":
        w = (torch.rand(n, generator=gen) + 0.5).to(device=device, dtype=dtype)
        b = torch.randn(n, generator=gen).to(device=device, dtype=dtype)
        op, values = kernelgate.layer_norm, (x + 2.0, (n,), w, b, EPS)
    else:
        w = (torch.rand(n, generator=gen) + 0.5).to(device=device, dtype=dtype)
        op, values = kernelgate.rms_norm, (x, w, EPS)
    nbytes = 2 * rows * n * x.element_size()
    # A configuration that cannot run here (resources, shape) is reported, not fatal.
    chosen = [impl for impl in variants(op_name) if only is None or impl.name in only]
    return check_and_time(op, chosen, values, n, nbytes, interpret, record_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(__doc__, DEFAULT_LENGTHS)
    parser.add_argument("--op", action="append", choices=["softmax", "rms_norm", "layer_norm"])
    parser.add_argument("--only", action="append", metavar="VARIANT", help="only this variant (repeatable)")
    args = parser.parse_args(argv)
    groups = [
        ({"op": name}, functools.partial(measure_case, name, args.only)) for name in args.op or ["softmax", "rms_norm"]
    ]
    return run_cases(args, Path(__file__).name, groups)


if __name__ == "__main__":
    sys.exit(main())
