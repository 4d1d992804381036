"""The ``kernelgate`` command: ``doctor`` (what runs here and why) and ``demo`` (the ops at work).

Exit codes:
    0  success: everything checked ran and every result matched its reference.
    1  a problem was found: a result did not match its reference, or a GPU is present but Triton
       cannot use it (``doctor`` says why).
    2  usage error (unknown command or option).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import kernelgate
from kernelgate import backend
from kernelgate.op import Op, registered_ops
from kernelgate.tolerance import assert_close

__all__ = ["main"]

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


def best_device() -> torch.device:
    """The GPU when torch sees one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu")
    return torch.device("cpu")


def doctor(console: Console) -> int:
    """Print versions, the Triton target and, per op, the path it would take here and why."""
    status = backend.status()
    device = best_device()
    current = kernelgate.settings()
    env = Table(title="kernelgate doctor", show_header=False)
    env.add_column(style="bold")
    env.add_column()
    env.add_row("kernelgate", kernelgate.__version__)
    env.add_row("python", platform.python_version())
    env.add_row("torch", f"{torch.__version__} (CUDA {torch.version.cuda or '-'}, HIP {torch.version.hip or '-'})")
    env.add_row("triton", status.triton_version or f"[red]not importable[/red]: {status.triton_error}")
    env.add_row("triton target", status.target or f"[yellow]none[/yellow]: {status.driver_error}")
    if torch.cuda.is_available():
        env.add_row("GPU driver", _nvidia_driver())
    env.add_row("device", f"{device} ({backend.device_name(device)})")
    env.add_row("capability", backend.capability(device) or "-")
    env.add_row("interpreter", "available" if status.interpreter else "[yellow]unavailable[/yellow]")
    env.add_row("settings", f"mode={current.mode} interpret={current.interpret} log={current.log_path or 'off'}")
    console.print(env)

    ops = Table(title=f"what each op runs on {device} here")
    for column in ("op", "implementations", "path", "implementation", "reason"):
        ops.add_column(column)
    problem = False
    for op in registered_ops():
        impls = ", ".join(i.name for i in op.implementations) or "-"
        if op.example is None:
            ops.add_row(op.name, impls, "-", "-", "no example inputs declared")
            continue
        try:
            plan = op.plan(*op.example(device))
        except Exception as err:  # doctor reports; it does not crash on a broken op
            problem = True
            ops.add_row(op.name, impls, "[red]error[/red]", "-", f"{type(err).__name__}: {err}")
            continue
        detail = f"{plan.reason}" + (f": {plan.detail}" if plan.detail else "")
        ops.add_row(op.name, impls, plan.path, plan.name, detail)
    console.print(ops)
    if device.type in ("cuda", "xpu") and not status.gpu:
        console.print("[red]A GPU is present but Triton cannot use it[/red]: every op runs its reference.")
        problem = True
    return EXIT_PROBLEM if problem else EXIT_OK


def _nvidia_driver() -> str:
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except Exception:
        return "unknown (nvidia-smi unavailable)"


def _time_ms(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn`` in milliseconds, the device synchronised around each run."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _demo_cases(device: torch.device, interpret: bool) -> list[tuple[Op, str, Callable[[], tuple[Any, ...]], Any]]:
    small = device.type == "cpu"
    shapes = [(4, 100), (2, 20000)] if interpret else ([(64, 1000), (256, 4096)] if small else
                                                         [(64, 4096), (16384, 4096), (4096, 32768)])
    dtype = torch.float32 if small else torch.bfloat16
    cases: list[tuple[Op, str, Callable[[], tuple[Any, ...]], Any]] = []
    for rows, cols in shapes:
        gen = torch.Generator(device="cpu").manual_seed(rows * cols)

        def x(rows: int = rows, cols: int = cols, gen: torch.Generator = gen) -> torch.Tensor:
            return torch.randn(rows, cols, generator=gen).to(device=device, dtype=dtype)

        def w(cols: int = cols) -> torch.Tensor:
            return torch.linspace(0.5, 1.5, cols).to(device=device, dtype=dtype)

        shape = f"{rows}x{cols} {str(dtype).removeprefix('torch.')}"
        cases.append((kernelgate.softmax, shape, lambda x=x: (x(), -1), lambda a: torch.softmax(*a)))
        cases.append((
            kernelgate.rms_norm,
            shape,
            lambda x=x, w=w: (x(), w(), 1e-6),
            lambda a: torch.nn.functional.rms_norm(a[0], (a[0].shape[-1],), a[1], a[2]),
        ))
    return cases


def demo(console: Console, log: Path, interpret: bool, repeats: int) -> int:
    """Run the built-in ops on the best device, check each against its reference, time it, log it."""
    device = torch.device("cpu") if interpret else best_device()
    kernelgate.configure(log_path=log, interpret=interpret or kernelgate.settings().interpret, warn_fallback=False)
    table = Table(title=f"kernelgate demo on {device} ({backend.device_name(device)})")
    for column in ("op", "shape", "path", "implementation", "reason", "kernelgate ms", "torch ms", "matches"):
        table.add_column(column, justify="right" if column.endswith("ms") else "left")
    failures = 0
    for op, shape, make_args, torch_fn in _demo_cases(device, interpret):
        args = make_args()
        plan = op.plan(*args)
        result = op(*args)
        try:
            n = args[0].shape[-1]
            assert_close(result, op.reference(*args), reduction_length=n)
            matches = "[green]yes[/green]"
        except AssertionError:
            failures += 1
            matches = "[red]NO[/red]"
        kernelgate.configure(log_path=None)  # the log synchronises per call; time without it
        ours = _time_ms(lambda op=op, args=args: op(*args), device, repeats)
        theirs = _time_ms(lambda f=torch_fn, args=args: f(args), device, repeats)
        kernelgate.configure(log_path=log)
        table.add_row(op.name, shape, plan.path, plan.name, str(plan.reason), f"{ours:.3f}", f"{theirs:.3f}", matches)
    console.print(table)
    console.print(f"launch log: {log} (one row per call)")
    if failures:
        console.print(f"[red]{failures} result(s) did not match the reference[/red]")
    return EXIT_PROBLEM if failures else EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelgate", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="versions, Triton target, and the path each op takes here")
    run = commands.add_parser("demo", help="run the built-in ops, check them against their references, time them")
    run.add_argument("--log", type=Path, default=Path("kernelgate-demo.csv"), help="CSV launch log to append to")
    run.add_argument("--interpret", action="store_true", help="run the Triton kernels through the interpreter (CPU)")
    run.add_argument("--repeats", type=int, default=5, help="timed runs per case (median reported)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kernelgate`` command; returns the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return EXIT_USAGE if exit_.code not in (0, None) else EXIT_OK
    console = Console()
    if args.command == "doctor":
        return doctor(console)
    if args.repeats < 1:
        console.print(f"[red]--repeats must be >= 1; got {args.repeats}[/red]")
        return EXIT_USAGE
    return demo(console, args.log, args.interpret, args.repeats)


if __name__ == "__main__":
    sys.exit(main())
