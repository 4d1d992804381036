"""Host cost of kernelgate calls planned to the reference, against the reference called directly.

At the bench's latency shapes tuning keeps the reference for most ops (a launch of a Triton kernel costs the
host more than eager torch's), so a call costs eager's plus kernelgate's dispatch: what this measures, forward
(no grad) and forward+backward (``torch.autograd.grad`` through the op, whose steps run eager autograd of the
reference once the first step has shown both passes are the reference). The ops and their backward ops are
pinned to mode ``reference`` (``Op.set_mode``, no context), so nothing is tuned and the path is the one a
``reference-faster`` decision takes. Each case alternates rounds of the direct call and kernelgate's (calls back
to back, then one synchronise); the minimum over rounds of each, and the median of the paired differences.

    python benchmarks/reference_route_overhead.py --out results.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate

SHAPES = ((1, 4096), (64, 4096), (512, 4096))


def _inputs(op_name: str, shape: tuple[int, ...], device: torch.device) -> tuple[Any, ...]:
    x = torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(shape[-1], device=device, dtype=torch.bfloat16, requires_grad=True)
    if op_name in ("softmax", "log_softmax"):
        return (x, -1)
    if op_name == "rms_norm":
        return (x, w, 1e-6)
    if op_name == "layer_norm":
        return (x, (shape[-1],), w, torch.randn_like(w).requires_grad_(), 1e-5)
    return (x, torch.randn_like(x).requires_grad_())  # swiglu


def _round_us(fn: Callable[[], object], sync: Callable[[], object], calls: int) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--op", action="append", help="ops to measure (default softmax, rms_norm, layer_norm, swiglu)")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    kernelgate.configure(warn_fallback=False)
    torch.manual_seed(0)
    rows = []
    for name in args.op or ("softmax", "rms_norm", "layer_norm", "swiglu"):
        op = kernelgate.op.get_op(name)
        op.set_mode("reference")
        backward = kernelgate.op.get_op(f"{name}_backward")
        backward.set_mode("reference")
        try:
            for shape in SHAPES:
                values = _inputs(name, shape, device)
                leaves = [v for v in values if isinstance(v, torch.Tensor) and v.requires_grad]
                detached = tuple(v.detach() if isinstance(v, torch.Tensor) else v for v in values)
                grad = torch.randn_like(op.reference(*detached))
                cases = {
                    "forward": (lambda d=detached, o=op: o.reference(*d), lambda d=detached, o=op: o(*d)),
                    "forward+backward": (
                        lambda v=values, ls=leaves, g=grad, o=op: torch.autograd.grad(o.reference(*v), ls, g),
                        lambda v=values, ls=leaves, g=grad, o=op: torch.autograd.grad(o(*v), ls, g),
                    ),
                }
                for direction, (direct, ours) in cases.items():
                    for fn in (direct, ours, direct, ours):  # warm-up; the first autograd step settles the route
                        _round_us(fn, sync, max(args.calls // 10, 1))
                    direct_us, ours_us = [], []
                    for _ in range(args.rounds):
                        direct_us.append(_round_us(direct, sync, args.calls))
                        ours_us.append(_round_us(ours, sync, args.calls))
                    extra = statistics.median(o - d for o, d in zip(ours_us, direct_us, strict=True))
                    row = {
                        "op": name,
                        "shape": "x".join(map(str, shape)),
                        "direction": direction,
                        "reference_us": round(min(direct_us), 2),
                        "kernelgate_us": round(min(ours_us), 2),
                        "median_extra_us": round(extra, 2),
                        "step_route": op.step_route(*values).path if direction == "forward+backward" else "",
                    }
                    rows.append(row)
                    print(
                        f"{name:11} {row['shape']:9} {direction:17} reference {row['reference_us']:7.2f} us  "
                        f"kernelgate {row['kernelgate_us']:7.2f} us  extra (median of pairs) {extra:6.2f} us  "
                        f"{row['step_route']}"
                    )
        finally:
            op.set_mode(None)
            backward.set_mode(None)
    write_json(
        args.out,
        {
            "benchmark": "host cost of calls planned to the reference (bfloat16, ops in mode reference), "
            "against the reference called directly; calls back to back then one synchronise, rounds alternating",
            **provenance(device),
            "calls": args.calls,
            "rounds": args.rounds,
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
