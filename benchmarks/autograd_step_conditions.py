"""Host time of an rms_norm forward+backward step through autograd, under conditions of the process.

In ``kernelgate bench`` every implementation built on a Python ``torch.autograd.Function``
(kernelgate, Liger-Kernel, torch.compile's compiled backward) takes several times longer per
forward+backward step than its kernels called directly, and longer than in a small script. This
measures one step three ways, side by side, in one process:

- ``eager``: the reference in eager PyTorch (autograd in C++);
- ``kernelgate``: ``kernelgate.rms_norm`` (its own ``autograd.Function``, dispatch, tuned kernels);
- ``bare Function``: a minimal ``autograd.Function`` around the same kernelgate ops, forward
  and backward, so kernelgate's autograd wrapper is the only difference to the line above;

under four conditions, in this order: a fresh process; Python's garbage collector disabled; a
rich progress bar refreshing in its thread (as ``kernelgate bench`` shows one); and after
``torch.compile`` has compiled and run a function (Dynamo and Inductor loaded, as in the bench).
For each: the host's time to issue ``--steps`` steps (before the synchronise) and the time per step
including it, the best of ``--rounds``. Writes JSON with provenance.

    python benchmarks/autograd_step_conditions.py --out step-conditions.json --shape 64x4096
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate


class _BareRmsNorm(torch.autograd.Function):
    """rms_norm through kernelgate's ops with the least autograd code around them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return kernelgate.rms_norm(x, weight, 1e-6)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight = ctx.saved_tensors
        dx, dw = kernelgate.rms_norm_backward(grad, x, weight, 1e-6)
        return dx, dw


def _timed(step: Callable[[], object], device: torch.device, steps: int, rounds: int) -> tuple[float, float]:
    """(host µs to issue one step, µs per step including the final synchronise), best of rounds."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):
        step()
    issue, total = float("inf"), float("inf")
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        issued = time.perf_counter()
        sync()
        done = time.perf_counter()
        issue = min(issue, (issued - start) / steps * 1e6)
        total = min(total, (done - start) / steps * 1e6)
    return issue, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="64x4096", help="rows x columns (default 64x4096: host-bound)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    rows, cols = (int(v) for v in args.shape.split("x"))
    kernelgate.configure(warn_fallback=False)
    torch.manual_seed(0)
    x = torch.randn(rows, cols, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(cols, device=device, dtype=dtype, requires_grad=True)
    g = torch.randn(rows, cols, device=device, dtype=dtype)
    reference = kernelgate.rms_norm.reference
    cases: dict[str, Callable[[], object]] = {
        "eager": lambda: torch.autograd.grad(reference(x, w, 1e-6), (x, w), g),
        "kernelgate": lambda: torch.autograd.grad(kernelgate.rms_norm(x, w, 1e-6), (x, w), g),
        "bare Function": lambda: torch.autograd.grad(_BareRmsNorm.apply(x, w), (x, w), g),
    }

    def compile_something() -> None:
        compiled = torch.compile(lambda a: torch.nn.functional.gelu(a) * 2, dynamic=False)
        compiled(torch.randn(8, 128, device=device))

    from rich.console import Console
    from rich.progress import Progress

    progress = Progress(console=Console(file=sys.stderr), transient=True)  # as kernelgate bench shows it
    progress.add_task("measuring", total=None)
    conditions: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
        ("fresh process", lambda: None, lambda: None),
        ("garbage collector disabled", gc.disable, gc.enable),
        ("a rich progress bar running", progress.start, progress.stop),
        ("after torch.compile", compile_something, lambda: None),
    ]
    rows_out = []
    for condition, enter, leave in conditions:
        enter()
        try:
            for name, step in cases.items():
                issue, total = _timed(step, device, args.steps, args.rounds)
                rows_out.append(
                    {"condition": condition, "case": name, "issue_us": round(issue, 1), "step_us": round(total, 1)}
                )
                print(f"{condition:28} {name:14} issue {issue:8.1f} us/step   with sync {total:8.1f} us/step")
        finally:
            leave()
    result = {
        "benchmark": f"rms_norm forward+backward step through autograd, {args.shape} {args.dtype}, x and weight",
        **provenance(device),
        "path": str(kernelgate.rms_norm.explain(x.detach(), w.detach(), 1e-6).path),
        "steps": args.steps,
        "rounds": args.rounds,
        "rows": rows_out,
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
