"""Host time of a forward+backward step with autograd's device threads on and off.

On a CUDA device, autograd runs each backward on a device thread of its own: the calling thread
hands the graph over and waits. A ``torch.autograd.Function`` (kernelgate's eager autograd path)
runs its Python backward on that thread. This times, per step, back to back:

- kernelgate in mode ``triton`` (its Function, forward and backward kernels) and in mode ``auto``;
- eager torch (the same op's PyTorch formula, whose backward is C++);
- an empty Function (saves two tensors, returns the incoming gradient): autograd's own cost;

each with ``torch.autograd.set_multithreading_enabled`` on (the default) and off (the backward runs on
the calling thread), in interleaved rounds (the best of them). "issue" is the host's time per step
before the closing synchronise, "total" the time per step with it. GPU only. Writes JSON with provenance.

    python benchmarks/autograd_threads.py --out autograd-threads.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate

CASES = [("rms_norm", (262144, 128), "float32"), ("softmax", (262144, 128), "float32"),
         ("rms_norm", (64, 4096), "bfloat16"), ("softmax", (64, 4096), "bfloat16")]  # fmt: skip


class _EmptyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)  # type: ignore[attr-defined]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _steps(op: str, shape: tuple[int, int], dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    x = torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
    g = torch.randn(*shape, device="cuda", dtype=dtype)

    def kernelgate_step(mode: str) -> Callable[[], object]:
        def step() -> object:
            with kernelgate.use_mode(mode):  # type: ignore[arg-type]
                if op == "rms_norm":
                    return torch.autograd.grad(kernelgate.rms_norm(x, w, 1e-6), (x, w), g)
                return torch.autograd.grad(kernelgate.softmax(x, -1), (x,), g)

        return step

    def eager_step() -> object:
        if op == "rms_norm":
            return torch.autograd.grad(torch.nn.functional.rms_norm(x, (shape[-1],), w, 1e-6), (x, w), g)
        return torch.autograd.grad(torch.softmax(x, -1), (x,), g)

    return {
        "kernelgate triton": kernelgate_step("triton"),
        "kernelgate auto": kernelgate_step("auto"),
        "eager torch": eager_step,
        "empty Function": lambda: torch.autograd.grad(_EmptyFunction.apply(x, w), (x,), g),  # type: ignore[no-untyped-call]
    }


def _issue_and_total_us(fn: Callable[[], object], steps: int) -> tuple[float, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    issued = time.perf_counter()
    torch.cuda.synchronize()
    end = time.perf_counter()
    return (issued - start) / steps * 1e6, (end - start) / steps * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("autograd_threads.py: needs a CUDA GPU (autograd's device threads); none here.", file=sys.stderr)
        return 2
    kernelgate.configure(warn_fallback=False)
    torch.manual_seed(0)
    rows = []
    for op, shape, dtype_name in CASES:
        steps = _steps(op, shape, getattr(torch, dtype_name))
        for fn in steps.values():  # warm-up: compile, tune, route
            for _ in range(20):
                fn()
        best: dict[tuple[str, bool], tuple[float, float]] = {}
        for _ in range(args.rounds):
            for threads in (True, False):
                torch.autograd.set_multithreading_enabled(threads)
                for name, fn in steps.items():
                    issue, total = _issue_and_total_us(fn, args.steps)
                    old = best.get((name, threads), (float("inf"), float("inf")))
                    best[(name, threads)] = (min(old[0], issue), min(old[1], total))
        torch.autograd.set_multithreading_enabled(True)
        for (name, threads), (issue, total) in best.items():
            row = {"op": op, "shape": list(shape), "dtype": dtype_name, "step": name, "device_threads": threads}
            rows.append({**row, "issue_us": round(issue, 1), "total_us": round(total, 1)})
            print(f"{op:8} {'x'.join(map(str, shape)):>10} {dtype_name:8} {name:18} "
                  f"threads {'on ' if threads else 'off'}  issue {issue:7.1f}  total {total:7.1f} us/step")  # fmt: skip
    write_json(args.out, {"provenance": provenance(torch.device("cuda")), "steps": args.steps,
                          "rounds": args.rounds, "rows": rows})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
