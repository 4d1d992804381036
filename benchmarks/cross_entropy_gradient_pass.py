"""cross_entropy_with_grad's looped kernel with its gradient pass read as its statistics pass is, against the package's.

The looped forward with the gradient streams a row for its loss, maximum and log-sum, then reads it again to write
the gradient. The first pass reads whole blocks without a mask, NUM_STAGES blocks in flight, and sums
``exp2(fma(x, log2(e), -b))`` (the kernels' module docstring); the second masks every block, runs a plain loop and
takes ``exp((x - m) - log(s))``, then per element multiplies by ``g``, selects the target's column and selects NaN
for a bad row. The variant here, ``staged_gradient_pass``, gives the second pass what the first has: whole blocks
unmasked (a masked tail), NUM_STAGES blocks in flight, the softmax as ``exp2(fma(x, log2(e), -b) - log2(s))`` from
the first pass's base ``b`` and total ``s``, and ``g`` folded into three scalars a row (a bad row's NaN among them,
so no select per element). On an H100 at b7b5b64 the same change made float32's kernel 2 to 4 % faster
(``benchmarks/results/h100/ab-ln-shifted-sums-ce-grad-pass-b7b5b64``); bfloat16, which takes this kernel since
5d06b6e, was not measured with it.

For each dtype and shape (the bench's cross_entropy shapes, or ``--shapes``), both run at every configuration of
the package's looped implementation that suits the input, compiled ahead in worker processes, each checked against
the reference (the package's tolerance) before it is timed (``do_bench``: L2 flushed, median). Fractions are of a
device-to-device copy measured in the same run, over ``2*M*V*e + 8*M`` bytes. With ``--interpret`` the kernels run on
the CPU through Triton's interpreter and are only checked.

    python benchmarks/cross_entropy_gradient_pass.py --out results.json
    python benchmarks/cross_entropy_gradient_pass.py --interpret --shapes 5x2500 --out check.json
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
from variant_timing import check_and_time, package_impl, run_cases, shapes_argument_parser  # beside this script

from kernelgate.launch import LazyKernel, as_rows, launch
from kernelgate.op import TritonImpl
from kernelgate.ops.cross_entropy.kernels import (
    _log_sum_exp2,
    _row_target,
    _store_row_loss,
    _streamed_block,
    _target_logit,
)
from kernelgate.ops.tiles import LOG2E

# The package module (kernelgate.cross_entropy is the op object of the same name).
ce = importlib.import_module("kernelgate.ops.cross_entropy")

SHAPES = ((8192, 32000), (4096, 128256), (2048, 256000))


@triton.jit
def _sums_with_base(
    x_row, weight_ptr, n_read, n_cols, pivot, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, EXP2: tl.constexpr,
):  # fmt: skip
    """The package's ``_streamed_sums`` (the row kept in L2), returning also the sums' base ``b`` and the log2 of
    their total, from which the gradient pass forms the softmax with EXP2."""
    m = tl.full((), float("-inf"), tl.float32)
    b = tl.zeros((), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    sum_w = tl.zeros([BLOCK_N], tl.float32)
    sum_wx = tl.zeros([BLOCK_N], tl.float32)
    n_whole = n_read // BLOCK_N * BLOCK_N
    for start in tl.range(0, n_whole, BLOCK_N, num_stages=NUM_STAGES):
        m, b, s, sum_w, sum_wx = _streamed_block(
            m, b, s, sum_w, sum_wx, x_row, start + tl.arange(0, BLOCK_N), n_cols, pivot, weight_ptr, HAS_WEIGHT,
            HAS_SMOOTHING, "evict_last", False, EXP2,
        )  # fmt: skip
    if n_whole < n_read:
        m, b, s, sum_w, sum_wx = _streamed_block(
            m, b, s, sum_w, sum_wx, x_row, n_whole + tl.arange(0, BLOCK_N), n_cols, pivot, weight_ptr, HAS_WEIGHT,
            HAS_SMOOTHING, "evict_last", True, EXP2,
        )  # fmt: skip
    total = tl.sum(s, axis=0)
    log_s = _log_sum_exp2(m, b, s) if EXP2 else tl.log(total)
    return m, log_s, sum_w, sum_wx, b, tl.log2(total)


@triton.jit
def _gradient_scales(g, w_t, total_w, valid, ignored, n_cols, label_smoothing, HAS_SMOOTHING: tl.constexpr):
    """The row's gradient ``g * d loss / d x`` as ``p * a - [c == t] * b - w[c] * c_w``: the scalars ``(a, b, c_w)``,
    ``a`` NaN for a bad row so that its whole gradient is NaN without a select per element."""
    if HAS_SMOOTHING:
        on_target = g * ((1.0 - label_smoothing) * w_t)
        spread = g * (label_smoothing / n_cols)
        a = on_target + spread * total_w
        b = on_target
        c_w = spread
    else:
        a = g * w_t
        b = a
        c_w = 0.0
    return tl.where(valid | ignored, a, float("nan")), b, c_w


@triton.jit
def _gradient_block(
    x_row, dx_row, cols, n_cols, m, log_s, b_m, log2_s, weight_ptr, t_safe, a, b, c_w, HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr, MASKED: tl.constexpr, EXP2: tl.constexpr,
):  # fmt: skip
    """The gradient of the columns ``cols`` of a row; without MASKED every column is in the row."""
    mask = cols < n_cols
    if MASKED:
        x = tl.load(x_row + cols, mask=mask, other=float("-inf"), eviction_policy="evict_first")
    else:
        x = tl.load(x_row + cols, eviction_policy="evict_first")
    x = x.to(tl.float32)
    p = tl.exp2(tl.fma(x, LOG2E, -b_m) - log2_s) if EXP2 else tl.exp((x - m) - log_s)
    dx = p * a - tl.where(cols == t_safe, b, 0.0)
    if HAS_SMOOTHING:
        if HAS_WEIGHT:
            w = tl.load(weight_ptr + cols, mask=mask, other=0.0) if MASKED else tl.load(weight_ptr + cols)
            dx -= c_w * w.to(tl.float32)
        else:
            dx -= c_w
    if MASKED:
        tl.store(dx_row + cols, dx.to(dx_row.dtype.element_ty), mask=mask)
    else:
        tl.store(dx_row + cols, dx.to(dx_row.dtype.element_ty))


@triton.jit
def _fwd_grad_staged_kernel(
    x_ptr, target_ptr, weight_ptr, share_ptr, loss_ptr, target_weight_ptr, dx_ptr, stride_xm, stride_tm, n_cols,
    ignore_index, label_smoothing, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, MEAN: tl.constexpr,
    WRITE_TARGET_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, EXP2: tl.constexpr,
):  # fmt: skip
    """The package's ``_cross_entropy_fwd_grad_kernel`` with LOOPED, its gradient pass as the module docstring says;
    arguments and grid (n_rows,) as its."""
    row = tl.program_id(0)
    ignored, valid, t_safe = _row_target(target_ptr, row, stride_tm, n_cols, ignore_index)
    x_row = x_ptr + row * stride_xm
    x_t, pivot = _target_logit(x_row, t_safe, valid)
    n_read = tl.where(valid | ignored, n_cols, 0)
    m, log_s, sum_w, sum_wx, b_m, log2_s = _sums_with_base(
        x_row, weight_ptr, n_read, n_cols, pivot, HAS_WEIGHT, HAS_SMOOTHING, BLOCK_N, NUM_STAGES, EXP2
    )
    w_t, total_w = _store_row_loss(
        loss_ptr, target_weight_ptr, row, m, log_s, sum_w, sum_wx, x_t, pivot, weight_ptr, t_safe, valid, ignored,
        n_cols, label_smoothing, HAS_WEIGHT, HAS_SMOOTHING, WRITE_TARGET_WEIGHT,
    )  # fmt: skip
    g = tl.where(valid, tl.load(share_ptr) if MEAN else 1.0, 0.0)
    a, b, c_w = _gradient_scales(g, w_t, total_w, valid, ignored, n_cols, label_smoothing, HAS_SMOOTHING)
    dx_row = dx_ptr + row * n_cols
    n_whole = n_cols // BLOCK_N * BLOCK_N
    for start in tl.range(0, n_whole, BLOCK_N, num_stages=NUM_STAGES):
        _gradient_block(
            x_row, dx_row, start + tl.arange(0, BLOCK_N), n_cols, m, log_s, b_m, log2_s, weight_ptr, t_safe, a, b, c_w,
            HAS_WEIGHT, HAS_SMOOTHING, False, EXP2,
        )  # fmt: skip
    if n_whole < n_cols:
        _gradient_block(
            x_row, dx_row, n_whole + tl.arange(0, BLOCK_N), n_cols, m, log_s, b_m, log2_s, weight_ptr, t_safe, a, b,
            c_w, HAS_WEIGHT, HAS_SMOOTHING, True, EXP2,
        )  # fmt: skip


# By the module's importable name (not "__main__" when it runs as a script): the compile workers import it by name.
STAGED = LazyKernel(Path(__file__).stem, "_fwd_grad_staged_kernel")


def _staged_variant() -> TritonImpl:
    """The package's looped implementation with the staged gradient pass, at the same configurations."""
    looped = package_impl(ce.cross_entropy_with_grad, "looped")

    def run(
        logits: torch.Tensor,
        target: torch.Tensor,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        *,
        config: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = as_rows(logits, "logits")
        t, stride_t, w, loss, target_weight, share, dx = ce._with_grad_buffers(
            rows, logits, target, weight, ignore_index, reduction
        )
        mean = reduction == "mean"
        launch(
            STAGED, (rows.n_rows,), rows.tensor, t, w, share, loss, target_weight, dx, rows.stride, stride_t,
            rows.n_cols, ignore_index, float(label_smoothing),
            HAS_WEIGHT=weight is not None, HAS_SMOOTHING=label_smoothing > 0, MEAN=mean, WRITE_TARGET_WEIGHT=mean,
            BLOCK_N=config["BLOCK_N"], NUM_STAGES=config["NUM_STAGES"], EXP2=ce._exp2_sums(),
            num_warps=config["num_warps"],
        )  # fmt: skip
        return ce._reduce(loss, target_weight, logits, reduction), dx

    return dataclasses.replace(
        looped,
        name="staged_gradient_pass",
        launcher=run,
        kernels=(ce.CROSS_ENTROPY_BWD_SCALE, STAGED, ce.CROSS_ENTROPY_REDUCE),
    )


def variants() -> list[TritonImpl]:
    """The package's looped implementation of cross_entropy_with_grad and the staged variant."""
    return [package_impl(ce.cross_entropy_with_grad, "looped"), _staged_variant()]


def measure_case(
    smoothing: float, dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool
) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of each variant at ``rows`` x ``n`` logits of the op's
    inputs, with label smoothing ``smoothing``."""
    op = ce.cross_entropy_with_grad
    logits, target, weight, ignore_index, _, reduction = op.make_inputs((rows, n), dtype, device)
    values = (logits, target, weight, ignore_index, smoothing, reduction)
    nbytes = 2 * rows * n * dtype.itemsize + 8 * rows
    return check_and_time(op, variants(), values, n, nbytes, interpret, record_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = shapes_argument_parser(__doc__, SHAPES)
    parser.add_argument("--smoothing", type=float, default=0.0, help="label smoothing of the inputs (default 0)")
    args = parser.parse_args(argv)
    groups = [({}, functools.partial(measure_case, args.smoothing))]
    return run_cases(args, Path(__file__).name, groups, {"smoothing": args.smoothing})


if __name__ == "__main__":
    sys.exit(main())
