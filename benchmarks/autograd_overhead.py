"""Host cost of forward + backward through autograd: kernelgate's eager path against the operator's.

A kernelgate op that needs autograd runs through its own ``torch.autograd.Function`` in eager code,
and through ``torch.ops.kernelgate.<name>`` (the dispatcher, with torch.library's autograd) when
traced. This measures both on a small input, where the host decides the time, beside eager torch
and the two kernelgate ops called without autograd. Writes JSON with provenance.

    python benchmarks/autograd_overhead.py --out benchmarks/results/cpu/autograd-overhead.json
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate


def _per_call_us(fn: Callable[[], object], device: torch.device, calls: int, rounds: int) -> float:
    """The best of ``rounds`` means over ``calls`` calls (then one synchronise), in microseconds."""
    for _ in range(calls // 10):
        fn()
    best = float("inf")
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kernelgate.configure(warn_fallback=False)
    torch.manual_seed(0)
    x = torch.randn(1, 256, device=device, requires_grad=True)
    g = torch.randn(1, 256, device=device)
    plain = x.detach()
    cases: dict[str, Callable[[], object]] = {
        "eager torch softmax, forward + backward": lambda: torch.autograd.grad(torch.softmax(x, -1), (x,), g),
        "kernelgate softmax, forward + backward (eager path)": lambda: torch.autograd.grad(
            kernelgate.softmax(x, -1), (x,), g
        ),
        "torch.ops.kernelgate.softmax, forward + backward (operator path)": lambda: torch.autograd.grad(
            kernelgate.softmax.torch_op(x, -1), (x,), g
        ),
        "kernelgate softmax then softmax_backward, no autograd": lambda: kernelgate.softmax_backward(
            g, kernelgate.softmax(plain, -1), -1
        ),
    }
    rows = []
    for name, fn in cases.items():
        us = _per_call_us(fn, device, args.calls, args.rounds)
        rows.append({"case": name, "us_per_call": round(us, 2)})
        print(f"{name:68} {us:8.2f} us")
    result = {
        "benchmark": "host cost of softmax forward + backward at 1x256 float32, best of rounds",
        **provenance(device),
        "path": str(kernelgate.softmax.explain(plain, -1).path),
        "calls": args.calls,
        "rounds": args.rounds,
        "rows": rows,
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
