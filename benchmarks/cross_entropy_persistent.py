"""cross_entropy_with_grad's looped kernel with a persistent grid, against the package's implementations.

The looped forward with the gradient reads a row longer than one block twice: a pass for its statistics (asking L2
to keep the row), a pass writing the gradient. With a program a row, more rows can be in flight than L2 holds (bf16
8192x32000 at 4 warps: up to 16 programs a multiprocessor by their threads, 64 KB a row), so the second read may
come from memory: three passes over the row's bytes where the minimum is two. The variant here,
``persistent_looped``, tests that: it launches PER_SM programs a multiprocessor, each taking rows ``pid, pid +
programs, ...`` in turn with the package kernel's row body, so that only ``programs`` rows are in flight (with
PER_SM 1 or 2 and rows of 64 KB, 8 to 17 MB, which L2 holds between the two passes).

For each dtype and shape (the bench's cross_entropy shapes, or ``--shapes``), the package's ``looped`` and
``split_rows`` and the variant run at every configuration that suits the input, compiled ahead in worker
processes, each checked against the reference (the package's tolerance) before it is timed (``do_bench``: L2
flushed, median). Fractions are of a device-to-device copy measured in the same run, over ``2*M*V*e + 8*M`` bytes
(the logits read once, their gradient written once, the targets read). With ``--interpret`` the kernels run on the
CPU through Triton's interpreter and are only checked.

    python benchmarks/cross_entropy_persistent.py --out results.json
    python benchmarks/cross_entropy_persistent.py --interpret --shapes 5x3000 --out check.json
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
from kernelgate.config import ConfigSpace
from kernelgate.launch import LazyKernel, as_rows, launch
from kernelgate.op import TritonImpl
from kernelgate.ops.cross_entropy.kernels import (
    _dlogits_scales,
    _row_target,
    _store_dlogits_looped,
    _store_row_loss,
    _streamed_sums,
    _target_logit,
)

# The package module (kernelgate.cross_entropy is the op object of the same name).
ce = importlib.import_module("kernelgate.ops.cross_entropy")

SHAPES = ((8192, 32000), (4096, 128256), (2048, 256000))


@triton.jit
def _fwd_grad_persistent_kernel(
    x_ptr, target_ptr, weight_ptr, share_ptr, loss_ptr, target_weight_ptr, dx_ptr, stride_xm, stride_tm, n_rows,
    n_cols, ignore_index, label_smoothing, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, MEAN: tl.constexpr,
    WRITE_TARGET_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, EXP2: tl.constexpr,
):  # fmt: skip
    """The package's ``_cross_entropy_fwd_grad_kernel`` with LOOPED, its row body run for rows ``pid, pid +
    programs, ...``: arguments as its, with ``n_rows``; grid (programs,)."""
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        ignored, valid, t_safe = _row_target(target_ptr, row, stride_tm, n_cols, ignore_index)
        x_row = x_ptr + row * stride_xm
        x_t, pivot = _target_logit(x_row, t_safe, valid)
        n_read = tl.where(valid | ignored, n_cols, 0)
        m, log_s, sum_w, sum_wx, b_m, log2_s = _streamed_sums(
            x_row, weight_ptr, n_read, n_cols, pivot, HAS_WEIGHT, HAS_SMOOTHING, "evict_last", BLOCK_N, NUM_STAGES, EXP2
        )
        w_t, total_w = _store_row_loss(
            loss_ptr, target_weight_ptr, row, m, log_s, sum_w, sum_wx, x_t, pivot, weight_ptr, t_safe, valid, ignored,
            n_cols, label_smoothing, HAS_WEIGHT, HAS_SMOOTHING, WRITE_TARGET_WEIGHT,
        )  # fmt: skip
        g = tl.where(valid, tl.load(share_ptr) if MEAN else 1.0, 0.0)
        a, b, c_w = _dlogits_scales(g, w_t, total_w, n_cols, label_smoothing, HAS_SMOOTHING)
        _store_dlogits_looped(
            x_row, dx_ptr + row * n_cols, m, log_s, b_m, log2_s, weight_ptr, t_safe, a, b, c_w, valid | ignored, n_cols,
            HAS_WEIGHT, HAS_SMOOTHING, BLOCK_N, NUM_STAGES, EXP2,
        )  # fmt: skip


# By the module's importable name (not "__main__" when it runs as a script): the compile workers import it by name.
PERSISTENT = LazyKernel(Path(__file__).stem, "_fwd_grad_persistent_kernel")
CONFIGS = ConfigSpace(BLOCK_N=(2048, 4096, 8192), num_warps=(4, 8, 16), NUM_STAGES=(1, 3), PER_SM=(1, 2, 4))


def _persistent_variant() -> TritonImpl:
    """The package's looped implementation with the persistent kernel, at CONFIGS (the looped ones with PER_SM),
    pruned as the looped ones are."""
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
        programs = rowwise.persistent_programs(logits.device, rows.n_rows, config)
        launch(
            PERSISTENT, (programs,), rows.tensor, t, w, share, loss, target_weight, dx, rows.stride, stride_t,
            rows.n_rows, rows.n_cols, ignore_index, float(label_smoothing),
            HAS_WEIGHT=weight is not None, HAS_SMOOTHING=label_smoothing > 0, MEAN=mean, WRITE_TARGET_WEIGHT=mean,
            BLOCK_N=config["BLOCK_N"], NUM_STAGES=config["NUM_STAGES"], EXP2=ce._exp2_sums(),
            num_warps=config["num_warps"],
        )  # fmt: skip
        return ce._reduce(loss, target_weight, logits, reduction), dx

    return dataclasses.replace(
        looped,
        name="persistent_looped",
        launcher=run,
        kernels=(ce.CROSS_ENTROPY_BWD_SCALE, PERSISTENT, ce.CROSS_ENTROPY_REDUCE),
        configs=CONFIGS,
        default_config={**ce.LOOPED_FORWARD_DEFAULT, "PER_SM": 2},
    )


def variants() -> list[TritonImpl]:
    """The package's looped and split_rows implementations of cross_entropy_with_grad, and the persistent variant."""
    op = ce.cross_entropy_with_grad
    return [package_impl(op, "looped"), package_impl(op, "split_rows"), _persistent_variant()]


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
