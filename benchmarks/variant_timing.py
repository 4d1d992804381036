"""Kernel variants checked, then timed, for the variant scripts beside this file (imported as a sibling module).

A script names its variants (``TritonImpl``: the package's and its own) and builds each input; this module runs
each variant at every configuration that suits the input, compiled ahead in worker processes, checks it against
the op's reference (the package's tolerance) and times it (``do_bench``: L2 flushed, median) only where it
matched. Results are fractions of a device-to-device copy measured in the same run. With ``--interpret`` the
kernels run on the CPU through Triton's interpreter and are only checked. Each result is a dict: ``variant``,
``config``, then ``matches_reference`` (with ``mismatch`` where it is false, ``time_us``, ``gbps`` and
``frac_of_copy`` where timed) or ``error``.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this module

import kernelgate
from kernelgate.compile_ahead import compile_ahead, default_workers
from kernelgate.op import Op, TritonImpl
from kernelgate.selection import compare, float64_truth, run_candidate

# The size of x when --rows is not given, and of the copy that the results are fractions of.
TARGET_BYTES = 128 * 2**20

# A script's measurement of one input: (dtype, rows, n, device, interpret) -> its results.
Measure = Callable[[torch.dtype, int, int, torch.device, bool], list[dict[str, Any]]]
# How long one configuration's check and timing may take on a GPU before the run is taken to hang (its kernels are
# compiled ahead; a check and a timing take seconds).
HANG_SECONDS = 120.0
# The exit status of a run stopped that way.
HUNG = 3


@contextlib.contextmanager
def hang_watchdog(what: str, seconds: float = HANG_SECONDS) -> Iterator[None]:
    """Within the block, a run that has not left it after ``seconds`` is taken to hang (a kernel whose programs wait
    for each other for ever, as a split_rows backward variant did on an H100 at 1d9eadd): ``what`` and every
    thread's stack go to stderr and the process exits with status HUNG, so that a device call's output says which
    configuration hung instead of ending empty at its time limit."""

    def stop() -> None:
        print(f"hung: {what} did not finish in {seconds:g} s", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr)
        os._exit(HUNG)

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def package_impl(op: Op, name: str) -> TritonImpl:
    """The implementation of ``op`` named ``name``, as the package declares it."""
    return next(impl for impl in op.implementations if impl.name == name)


def copy_gbps(device: torch.device) -> float:
    """A device-to-device copy of ``TARGET_BYTES`` (read and written), in GB/s (``do_bench``: median)."""
    from triton.testing import do_bench

    src = torch.empty(TARGET_BYTES // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    return float(2 * TARGET_BYTES / (ms * 1e-3) / 1e9)


def check_and_time(
    op: Op,
    impls: Sequence[TritonImpl],
    values: Sequence[Any],
    n_cols: int,
    nbytes: int,
    interpret: bool,
    *,
    record_errors: bool = False,
) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of each of ``impls`` that supports ``values``.

    ``n_cols`` is the reduction length the tolerance scales with, ``nbytes`` the bytes a call moves (for
    ``gbps``). The op's ``normwise_outputs`` (a backward's parameter gradients) are compared by the norm of their
    error. With ``record_errors`` a configuration that raises (resources, shape) is recorded as ``error`` and the
    rest still run; without it the exception propagates.
    """
    expected = op.reference(*values)
    truth = float64_truth(op, values)
    jobs = [
        (impl, config)
        for impl in impls
        if impl.supports is None or impl.supports(*values) is None
        for config in impl.candidate_configs(values)
    ]
    if not interpret:
        launches = [functools.partial(run_candidate, impl, config, values, False, False) for impl, config in jobs]
        compile_ahead(launches, default_workers())
    results = []
    for impl, config in jobs:
        result: dict[str, Any] = {"variant": impl.name, "config": dict(config or {})}
        results.append(result)
        with contextlib.nullcontext() if interpret else hang_watchdog(f"{impl.name} {result['config']}"):
            try:
                got = run_candidate(impl, config, values, interpret, True)
            except Exception as err:
                if not record_errors:
                    raise
                result["error"] = f"{type(err).__name__}: {err}"[:300]
                continue
            mismatch = compare(got, expected, n_cols, normwise=op.normwise_outputs, truth=truth)
            result["matches_reference"] = mismatch is None
            if mismatch is not None:
                result["mismatch"] = str(mismatch)
            elif not interpret:
                from triton.testing import do_bench

                run: Callable[[], object] = functools.partial(run_candidate, impl, config, values, False, False)
                us = do_bench(run, warmup=10, rep=50, return_mode="median") * 1e3
                result.update(time_us=round(us, 2), gbps=round(nbytes / (us * 1e-6) / 1e9, 1))
    return results


def argument_parser(description: str, default_lengths: Sequence[int]) -> argparse.ArgumentParser:
    """The arguments every variant script takes: ``--out``, ``--dtype``, ``--lengths``, ``--rows``, ``--interpret``.

    ``description`` is the script's docstring, shown as written; a script adds its own arguments after these.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", action="append", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(default_lengths))
    parser.add_argument("--rows", type=int, help="rows of each input (default: about 128 MiB of x)")
    parser.add_argument("--interpret", action="store_true", help="run the kernels on the CPU and only check them")
    return parser


def parse_shape(text: str) -> tuple[int, int]:
    """``"8192x32000"`` as ``(8192, 32000)``: rows by row length."""
    rows, _, n = text.partition("x")
    try:
        return int(rows), int(n)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is ROWSxLENGTH, such as 8192x32000; got {text!r}") from None


def shapes_argument_parser(description: str, default_shapes: Sequence[tuple[int, int]]) -> argparse.ArgumentParser:
    """The arguments of a variant script measured at whole shapes (cross_entropy's vocabularies): ``--out``,
    ``--dtype``, ``--shapes`` (``ROWSxLENGTH`` each), ``--interpret``; :func:`run_cases` takes them as it takes
    :func:`argument_parser`'s."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", action="append", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--shapes", type=parse_shape, nargs="+", default=list(default_shapes), metavar="ROWSxLENGTH")
    parser.add_argument("--interpret", action="store_true", help="run the kernels on the CPU and only check them")
    return parser


def _case_shapes(args: argparse.Namespace, dtype: torch.dtype) -> list[tuple[int, int]]:
    """The ``(rows, length)`` of each case: ``--shapes``, or each of ``--lengths`` with ``--rows`` or rows making
    about TARGET_BYTES of ``dtype``."""
    if getattr(args, "shapes", None):
        return list(args.shapes)
    return [(args.rows or max(1, TARGET_BYTES // (n * dtype.itemsize)), n) for n in args.lengths]


def run_cases(
    args: argparse.Namespace,
    script: str,
    groups: Sequence[tuple[dict[str, str], Measure]],
    extra: dict[str, Any] | None = None,
) -> int:
    """Measure each group at each of ``args``' dtypes and shapes (or lengths), print a line a case and write
    ``args.out``.

    A group is its labels (``{"op": "softmax"}``, or none), which head each of its cases, and its measurement. The
    JSON holds the provenance, ``copy_gbps`` (``None`` interpreted), ``extra`` and ``cases``: the labels,
    ``dtype``, ``shape`` and ``results``. Returns 0, 1 when a result mismatched (each listed on stderr), or 2
    without ``--interpret`` where no GPU is visible (``script`` names the script in that message).
    """
    if not args.interpret and not torch.cuda.is_available():
        print(f"benchmarks/{script} times kernels on a GPU; none is visible (--interpret checks them).")
        return 2
    device = torch.device("cpu" if args.interpret else "cuda")
    copy = None if args.interpret else copy_gbps(device)
    cases = []
    with kernelgate.use_interpreter() if args.interpret else contextlib.nullcontext():
        for labels, measure in groups:
            for dtype_name in args.dtype or ["float32", "bfloat16"]:
                dtype = getattr(torch, dtype_name)
                for rows, n in _case_shapes(args, dtype):
                    results = measure(dtype, rows, n, device, args.interpret)
                    for r in results:
                        if copy is not None and "gbps" in r:
                            r["frac_of_copy"] = round(r["gbps"] / copy, 4)
                    cases.append({**labels, "dtype": dtype_name, "shape": [rows, n], "results": results})
                    print(summary_line(" ".join((*labels.values(), dtype_name, f"{rows}x{n}")), results), flush=True)
    write_json(args.out, {**provenance(device), "copy_gbps": copy, **(extra or {}), "cases": cases})
    failed = [
        (*(v for k, v in c.items() if k != "results"), r["variant"], r["config"])
        for c in cases
        for r in c["results"]
        if "mismatch" in r
    ]
    for failure in failed:
        print("mismatch:", *failure, file=sys.stderr)
    return 1 if failed else 0


def summary_line(case: str, results: Sequence[dict[str, Any]]) -> str:
    """``case``, then per variant its fastest configuration (or how many configurations passed the check,
    interpreted)."""
    parts = []
    for name in dict.fromkeys(r["variant"] for r in results):
        mine = [r for r in results if r["variant"] == name and "mismatch" not in r and "error" not in r]
        timed = sorted((r for r in mine if "time_us" in r), key=lambda r: r["time_us"])
        if timed:
            best = timed[0]
            parts.append(f"{name} {best['time_us']:.1f} us {best.get('frac_of_copy', '')} {best['config']}")
        else:
            total = sum(r["variant"] == name for r in results)
            parts.append(f"{name}: {len(mine)} of {total} configs match the reference")
    return f"{case}: " + "; ".join(parts)
