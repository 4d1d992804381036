"""layer_norm's looped forward against the kernels it replaced, on a GPU (or interpreted on the CPU).

Up to 80b1374 the looped forward kept a running mean and sum of squared deviations for each lane (Welford's
update): compiled for sm_90, 64 registers a thread at bfloat16, BLOCK_N 4096 and 8 warps, so four programs a
multiprocessor and one block of each in flight; bfloat16 2048x32768 ran at 0.69 of copy at 07749bf. From 80b1374
to b7b5b64 it kept two numbers a row (each block's mean and squared deviations, merged by Chan's update; 40
registers), with a PREFETCH switch in its configurations (``benchmarks/results/h200/layer-norm-variants-80b1374``):
0.74 of copy there, where rms_norm's looped kernel, which reduces nothing inside its loop, reached 0.91. Since then
it takes its first pass as rms_norm's: sums of ``x - k`` and of its square kept per lane (``k`` the first block's
mean, which bounds their difference's cancellation). The script keeps:

- ``looped``: kernelgate's looped implementation, every configuration (PREFETCH included).
- ``welford``: the kernel up to 80b1374 (``_welford_kernel``), at the same configurations without PREFETCH.
- ``chan``: the kernel from 80b1374 to b7b5b64 (``_chan_kernel``), at every configuration of ``looped``.
- ``shifted_sums_per_block``: the package's sums reduced a block at a time into one pair a row
  (``_shifted_sums_per_block_kernel``), at every configuration of ``looped``.

Both end with the package's second pass (``normalise_row``). For each dtype and row length (rows chosen so
that x is about 128 MiB), each runs at every configuration that suits the row, compiled ahead in worker
processes; each is checked against the reference (the package's tolerance) before it is timed (``do_bench``:
L2 flushed, median). Results are fractions of a device-to-device copy measured in the same run (bytes: x read,
y written, weight and bias read once). With ``--interpret`` the kernels run on the CPU through Triton's
interpreter and are only checked.

    python benchmarks/layer_norm_variants.py --out results.json
    python benchmarks/layer_norm_variants.py --interpret --rows 3 --lengths 1500 --out check.json
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
from kernelgate.launch import LazyKernel
from kernelgate.op import TritonImpl
from kernelgate.ops.layer_norm.kernels import _add_pair, _block_stats, normalise_row
from kernelgate.ops.tiles import load_tile

# The package module (kernelgate.layer_norm is the op object of the same name).
layer_norm_module = importlib.import_module("kernelgate.ops.layer_norm")

DEFAULT_LENGTHS = (8192, 16384, 32768, 65536, 131072)
EPS = 1e-5


@triton.jit
def _welford_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    stride_xm,
    stride_ym,
    n_cols,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr = False,
):
    """kernelgate's looped forward up to 80b1374; the arguments and grid of ``_layer_norm_fwd_looped_kernel``.

    The first pass streams the row once, keeping per lane a running mean and sum of squared deviations of
    ``x - k`` (Welford's update, no reduction inside the loop), combined across lanes at the end; the second is
    the package's ``normalise_row``.
    """
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    lanes = tl.arange(0, BLOCK_N)
    # The lanes hold statistics of x - k, k the mean of the first block: values near zero, whose
    # means keep their low bits (those of x itself would round to the units of x's offset).
    mask = lanes < n_cols
    x = load_tile(x_row + lanes, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
    k = tl.sum(x, axis=0) / tl.minimum(n_cols, BLOCK_N)
    mean = tl.where(mask, x - k, 0.0)
    m2 = tl.zeros([BLOCK_N], tl.float32)
    for start in range(BLOCK_N, n_cols, BLOCK_N):
        cols = start + lanes
        mask = cols < n_cols
        x = load_tile(x_row + cols, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
        # Every lane in range has now seen start // BLOCK_N + 1 elements; lanes out of range keep theirs.
        delta = tl.where(mask, (x - k) - mean, 0.0)
        mean += delta * (1.0 / (start // BLOCK_N + 1))
        m2 += delta * ((x - k) - mean)
    # How many elements of the row each lane saw.
    count = tl.where(lanes < n_cols, (n_cols - lanes + BLOCK_N - 1) // BLOCK_N, 0).to(tl.float32)
    m0 = tl.sum(count * mean, axis=0) / n_cols
    dev = tl.where(count > 0, mean - m0, 0.0)
    shift = tl.sum(count * dev, axis=0) / n_cols
    var = (tl.sum(m2, axis=0) + tl.sum(count * dev * dev, axis=0)) / n_cols - shift * shift
    rstd = tl.rsqrt(tl.maximum(var, 0.0) + eps)
    centre = m0 + shift  # mean(x) - k
    y_row = y_ptr + row * stride_ym
    normalise_row(x_row, w_ptr, b_ptr, y_row, n_cols, k, centre, rstd, HAS_WEIGHT, HAS_BIAS, BLOCK_N, EVEN_N)


@triton.jit
def _chan_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, stride_xm, stride_ym, n_cols, eps, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False, PREFETCH: tl.constexpr = False,
):  # fmt: skip
    """kernelgate's looped forward from 80b1374 to b7b5b64; the arguments and grid of ``_layer_norm_fwd_looped_kernel``.

    The first pass keeps two numbers a row: each block's mean and sum of squared deviations of ``d = x - k`` (``k``
    the first block's mean), merged into the row's running pair (Chan's update), two reductions in turn a block.
    PREFETCH: each block's load issued before the previous block's arithmetic, as the package kernel's.
    """
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    lanes = tl.arange(0, BLOCK_N)
    mask = lanes < n_cols
    x = load_tile(x_row + lanes, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
    count = tl.minimum(n_cols, BLOCK_N).to(tl.float32)
    k = tl.sum(x, axis=0) / count
    mean, m2 = _block_stats(x, mask, k, count, False)
    if PREFETCH:
        last_start = (n_cols - 1) // BLOCK_N * BLOCK_N
        ahead = tl.minimum(BLOCK_N, last_start) + lanes
        x_ahead = load_tile(x_row + ahead, ahead < n_cols, 0.0, EVEN_N, "evict_last")
    for start in range(BLOCK_N, n_cols, BLOCK_N):
        cols = start + lanes
        mask = cols < n_cols
        if PREFETCH:
            x = x_ahead.to(tl.float32)
            ahead = tl.minimum(start + BLOCK_N, last_start) + lanes
            x_ahead = load_tile(x_row + ahead, ahead < n_cols, 0.0, EVEN_N, "evict_last")
        else:
            x = load_tile(x_row + cols, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
        n_block = tl.minimum(n_cols - start, BLOCK_N).to(tl.float32)
        block_mean, block_m2 = _block_stats(x, mask, k, n_block, False)
        total = count + n_block
        delta = block_mean - mean
        mean += delta * (n_block / total)
        m2 += block_m2 + delta * delta * (count * n_block / total)
        count = total
    rstd = tl.rsqrt(m2 / n_cols + eps)
    y_row = y_ptr + row * stride_ym
    normalise_row(x_row, w_ptr, b_ptr, y_row, n_cols, k, mean, rstd, HAS_WEIGHT, HAS_BIAS, BLOCK_N, EVEN_N)


@triton.jit
def _shifted_sums_per_block_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, stride_xm, stride_ym, n_cols, eps, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False, PREFETCH: tl.constexpr = False,
):  # fmt: skip
    """The package's looped forward with its sums of ``d = x - k`` and of ``d * d`` reduced a block at a time into two
    numbers a row (one reduction of the pair a block) instead of kept per lane; the arguments and grid of
    ``_layer_norm_fwd_looped_kernel``, PREFETCH as its.
    """
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    lanes = tl.arange(0, BLOCK_N)
    mask = lanes < n_cols
    x = load_tile(x_row + lanes, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
    k = tl.sum(x, axis=0) / tl.minimum(n_cols, BLOCK_N)
    d = tl.where(mask, x - k, 0.0)
    sum1, sum2 = tl.reduce((d, d * d), 0, _add_pair)
    if PREFETCH:
        last_start = (n_cols - 1) // BLOCK_N * BLOCK_N
        ahead = tl.minimum(BLOCK_N, last_start) + lanes
        x_ahead = load_tile(x_row + ahead, ahead < n_cols, 0.0, EVEN_N, "evict_last")
    for start in range(BLOCK_N, n_cols, BLOCK_N):
        cols = start + lanes
        mask = cols < n_cols
        if PREFETCH:
            x = x_ahead.to(tl.float32)
            ahead = tl.minimum(start + BLOCK_N, last_start) + lanes
            x_ahead = load_tile(x_row + ahead, ahead < n_cols, 0.0, EVEN_N, "evict_last")
        else:
            x = load_tile(x_row + cols, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
        d = x - k if EVEN_N else tl.where(mask, x - k, 0.0)
        b1, b2 = tl.reduce((d, d * d), 0, _add_pair)
        sum1 += b1
        sum2 += b2
    centre = sum1 / n_cols  # mean(x) - k
    rstd = tl.rsqrt(tl.maximum(sum2 / n_cols - centre * centre, 0.0) + eps)
    y_row = y_ptr + row * stride_ym
    normalise_row(x_row, w_ptr, b_ptr, y_row, n_cols, k, centre, rstd, HAS_WEIGHT, HAS_BIAS, BLOCK_N, EVEN_N)


# By the module's importable name (not "__main__" when it runs as a script): the compile workers import it by name.
WELFORD = LazyKernel(Path(__file__).stem, "_welford_kernel")
CHAN = LazyKernel(Path(__file__).stem, "_chan_kernel")
SHIFTED_SUMS_PER_BLOCK = LazyKernel(Path(__file__).stem, "_shifted_sums_per_block_kernel")


def _welford_variant() -> TritonImpl:
    """The looped implementation with ``_welford_kernel`` in place of the package's kernel, at the same
    configurations less PREFETCH (which that kernel lacks)."""
    looped = package_impl(kernelgate.layer_norm, "looped")

    def launch(
        x: torch.Tensor, shape: Sequence[int], weight: Any = None, bias: Any = None, eps: float = EPS, *, config: Any
    ) -> torch.Tensor:
        return layer_norm_module._run_forward(x, shape, weight, bias, eps, WELFORD, config["BLOCK_N"], config)

    def prune(config: Any, *args: Any) -> bool:
        return not config["PREFETCH"] and looped.prune(config, *args)

    return dataclasses.replace(looped, name="welford", launcher=launch, kernels=(WELFORD,), prune=prune)


def _prefetching_variant(name: str, kernel: LazyKernel) -> TritonImpl:
    """The looped implementation with ``kernel`` in place of the package's kernel, at the same configurations
    (PREFETCH included)."""
    looped = package_impl(kernelgate.layer_norm, "looped")

    def launch(
        x: torch.Tensor, shape: Sequence[int], weight: Any = None, bias: Any = None, eps: float = EPS, *, config: Any
    ) -> torch.Tensor:
        prefetch = bool(config.get("PREFETCH", 0))
        return layer_norm_module._run_forward(
            x, shape, weight, bias, eps, kernel, config["BLOCK_N"], config, PREFETCH=prefetch
        )

    return dataclasses.replace(looped, name=name, launcher=launch, kernels=(kernel,))


def variants() -> list[TritonImpl]:
    """The package's looped implementation, the two kernels it replaced, and its sums reduced a block at a time."""
    return [
        package_impl(kernelgate.layer_norm, "looped"),
        _welford_variant(),
        _prefetching_variant("chan", CHAN),
        _prefetching_variant("shifted_sums_per_block", SHIFTED_SUMS_PER_BLOCK),
    ]


def measure_case(
    impls: Sequence[TritonImpl], dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool
) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of each of ``impls`` at a ``rows`` x ``n`` input."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(rows, n, generator=gen) * 2 + 0.5).to(device=device, dtype=dtype)
    w = (torch.rand(n, generator=gen) + 0.5).to(device=device, dtype=dtype)
    b = torch.randn(n, generator=gen).to(device=device, dtype=dtype)
    nbytes = (2 * rows * n + 2 * n) * x.element_size()
    return check_and_time(kernelgate.layer_norm, impls, (x, (n,), w, b, EPS), n, nbytes, interpret)


def main(argv: Sequence[str] | None = None) -> int:
    args = argument_parser(__doc__, DEFAULT_LENGTHS).parse_args(argv)
    groups = [({}, functools.partial(measure_case, variants()))]
    return run_cases(args, Path(__file__).name, groups, {"eps": EPS})


if __name__ == "__main__":
    sys.exit(main())
