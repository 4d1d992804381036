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

The package's ``split_rows_pipelined`` runs beside them, its split_rows backward with the row loop pipelined by
Triton (2-byte rows, NVIDIA GPUs): it began here as the rms norms' variant ``split_rows_staged``, which was wrong
and could hang as first written and, fixed, was faster than split_rows at most bfloat16 shapes on an H100
(``results/h100/norm-backward-split-rows-staged-1d9eadd``); layer_norm's began here as ``layer_norm_pipelined``.

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
from kernelgate.ops.rms_norm.kernels import rms_norm_store_partials, rms_norm_write_dx
from kernelgate.ops.split_rows import (
    arrive_at_row,
    leave_row,
    load_block_pair,
    load_row_partials,
    row_group_block,
    wait_until_arrived,
)
from kernelgate.ops.tiles import store_tile

rms_norm_module = importlib.import_module("kernelgate.ops.rms_norm")
layer_norm_module = importlib.import_module("kernelgate.ops.layer_norm")

DEFAULT_LENGTHS = (16384, 32768, 65536, 131072)
IMPLEMENTATIONS = ("split", "split_rows", "split_rows_pipelined")


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
            partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
            rms_norm_store_partials(
                x_in, dy_in, w_ptr, partial_row, part, cols, mask, SPLIT_BLOCK, HAS_WEIGHT, PHASE, EVEN_N
            )
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
                dw = rms_norm_write_dx(
                    x_prev, dy_prev, sum_xx, sum_gx, w_ptr, ds_ptr, dx_ptr, dw, previous, stride_dsm, stride_dxm,
                    cols, mask, n_cols, eps, HAS_DS, HAS_WEIGHT, EVEN_N,
                )  # fmt: skip
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


# The rms norms' variants of the package's split_rows backward kernel, by the name their rows take.
VARIANT_KERNELS = {"split_rows_lagged": LAGGED}


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
