"""softmax's and rms_norm's long-row forwards against variants of their kernels, on a GPU (or interpreted on the CPU).

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

The results at 3296d94 (``benchmarks/results/h200/split-rows-variants-3296d94/``) made the package's split_rows
kernels wait as ``split_one_exp_last`` does, and its softmax forward take one exponential an element: from then
on ``split_rows`` here is that kernel, and ``split_one_exp`` and ``split_last`` measure the waits it replaced
only in name (they keep the old poll: ``WAIT_PACKAGE`` below is the wait of 3296d94).

Two more variants, timed at 0e3534d (``benchmarks/results/h200/split-rows-exp2-0e3534d/``), took each element's
``exp(x - m)`` as ``exp2((x - m) * log2(e))`` with m read as 0 where it is -inf: in the split kernel's blocks
(``split_exp2``) and in both passes of the looped one (``looped_exp2``). The package's kernels took them from then
on (``kernelgate.ops.tiles.exp_below_max``: the looped forwards in every dtype, the split forwards' blocks in 16-bit
ones), and the copies left this script.

For each dtype and row length (rows chosen so that x is about 128 MiB), each runs at every configuration that
suits the row, compiled ahead in worker processes; each is checked against the reference (the package's
tolerance) before it is timed (``do_bench``: L2 flushed, median). Results are fractions of a device-to-device copy
measured in the same run (bytes: x read, y written). With ``--interpret`` the kernels run on the CPU through
Triton's interpreter and are only checked.

    python benchmarks/split_rows_variants.py --out results.json
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
from variant_timing import argument_parser, check_and_time, run_cases  # benchmarks/variant_timing.py, beside it

import kernelgate
from kernelgate import rowwise
from kernelgate.launch import LazyKernel
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.split_rows import load_row_partials, split_row_block
from kernelgate.ops.tiles import load_tile, store_tile

rms_norm_module = importlib.import_module("kernelgate.ops.rms_norm")

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


_STEM = Path(__file__).stem
SOFTMAX_ONE_EXP = LazyKernel(_STEM, "_softmax_one_exp_kernel")
SOFTMAX_RECIPROCAL = LazyKernel(_STEM, "_softmax_reciprocal_kernel")
SOFTMAX_PERSISTENT_RECIPROCAL = LazyKernel(_STEM, "_softmax_persistent_reciprocal_kernel")
RMS_NORM_WAIT = LazyKernel(_STEM, "_rms_norm_wait_kernel")


def _package(op: Op, name: str) -> TritonImpl:
    return next(i for i in op.implementations if i.name == name)


def _softmax_split_variant(name: str, wait: int) -> TritonImpl:
    package = _package(kernelgate.softmax, "split_rows")

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
    package = _package(kernelgate.rms_norm, "split_rows")

    def launch(x: torch.Tensor, weight: torch.Tensor | None, eps: float = EPS, *, config: Any) -> torch.Tensor:
        rows, w, y = rms_norm_module._forward_operands(x, weight)
        rowwise.launch_split_rows(
            RMS_NORM_WAIT, rows, (rows.tensor, w, y), (rows.stride, rows.n_cols), (eps,), 1, config=config,
            fresh_counts=True, HAS_WEIGHT=weight is not None, EVEN_N=rows.n_cols % config["BLOCK_N"] == 0, WAIT=wait,
        )  # fmt: skip
        return y

    return dataclasses.replace(package, name=name, launcher=launch, kernels=(RMS_NORM_WAIT,))


def variants(op_name: str) -> list[TritonImpl]:
    if op_name == "softmax":
        return [
            _package(kernelgate.softmax, "split_rows"),
            _softmax_split_variant("split_one_exp", WAIT_PACKAGE),
            _softmax_split_variant("split_one_exp_last", WAIT_LAST),
            _softmax_split_variant("split_one_exp_volatile", WAIT_VOLATILE),
            _package(kernelgate.softmax, "looped"),
            _package(kernelgate.softmax, "single_block"),
            _package(kernelgate.softmax, "persistent"),
            *_softmax_reciprocal_variants(),
        ]
    return [
        _package(kernelgate.rms_norm, "split_rows"),
        _rms_norm_split_variant("split_last", WAIT_LAST),
        _rms_norm_split_variant("split_volatile", WAIT_VOLATILE),
    ]


def measure_case(
    op_name: str, dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool
) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of each variant of ``op_name`` at a ``rows`` x ``n`` input."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(rows, n, generator=gen) * 3).to(device=device, dtype=dtype)
    if op_name == "softmax":
        op, values = kernelgate.softmax, (x, -1)
    else:
        w = (torch.rand(n, generator=gen) + 0.5).to(device=device, dtype=dtype)
        op, values = kernelgate.rms_norm, (x, w, EPS)
    nbytes = 2 * rows * n * x.element_size()
    # A configuration that cannot run here (resources, shape) is reported, not fatal.
    return check_and_time(op, variants(op_name), values, n, nbytes, interpret, record_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(__doc__, DEFAULT_LENGTHS)
    parser.add_argument("--op", action="append", choices=["softmax", "rms_norm"])
    args = parser.parse_args(argv)
    groups = [({"op": name}, functools.partial(measure_case, name)) for name in args.op or ["softmax", "rms_norm"]]
    return run_cases(args, Path(__file__).name, groups)


if __name__ == "__main__":
    sys.exit(main())
