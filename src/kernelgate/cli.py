"""The ``kernelgate`` command: ``doctor`` (what runs here and why) and ``demo`` (the ops at work).

Exit codes:
    0  success: everything checked ran and every result matched its reference.
    1  a problem was found: a result did not match its reference, or a GPU is present but Triton
       cannot use it (``doctor`` says why).
    2  usage error (unknown command or option).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import platform
import statistics
import subprocess
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
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown (nvidia-smi unavailable)"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn`` in milliseconds, the device synchronised around each run."""
    fn()
    _synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


@dataclasses.dataclass(frozen=True)
class _DemoCase:
    op: Op
    shape: str
    args: tuple[Any, ...]
    plain_torch: Callable[..., torch.Tensor]


def _demo_cases(device: torch.device, interpret: bool) -> list[_DemoCase]:
    if interpret:
        shapes = [(4, 100), (2, 20000)]
    elif device.type == "cpu":
        shapes = [(64, 1000), (256, 4096)]
    else:
        shapes = [(64, 4096), (16384, 4096), (4096, 32768)]
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    cases = []
    for rows, cols in shapes:
        gen = torch.Generator().manual_seed(rows * cols)
        x = torch.randn(rows, cols, generator=gen).to(device=device, dtype=dtype)
        w = torch.linspace(0.5, 1.5, cols).to(device=device, dtype=dtype)
        shape = f"{rows}x{cols} {str(dtype).removeprefix('torch.')}"
        cases.append(_DemoCase(kernelgate.softmax, shape, (x, -1), torch.softmax))
        cases.append(_DemoCase(kernelgate.rms_norm, shape, (x, w, 1e-6), _torch_rms_norm))
    return cases


def demo(console: Console, log: Path, repeats: int) -> int:
    """Run the built-in ops on the best device, check each against its reference, time it, log it.

    On a GPU, the first call of each shape bucket tunes it (gate, then time every candidate), so the
    table shows what measurement chose. On a machine without a GPU the ops run their references;
    the Triton kernels then also run at small shapes through the interpreter, in mode ``triton``
    with their default configurations, checked for correctness (interpreter times are not speed).
    """
    device = best_device()
    kernelgate.configure(log_path=log, warn_fallback=False)
    table = Table(title=f"kernelgate demo on {device} ({backend.device_name(device)})")
    for column in ("op", "shape", "path", "implementation", "reason", "kernelgate ms", "torch ms", "matches"):
        table.add_column(column, justify="right" if column.endswith("ms") else "left")
    runs = [(device, False)]
    if device.type == "cpu" and backend.status().interpreter:
        runs.append((device, True))
    failures = 0
    for run_device, interpret in runs:
        if interpret:
            kernelgate.configure(tune=False)
        with kernelgate.use_interpreter(interpret), kernelgate.use_mode("triton" if interpret else "auto"):
            for case in _demo_cases(run_device, interpret):
                op, args = case.op, case.args
                plan = op.plan(*args)
                try:
                    assert_close(op(*args), op.reference(*args), reduction_length=args[0].shape[-1])
                    matches = "[green]yes[/green]"
                except AssertionError:
                    failures += 1
                    matches = "[red]NO[/red]"
                kernelgate.configure(log_path=None)  # the log synchronises per call; time without it
                ours = _time_ms(functools.partial(op, *args), run_device, repeats)
                theirs = _time_ms(functools.partial(case.plain_torch, *args), run_device, repeats)
                kernelgate.configure(log_path=log)
                table.add_row(
                    op.name, case.shape, plan.path, plan.name, str(plan.reason), f"{ours:.3f}", f"{theirs:.3f}", matches
                )
    console.print(table)
    if len(runs) > 1:
        console.print("No GPU here: the ops ran their references; the interpreter rows check the Triton kernels.")
    console.print(f"launch log: {log} (one row per call)")
    if failures:
        console.print(f"[red]{failures} result(s) did not match the reference[/red]")
    return EXIT_PROBLEM if failures else EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelgate", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="versions, Triton target, and the path each op takes here")
    run = commands.add_parser("demo", help="run the built-in ops, check them against their references, time them")
    run.add_argument("--log", type=Path, default=Path("kernelgate-demo.csv"), help="CSV launch log to append to")
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
    return demo(console, args.log, args.repeats)


if __name__ == "__main__":
    sys.exit(main())
