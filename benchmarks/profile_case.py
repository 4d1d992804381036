"""One bench case under the profiler: what kernelgate launches, and what its kernels alone launch.

Where ``kernelgate bench`` shows kernelgate slower than its own tuned kernels for a case, this says
where the difference is: extra kernels (a copy, a cast), kernels that take longer, or host time
(CUDA API calls, synchronising calls such as ``cudaFree`` or ``cudaStreamSynchronize``). It runs a
case of the bench's suite (the same argument maker as ``kernelgate bench``) two ways:

- ``kernelgate``: the op as a user calls it (forward+backward: through autograd);
- ``ops``: forward+backward without autograd, the op's forward (or its Backward's ``forward`` with
  statistics) then the declared backward, as kernelgate's ``autograd.Function`` runs them; forward:
  the op again (the pair then measures the profiler's noise);
- ``liger`` (with ``--liger``, where Liger-Kernel is installed and has the op): Liger-Kernel's op as the
  bench calls it, through autograd for forward+backward, to see which of its kernels are faster.

For each: the time per step with a synchronise after each step and back to back, then a profile of
``--steps`` steps: each device kernel (launches, device µs) and each CUDA API call (calls, host µs).
Writes JSON with provenance.

    python benchmarks/profile_case.py --op cross_entropy --shape 8192x32000 --dtype bfloat16 \\
        --direction forward+backward --out profile.json
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate
from kernelgate.bench import spec_for
from kernelgate.op import get_op


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [v for v in value if isinstance(v, torch.Tensor)] if isinstance(value, tuple | list) else []


def _steps(
    op_name: str, args: tuple[Any, ...], grad_args: tuple[int, ...], backward: bool, peer: Callable[..., Any] | None
) -> dict[str, Callable[[], Any]]:
    """The ways of running the case, each a step function: kernelgate, its ops, and ``peer`` where given (a callable
    with the op's arguments, Liger-Kernel's as the bench makes it)."""
    op = get_op(op_name)
    if not backward:
        return {"kernelgate": lambda: op(*args), "ops": lambda: op(*args)} | (
            {"liger": lambda: peer(*args)} if peer is not None else {}
        )
    declared = op.backward
    if declared is None:
        raise SystemExit(f"{op_name} declares no backward op: its gradient is autograd of the reference")
    leaves = tuple(
        a.detach().requires_grad_(True) if i in grad_args and isinstance(a, torch.Tensor) else a
        for i, a in enumerate(args)
    )
    wrt = [leaves[i] for i in grad_args if isinstance(leaves[i], torch.Tensor)]
    outputs = [t for t in _tensors(op(*leaves)) if t.requires_grad]
    # As `kernelgate bench` feeds them: 1 for a scalar (a loss, as loss.backward() gives), random otherwise.
    grads = [torch.ones_like(t) if t.dim() == 0 else torch.randn_like(t) for t in outputs]
    grad: Any = grads[0] if len(grads) == 1 else tuple(grads)
    plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)

    def through_autograd(fn: Callable[..., Any] = op) -> Any:
        outs = [t for t in _tensors(fn(*leaves)) if t.requires_grad]
        return torch.autograd.grad(outs, wrt, grads, allow_unused=True)

    def ops_only() -> Any:
        with torch.no_grad():
            forward = declared.forward_op(plain)  # chosen per call, as the autograd Function does
            if forward is not None:
                output, *extras = forward(*plain)
                kept = declared.kept(plain, tuple(extras), forward)
            else:
                output, kept = op(*plain), ()
            return declared.grads((*declared.save(plain, output), *kept), grad)

    steps: dict[str, Callable[[], Any]] = {"kernelgate": through_autograd, "ops": ops_only}
    if peer is not None:
        steps["liger"] = lambda: through_autograd(peer)
    return steps


def _time_us(step: Callable[[], Any], device: torch.device, steps: int) -> tuple[float, float]:
    """(µs per step with a synchronise after each, µs per step back to back), best of 5 rounds."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    each = back_to_back = float("inf")
    for _ in range(5):
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
            sync()
        each = min(each, (time.perf_counter() - start) / steps * 1e6)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        back_to_back = min(back_to_back, (time.perf_counter() - start) / steps * 1e6)
    return each, back_to_back


def _profile(step: Callable[[], Any], device: torch.device, steps: int) -> dict[str, list[dict[str, Any]]]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    kernels, api = [], []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0.0))
        if device_us > 0 and event.self_cpu_time_total == 0:
            kernels.append({"name": event.key[:120], "launches": event.count, "device_us": round(device_us, 1)})
        elif event.key.startswith(("cuda", "cu")):
            api.append({"name": event.key, "calls": event.count, "host_us": round(event.self_cpu_time_total, 1)})
    kernels.sort(key=lambda k: -k["device_us"])
    api.sort(key=lambda a: -a["host_us"])
    return {"kernels": kernels, "cuda_api": api}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", required=True)
    parser.add_argument("--shape", required=True, help="the suite's shape, numbers joined by x (e.g. 8192x32000)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--direction", default="forward", choices=("forward", "forward+backward"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--liger", action="store_true", help="profile Liger-Kernel's op too, where it has one")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = spec_for(args.op)
    shape = tuple(int(v) for v in args.shape.split("x"))
    kernelgate.configure(warn_fallback=False)
    torch.manual_seed(0)
    case_args = spec.make_args(shape, getattr(torch, args.dtype), device)
    peer = None
    if args.liger:
        try:
            peer = spec.liger(case_args) if spec.liger is not None else None
        except ImportError as err:  # Liger-Kernel not installed, or without this op
            print(f"--liger: no Liger-Kernel counterpart here ({err}); profiling kernelgate alone")
    steps = _steps(args.op, case_args, spec.grad_args, args.direction == "forward+backward", peer)
    rows = []
    for name, step in steps.items():
        for _ in range(3):  # tuning, compiling, the eager-autograd decision
            step()
        each, back_to_back = _time_us(step, device, args.steps)
        profiled = _profile(step, device, args.steps)
        timing = {"us_per_step_synchronised": round(each, 1), "us_per_step_back_to_back": round(back_to_back, 1)}
        rows.append({"case": name, **timing, **profiled})
        print(f"{name:10} {each:9.1f} us/step synchronised   {back_to_back:9.1f} us/step back to back")
        for k in profiled["kernels"]:
            print(f"    kernel {k['launches']:4d} x  {k['device_us'] / args.steps:9.1f} us/step  {k['name']}")
        for a in profiled["cuda_api"][:8]:
            print(f"    api    {a['calls']:4d} x  {a['host_us'] / args.steps:9.1f} us/step  {a['name']}")
    plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in case_args)
    result = {
        "benchmark": f"{args.op} {args.shape} {args.dtype} {args.direction}: kernelgate against its ops, profiled",
        **provenance(device),
        "plan": str(get_op(args.op).explain(*plain)),
        "steps": args.steps,
        "rows": rows,
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
