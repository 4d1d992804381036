"""softmax's forward with each row split over programs that stream a segment of it twice, against the package's
long-row forwards.

cross_entropy_with_grad's ``split_looped`` (a row split over programs that each stream a segment twice, waiting for
the row's sums between the reads) beat its looped and split_rows kernels by 10 and 17 % at bf16 rows of 128K and
256K classes on an H100 (``benchmarks/results/h100/ce-split-looped-cc1334d/``): only a segment a program is in
flight between its two reads, which L2 holds, and each wait is spread over a segment's read. softmax's long-row
forwards have the same two choices and misses at bf16 rows of 32768 to 131072 (0.78 to 0.88 of copy on an H100 at
3af2135). The variant here, ``split_looped``, is softmax's forward in that form: a program takes a segment of
BLOCK_N columns, takes its max and sum of ``exp(x - max)`` in one pass STREAM_N at a time (the package's
``online_max_and_sum``, which loads the segment with ``evict_last``), stores them as split_rows' programs do and
waits for the row's others, then reads the segment again, back to front, to write ``exp(x - m) / s``.

For each dtype and row length (rows chosen so that x is about 128 MiB), the package's ``looped``, ``split_rows``,
``single_block`` and ``persistent_looped`` and the variant run at every configuration that suits the row, compiled
ahead in worker processes; each is checked against the reference (the package's tolerance) before it is timed
(``do_bench``: L2 flushed, median). Results are fractions of a device-to-device copy measured in the same run
(bytes: x read, y written). With ``--interpret`` the kernels run on the CPU through Triton's interpreter and are
only checked.

    python benchmarks/softmax_split_looped.py --dtype bfloat16 --out results.json
    python benchmarks/softmax_split_looped.py --interpret --rows 3 --lengths 5000 --out check.json
"""

from __future__ import annotations

import dataclasses
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
from kernelgate.config import Config, ConfigSpace
from kernelgate.launch import LazyKernel, as_rows
from kernelgate.op import TritonImpl
from kernelgate.ops.softmax.kernels import online_max_and_sum
from kernelgate.ops.split_rows import leave_row, load_row_partials, wait_for_row
from kernelgate.ops.tiles import exp_below_max, load_tile, store_tile

DEFAULT_LENGTHS = (32768, 65536, 131072)


@triton.jit
def _softmax_fwd_split_looped_kernel(
    x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, STREAM_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """Softmax of rows split over ``n_split`` programs of a BLOCK_N-column segment each, streamed STREAM_N at a
    time: the segment's max and sum from a first read, the row's from every program's once they have all arrived
    (:mod:`kernelgate.ops.split_rows`), then the segment's result from a second read, back to front.

    x_ptr, y_ptr: (n_rows, n_cols). Grid: (n_rows * n_split,). partial_ptr: (n_rows, 2 * SPLIT_BLOCK) float32;
    arrived_ptr: (n_rows,) int32, zeros. EVEN_N: n_cols is a multiple of BLOCK_N (no masks; STREAM_N divides
    BLOCK_N)."""
    pid = tl.program_id(0)
    row = pid // n_split
    part = pid % n_split
    start = part * BLOCK_N
    seg_len = tl.minimum(n_cols - start, BLOCK_N)
    x_seg = x_ptr + row * stride_xm + start
    y_seg = y_ptr + row * stride_ym + start
    partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
    if PHASE != 2:
        m_part, s_part = online_max_and_sum(x_seg, seg_len, STREAM_N, EVEN_N)
        tl.store(partial_row + part, m_part)
        tl.store(partial_row + SPLIT_BLOCK + part, s_part)
    if PHASE == 0:
        wait_for_row(arrived_ptr, row, n_split)
    if PHASE != 1:
        m_parts = load_row_partials(partial_row, 0, n_split, -float("inf"), SPLIT_BLOCK)
        s_parts = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
        if PHASE == 0:
            leave_row(arrived_ptr, row, part, n_split)
        m = tl.max(m_parts, axis=0)
        # A segment of nothing but -inf has a sum of 0 (its rescale would be NaN); a NaN segment's stays NaN.
        scale = tl.where(m_parts == -float("inf"), 0.0, tl.exp(m_parts - tl.where(m == -float("inf"), 0.0, m)))
        inverse = 1.0 / tl.sum(s_parts * scale, axis=0)
        n_blocks = tl.cdiv(seg_len, STREAM_N)
        for i in range(0, n_blocks):
            cols = (n_blocks - 1 - i) * STREAM_N + tl.arange(0, STREAM_N)
            mask = cols < seg_len
            x = load_tile(x_seg + cols, mask, -float("inf"), EVEN_N, "evict_first").to(tl.float32)
            y = exp_below_max(x, m) * inverse
            store_tile(y_seg + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "evict_first")


# By the module's importable name (not "__main__" when it runs as a script): the compile workers import it by name.
SPLIT_LOOPED = LazyKernel(Path(__file__).stem, "_softmax_fwd_split_looped_kernel")
# BLOCK_N: a program's segment; STREAM_N: the columns it reads at a time. Segments of 2048 columns are for the
# interpreter's small rows (a GPU times them too, as split_rows' smallest blocks).
CONFIGS = ConfigSpace(BLOCK_N=(2048, 8192, 16384, 32768), STREAM_N=(1024, 2048, 4096), num_warps=(4, 8, 16))


def _launch(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
    """The variant's launcher: softmax along ``dim`` (moved last, as the package's launchers do)."""
    last = dim in (-1, x.dim() - 1)
    moved = x if last else x.movedim(dim, -1)
    rows = as_rows(moved, "x")
    y = torch.empty(moved.shape, dtype=x.dtype, device=x.device)
    rowwise.launch_split_rows(
        SPLIT_LOOPED, rows, (rows.tensor, y), (rows.stride, rows.n_cols), (), 2, config=config,
        STREAM_N=config["STREAM_N"], EVEN_N=rows.n_cols % config["BLOCK_N"] == 0,
    )  # fmt: skip
    return y if last else y.movedim(-1, dim).contiguous()


def _split_looped_variant() -> TritonImpl:
    """The variant as an implementation of softmax: rows longer than a segment, at CONFIGS whose reads fit the
    segment with at least 4 elements a thread."""

    def supports(x: torch.Tensor, *args: Any) -> str | None:
        n = x.shape[-1]
        least = min(CONFIGS.params["BLOCK_N"])
        return None if n > least else f"rows of {n} fit one segment (at most {least})"

    def prune(config: Config, x: torch.Tensor, *args: Any) -> bool:
        per_thread = config["STREAM_N"] // (32 * config["num_warps"])
        return config["STREAM_N"] <= config["BLOCK_N"] < x.shape[-1] and per_thread >= 4

    split_rows = package_impl(kernelgate.softmax, "split_rows")
    return dataclasses.replace(
        split_rows,
        name="split_looped",
        launcher=_launch,
        kernels=(SPLIT_LOOPED,),
        configs=CONFIGS,
        default_config={"BLOCK_N": 16384, "STREAM_N": 4096, "num_warps": 8},
        supports=supports,
        prune=prune,
    )


def variants() -> list[TritonImpl]:
    """The package's long-row softmax forwards, and the split_looped variant."""
    names = ("looped", "split_rows", "single_block", "persistent_looped")
    return [package_impl(kernelgate.softmax, name) for name in names] + [_split_looped_variant()]


def measure_case(dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of each variant at a ``rows`` x ``n`` input."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(rows, n, generator=gen) * 3).to(device=device, dtype=dtype)
    nbytes = 2 * rows * n * x.element_size()
    return check_and_time(kernelgate.softmax, variants(), (x, -1), n, nbytes, interpret, record_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = argument_parser(__doc__, DEFAULT_LENGTHS).parse_args(argv)
    return run_cases(args, Path(__file__).name, [({}, measure_case)])


if __name__ == "__main__":
    sys.exit(main())
