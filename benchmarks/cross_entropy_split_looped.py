"""cross_entropy_with_grad with each row split over programs that stream a segment of it twice, against the package's
looped and split_rows implementations.

The package's looped kernel reads a long row twice, a program a row: between a row's two reads every program in
flight holds a whole row's worth of lines in L2 (bf16 4096x128256: 256 KB a row, several rows a multiprocessor),
more than L2 keeps, so the second read comes mostly from memory (at most 0.67 of copy). split_rows reads a row once,
each program holding a block of it in registers, but its programs hold little (8 to 32 KB) between waiting for the
row's partial sums, and at bf16 128K and 256K classes reach no more than looped. The variant here,
``split_looped``, splits a row over programs as split_rows does, each taking a segment of BLOCK_N columns: it
streams the segment for its partial sums (STREAM_N columns at a time, NUM_STAGES in flight), waits for the row's
other programs as split_rows does, then streams the segment again to write its gradient, back to front. Between a
segment's two reads only a segment a program is in flight (16 to 128 KB), which L2 can hold, and each wait is spread
over a segment's read rather than a block's.

For each dtype and shape (the bench's cross_entropy shapes, or ``--shapes``), the package's ``looped`` and
``split_rows`` and the variant run at every configuration that suits the input, compiled ahead in worker processes,
each checked against the reference (the package's tolerance) before it is timed (``do_bench``: L2 flushed, median).
Fractions are of a device-to-device copy measured in the same run, over ``2*M*V*e + 8*M`` bytes. With
``--interpret`` the kernels run on the CPU through Triton's interpreter and are only checked.

    python benchmarks/cross_entropy_split_looped.py --dtype bfloat16 --out results.json
    python benchmarks/cross_entropy_split_looped.py --interpret --shapes 5x2500 --out check.json
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from variant_timing import check_and_time, package_impl, run_cases, shapes_argument_parser  # beside this script

from kernelgate import rowwise
from kernelgate.config import Config, ConfigSpace
from kernelgate.launch import LazyKernel, as_rows
from kernelgate.op import TritonImpl
from kernelgate.ops.cross_entropy.kernels import (
    _dlogits_scales,
    _exponent_base,
    _row_target,
    _store_dlogits_looped,
    _store_row_loss,
    _streamed_sums,
    _target_logit,
    _target_weight,
)
from kernelgate.ops.split_rows import leave_row, load_row_partials, wait_for_row
from kernelgate.ops.tiles import LOG2E

# The package module (kernelgate.cross_entropy is the op object of the same name).
ce = importlib.import_module("kernelgate.ops.cross_entropy")

SHAPES = ((8192, 32000), (4096, 128256), (2048, 256000))


@triton.jit
def _fwd_grad_split_looped_kernel(
    x_ptr, target_ptr, weight_ptr, share_ptr, loss_ptr, target_weight_ptr, dx_ptr, partial_ptr, arrived_ptr,
    stride_xm, stride_tm, n_cols, n_split, ignore_index, label_smoothing, HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr, MEAN: tl.constexpr, WRITE_TARGET_WEIGHT: tl.constexpr, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, STREAM_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    EXP2: tl.constexpr,
):  # fmt: skip
    """The package's ``_cross_entropy_fwd_grad_split_kernel`` (arguments and grid as its) with a segment of BLOCK_N
    columns a program, streamed STREAM_N at a time, instead of a block held in registers: the segment's partial
    sums from a first read (:func:`_streamed_sums`, asking L2 to keep it), the row's from every program's once
    they have all arrived, then the segment's gradient from a second read (:func:`_store_dlogits_looped`)."""
    pid = tl.program_id(0)
    row = pid // n_split
    part = pid % n_split
    start = part * BLOCK_N
    seg_len = tl.minimum(n_cols - start, BLOCK_N)
    ignored, valid, t_safe = _row_target(target_ptr, row, stride_tm, n_cols, ignore_index)
    x_row = x_ptr + row * stride_xm
    x_t, pivot = _target_logit(x_row, t_safe, valid)
    partial_row = partial_ptr + row * (4 * SPLIT_BLOCK)
    if PHASE != 2:
        n_read = tl.where(valid | ignored, seg_len, 0)
        m_part, log_s_part, sum_w, sum_wx, _, _ = _streamed_sums(
            x_row + start, weight_ptr + start, n_read, seg_len, pivot, HAS_WEIGHT, HAS_SMOOTHING, "evict_last",
            STREAM_N, NUM_STAGES, EXP2,
        )  # fmt: skip
        # A segment of nothing but -inf (or not read) sums to 0; a NaN in it makes its sum NaN.
        tl.store(partial_row + part, m_part)
        tl.store(partial_row + SPLIT_BLOCK + part, tl.where(m_part == float("-inf"), 0.0, tl.exp(log_s_part)))
        tl.store(partial_row + 2 * SPLIT_BLOCK + part, tl.sum(sum_w, axis=0))
        tl.store(partial_row + 3 * SPLIT_BLOCK + part, tl.sum(sum_wx, axis=0))
    if PHASE == 0:
        wait_for_row(arrived_ptr, row, n_split)
    if PHASE != 1:
        m_parts = load_row_partials(partial_row, 0, n_split, float("-inf"), SPLIT_BLOCK)
        s_parts = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
        w_parts = load_row_partials(partial_row, 2, n_split, 0.0, SPLIT_BLOCK)
        wx_parts = load_row_partials(partial_row, 3, n_split, 0.0, SPLIT_BLOCK)
        if PHASE == 0:
            leave_row(arrived_ptr, row, part, n_split)
        m = tl.max(m_parts, axis=0)
        scale = tl.where(m_parts == float("-inf"), 0.0, tl.exp(m_parts - tl.where(m == float("-inf"), 0.0, m)))
        log_s = tl.log(tl.sum(s_parts * scale, axis=0))
        if part == 0:
            _store_row_loss(
                loss_ptr, target_weight_ptr, row, m, log_s, w_parts, wx_parts, x_t, pivot, weight_ptr, t_safe, valid,
                ignored, n_cols, label_smoothing, HAS_WEIGHT, HAS_SMOOTHING, WRITE_TARGET_WEIGHT,
            )  # fmt: skip
        w_t = _target_weight(weight_ptr, t_safe, valid, HAS_WEIGHT)
        total_w = tl.sum(w_parts, axis=0) if HAS_WEIGHT and HAS_SMOOTHING else n_cols + 0.0
        g = tl.where(valid, tl.load(share_ptr) if MEAN else 1.0, 0.0)
        a, b, c_w = _dlogits_scales(g, w_t, total_w, n_cols, label_smoothing, HAS_SMOOTHING)
        # The exp2 form's base and log2 total for the row's m and log(s): exp(x - m - log(s)) is
        # exp2(fma(x, log2(e), -b_m) - log2_s) with log2_s = log(s) * log2(e) + (m * log2(e) - b_m), the last term
        # exact by an fma.
        b_m = _exponent_base(m)
        residual = tl.where(tl.abs(m) < float("inf"), tl.fma(m, LOG2E, -b_m), 0.0)
        log2_s = log_s * LOG2E + residual
        _store_dlogits_looped(
            x_row + start, dx_ptr + row * n_cols + start, m, log_s, b_m, log2_s, weight_ptr + start, t_safe - start,
            a, b, c_w, valid | ignored, seg_len, HAS_WEIGHT, HAS_SMOOTHING, STREAM_N, NUM_STAGES, EXP2,
        )  # fmt: skip


# By the module's importable name (not "__main__" when it runs as a script): the compile workers import it by name.
SPLIT_LOOPED = LazyKernel(Path(__file__).stem, "_fwd_grad_split_looped_kernel")
# BLOCK_N: a program's segment; STREAM_N: the columns it reads at a time. Segments of 2048 columns are for the
# interpreter's small rows (a GPU times them too, as split_rows' smallest blocks).
CONFIGS = ConfigSpace(BLOCK_N=(2048, 16384, 32768, 65536), STREAM_N=(1024, 4096), num_warps=(4, 8), NUM_STAGES=(3,))


def _launch(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The variant's launcher: the package split_rows launcher's buffers and launch, with the kernel above."""
    rows = as_rows(logits, "logits")
    rowwise.split_rows_count(logits.device, rows.n_cols, config["BLOCK_N"])  # checked before anything allocates
    t, stride_t, w, loss, target_weight, share, dx = ce._with_grad_buffers(
        rows, logits, target, weight, ignore_index, reduction
    )
    mean = reduction == "mean"
    rowwise.launch_split_rows(
        SPLIT_LOOPED, rows, (rows.tensor, t, w, share, loss, target_weight, dx), (rows.stride, stride_t),
        (ignore_index, float(label_smoothing)), 4, config=config, HAS_WEIGHT=weight is not None,
        HAS_SMOOTHING=label_smoothing > 0, MEAN=mean, WRITE_TARGET_WEIGHT=mean, STREAM_N=config["STREAM_N"],
        NUM_STAGES=config["NUM_STAGES"], EXP2=ce._exp2_sums(),
    )  # fmt: skip
    return ce._reduce(loss, target_weight, logits, reduction), dx


def _split_looped_variant() -> TritonImpl:
    """The variant as an implementation of cross_entropy_with_grad: rows longer than a segment, at CONFIGS whose
    streamed block fits the segment."""

    def supports(logits: torch.Tensor, *args: Any) -> str | None:
        n = logits.shape[-1]
        least = min(CONFIGS.params["BLOCK_N"])
        return None if n > least else f"rows of {n} fit one segment (at most {least})"

    def prune(config: Config, logits: torch.Tensor, *args: Any) -> bool:
        return config["STREAM_N"] <= config["BLOCK_N"] < logits.shape[-1]

    split_rows = package_impl(ce.cross_entropy_with_grad, "split_rows")
    return dataclasses.replace(
        split_rows,
        name="split_looped",
        launcher=_launch,
        kernels=(ce.CROSS_ENTROPY_BWD_SCALE, SPLIT_LOOPED, ce.CROSS_ENTROPY_REDUCE),
        configs=CONFIGS,
        default_config={"BLOCK_N": 32768, "STREAM_N": 4096, "num_warps": 8, "NUM_STAGES": 3},
        supports=supports,
        prune=prune,
    )


def variants() -> list[TritonImpl]:
    """The package's looped and split_rows implementations of cross_entropy_with_grad, and the split_looped
    variant."""
    op = ce.cross_entropy_with_grad
    return [package_impl(op, "looped"), package_impl(op, "split_rows"), _split_looped_variant()]


def measure_case(dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of each variant at ``rows`` x ``n`` logits of the op's
    inputs."""
    op = ce.cross_entropy_with_grad
    values = op.make_inputs((rows, n), dtype, device)
    nbytes = 2 * rows * n * dtype.itemsize + 8 * rows
    return check_and_time(op, variants(), values, n, nbytes, interpret, record_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = shapes_argument_parser(__doc__, SHAPES).parse_args(argv)
    return run_cases(args, Path(__file__).name, [({}, measure_case)])


if __name__ == "__main__":
    sys.exit(main())
