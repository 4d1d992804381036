"""The norms' backward implementations for long rows, side by side, at every configuration tuning would try.

The ``split`` backwards of rms_norm, add_rms_norm and layer_norm read x and dy twice (a kernel for each row's
statistics, then one over column blocks of row groups), which bounds the forward+backward at 0.71 of copy;
``split_rows`` reads them once (a row's programs exchange its statistics, in groups that loop over rows). For each
case this checks each configuration of each implementation against the op's reference (the package's tolerance,
the parameter gradients by the norm of their error) and times the ones that match (``do_bench``: L2 flushed,
median, compiled ahead in worker processes). Bytes a call: x and dy read, dx written (add_rms_norm: grad_s read
too), the weight read once (layer_norm's bias not counted); fractions are of a device-to-device copy measured in
the same run. Writes JSON with provenance.

Beside the package's two, rms_norm's and add_rms_norm's backwards run a variant, ``split_rows_lagged``: the
package's split_rows kernel with each row's wait put off by one row. A program stores its partials of row i and
arrives, then waits for row i - 1 (whose programs all arrived an iteration ago) and writes its dx, so the
exchange's latency is spent on that work instead of idle; it holds two rows (three with PREFETCH). In bfloat16 the
package's kernel stays far from the read-once bound (``results/h100/norm-backward-split-rows-80f70db``), and the
exchange, paid once a row, is the suspect this variant tests. Measured on an H100
(``results/h100/norm-backward-split-rows-lagged-8d8bed0``), it is not: 0.95 to 1.06 times the package kernel's
time. Its ``PREFETCH=1`` configurations fail the check there (the interpreter passes them); cause not found.

A second variant, ``split_rows_staged`` (rms_norm's and add_rms_norm's backwards), asks Triton to pipeline the row
loop instead: ``tl.range`` stages make the next rows' loads asynchronous copies into shared memory, in flight through
an iteration, where PREFETCH keeps the next blocks in registers. Triton's pipeliner (3.6 and 3.9) takes no loop that
holds a while loop or a ``tl.debug_barrier`` (``results/compile-sm90/pipeliner-blockers.txt``), so the wait polls in
inline assembly (each thread an acquiring load until the row's count says all arrived or leaving, then a barrier)
and the barrier before the arrival is inline assembly too, as is the load of the row's partials after the wait
(a ``tl.load`` there was copied ahead an iteration early, before the partials were stored). Its ``PREFETCH`` names
the stages: 0 one (no copies ahead), 1 three (two rows' copies issued ahead, so one row's stay in flight while the
program works on another; at BLOCK_N 16384 that needs more shared memory than the H100 has, and the configuration
is recorded as an error). On an H100 (``results/h100/norm-backward-split-rows-staged-1d9eadd``) it matches the
reference at every other configuration and is faster than the package's split_rows at rows of 16384 and 32768
(rms_norm 4 to 6 %, add_rms_norm 8 to 10 %) and add_rms_norm's longer rows (2 to 5 %), slower for rms_norm at 65536
and 131072 (2 to 3 %). The interpreter runs the two-launch form, without the assembly.

    python benchmarks/norm_backward_split_rows.py --out split-rows.json
    python benchmarks/norm_backward_split_rows.py --interpret --rows 5 --lengths 9000 --out check.json
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
from variant_timing import argument_parser, check_and_time, package_impl, run_cases  # beside this script

import kernelgate
from kernelgate import rowwise
from kernelgate.launch import LazyKernel
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.split_rows import (
    arrive_at_row,
    leave_row,
    load_block_pair,
    load_row_partials,
    row_group_block,
    wait_until_arrived,
    widen_after_wait,
)
from kernelgate.ops.tiles import load_tile, store_tile

rms_norm_module = importlib.import_module("kernelgate.ops.rms_norm")

DEFAULT_LENGTHS = (16384, 32768, 65536, 131072)
IMPLEMENTATIONS = ("split", "split_rows")


@triton.jit
def _rms_norm_bwd_lagged_kernel(
    dy_ptr, ds_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, partial_ptr, arrived_ptr, stride_dym, stride_dsm, stride_xm,
    stride_dxm, n_cols, n_split, n_rows, eps, HAS_DS: tl.constexpr, HAS_WEIGHT: tl.constexpr, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """The package's ``_rms_norm_bwd_split_rows_kernel`` (same arguments, grid and results) with each row's wait
    put off by one row: iteration i stores row i's partials and arrives, then (PREFETCH: after issuing row i + 1's
    loads) waits for row i - 1 and writes its dx; a last iteration finishes the group's last row. A program waits
    only for a row whose programs all arrived before they could wait on anything later, so none waits for ever."""
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    rows_here = tl.cdiv(n_rows - group, groups)
    dw = tl.zeros([BLOCK_N], tl.float32)
    x_next, dy_next = load_block_pair(x_ptr, dy_ptr, group, stride_xm, stride_dym, cols, mask, EVEN_N)
    x_prev, dy_prev = x_next, dy_next
    seen_prev = 0
    for i in range(0, rows_here + 1):
        row = group + i * groups
        x_in, dy_in = x_prev, dy_prev
        seen = 0
        if i < rows_here:
            if PREFETCH:
                x_in, dy_in = x_next, dy_next
            else:
                x_in, dy_in = load_block_pair(x_ptr, dy_ptr, row, stride_xm, stride_dym, cols, mask, EVEN_N)
            x = x_in.to(tl.float32)
            g = dy_in.to(tl.float32)
            if HAS_WEIGHT:
                g = g * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
            partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
            if PHASE != 2:
                tl.store(partial_row + part, tl.sum(x * x, axis=0))
                tl.store(partial_row + SPLIT_BLOCK + part, tl.sum(g * x, axis=0))
            if PHASE == 0:
                seen = arrive_at_row(arrived_ptr, row)
            if PREFETCH:
                following = tl.minimum(row + groups, n_rows - 1)
                x_next, dy_next = load_block_pair(x_ptr, dy_ptr, following, stride_xm, stride_dym, cols, mask, EVEN_N)
        if i > 0:
            previous = row - groups
            if PHASE == 0:
                wait_until_arrived(arrived_ptr, previous, n_split, seen_prev)
            if PHASE != 1:
                partial_prev = partial_ptr + previous * (2 * SPLIT_BLOCK)
                sum_xx = tl.sum(load_row_partials(partial_prev, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
                sum_gx = tl.sum(load_row_partials(partial_prev, 1, n_split, 0.0, SPLIT_BLOCK), axis=0)
                if PHASE == 0:
                    leave_row(arrived_ptr, previous, part, n_split)
                rstd = tl.rsqrt(sum_xx / n_cols + eps)
                c = rstd * rstd * rstd * (sum_gx / n_cols)
                x = widen_after_wait(x_prev)
                dy = widen_after_wait(dy_prev)
                g = dy
                if HAS_WEIGHT:
                    g = dy * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
                dx = rstd * g - c * x
                if HAS_DS:
                    dx += load_tile(ds_ptr + previous * stride_dsm + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
                store_tile(dx_ptr + previous * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask, EVEN_N, "")
                if HAS_WEIGHT:
                    dw += dy * (x * rstd)
        x_prev, dy_prev, seen_prev = x_in, dy_in, seen
    if HAS_WEIGHT and PHASE != 1:
        store_tile(dw_ptr + group * n_cols + cols, dw, mask, EVEN_N, "")


# By the module's importable name (not "__main__" when it runs as a script): the compile workers import it by name.
LAGGED = LazyKernel(Path(__file__).stem, "_rms_norm_bwd_lagged_kernel")


def split_rows_variant(op: Op, name: str) -> TritonImpl:
    """``op``'s split_rows implementation (rms_norm's or add_rms_norm's backward) with the kernel of variant ``name``
    (a key of ``VARIANT_KERNELS``) in place of the package's, at the same configurations."""
    split_rows = package_impl(op, "split_rows")
    kernel = VARIANT_KERNELS[name]
    run = functools.partial(rms_norm_module.run_backward_split_rows, kernel=kernel)

    def launch(*args: Any, config: Any) -> Any:
        if op.name == "add_rms_norm_backward":  # (grad, grad_s, s, weight, eps)
            return run(*args, config)
        grad, x, weight, eps = args
        return run(grad, None, x, weight, eps, config)

    return dataclasses.replace(split_rows, name=name, launcher=launch, kernels=(kernel, rowwise.PARTIAL_SUMS))


@triton.jit
def _wait_by_polling(arrived_ptr, row, n_split, seen):
    """:func:`~kernelgate.ops.split_rows.wait_until_arrived` as one inline-assembly loop, which Triton's pipeliner
    does not see as a loop: each thread loads the row's count (acquire, device scope) until it is ``n_split`` or
    more, or negative (programs leaving), read as unsigned so that both end the wait; ``seen`` first. A barrier
    ends it: each thread polls for itself, so without one a program's first thread could count the program out
    of the row (:func:`~kernelgate.ops.split_rows.leave_row`) while another of its threads still polls, and once the
    row's other programs had left too that thread would read a count back at zero and poll for ever (on an H100
    the variant without this barrier hung at BLOCK_N 8192 / 16 warps)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred %p; .reg .b32 %v; mov.b32 %v, $2; "
        "poll${:uid}: setp.lt.u32 %p, %v, $3; @!%p bra done${:uid}; "
        "ld.acquire.gpu.global.b32 %v, [$1]; bra poll${:uid}; done${:uid}: bar.sync 0; mov.b32 $0, %v; }",
        "=r,l,r,r",
        [arrived_ptr + row, seen, n_split],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _load_partials_after_wait(partial_row, slot, n_split, SPLIT_BLOCK: tl.constexpr):
    """:func:`~kernelgate.ops.split_rows.load_row_partials` (``other`` 0) in inline assembly, which the pipeliner
    does not copy ahead: as a ``tl.load`` in a staged loop it became an asynchronous copy issued an iteration early,
    before the row's programs had stored their partials or the wait (compiled for sm_90 by Triton 3.6.0), and on an
    H100 the variant's results were NaN."""
    parts = tl.arange(0, SPLIT_BLOCK)
    inside = parts < n_split
    addresses = partial_row + slot * SPLIT_BLOCK + tl.where(inside, parts, 0)
    bits = tl.inline_asm_elementwise(
        "ld.global.cg.b32 $0, [$1];", "=r,l", [addresses], dtype=tl.int32, is_pure=False, pack=1
    )
    return tl.where(inside, bits.to(tl.float32, bitcast=True), 0.0)


@triton.jit
def _arrive_after_barrier(arrived_ptr, row):
    """:func:`~kernelgate.ops.split_rows.arrive_at_row` with its barrier in inline assembly: Triton's pipeliner
    leaves a loop that holds a ``tl.debug_barrier`` alone. The count's add takes the barrier's output (0), so it
    follows it."""
    after = tl.inline_asm_elementwise(
        "bar.sync 0; mov.b32 $0, 0;", "=r,r", [row], dtype=tl.int32, is_pure=False, pack=1
    )
    return tl.atomic_add(arrived_ptr + row, 1 + after, sem="acq_rel") + 1


@triton.jit
def _rms_norm_bwd_staged_kernel(
    dy_ptr, ds_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, partial_ptr, arrived_ptr, stride_dym, stride_dsm, stride_xm,
    stride_dxm, n_cols, n_split, n_rows, eps, HAS_DS: tl.constexpr, HAS_WEIGHT: tl.constexpr, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """The package's ``_rms_norm_bwd_split_rows_kernel`` (same arguments, grid and results) with its row loop in
    ``tl.range`` stages (``1 + 2 * PREFETCH``): the next rows' blocks are copied ahead into shared memory by the
    pipeliner rather than loaded into registers by the kernel, and the arrival's barrier, the wait and the load of
    the row's partials are inline assembly (:func:`_arrive_after_barrier`, :func:`_wait_by_polling`,
    :func:`_load_partials_after_wait`) so that the loop stays one Triton can pipeline and copies nothing ahead that
    the row's programs have yet to store. With three stages the pipeliner issues the copies of the row after next at
    the end of an iteration and waits at the start of the next for the oldest row's only, so one row's copies are in
    flight through each iteration (with two it waited for all at once; compiled for sm_90 by Triton 3.6.0)."""
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    dw = tl.zeros([BLOCK_N], tl.float32)
    for row in tl.range(group, n_rows, groups, num_stages=1 + 2 * PREFETCH):
        x_in, dy_in = load_block_pair(x_ptr, dy_ptr, row, stride_xm, stride_dym, cols, mask, EVEN_N)
        x = x_in.to(tl.float32)
        g = dy_in.to(tl.float32)
        if HAS_WEIGHT:
            g = g * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
        if PHASE != 2:
            tl.store(partial_row + part, tl.sum(x * x, axis=0))
            tl.store(partial_row + SPLIT_BLOCK + part, tl.sum(g * x, axis=0))
        if PHASE == 0:
            _wait_by_polling(arrived_ptr, row, n_split, _arrive_after_barrier(arrived_ptr, row))
            sum_xx = tl.sum(_load_partials_after_wait(partial_row, 0, n_split, SPLIT_BLOCK), axis=0)
            sum_gx = tl.sum(_load_partials_after_wait(partial_row, 1, n_split, SPLIT_BLOCK), axis=0)
            leave_row(arrived_ptr, row, part, n_split)
        elif PHASE == 2:  # the interpreter's second launch, after every program stored its partials
            sum_xx = tl.sum(load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
            sum_gx = tl.sum(load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK), axis=0)
        if PHASE != 1:
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
    if HAS_WEIGHT and PHASE != 1:
        store_tile(dw_ptr + group * n_cols + cols, dw, mask, EVEN_N, "")


STAGED = LazyKernel(Path(__file__).stem, "_rms_norm_bwd_staged_kernel")
# The rms norms' variants of the package's split_rows backward kernel, by the name their rows take.
VARIANT_KERNELS = {"split_rows_lagged": LAGGED, "split_rows_staged": STAGED}


def measure_case(
    op: Op, dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool
) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of ``op``'s long-row backwards at a ``rows`` x ``n`` input."""
    assert op.make_inputs is not None
    torch.manual_seed(0)
    values = tuple(op.make_inputs((rows, n), dtype, device))
    tensors_read = 3 if op.name == "add_rms_norm_backward" else 2  # grad, (grad_s), x
    nbytes = ((tensors_read + 1) * rows * n + n) * dtype.itemsize
    impls = [impl for impl in op.implementations if impl.name in IMPLEMENTATIONS]
    if op.name != "layer_norm_backward":
        impls += [split_rows_variant(op, name) for name in VARIANT_KERNELS]
    return check_and_time(op, impls, values, op.reduction_length(*values), nbytes, interpret, record_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = argument_parser(__doc__, DEFAULT_LENGTHS).parse_args(argv)
    ops = (kernelgate.rms_norm_backward, kernelgate.add_rms_norm_backward, kernelgate.layer_norm_backward)
    groups = [({"op": op.name}, functools.partial(measure_case, op)) for op in ops]
    return run_cases(args, Path(__file__).name, groups)


if __name__ == "__main__":
    sys.exit(main())
