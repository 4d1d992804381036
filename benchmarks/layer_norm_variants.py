"""layer_norm's looped forward against two variants of its statistics pass, on a GPU (or interpreted on the CPU).

The looped forward is layer_norm's weakest kernel in the default suite (bfloat16 2048x32768 at 0.69 of copy at
07749bf, where rms_norm's looped kernel reaches 0.91). Compiled for sm_90, it keeps a running mean and sum of
squared deviations for each lane: 64 registers a thread at bfloat16, BLOCK_N 4096 and 8 warps, so four programs
a multiprocessor and one block of each in flight. The variants keep two numbers a row instead:

- ``looped``: kernelgate's kernel (``_layer_norm_fwd_looped_kernel``), Welford's update a lane.
- ``block_stats``: each block's mean and sum of squared deviations from it (two reductions over the block),
  merged into the row's running pair (Chan's update); 40 registers there.
- ``block_stats_prefetch``: the same, with the next block's load issued before a block's reductions.

All three end with the package's second pass (``normalise_row``). For each dtype and row length (rows chosen so
that x is about 128 MiB), each variant runs at every configuration of the looped implementation's space that
suits the row, compiled ahead in worker processes; each is checked against the reference (the package's
tolerance) before it is timed (``do_bench``: L2 flushed, median). Results are fractions of a device-to-device
copy measured in the same run (bytes: x read, y written, weight and bias read once). With ``--interpret`` the
kernels run on the CPU through Triton's interpreter and are only checked.

    python benchmarks/layer_norm_variants.py --out results.json
    python benchmarks/layer_norm_variants.py --interpret --rows 3 --lengths 1500 --out check.json
"""

from __future__ import annotations

import argparse
import contextlib
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
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate
from kernelgate.compile_ahead import compile_ahead, default_workers
from kernelgate.launch import LazyKernel
from kernelgate.op import TritonImpl
from kernelgate.ops.layer_norm.kernels import normalise_row
from kernelgate.ops.tiles import load_tile
from kernelgate.selection import compare, float64_truth, run_candidate

# The package module (kernelgate.layer_norm is the op object of the same name).
layer_norm_module = importlib.import_module("kernelgate.ops.layer_norm")

TARGET_BYTES = 128 * 2**20
DEFAULT_LENGTHS = (8192, 16384, 32768, 65536, 131072)
EPS = 1e-5


@triton.jit
def _block_stats(x, mask, k, n_block):
    """The mean of ``d = x - k`` over a block's ``n_block`` valid lanes, and the sum of its squared deviations."""
    d = tl.where(mask, x - k, 0.0)
    mean = tl.sum(d, axis=0) / n_block
    return mean, tl.sum(tl.where(mask, (d - mean) * (d - mean), 0.0), axis=0)


@triton.jit
def _block_stats_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, stride_xm, stride_ym, n_cols, eps, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr = False, PREFETCH: tl.constexpr = False,
):  # fmt: skip
    """layer_norm of a row longer than one block, two numbers a row in the statistics pass; the arguments and grid
    of ``_layer_norm_fwd_looped_kernel``.

    The statistics are of ``d = x - k``, ``k`` the mean of the first block: each block's mean and squared
    deviations, merged into the row's running pair by Chan's update. PREFETCH: each block's load is issued
    before the previous block's reductions (the last block's "next" load is clamped to the row's last block).
    """
    row = tl.program_id(0)
    x_row, y_row = x_ptr + row * stride_xm, y_ptr + row * stride_ym
    lanes = tl.arange(0, BLOCK_N)
    mask = lanes < n_cols
    x = load_tile(x_row + lanes, mask, 0.0, EVEN_N, "evict_last").to(tl.float32)
    count = tl.minimum(n_cols, BLOCK_N).to(tl.float32)
    k = tl.sum(x, axis=0) / count
    mean, m2 = _block_stats(x, mask, k, count)
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
        block_mean, block_m2 = _block_stats(x, mask, k, n_block)
        total = count + n_block
        delta = block_mean - mean
        mean += delta * (n_block / total)
        m2 += block_m2 + delta * delta * (count * n_block / total)
        count = total
    rstd = tl.rsqrt(m2 / n_cols + eps)
    normalise_row(x_row, w_ptr, b_ptr, y_row, n_cols, k, mean, rstd, HAS_WEIGHT, HAS_BIAS, BLOCK_N, EVEN_N)


# By the module's importable name (not "__main__" when it runs as a script): the compile workers import it by name.
BLOCK_STATS = LazyKernel(Path(__file__).stem, "_block_stats_kernel")


def _variant(name: str, prefetch: bool) -> TritonImpl:
    """The looped implementation with ``_block_stats_kernel`` in place of the package's kernel."""
    looped = next(i for i in kernelgate.layer_norm.implementations if i.name == "looped")

    def launch(
        x: torch.Tensor, shape: Sequence[int], weight: Any = None, bias: Any = None, eps: float = EPS, *, config: Any
    ) -> torch.Tensor:
        run = layer_norm_module._run_forward
        return run(x, shape, weight, bias, eps, BLOCK_STATS, config["BLOCK_N"], config, PREFETCH=prefetch)

    return dataclasses.replace(looped, name=name, launcher=launch, kernels=(BLOCK_STATS,))


def variants() -> list[TritonImpl]:
    """The package's looped implementation, then the two variants."""
    looped = next(i for i in kernelgate.layer_norm.implementations if i.name == "looped")
    return [
        looped,
        _variant("block_stats", prefetch=False),
        _variant("block_stats_prefetch", prefetch=True),
    ]


def _copy_gbps(device: torch.device) -> float:
    from triton.testing import do_bench

    src = torch.empty(TARGET_BYTES // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    return 2 * TARGET_BYTES / (ms * 1e-3) / 1e9


def measure_case(
    impls: Sequence[TritonImpl], dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool
) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of each of ``impls`` at a ``rows`` x ``n`` input."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(rows, n, generator=gen) * 2 + 0.5).to(device=device, dtype=dtype)
    w = (torch.rand(n, generator=gen) + 0.5).to(device=device, dtype=dtype)
    b = torch.randn(n, generator=gen).to(device=device, dtype=dtype)
    values = (x, (n,), w, b, EPS)
    op = kernelgate.layer_norm
    expected = op.reference(*values)
    truth = float64_truth(op, values)
    jobs = [(impl, config) for impl in impls for config in impl.candidate_configs(values)]
    if not interpret:
        launches = [functools.partial(run_candidate, impl, config, values, False, False) for impl, config in jobs]
        compile_ahead(launches, default_workers())
    nbytes = (2 * rows * n + 2 * n) * x.element_size()
    results = []
    for impl, config in jobs:
        result: dict[str, Any] = {"variant": impl.name, "config": dict(config or {})}
        mismatch = compare(run_candidate(impl, config, values, interpret, True), expected, n, truth=truth)
        result["matches_reference"] = mismatch is None
        if mismatch is not None:
            result["mismatch"] = str(mismatch)
        elif not interpret:
            from triton.testing import do_bench

            run: Callable[[], object] = functools.partial(run_candidate, impl, config, values, False, False)
            us = do_bench(run, warmup=10, rep=50, return_mode="median") * 1e3
            result.update(time_us=round(us, 2), gbps=round(nbytes / (us * 1e-6) / 1e9, 1))
        results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", action="append", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS))
    parser.add_argument("--rows", type=int, help="rows of each input (default: about 128 MiB of x)")
    parser.add_argument("--interpret", action="store_true", help="run the kernels on the CPU and only check them")
    args = parser.parse_args(argv)
    if not args.interpret and not torch.cuda.is_available():
        print("benchmarks/layer_norm_variants.py times kernels on a GPU; none is visible (--interpret checks them).")
        return 2
    device = torch.device("cpu" if args.interpret else "cuda")
    copy = None if args.interpret else _copy_gbps(device)
    impls = variants()
    cases = []
    with kernelgate.use_interpreter() if args.interpret else contextlib.nullcontext():
        for dtype_name in args.dtype or ["float32", "bfloat16"]:
            dtype = getattr(torch, dtype_name)
            for n in args.lengths:
                rows = args.rows or max(1, TARGET_BYTES // (n * dtype.itemsize))
                results = measure_case(impls, dtype, rows, n, device, args.interpret)
                for r in results:
                    if copy is not None and "gbps" in r:
                        r["frac_of_copy"] = round(r["gbps"] / copy, 4)
                cases.append({"dtype": dtype_name, "shape": [rows, n], "results": results})
                print(_summary_line(dtype_name, rows, n, results))
    write_json(args.out, {**provenance(device), "copy_gbps": copy, "eps": EPS, "cases": cases})
    failed = [
        (c["dtype"], c["shape"], r["variant"], r["config"]) for c in cases for r in c["results"] if "mismatch" in r
    ]
    for failure in failed:
        print("mismatch:", *failure, file=sys.stderr)
    return 1 if failed else 0


def _summary_line(dtype: str, rows: int, n: int, results: Sequence[dict[str, Any]]) -> str:
    """Per variant: its fastest configuration (or how many configurations passed the check, interpreted)."""
    parts = []
    for name in dict.fromkeys(r["variant"] for r in results):
        mine = [r for r in results if r["variant"] == name and "mismatch" not in r]
        timed = sorted((r for r in mine if "time_us" in r), key=lambda r: r["time_us"])
        if timed:
            best = timed[0]
            parts.append(f"{name} {best['time_us']:.1f} us {best.get('frac_of_copy', '')} {best['config']}")
        else:
            total = sum(r["variant"] == name for r in results)
            parts.append(f"{name}: {len(mine)} of {total} configs match the reference")
    return f"{dtype} {rows}x{n}: " + "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
