"""The norms' backward implementations for long rows, side by side, at every configuration tuning would try.

The ``split`` backwards of rms_norm, add_rms_norm and layer_norm read x and dy twice (a kernel for each row's
statistics, then one over column blocks of row groups), which bounds the forward+backward at 0.71 of copy;
``split_rows`` reads them once (a row's programs exchange its statistics, in groups that loop over rows). For each
case this checks each configuration of each implementation against the op's reference (the package's tolerance,
the parameter gradients by the norm of their error) and times the ones that match (``do_bench``: L2 flushed,
median, compiled ahead in worker processes). Bytes a call: x and dy read, dx written (add_rms_norm: grad_s read
too), the weight read once (layer_norm's bias not counted); fractions are of a device-to-device copy measured in
the same run. Writes JSON with provenance.

    python benchmarks/norm_backward_split_rows.py --out split-rows.json
    python benchmarks/norm_backward_split_rows.py --interpret --rows 5 --lengths 9000 --out check.json
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from variant_timing import argument_parser, run_cases  # beside this script

import kernelgate
from kernelgate.compile_ahead import compile_ahead, default_workers
from kernelgate.op import Op
from kernelgate.selection import compare, run_candidate

DEFAULT_LENGTHS = (16384, 32768, 65536, 131072)
IMPLEMENTATIONS = ("split", "split_rows")


def measure_case(
    op: Op, dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool
) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of ``op``'s long-row backwards at a ``rows`` x ``n`` input."""
    assert op.make_inputs is not None
    torch.manual_seed(0)
    values = tuple(op.make_inputs((rows, n), dtype, device))
    tensors_read = 3 if op.name == "add_rms_norm_backward" else 2  # grad, (grad_s), x
    nbytes = ((tensors_read + 1) * rows * n + n) * dtype.itemsize
    expected = op.reference(*values)
    jobs = [
        (impl, config)
        for impl in op.implementations
        if impl.name in IMPLEMENTATIONS and (impl.supports is None or impl.supports(*values) is None)
        for config in impl.candidate_configs(values)
    ]
    if not interpret:
        compile_ahead(
            [functools.partial(run_candidate, i, c, values, False, False) for i, c in jobs], default_workers()
        )
    results = []
    for impl, config in jobs:
        result: dict[str, Any] = {"variant": impl.name, "config": dict(config or {})}
        got = run_candidate(impl, config, values, interpret, True)
        mismatch = compare(got, expected, op.reduction_length(*values), normwise=op.normwise_outputs)
        result["matches_reference"] = mismatch is None
        if mismatch is not None:
            result["mismatch"] = str(mismatch)
        elif not interpret:
            from triton.testing import do_bench

            us = do_bench(functools.partial(run_candidate, impl, config, values, False, False), warmup=10, rep=50,
                          return_mode="median") * 1e3  # fmt: skip
            result.update(time_us=round(us, 2), gbps=round(nbytes / (us * 1e-6) / 1e9, 1))
        results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = argument_parser(__doc__, DEFAULT_LENGTHS).parse_args(argv)
    ops = (kernelgate.rms_norm_backward, kernelgate.add_rms_norm_backward, kernelgate.layer_norm_backward)
    groups = [({"op": op.name}, functools.partial(measure_case, op)) for op in ops]
    return run_cases(args, Path(__file__).name, groups)


if __name__ == "__main__":
    sys.exit(main())
