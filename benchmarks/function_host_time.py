"""kernelgate's own host time in a forward+backward step through its Function, without a GPU.

On CPU tensors under Triton's interpreter, with tuning made to choose the Triton kernels and the step route made to
keep the Function, the step runs kernelgate's whole path (dispatch, the Function's save and backward, the launchers'
allocations and torch calls) with every kernel launch made a no-op: what is timed is the host's work alone, beside
the same step through eager autograd of torch's op and through an empty ``autograd.Function``. The interpreter's
call path (``Op._call_slow``) stands in for the compiled route's, so the figures compare trees, not machines.
Best of ``--rounds`` means over ``--steps`` steps. Writes JSON with provenance.

    python benchmarks/function_host_time.py --op layer_norm --out host.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate
import kernelgate.op
from kernelgate import backend, selection


class _Empty(torch.autograd.Function):
    """The least a Python Function's step costs: save the input, return a gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _cases(rows: int, cols: int) -> dict[str, tuple[Callable[..., Any], Callable[..., Any], tuple[Any, ...]]]:
    """For each op: kernelgate's call, torch's, and the arguments (leaves that require grad)."""

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape).requires_grad_()

    x, w, b = leaf(rows, cols), leaf(cols), leaf(cols)
    return {
        "layer_norm": (kernelgate.layer_norm, F.layer_norm, (x, (cols,), w, b, 1e-5)),
        "rms_norm": (kernelgate.rms_norm, lambda x, w, eps: F.rms_norm(x, (cols,), w, eps), (x, w, 1e-6)),
        "softmax": (kernelgate.softmax, torch.softmax, (x, -1)),
    }


def _step_us(call: Callable[..., Any], args: tuple[Any, ...], steps: int, rounds: int) -> float:
    leaves = [a for a in args if isinstance(a, torch.Tensor)]
    grad = torch.ones_like(call(*args))

    def step() -> None:
        torch.autograd.grad(call(*args), leaves, grad, allow_unused=True)

    for _ in range(steps // 5):
        step()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        best = min(best, (time.perf_counter() - start) / steps * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", action="append", required=True, help="layer_norm, rms_norm or softmax; repeatable")
    parser.add_argument("--shape", default="4x64", help="ROWSxCOLS (default 4x64)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows, cols = (int(v) for v in args.shape.split("x"))
    # Decisions made on the fake timings below stay in a directory of this run, out of the user's cache (a later
    # run reading them would skip tuning, and with it the kernels this script times).
    kernelgate.configure(warn_fallback=False, cache_dir=Path(tempfile.mkdtemp(prefix="kernelgate-host-time-")))
    # Tuning picks the (interpreted) kernels, and the step route keeps the Function: timed at fixed lengths.
    real_time_us = selection.time_us
    selection.time_us = lambda fn, device, *, screen=False: (  # type: ignore[assignment]
        1.0 if getattr(fn, "func", None) is selection.run_candidate else real_time_us(fn, device, screen=screen)
    )
    references = {getattr(kernelgate, name).reference for name in args.op}
    kernelgate.op.time_autograd_step = lambda forward, *a: 100.0 if forward in references else 10.0  # type: ignore[assignment]
    results = []
    for name in args.op:
        ours, torchs, values = _cases(rows, cols)[name]
        with kernelgate.use_interpreter():
            for _ in range(3):  # tuning, the Function's first step, the step route
                _step_us(ours, values, 1, 1)
            route = ours.step_route(*values)
            assert route.path == "function", route
            launch = backend.launch_interpreted
            backend.launch_interpreted = lambda *a: None  # type: ignore[assignment]
            try:
                function_us = _step_us(ours, values, args.steps, args.rounds)
            finally:
                backend.launch_interpreted = launch  # type: ignore[assignment]
        eager_us = _step_us(torchs, values, args.steps, args.rounds)
        empty_us = _step_us(_Empty.apply, values[:1], args.steps, args.rounds)
        results.append({"op": name, "function_us": function_us, "eager_us": eager_us, "empty_function_us": empty_us})
        print(
            f"{name} {args.shape}: kernelgate's Function {function_us:.1f} us a step (launches as no-ops), "
            f"eager autograd {eager_us:.1f}, an empty Function {empty_us:.1f}"
        )
    write_json(args.out, {"provenance": provenance(torch.device("cpu")), "shape": args.shape, "results": results})


if __name__ == "__main__":
    main()
