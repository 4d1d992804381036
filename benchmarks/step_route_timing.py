"""The step route's own timing of an op's forward+backward step, repeated: eager autograd against kernelgate's Function.

In mode ``auto``, the first steps of a signature tune its kernels; the next one times the step both ways, steps
back to back (``Op._eager_step_is_faster``), and runs eager autograd unless the Function is faster by the step
margin. This runs those first steps, then that same timing ``--repeats`` times over, and reports each repeat's
best step through eager autograd and through the Function (microseconds), so that a change to the Function's
host time can be compared between two trees in alternating processes. Writes JSON with provenance.

    python benchmarks/step_route_timing.py --op layer_norm --shape 8192x4096 --dtype bfloat16 --out t.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate


def _inputs(op: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    """The op's arguments at ``rows x cols``: inputs and parameters that require grad, as in training."""

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype).requires_grad_()

    if op == "layer_norm":
        return leaf(rows, cols), (cols,), leaf(cols), leaf(cols), 1e-5
    if op == "rms_norm":
        return leaf(rows, cols), leaf(cols), 1e-6
    if op == "softmax":
        return leaf(rows, cols), -1
    raise SystemExit(f"--op must be layer_norm, rms_norm or softmax; got {op!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", required=True)
    parser.add_argument("--shape", action="append", required=True, help="ROWSxCOLS; repeat for more shapes")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    op = getattr(kernelgate, args.op)
    cases = []
    for shape in args.shape:
        rows, cols = (int(v) for v in shape.split("x"))
        values = _inputs(args.op, rows, cols, dtype, device)
        leaves = [v for v in values if isinstance(v, torch.Tensor)]
        for _ in range(3):  # tuning, the Function's first step, then the step route's own timing
            out = op(*values)
            torch.autograd.grad(out, leaves, torch.ones_like(out))
        route = op.forward_route(values)
        assert route is not None, "no memoised route: run in mode auto without a launch log"
        first = op.step_route(*values)
        repeats = []
        for _ in range(args.repeats):
            op._eager_step_is_faster(values, route)
            repeats.append(route.step_us)
        eager = [e for e, _ in repeats]
        function = [f for _, f in repeats]
        case = {
            "shape": shape,
            "route": first.path,
            "detail": first.detail,
            "eager_us": eager,
            "function_us": function,
            "median_eager_us": statistics.median(eager),
            "median_function_us": statistics.median(function),
        }
        cases.append(case)
        print(
            f"{args.op} {shape} {args.dtype}: route {first.path}; median of {args.repeats} timings: eager "
            f"{case['median_eager_us']:.1f} us, the Function {case['median_function_us']:.1f} us\n  {first.detail}"
        )
    write_json(args.out, {"provenance": provenance(device), "op": args.op, "dtype": args.dtype, "cases": cases})


if __name__ == "__main__":
    main()
