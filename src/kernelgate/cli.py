"""The ``kernelgate`` command.

Commands:
    doctor                 versions, Triton target, and the path each op takes here and why
    demo                   run the built-in ops, check them against their references, time them
    tune                   decide shape buckets ahead of time and save the decisions
    cache show|export|import|clear
                           inspect, ship or reset the decision cache
    replay FILE            re-run a case saved by check mode and compare it with the reference
    bench                  eager, torch.compile, kernelgate, its Triton kernels and Liger-Kernel side by
                           side: a CSV, a markdown summary and plots (docs/bench.md)

Exit codes:
    0  success: everything checked ran and every result matched its reference.
    1  a problem was found: a result did not match its reference, a tune spec failed, or a GPU is
       present but Triton cannot use it (``doctor`` says why).
    2  usage error (unknown command, bad option, unreadable file).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
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
from kernelgate import backend, rowwise
from kernelgate.cache import decision_cache, default_cache_dir
from kernelgate.op import Op, registered_ops
from kernelgate.selection import synchronize
from kernelgate.tolerance import assert_close

__all__ = ["main"]

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
# The compute capabilities `kernelgate bench --kernel-arch` accepts (sm_50 to sm_120).
KERNEL_ARCHS = (50, 120)


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
    # A reason's detail is printed once under the table, with the ops it holds for: on a machine without a GPU
    # every op shares one, which repeated in each row made the table many times longer than its ops.
    details: dict[str, list[str]] = {}
    for op in registered_ops():
        impls = ", ".join(i.name for i in op.implementations) or "-"
        if op.make_inputs is None:
            ops.add_row(op.name, impls, "-", "-", "no make_inputs declared")
            continue
        try:
            plan = op.explain(*op.make_inputs((64, 1000), torch.float32, device))
        except Exception as err:  # doctor reports; it does not crash on a broken op
            problem = True
            ops.add_row(op.name, impls, "[red]error[/red]", "-", f"{type(err).__name__}: {err}")
            continue
        ops.add_row(op.name, impls, plan.path, plan.name, str(plan.reason))
        if plan.detail:
            details.setdefault(f"{plan.reason}: {plan.detail}", []).append(op.name)
    console.print(ops)
    for detail, names in details.items():
        console.print(f"{detail} [dim]({', '.join(names)})[/dim]")
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


def _time_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn`` in milliseconds, the device synchronised around each run."""
    fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
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
        # one row too long for a single block, so both forward kernels are shown
        shapes = [(4, 100), (1, rowwise.MAX_SINGLE_BLOCK_FORWARD + 1000)]
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
                    assert_close(op(*args), op.run_reference(*args), reduction_length=args[0].shape[-1])
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


def tune_command(console: Console, args: argparse.Namespace) -> int:
    """``kernelgate tune``: decide the given (op, shape, dtype) buckets, with a progress bar."""
    from rich.progress import Progress

    from kernelgate.tuning import TuneResult, TuneSpec, load_specs, tune_specs

    try:
        specs = load_specs(args.file) if args.file else []
        names = args.ops or ([] if args.file else [op.name for op in registered_ops()])
        specs += [TuneSpec.parse(op, shape, dtype) for op in names for shape in args.shape for dtype in args.dtype]
    except (ValueError, KeyError, OSError) as err:
        console.print(f"[red]kernelgate tune: {err}[/red]")
        return EXIT_USAGE
    if not specs:
        console.print("[red]kernelgate tune: nothing to tune; give --shape (and ops), or --file[/red]")
        return EXIT_USAGE
    device = torch.device("cpu") if args.interpret else best_device()
    table = Table(title=f"kernelgate tune on {device} ({backend.device_name(device)})")
    for column in ("op", "shape", "dtype", "status", "implementation", "config", "reason", "seconds"):
        table.add_column(column)
    with kernelgate.use_interpreter(args.interpret), Progress(console=console, transient=True) as progress:
        task = progress.add_task("tuning", total=len(specs))

        def show(result: TuneResult) -> None:
            progress.advance(task)
            plan, spec = result.plan, result.spec
            config = ",".join(f"{k}={v}" for k, v in sorted(plan.config.items())) if plan and plan.config else "-"
            reason = (
                f"{plan.reason}: {plan.detail}" if plan and plan.detail else str(plan.reason) if plan else result.detail
            )
            table.add_row(
                spec.op,
                "x".join(map(str, spec.shape)),
                str(spec.dtype).removeprefix("torch."),
                result.status,
                plan.name if plan else "-",
                config,
                reason,
                f"{result.seconds:.1f}",
            )

        results = tune_specs(specs, device, budget_s=args.budget_s, on_result=show, retune=args.retune)
    console.print(table)
    console.print(f"decisions saved in {kernelgate.settings().cache_dir or default_cache_dir()}")
    return EXIT_PROBLEM if any(r.status == "error" for r in results) else EXIT_OK


def cache_command(console: Console, args: argparse.Namespace) -> int:
    """``kernelgate cache show|export|import|clear``."""
    from kernelgate.op import clear_memos

    cache = decision_cache(kernelgate.settings().cache_dir)
    if args.action == "show":
        table = Table(title=f"decision cache {cache.path}")
        for column in ("op", "bucket", "dtypes", "layout", "device", "implementation", "config", "reason", "source"):
            table.add_column(column)
        for key, entry in sorted(cache.entries().items()):
            try:
                parts = json.loads(key)
                op, bucket, dtypes, layout, device = parts[0], parts[1], parts[2], parts[3], parts[5]
            except (ValueError, IndexError, TypeError):
                op, bucket, dtypes, layout, device = "?", key, "", "", ""
            config = entry.get("config")
            table.add_row(
                str(op),
                str(bucket),
                ",".join(map(str, dtypes)),
                ",".join(map(str, layout)),
                str(device),
                str(entry.get("implementation")),
                ",".join(f"{k}={v}" for k, v in sorted(config.items())) if isinstance(config, dict) else "-",
                str(entry.get("reason", "")),
                str(entry.get("source", "")),
            )
        console.print(table)
        console.print(f"{len(cache.entries())} decision(s)")
        return EXIT_OK
    if args.action == "clear":
        console.print(f"removed {cache.clear()} decision(s) from {cache.path}")
        clear_memos()
        return EXIT_OK
    if args.path is None:
        console.print(f"[red]kernelgate cache {args.action}: give the file path[/red]")
        return EXIT_USAGE
    try:
        if args.action == "export":
            console.print(f"wrote {cache.export(args.path)} decision(s) to {args.path}")
        else:
            console.print(f"imported {cache.import_file(args.path)} decision(s) from {args.path} into {cache.path}")
            clear_memos()
    except (OSError, ValueError) as err:
        console.print(f"[red]kernelgate cache {args.action}: {err}[/red]")
        return EXIT_USAGE
    return EXIT_OK


def replay_command(console: Console, path: Path) -> int:
    """``kernelgate replay FILE``: run a saved check-mode case again; exit 1 while it still mismatches."""
    from kernelgate.op import get_op
    from kernelgate.selection import compare, float64_truth, run_candidate

    try:
        case = torch.load(path, weights_only=False)
        op = get_op(case["op"])
    except (OSError, KeyError, RuntimeError) as err:
        console.print(f"[red]kernelgate replay: cannot use {path}: {err}[/red]")
        return EXIT_USAGE
    device = best_device() if any(d and d != "cpu" for d in case["devices"]) else torch.device("cpu")
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in case["args"])
    impl = next((i for i in op.implementations if i.name == case["implementation"]), None)
    if impl is None:
        console.print(f"[red]kernelgate replay: {op.name} has no implementation {case['implementation']!r} now[/red]")
        return EXIT_USAGE
    config = impl.configs.validate(case["config"]) if impl.configs is not None else None
    interpret = bool(case["interpret"]) or device.type == "cpu"
    expected = op.run_reference(*args)
    mismatch = compare(
        run_candidate(impl, config, args, interpret, poison=True),
        expected,
        op.reduction_length(*args),
        op.normwise_outputs,
        float64_truth(op, args),
    )
    label = f"{op.name} {impl.name} config {case['config']} on {device}"
    if mismatch is None:
        console.print(f"[green]{label}: matches the reference now[/green]")
        return EXIT_OK
    console.print(f"[red]{label}: still differs from the reference: {mismatch}[/red]")
    return EXIT_PROBLEM


def _kernel_notes(console: Console, rows: list[Any], arch: int | None) -> dict[tuple[str, str, str], str]:
    """What the kernels behind forward bandwidth misses hold (registers, local memory), where Triton compiles for
    NVIDIA GPUs here (this one, or sm_``arch``); each case that could not be read is printed with why."""
    status = backend.status()
    if status.triton_version is None or (arch is None and status.target != "cuda"):
        return {}
    from kernelgate.bench.resources import kernel_notes

    notes, unread = kernel_notes(rows, arch)
    for line in unread:
        console.print(f"[yellow]kernel resources not read: {line}[/yellow]")
    return notes


def bench_command(console: Console, args: argparse.Namespace) -> int:
    """``kernelgate bench``: measure, then write the CSV, summary.md and one PNG per op (``--plot CSV``: redraw)."""
    from kernelgate import bench
    from kernelgate.bench import report

    if args.kernel_arch is not None and not KERNEL_ARCHS[0] <= args.kernel_arch <= KERNEL_ARCHS[1]:
        console.print(
            f"[red]kernelgate bench: --kernel-arch must be an NVIDIA compute capability written as one number, from "
            f"{KERNEL_ARCHS[0]} to {KERNEL_ARCHS[1]} (90 for sm_90: H100, H200; 80 for sm_80: A100); got "
            f"{args.kernel_arch}. Leave it out to read the kernels for this machine's GPU.[/red]"
        )
        return EXIT_USAGE
    try:
        if args.plot is not None:
            rows = bench.read_csv(args.plot)
            out = args.out or args.plot.parent
            runs = bench.read_runs(args.plot.parent)
        else:
            out = args.out or Path("kernelgate-bench")
            out.mkdir(parents=True, exist_ok=True)
            started, start = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.monotonic()
            # --resume: the cases an earlier run in this folder measured are kept, not measured again.
            earlier = bench.read_csv(out / "bench.csv") if args.resume and (out / "bench.csv").exists() else []
            done = {(r.op, r.dtype, r.shape) for r in earlier if r.note != bench.TIME_LIMIT_NOTE}
            earlier = [r for r in earlier if (r.op, r.dtype, r.shape) in done]
            runs_before = bench.read_runs(out) if args.resume else None  # None: this call starts the record
            rows = earlier + bench.run(
                args.op or None,
                args.dtype or None,
                suite=args.suite,
                quick=args.quick,
                backward=not args.no_backward,
                compile=not args.no_compile,
                compile_backend=args.compile_backend,
                precompile_workers=args.precompile_workers,
                liger=not args.no_liger,
                interpret=args.interpret,
                warmup_ms=args.warmup,
                rep_ms=args.rep,
                hold_us=args.hold_us,
                repeats=args.repeats,
                host_calls=args.host_calls,
                latency_bytes=report.LATENCY_BYTES if args.latency_mib is None else int(args.latency_mib * 2**20),
                time_limit_s=args.time_limit,
                skip=done,
                console=console,
                on_progress=lambda so_far: _keep_progress(out, earlier + so_far, started, start, runs_before),
            )
            console.print(f"results: {bench.write_csv(rows, out / 'bench.csv')}")
            # How long measuring took, per call: a suite measured in parts with --resume adds them up.
            runs = bench.record_run(out, started, time.monotonic() - start, runs_before is not None, runs_before)
    except (bench.BenchError, OSError) as err:
        console.print(f"[red]kernelgate bench: {err}[/red]")
        return EXIT_USAGE
    notes = _kernel_notes(console, rows, args.kernel_arch)
    console.print(f"summary: {bench.write_summary(rows, out / 'summary.md', runs=runs, kernel_notes=notes)}")
    if bench.plots_available():
        for path in bench.write_plots(rows, out):
            console.print(f"plot: {path}")
    else:
        console.print(
            "No plots: matplotlib is not installed (pip install matplotlib, or pip install 'kernelgate[bench]'); "
            "kernelgate bench --plot CSV draws them later from the CSV."
        )
    missed = bench.misses(rows)
    if missed:
        console.print(f"{len(missed)} target(s) missed ({bench.miss_breakdown(rows)}): see the summary.")
    errors = [r for r in rows if r.status == "error"]
    if errors:
        console.print(f"[red]{len(errors)} measurement(s) failed[/red]: their rows say why.")
    return EXIT_PROBLEM if errors else EXIT_OK


def _keep_progress(
    out: Path, rows: list[Any], started: str, start: float, runs_before: list[dict[str, Any]] | None
) -> None:
    """What a bench call has measured so far, kept as it goes (after each op) in case it is stopped from outside:
    the CSV, and this call's time in ``runs.json`` after ``runs_before`` (those of the calls it resumes; None:
    it resumes none)."""
    from kernelgate import bench

    bench.write_csv(rows, out / "bench.csv")
    bench.record_run(out, started, time.monotonic() - start, runs_before is not None, runs_before)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelgate", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="versions, Triton target, and the path each op takes here")
    run = commands.add_parser("demo", help="run the built-in ops, check them against their references, time them")
    run.add_argument("--log", type=Path, default=Path("kernelgate-demo.csv"), help="CSV launch log to append to")
    run.add_argument("--repeats", type=int, default=5, help="timed runs per case (median reported)")
    tune = commands.add_parser("tune", help="decide shape buckets ahead of time and save the decisions")
    tune.add_argument("ops", nargs="*", help="ops to tune (default: every registered op)")
    tune.add_argument("--shape", action="append", default=[], help="main tensor shape, e.g. 4096x4096 (repeatable)")
    tune.add_argument("--dtype", action="append", default=None, help="float32, float16, bfloat16 (repeatable)")
    tune.add_argument("--file", type=Path, help='JSON list of {"op", "shape", "dtype"} objects')
    tune.add_argument("--budget-s", type=float, default=None, help="start no new spec after this many seconds")
    tune.add_argument(
        "--retune", action="store_true", help="tune buckets decided before again, replacing their cached decisions"
    )
    tune.add_argument("--interpret", action="store_true", help="tune the interpreter on the CPU (for tests)")
    cache = commands.add_parser("cache", help="show, export, import or clear the decision cache")
    cache.add_argument("action", choices=("show", "export", "import", "clear"))
    cache.add_argument("path", nargs="?", type=Path, help="file to export to or import from")
    replay = commands.add_parser("replay", help="re-run a case saved by check mode")
    replay.add_argument("file", type=Path)
    bench = commands.add_parser("bench", help="measure ops side by side with eager, torch.compile and Liger-Kernel")
    bench.add_argument("--op", action="append", default=[], help="op to measure (repeatable; default: all)")
    bench.add_argument(
        "--dtype", action="append", default=[], choices=("float32", "float16", "bfloat16"), help="(repeatable)"
    )
    bench.add_argument("--quick", action="store_true", help="the suite's short variant")
    bench.add_argument("--suite", type=Path, help="JSON suite file replacing (or extending) the built-in one")
    bench.add_argument("--out", type=Path, help="output folder (default ./kernelgate-bench; with --plot: the CSV's)")
    bench.add_argument("--plot", type=Path, metavar="CSV", help="measure nothing: draw plots and summary from a CSV")
    bench.add_argument("--no-backward", action="store_true", help="forward only")
    bench.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    bench.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    bench.add_argument(
        "--precompile-workers",
        type=int,
        default=None,  # kernelgate.bench.precompile.default_workers (the bench package is imported on use)
        metavar="N",
        help="processes compiling, before the run measures, torch.compile's graphs (inductor), kernelgate's tuning "
        "candidates and Liger-Kernel's kernels (GPU; 0: off; default: one fewer than the usable CPUs, at most 16 "
        "and one per 6 GiB of GPU memory)",
    )
    bench.add_argument("--no-liger", action="store_true", help="skip Liger-Kernel even where it is installed")
    bench.add_argument("--warmup", type=int, default=5, help="do_bench warm-up, ms (default 5)")
    bench.add_argument("--rep", type=int, default=20, help="do_bench measuring time, ms (default 20)")
    bench.add_argument(
        "--hold-us",
        type=float,
        default=100.0,  # kernelgate.bench.runner.DEFAULT_HOLD_US (the bench package is imported on use)
        metavar="US",
        help="GPU: hold the device busy this long after each L2 flush, so the time excludes the host's lateness "
        "past the flush (default 100; 0: do_bench as it is)",
    )
    bench.add_argument("--repeats", type=int, default=1, help="interleaved rounds per measurement (median)")
    bench.add_argument("--host-calls", type=int, default=None, help="calls a round of the host-cost measurement")
    bench.add_argument(
        "--latency-mib", type=float, help="inputs below this many MiB are latency shapes (default: the report's, 64)"
    )
    bench.add_argument(
        "--time-limit", type=float, metavar="S", help="start no case after S seconds (the rest: skipped rows)"
    )
    bench.add_argument(
        "--resume", action="store_true", help="keep the cases OUT/bench.csv already holds; measure only the rest"
    )
    bench.add_argument("--interpret", action="store_true", help="run Triton kernels interpreted on the CPU")
    bench.add_argument(
        "--kernel-arch",
        type=int,
        metavar="ARCH",
        help="read the registers and local memory of the kernels behind forward bandwidth misses compiled for "
        "sm_ARCH (e.g. 90, to redraw an H200 run without a GPU; default: this GPU's, none without one)",
    )
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
    if args.command == "tune":
        args.dtype = args.dtype or ["float32"]
        return tune_command(console, args)
    if args.command == "cache":
        return cache_command(console, args)
    if args.command == "replay":
        return replay_command(console, args.file)
    if args.command == "bench":
        return bench_command(console, args)
    if args.repeats < 1:
        console.print(f"[red]--repeats must be >= 1; got {args.repeats}[/red]")
        return EXIT_USAGE
    return demo(console, args.log, args.repeats)


if __name__ == "__main__":
    sys.exit(main())
