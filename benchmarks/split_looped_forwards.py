"""softmax's, log_softmax's, rms_norm's and layer_norm's forwards with each row split over programs that stream a
segment of it twice, against the package's long-row forwards.

cross_entropy_with_grad's ``split_looped`` (a row split over programs that each stream a segment twice, waiting for
the row's sums between the reads) beat its looped and split_rows kernels by 10 and 17 % at bf16 rows of 128K and
256K classes on an H100 (``benchmarks/results/h100/ce-split-looped-cc1334d/``): only a segment a program is in
flight between its two reads, which L2 holds, and each wait is spread over a segment's read. These forwards have
the same two choices, and misses at bf16 rows of 32768 to 131072 (softmax 0.78 to 0.88 of copy, log_softmax 0.77
and 0.87, rms_norm 0.84 and 0.89, layer_norm 0.67 to 0.87 on an H100 at 3af2135). The variant here,
``split_looped``, is each forward in that form: a program takes a segment of BLOCK_N columns and streams it
STREAM_N at a time for its partial sums (softmax's: the package's ``online_max_and_sum``; rms_norm's: the sum of
squares; layer_norm's: shifted sums, as its looped kernel's), loaded with ``evict_last``; stores them as
split_rows' programs do and waits for the row's others; then reads the segment again, back to front, to write its
result. Since the run at f2df623 (``benchmarks/results/h100/split-looped-forwards-f2df623/``) softmax's,
log_softmax's and layer_norm's are the package's ``split_looped`` implementations, timed here over a wider space
(CONFIGS) and in either dtype; rms_norm's, slower than its split_rows there, is this script's kernel.

For each op, dtype and row length (rows chosen so that x is about 128 MiB), the package's ``looped``,
``split_rows``, ``single_block`` and ``persistent_looped`` and the variant run at every configuration that suits
the row, compiled ahead in worker processes; each is checked against the reference (the package's tolerance)
before it is timed (``do_bench``: L2 flushed, median). Results are fractions of a device-to-device copy measured in
the same run (bytes: x read, y written). With ``--interpret`` the kernels run on the CPU through Triton's
interpreter and are only checked.

    python benchmarks/split_looped_forwards.py --dtype bfloat16 --out results.json
    python benchmarks/split_looped_forwards.py --op rms_norm --interpret --rows 3 --lengths 5000 --out check.json
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
from kernelgate.config import Config, ConfigSpace
from kernelgate.launch import LazyKernel
from kernelgate.op import TritonImpl
from kernelgate.ops.split_rows import leave_row, load_row_partials, split_row_segment, wait_for_row
from kernelgate.ops.tiles import load_tile, store_tile

DEFAULT_LENGTHS = (32768, 65536, 131072)
# The package module (kernelgate.rms_norm is the op object of the same name).
rms_norm_module = importlib.import_module("kernelgate.ops.rms_norm")


@triton.jit
def _rms_norm_fwd_split_looped_kernel(
    x_ptr, w_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, eps,
    HAS_WEIGHT: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
    STREAM_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """rms_norm of rows split over ``n_split`` programs of a BLOCK_N-column segment each, streamed STREAM_N at a
    time: the segment's sum of squares from a first read, the row's once its programs have all stored theirs, then
    the segment's result from a second read, back to front.

    x_ptr, y_ptr: (n_rows, n_cols); w_ptr: (n_cols,), unused unless HAS_WEIGHT. Grid: (n_rows * n_split,).
    partial_ptr: (n_rows, SPLIT_BLOCK) float32; arrived_ptr: (n_rows,) int32, zeros. EVEN_N: n_cols is a multiple
    of BLOCK_N (no masks; STREAM_N divides BLOCK_N)."""
    row, part, start, seg_len = split_row_segment(n_split, n_cols, BLOCK_N)
    x_seg = x_ptr + row * stride_xm + start
    y_seg = y_ptr + row * stride_ym + start
    partial_row = partial_ptr + row * SPLIT_BLOCK
    if PHASE != 2:
        acc = tl.zeros([STREAM_N], tl.float32)
        for first in range(0, seg_len, STREAM_N):
            cols = first + tl.arange(0, STREAM_N)
            x = load_tile(x_seg + cols, cols < seg_len, 0.0, EVEN_N, "evict_last").to(tl.float32)
            acc += x * x
        tl.store(partial_row + part, tl.sum(acc, axis=0))
    if PHASE == 0:
        wait_for_row(arrived_ptr, row, n_split)
    if PHASE != 1:
        total = tl.sum(load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
        if PHASE == 0:
            leave_row(arrived_ptr, row, part, n_split)
        rstd = tl.rsqrt(total / n_cols + eps)
        n_blocks = tl.cdiv(seg_len, STREAM_N)
        for i in range(0, n_blocks):
            cols = (n_blocks - 1 - i) * STREAM_N + tl.arange(0, STREAM_N)
            mask = cols < seg_len
            y = load_tile(x_seg + cols, mask, 0.0, EVEN_N, "evict_first").to(tl.float32) * rstd
            if HAS_WEIGHT:
                y = y * load_tile(w_ptr + start + cols, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
            store_tile(y_seg + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "evict_first")


# By the module's importable name (not "__main__" when it runs as a script): the compile workers import it by name.
RMS_NORM_SPLIT_LOOPED = LazyKernel(Path(__file__).stem, "_rms_norm_fwd_split_looped_kernel")
OPS = ("softmax", "log_softmax", "rms_norm", "layer_norm")
EPS = 1e-6
# BLOCK_N: a program's segment; STREAM_N: the columns it reads at a time. Segments of 2048 columns are for the
# interpreter's small rows (a GPU times them too, as split_rows' smallest blocks).
CONFIGS = ConfigSpace(BLOCK_N=(2048, 8192, 16384, 32768), STREAM_N=(1024, 2048, 4096), num_warps=(4, 8, 16))


def _launch_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = EPS, *, config: Config) -> torch.Tensor:
    """rms_norm over the last dimension, with the package's operands."""
    rows, w, y = rms_norm_module._forward_operands(x, weight)
    rowwise.launch_split_rows(
        RMS_NORM_SPLIT_LOOPED, rows, (rows.tensor, w, y), (rows.stride, rows.n_cols), (eps,), 1, config=config,
        HAS_WEIGHT=weight is not None, STREAM_N=config["STREAM_N"], EVEN_N=rows.n_cols % config["BLOCK_N"] == 0,
    )  # fmt: skip
    return y


def _split_looped_variant(op_name: str) -> TritonImpl:
    """The variant as an implementation of ``op_name``: the package's ``split_looped`` (softmax, log_softmax,
    layer_norm) or this script's rms_norm kernel, for rows longer than a segment in either dtype, at CONFIGS whose
    reads fit the segment with at least 4 elements a thread."""

    def supports(x: torch.Tensor, *args: Any) -> str | None:
        n = x.shape[-1]
        least = min(CONFIGS.params["BLOCK_N"])
        return None if n > least else f"rows of {n} fit one segment (at most {least})"

    def prune(config: Config, x: torch.Tensor, *args: Any) -> bool:
        per_thread = config["STREAM_N"] // (32 * config["num_warps"])
        return config["STREAM_N"] <= config["BLOCK_N"] < x.shape[-1] and per_thread >= 4

    op = getattr(kernelgate, op_name)
    if op_name == "rms_norm":
        base = dataclasses.replace(
            package_impl(op, "split_rows"), name="split_looped", launcher=_launch_rms_norm,
            kernels=(RMS_NORM_SPLIT_LOOPED,),
        )  # fmt: skip
    else:
        base = package_impl(op, "split_looped")
    return dataclasses.replace(
        base,
        configs=CONFIGS,
        default_config={"BLOCK_N": 16384, "STREAM_N": 4096, "num_warps": 8},
        supports=supports,
        prune=prune,
    )


def variants(op_name: str) -> list[TritonImpl]:
    """The package's long-row forwards of ``op_name``, and the split_looped variant."""
    op = getattr(kernelgate, op_name)
    names = [impl.name for impl in op.implementations if impl.name in ("looped", "split_rows", "single_block",
                                                                        "persistent_looped")]  # fmt: skip
    return [package_impl(op, name) for name in names] + [_split_looped_variant(op_name)]  # split_looped's last


def measure_case(
    op_name: str, dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool
) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of each variant of ``op_name`` at a ``rows`` x ``n``
    input."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(rows, n, generator=gen) * 3).to(device=device, dtype=dtype)
    if op_name == "rms_norm":
        w = (torch.rand(n, generator=gen) + 0.5).to(device=device, dtype=dtype)
        values: tuple[Any, ...] = (x, w, EPS)
    elif op_name == "layer_norm":
        w = (torch.rand(n, generator=gen) + 0.5).to(device=device, dtype=dtype)
        b = torch.randn(n, generator=gen).to(device=device, dtype=dtype)
        values = (x + 2.0, (n,), w, b, EPS)
    else:
        values = (x, -1)
    nbytes = 2 * rows * n * x.element_size()
    op = getattr(kernelgate, op_name)
    return check_and_time(op, variants(op_name), values, n, nbytes, interpret, record_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(__doc__, DEFAULT_LENGTHS)
    parser.add_argument("--op", action="append", choices=OPS, help="the ops to measure (default: all)")
    args = parser.parse_args(argv)
    groups = [({"op": name}, functools.partial(measure_case, name)) for name in args.op or OPS]
    return run_cases(args, Path(__file__).name, groups)


if __name__ == "__main__":
    sys.exit(main())
