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
result.

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
from collections.abc import Callable, Sequence
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
from kernelgate.ops.layer_norm.kernels import normalise_row
from kernelgate.ops.softmax.kernels import online_max_and_sum
from kernelgate.ops.split_rows import leave_row, load_row_partials, split_row_pair, wait_for_row
from kernelgate.ops.tiles import exp_below_max, load_tile, store_tile

DEFAULT_LENGTHS = (32768, 65536, 131072)
# The package module (kernelgate.rms_norm is the op object of the same name).
rms_norm_module = importlib.import_module("kernelgate.ops.rms_norm")
layer_norm_module = importlib.import_module("kernelgate.ops.layer_norm")


@triton.jit
def _softmax_fwd_split_looped_kernel(
    x_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, STREAM_N: tl.constexpr, LOG: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """Softmax (log_softmax with LOG) of rows split over ``n_split`` programs of a BLOCK_N-column segment each,
    streamed STREAM_N at a time: the segment's max and sum from a first read, the row's from every program's once
    they have all arrived (:mod:`kernelgate.ops.split_rows`), then the segment's result from a second read, back to
    front.

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
        total = tl.sum(s_parts * scale, axis=0)
        # A row of only -inf has total 0: softmax 0 * inf, log_softmax -inf - -inf - -inf, both NaN, as in torch.
        inverse = 1.0 / total
        log_total = tl.log(total)
        n_blocks = tl.cdiv(seg_len, STREAM_N)
        for i in range(0, n_blocks):
            cols = (n_blocks - 1 - i) * STREAM_N + tl.arange(0, STREAM_N)
            mask = cols < seg_len
            x = load_tile(x_seg + cols, mask, -float("inf"), EVEN_N, "evict_first").to(tl.float32)
            y = (x - m) - log_total if LOG else exp_below_max(x, m) * inverse
            store_tile(y_seg + cols, y.to(y_ptr.dtype.element_ty), mask, EVEN_N, "evict_first")


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
    pid = tl.program_id(0)
    row = pid // n_split
    part = pid % n_split
    start = part * BLOCK_N
    seg_len = tl.minimum(n_cols - start, BLOCK_N)
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


@triton.jit
def _layer_norm_fwd_split_looped_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, partial_ptr, arrived_ptr, stride_xm, stride_ym, n_cols, n_split, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr, STREAM_N: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """layer_norm of rows split over ``n_split`` programs of a BLOCK_N-column segment each, streamed STREAM_N at a
    time: the segment's mean and sum of squared deviations from a first read, the row's merged from every
    program's once they have all stored theirs (Chan's update, as the package's split kernel merges its blocks),
    then the segment's result from a second read, back to front (the package's ``normalise_row``).

    The segment's sums are of ``d = x - k_s``, ``k_s`` the mean of its first STREAM_N columns, kept per lane as the
    package's looped kernel keeps them (its docstring bounds their cancellation); its mean is stored as that of
    ``x - k``, ``k`` the row's first element, as the split kernel's blocks store theirs. x_ptr, y_ptr: (n_rows,
    n_cols); w_ptr, b_ptr: (n_cols,), read only if HAS_WEIGHT / HAS_BIAS. Grid: (n_rows * n_split,).
    partial_ptr: (n_rows, 2 * SPLIT_BLOCK) float32; arrived_ptr: (n_rows,) int32, zeros. EVEN_N: n_cols is a
    multiple of BLOCK_N (no masks; STREAM_N divides BLOCK_N)."""
    pid = tl.program_id(0)
    row = pid // n_split
    part = pid % n_split
    start = part * BLOCK_N
    seg_len = tl.minimum(n_cols - start, BLOCK_N)
    x_row = x_ptr + row * stride_xm
    x_seg = x_row + start
    k = tl.load(x_row).to(tl.float32)
    partial_row = partial_ptr + row * (2 * SPLIT_BLOCK)
    mean_part = tl.zeros([], tl.float32)
    m2_part = tl.zeros([], tl.float32)
    if PHASE != 2:
        lanes = tl.arange(0, STREAM_N)
        x = load_tile(x_seg + lanes, lanes < seg_len, 0.0, EVEN_N, "evict_last").to(tl.float32)
        k_s = tl.sum(x, axis=0) / tl.minimum(seg_len, STREAM_N)
        d = tl.where(lanes < seg_len, x - k_s, 0.0)
        sum_d = d
        sum_dd = d * d
        for first in range(STREAM_N, seg_len, STREAM_N):
            cols = first + lanes
            x = load_tile(x_seg + cols, cols < seg_len, 0.0, EVEN_N, "evict_last").to(tl.float32)
            d = x - k_s if EVEN_N else tl.where(cols < seg_len, x - k_s, 0.0)
            sum_d += d
            sum_dd += d * d
        total_d = tl.sum(sum_d, axis=0)
        centre = total_d / seg_len  # mean of the segment's x - k_s
        mean_part = (k_s - k) + centre
        m2_part = tl.maximum(tl.sum(sum_dd, axis=0) - total_d * centre, 0.0)
    means, m2s = split_row_pair(mean_part, m2_part, partial_row, arrived_ptr, row, part, n_split, PHASE, SPLIT_BLOCK)
    if PHASE != 1:
        parts = tl.arange(0, SPLIT_BLOCK)
        counts = tl.minimum(tl.maximum(n_cols - parts * BLOCK_N, 0), BLOCK_N).to(tl.float32)
        mean = tl.sum(counts * means, axis=0) / n_cols
        spread = means - mean
        var = (tl.sum(m2s, axis=0) + tl.sum(counts * spread * spread, axis=0)) / n_cols
        normalise_row(
            x_seg, w_ptr + start, b_ptr + start, y_ptr + row * stride_ym + start, seg_len, k, mean,
            tl.rsqrt(var + eps), HAS_WEIGHT, HAS_BIAS, STREAM_N, EVEN_N,
        )  # fmt: skip


# By the module's importable name (not "__main__" when it runs as a script): the compile workers import it by name.
SOFTMAX_SPLIT_LOOPED = LazyKernel(Path(__file__).stem, "_softmax_fwd_split_looped_kernel")
RMS_NORM_SPLIT_LOOPED = LazyKernel(Path(__file__).stem, "_rms_norm_fwd_split_looped_kernel")
LAYER_NORM_SPLIT_LOOPED = LazyKernel(Path(__file__).stem, "_layer_norm_fwd_split_looped_kernel")
OPS = ("softmax", "log_softmax", "rms_norm", "layer_norm")
EPS = 1e-6
# BLOCK_N: a program's segment; STREAM_N: the columns it reads at a time. Segments of 2048 columns are for the
# interpreter's small rows (a GPU times them too, as split_rows' smallest blocks).
CONFIGS = ConfigSpace(BLOCK_N=(2048, 8192, 16384, 32768), STREAM_N=(1024, 2048, 4096), num_warps=(4, 8, 16))


def _launch_softmax(x: torch.Tensor, dim: int, config: Config, log: bool) -> torch.Tensor:
    """softmax (log_softmax with ``log``) along ``dim`` (moved last, as the package's launchers do)."""
    last = dim in (-1, x.dim() - 1)
    moved = x if last else x.movedim(dim, -1)
    rows = as_rows(moved, "x")
    y = torch.empty(moved.shape, dtype=x.dtype, device=x.device)
    rowwise.launch_split_rows(
        SOFTMAX_SPLIT_LOOPED, rows, (rows.tensor, y), (rows.stride, rows.n_cols), (), 2, config=config,
        STREAM_N=config["STREAM_N"], LOG=log, EVEN_N=rows.n_cols % config["BLOCK_N"] == 0,
    )  # fmt: skip
    return y if last else y.movedim(-1, dim).contiguous()


def _launch_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = EPS, *, config: Config) -> torch.Tensor:
    """rms_norm over the last dimension, with the package's operands."""
    rows, w, y = rms_norm_module._forward_operands(x, weight)
    rowwise.launch_split_rows(
        RMS_NORM_SPLIT_LOOPED, rows, (rows.tensor, w, y), (rows.stride, rows.n_cols), (eps,), 1, config=config,
        HAS_WEIGHT=weight is not None, STREAM_N=config["STREAM_N"], EVEN_N=rows.n_cols % config["BLOCK_N"] == 0,
    )  # fmt: skip
    return y


def _launch_layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    config: Config,
) -> torch.Tensor:
    """layer_norm over the trailing ``normalized_shape``, with the package's operands."""
    rows, pointers, y = layer_norm_module._forward_operands(x, normalized_shape, weight, bias)
    rowwise.launch_split_rows(
        LAYER_NORM_SPLIT_LOOPED, rows, pointers, (rows.stride, rows.n_cols), (float(eps),), 2, config=config,
        HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, STREAM_N=config["STREAM_N"],
        EVEN_N=rows.n_cols % config["BLOCK_N"] == 0,
    )  # fmt: skip
    return y


def _launcher(op_name: str) -> Callable[..., torch.Tensor]:
    if op_name == "rms_norm":
        return _launch_rms_norm
    if op_name == "layer_norm":
        return _launch_layer_norm
    log = op_name == "log_softmax"

    def launch_softmax(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
        return _launch_softmax(x, dim, config, log)

    return launch_softmax


def _split_looped_variant(op_name: str) -> TritonImpl:
    """The variant as an implementation of ``op_name``: rows longer than a segment, at CONFIGS whose reads fit the
    segment with at least 4 elements a thread."""

    def supports(x: torch.Tensor, *args: Any) -> str | None:
        n = x.shape[-1]
        least = min(CONFIGS.params["BLOCK_N"])
        return None if n > least else f"rows of {n} fit one segment (at most {least})"

    def prune(config: Config, x: torch.Tensor, *args: Any) -> bool:
        per_thread = config["STREAM_N"] // (32 * config["num_warps"])
        return config["STREAM_N"] <= config["BLOCK_N"] < x.shape[-1] and per_thread >= 4

    split_rows = package_impl(getattr(kernelgate, op_name), "split_rows")
    kernel = {"rms_norm": RMS_NORM_SPLIT_LOOPED, "layer_norm": LAYER_NORM_SPLIT_LOOPED}.get(
        op_name, SOFTMAX_SPLIT_LOOPED
    )
    return dataclasses.replace(
        split_rows,
        name="split_looped",
        launcher=_launcher(op_name),
        kernels=(kernel,),
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
    return [package_impl(op, name) for name in names] + [_split_looped_variant(op_name)]


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
