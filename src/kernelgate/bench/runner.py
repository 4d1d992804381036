"""Measuring: every implementation of every op at every suite shape, forward and forward+backward.

For each (op, dtype, shape) the implementations are ``eager`` (the op's reference), ``compile``
(``torch.compile`` of the reference, ``dynamic=False``, one compiled function per op), ``kernelgate``
(the op in mode ``auto`` after its bucket is tuned: what users get), ``triton:<name>`` (each Triton
implementation the tuner timed at this shape, launched directly with its fastest configuration) and
``liger`` (when Liger-Kernel is installed and has the op). Forward+backward runs the forward with
the inputs requiring grad and ``torch.autograd.grad`` (no ``.grad`` accumulation), with random
incoming gradients, except 1 for a scalar output (a loss), as ``loss.backward()`` gives; for
``triton:<name>`` it is that forward followed by the op's declared backward, called directly.

Times: on a GPU ``triton.testing.do_bench`` (median, L2 flushed); elsewhere the median of
``time.perf_counter`` over a few calls. Bandwidth is compared with a device-to-device copy measured
at the start of the same run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import importlib.util
import math
import os
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from kernelgate import backend
from kernelgate.bench.precompile import default_workers, precompile
from kernelgate.bench.report import (
    FORWARD,
    FORWARD_BACKWARD,
    LATENCY_BYTES,
    TARGETS,
    BenchRow,
    Provenance,
    print_table,
)
from kernelgate.bench.resources import describe, step_resources
from kernelgate.bench.specs import SPECS, BenchSpec, Rereads, bench_specs
from kernelgate.bench.suite import DTYPES, BenchError, Case, Suite, default_suite, load_suite
from kernelgate.cache import decision_cache
from kernelgate.config import Config
from kernelgate.dispatch import Reason, use_interpreter, use_mode
from kernelgate.errors import KernelgateWarning
from kernelgate.op import Op, TritonImpl, get_op, registered_ops
from kernelgate.selection import (
    CandidateResult,
    output_tensors,
    per_call_us,
    run_candidate,
    spin,
    spin_cycles_per_us,
    synchronize,
    timing_event,
)
from kernelgate.settings import configure, settings

__all__ = ["DEFAULT_HOLD_US", "TIME_LIMIT_NOTE", "resolve_ops", "run"]

GPU_COPY_BYTES = 2 * 2**30
CPU_COPY_BYTES = 16 * 2**20
GPU_HOST_CALLS = 100  # a round's calls; 2000 took seconds per forward+backward step
CPU_HOST_CALLS = 10
# At latency shapes the host cost is the fastest of this many rounds, interleaved across the implementations, so
# that a slow stretch of the host's (a collection, another process) lands on every implementation alike, not on one.
# With one round of 200 calls each, the H200's default suite at 149c80b read eager autograd's rms_norm float32 step
# at 64x4096 at 137.3 us where the run before had 84.7, and kernelgate's rms_norm step there 52.8 us over eager's in
# bfloat16 and 23.9 under it in float32.
HOST_ROUNDS = 3
# How long the GPU is held after each L2 flush (see _device_time_us). On the H200 at bb6a88a, 100 us brought
# torch.compile's layer_norm float32 forward at 262144x128 from 0.67 to 0.92 of copy and softmax's at 32768x1024
# from 0.39 to 0.95, to its kernels' own rows; rows with no host lateness moved by 0.01 or less.
DEFAULT_HOLD_US = 100.0
# A call whose host issue takes longer than the hold gets a longer one: this many times its issue time (the median
# of the five calls that estimate its length), so that the host's time stays out of the device's. Forward+backward
# steps through autograd take 250 to 600 us of host time on the H200's host; with 100 us only, the same kernels'
# step measured 253 to 428 us from shape to shape at 7663478 (default-7663478).
HOLD_PER_ISSUE = 1.5
MAX_HOLD_US = 5000.0  # a call that waits for the device (a synchronise) is not helped by any hold
SEED = 0
# The note of a case that a run's time limit left unmeasured (``--resume`` measures these again).
TIME_LIMIT_NOTE = "not measured: the run's time limit passed"


@dataclasses.dataclass(frozen=True)
class _Timing:
    warmup_ms: int
    rep_ms: int
    hold_us: float
    cpu_repeats: int
    repeats: int
    host_calls: int
    latency_bytes: int


@dataclasses.dataclass
class _Impl:
    """One implementation at one case: how to run a forward, and a forward+backward step."""

    name: str
    forward: Callable[[], Any] | None = None
    # Builds the forward+backward step (runs the forward once to shape the upstream gradients).
    make_backward: Callable[[], Callable[[], Any]] | None = None
    note: str = ""
    skip: str = ""  # a reason not to measure: the row is written as "skipped"
    setup_ms: float = 0.0  # spent before the first forward call (kernelgate: planning the bucket)
    # A triton:* row whose forward+backward runs its implementation's twin of the Backward's forward op (which
    # forms the gradient, as cross_entropy_with_grad): (that op, the twin's candidate label).
    twin: tuple[str, str] | None = None


def resolve_ops(names: Sequence[str] | None) -> list[BenchSpec]:
    """The bench specs of ``names`` (default: every registered op that has one).

    Raises:
        BenchError: a name has no bench spec, or its op is not registered here.
    """
    available = bench_specs()
    if not names:
        return available
    registered = {op.name for op in registered_ops()}
    with_spec = {s.op for s in SPECS}
    chosen = []
    for name in dict.fromkeys(names):
        spec = next((s for s in available if s.op == name), None)
        if spec is not None:
            chosen.append(spec)
        elif name in with_spec:
            raise BenchError(
                f"op {name!r} has a bench spec but is not registered in this kernelgate (registered: "
                f"{', '.join(sorted(registered))}). Import the module that declares it, or choose another op."
            )
        elif name in registered:
            raise BenchError(
                f"op {name!r} is registered but has no bench spec; ops with one: "
                f"{', '.join(s.op for s in available)}. Add a BenchSpec to kernelgate/bench/specs.py (docs/bench.md)."
            )
        else:
            raise BenchError(
                f"no op named {name!r}; ops with a bench spec: {', '.join(s.op for s in available)} "
                f"(kernelgate doctor lists every registered op)."
            )
    return chosen


# --- provenance ------------------------------------------------------------------------------------


def _commit() -> str:
    """The kernelgate commit measured: ``KERNELGATE_COMMIT`` if set, else the source tree's ``HEAD``, with
    ``+changes`` where the package's files differ from it (a copied or edited tree: the code measured is not
    that commit's)."""
    if os.environ.get("KERNELGATE_COMMIT"):
        return os.environ["KERNELGATE_COMMIT"]
    package = Path(__file__).resolve().parents[1]  # the source tree's repository, not the caller's
    head = _git(package, "rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    changes = _git(package, "status", "--porcelain", "--", ".")
    return head if changes == "" else f"{head}+changes"


def _git(directory: Path, *args: str) -> str | None:
    """``git args`` run in ``directory``: its output, stripped, or ``None`` where git fails."""
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=10, cwd=directory)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _driver(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
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
        return "unknown"


def _liger_version() -> str:
    if importlib.util.find_spec("liger_kernel") is None:
        return ""
    try:
        return importlib.metadata.version("liger_kernel")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _copy_gbps(device: torch.device, timing: _Timing) -> float:
    """Device-to-device copy bandwidth, bytes read plus written per second."""
    n = GPU_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    seconds = _time_us(lambda: dst.copy_(src), device, timing) * 1e-6
    return 2 * n / seconds / 1e9


# --- timing ----------------------------------------------------------------------------------------


def _time_us(fn: Callable[[], object], device: torch.device, timing: _Timing) -> float:
    if device.type == "cuda":
        if timing.hold_us <= 0:
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=timing.warmup_ms, rep=timing.rep_ms, return_mode="median")) * 1e3
        return _device_time_us(fn, device, timing)
    times = []
    for _ in range(timing.cpu_repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def _device_time_us(fn: Callable[[], object], device: torch.device, timing: _Timing) -> float:
    """The median device time of ``fn``, in microseconds: ``triton.testing.do_bench``'s method (L2 flushed before
    each call, CUDA events around it), with the GPU held busy for ``timing.hold_us`` after each flush.

    do_bench's start event runs as soon as the flush ends. Where the host needs longer than the flush (about 65 us
    for its 256 MB on the H200) to issue the call, the GPU waits between that event and the call's first kernel,
    and the wait is counted as the call's time. The hold lets the host issue the call before its start event runs,
    so the time is the device's alone (host cost is measured separately). It is ``timing.hold_us``, or
    HOLD_PER_ISSUE times the host's median issue time of the call where that is longer (up to MAX_HOLD_US). The
    number of timed calls is chosen so that a measurement still takes about ``timing.rep_ms``.
    """
    from triton import runtime

    driver = runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    fn()
    synchronize(device)
    start, end = timing_event(), timing_event()
    start.record()
    issue_s = []
    for _ in range(5):
        driver.clear_cache(cache)
        began = time.perf_counter()
        fn()
        issue_s.append(time.perf_counter() - began)
    end.record()
    synchronize(device)
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
    hold_us = _hold_us(timing.hold_us, statistics.median(issue_s) * 1e6)
    warmups = max(1, int(timing.warmup_ms / estimate_ms))
    calls = max(1, int(timing.rep_ms / (estimate_ms + hold_us * 1e-3)))
    cycles = round(hold_us * spin_cycles_per_us(device))
    starts = [timing_event() for _ in range(calls)]
    ends = [timing_event() for _ in range(calls)]
    for _ in range(warmups):
        fn()
    for first, last in zip(starts, ends, strict=True):
        driver.clear_cache(cache)
        spin(cycles)
        first.record()
        fn()
        last.record()
    synchronize(device)
    return float(statistics.median(first.elapsed_time(last) for first, last in zip(starts, ends, strict=True))) * 1e3


def _hold_us(least_us: float, issue_us: float) -> float:
    """The GPU's hold before a timed call: ``least_us``, or HOLD_PER_ISSUE times the call's host issue time where
    that is longer, at most MAX_HOLD_US (and never less than ``least_us``)."""
    return max(least_us, min(HOLD_PER_ISSUE * issue_us, MAX_HOLD_US))


def _peak_mib(fn: Callable[[], object], device: torch.device) -> float:
    if device.type != "cuda":
        return math.nan
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


# --- implementations -------------------------------------------------------------------------------


def _significant(value: float) -> float:
    """``value`` to 5 significant digits (the CSV stays readable; tiny CPU figures keep their precision)."""
    return float(f"{value:.5g}")


def case_args(
    spec: BenchSpec, dtype: torch.dtype, case: Case, device: torch.device
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A case's arguments (seeded), and the same with the differentiated ones requiring grad."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(SEED)
        args = tuple(spec.make_args(case.shape, dtype, device))
    bwd_args = tuple(
        a.detach().requires_grad_(True) if i in spec.grad_args and isinstance(a, torch.Tensor) else a
        for i, a in enumerate(args)
    )
    return args, bwd_args


def _incoming_gradient(output: torch.Tensor) -> torch.Tensor:
    """The gradient a forward+backward step feeds ``output``: 1 for a scalar (a loss, as ``loss.backward()``
    gives), random otherwise."""
    return torch.ones_like(output) if output.dim() == 0 else torch.randn_like(output)


def _autograd_step(
    fn: Callable[..., Any], args: tuple[Any, ...], grad_args: Sequence[int]
) -> Callable[[], Callable[[], Any]]:
    """A forward+backward step through autograd: ``torch.autograd.grad`` of the differentiable outputs."""

    def make() -> Callable[[], Any]:
        wrt = [args[i] for i in grad_args if isinstance(args[i], torch.Tensor)]
        outputs = [t for t in output_tensors(fn(*args)) if t.requires_grad]
        if not outputs:
            raise RuntimeError("no output requires grad, so there is no backward to measure")
        grads = [_incoming_gradient(t) for t in outputs]

        def step() -> Any:
            outs = [t for t in output_tensors(fn(*args)) if t.requires_grad]
            return torch.autograd.grad(outs, wrt, grads, allow_unused=True)

        return step

    return make


def _decision(op: Op, args: tuple[Any, ...], plan: Any) -> dict[str, tuple[TritonImpl, Config | None, float] | str]:
    """Per implementation timed for this bucket: (impl, its fastest config, tuned µs), or why it has none."""
    if plan.key is None:
        return {}
    entry = decision_cache(settings().cache_dir).get(plan.key)
    candidates = entry.get("candidates") if isinstance(entry, dict) else None
    if not isinstance(candidates, dict):
        return {}
    found: dict[str, tuple[TritonImpl, Config | None, float] | str] = {}
    for impl in op.implementations:
        best: tuple[TritonImpl, Config | None, float] | None = None
        failure = ""
        for config in impl.candidate_configs(args):
            value = candidates.get(CandidateResult(impl.name, config, "pass").label)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if best is None or value < best[2]:
                    best = (impl, config, float(value))
            elif isinstance(value, str):
                failure = failure or value
        if best is not None:
            found[impl.name] = best
        elif failure:
            found[impl.name] = failure
    return found


def _kernels_held(step: Callable[[], Any], device: torch.device) -> str:
    """For a forward+backward row of Triton kernels short of the bandwidth target: what the kernels its step
    launches hold (registers, local memory), compiled for this GPU and not run; or why that could not be read."""
    try:
        major, minor = torch.cuda.get_device_capability(device)
        return describe(step_resources(step), major * 10 + minor, backend.triton_version() or "?")
    except Exception as err:  # the row keeps its measurement without the note
        return f"; its kernels' resources not read: {type(err).__name__}: {err}"[:300]


def ran_note(rereads: Rereads, label: str) -> str:
    """What a forward+backward row's note says of the kernels that formed its gradient (the report reads it):
    ``"; backward ran: <label>"``, naming ``rereads.backward_op``'s kernels as ``rereads.gradient`` does."""
    return f"; {rereads.gradient} ran: {label}"


def _backward_ran(spec: BenchSpec, shape: tuple[int, ...], dtype: str, device: torch.device) -> str:
    """``"; backward ran: <candidate>"`` (:func:`ran_note`): the decision that tuning stored for the bucket of
    ``spec``'s backward op (``Rereads.backward_op``) at ``shape``, read without tuning, on inputs of the op's own
    ``make_inputs``; ``""`` where the spec names none or the bucket holds no decision (a layout the real call does
    not share)."""
    if spec.rereads is None:
        return ""
    try:
        op = get_op(spec.rereads.backward_op)
        if op.make_inputs is None:
            return ""
        plan = op.explain(*op.make_inputs(shape, DTYPES[dtype], device))
    except Exception:  # the row keeps its measurement without the note
        return ""
    if plan.reason is Reason.REFERENCE_FASTER:
        return ran_note(spec.rereads, "reference")
    if plan.reason not in (Reason.CACHED, Reason.TUNED) or plan.implementation is None:
        return ""
    return ran_note(spec.rereads, CandidateResult(plan.implementation.name, plan.config, "pass").label)


def _twin_ran(spec: BenchSpec, impl: _Impl) -> str:
    """:func:`ran_note` of the twin a ``triton:*`` row ran, where that twin's op forms the gradient
    (``Rereads.backward_op``); else ``""``."""
    if spec.rereads is None or impl.twin is None or impl.twin[0] != spec.rereads.backward_op:
        return ""
    return ran_note(spec.rereads, impl.twin[1])


def _direct_launch(impl: TritonImpl, config: Config | None, interpret: bool) -> Callable[..., Any]:
    if interpret:
        return lambda *a: run_candidate(impl, config, a, True, False)
    if impl.configs is not None:
        return functools.partial(impl.launcher, config=config)
    return impl.launcher


def _triton_impl(
    op: Op, args: tuple[Any, ...], choice: tuple[TritonImpl, Config | None, float], interpret: bool
) -> _Impl:
    impl, config, tuned_us = choice
    launch = _direct_launch(impl, config, interpret)
    label = CandidateResult(impl.name, config, "pass").label
    result = _Impl(f"triton:{impl.name}", lambda: launch(*args), note=f"{label}; tuned {tuned_us:.1f} us")
    declared = op.backward
    if declared is None:
        result.make_backward = None
        result.note += "; forward+backward: the op declares no Backward (autograd of the reference)"
        return result

    # As under eager autograd: where the Backward names a forward that also returns statistics for
    # the backward, the same implementation and configuration of that forward runs.
    stats_op = declared.forward_op(args)
    twin = next((i for i in stats_op.implementations if i.name == impl.name), None) if stats_op else None
    if twin is not None and stats_op is not None:
        forward_with_extras = _direct_launch(twin, config, interpret)
        result.note += f"; forward+backward: its forward as {stats_op.name}"
        result.twin = (stats_op.name, CandidateResult(twin.name, config, "pass").label)

    def make() -> Callable[[], Any]:
        outputs = output_tensors(launch(*args))
        grads = [_incoming_gradient(t) for t in outputs]
        grad: Any = grads[0] if len(grads) == 1 else tuple(grads)

        # Without grad, as autograd runs a backward (without create_graph): a declared backward may take
        # another path where its own result is to be differentiated (cross_entropy's recomputes the
        # gradient instead of using the one its forward wrote, which doubled this row's time on the H200).
        @torch.no_grad()
        def step() -> Any:
            if twin is None:
                return declared.grads(declared.save(args, launch(*args)), grad)
            assert stats_op is not None  # a twin was found in it
            y, *extras = forward_with_extras(*args)
            return declared.grads((*declared.save(args, y), *declared.kept(args, tuple(extras), stats_op)), grad)

        return step

    result.make_backward = make
    return result


def _liger_impl(
    spec: BenchSpec, fwd_args: tuple[Any, ...], bwd_args: tuple[Any, ...], version: str, ahead_note: str = ""
) -> _Impl | None:
    if spec.liger is None or not version:
        return None
    try:
        fwd_fn = spec.liger(fwd_args)
        bwd_fn = spec.liger(bwd_args)
    except ImportError as err:
        return _Impl("liger", skip=f"Liger-Kernel {version} has no counterpart: {err}")
    return _Impl(
        "liger",
        lambda: fwd_fn(*fwd_args),
        _autograd_step(bwd_fn, bwd_args, spec.grad_args),
        note=f"Liger-Kernel {version}{ahead_note}",
    )


# --- the run ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _bench_settings(interpret: bool) -> Iterator[None]:
    """Tuning on, fallback warnings and the launch log off, mode auto; restored afterwards."""
    before = settings()
    configure(tune=True, warn_fallback=False, log_path=None)
    try:
        with use_mode("auto"), use_interpreter(interpret), warnings.catch_warnings():
            warnings.simplefilter("ignore", KernelgateWarning)
            yield
    finally:
        configure(tune=before.tune, warn_fallback=before.warn_fallback, log_path=before.log_path)


@contextlib.contextmanager
def _dynamo_limits() -> Iterator[None]:
    """Room for one compiled graph per shape and dtype, and an error rather than a silent eager fallback."""
    config = torch._dynamo.config
    names = [n for n in ("recompile_limit", "accumulated_recompile_limit") if hasattr(config, n)]
    if not names:
        names = [n for n in ("cache_size_limit", "accumulated_cache_size_limit") if hasattr(config, n)]
    patch: dict[str, Any] = {n: 100_000 for n in names}
    for flag in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(config, flag):
            patch[flag] = True
            break
    with config.patch(**patch):
        yield


class _Runner:
    def __init__(
        self,
        device: torch.device,
        timing: _Timing,
        provenance: Provenance,
        *,
        backward: bool,
        compile: bool,
        compile_backend: str | Callable[..., Any],
        liger: bool,
        interpret: bool,
        deadline: float | None = None,
        compile_note: str = "",
        ahead_note: str = "",
    ) -> None:
        self.device = device
        self.timing = timing
        self.provenance = provenance
        self.directions = (FORWARD, FORWARD_BACKWARD) if backward else (FORWARD,)
        self.compile = compile
        self.compile_backend = compile_backend
        self._backend_name = (
            repr(compile_backend) if isinstance(compile_backend, str) else getattr(compile_backend, "__name__", "?")
        )
        # Liger-Kernel launches compiled Triton kernels: it runs on GPUs only.
        self.liger_version = provenance.liger_version if liger and device.type == "cuda" else ""
        self.interpret = interpret
        self.deadline = deadline  # time.monotonic() after which no case starts
        self.compile_note = compile_note  # how torch.compile's graphs were compiled, when ahead of the run
        # Said of kernelgate's and Liger-Kernel's rows where their kernels were compiled ahead of the run.
        self.ahead_note = ahead_note

    def op_rows(
        self, spec: BenchSpec, cases: Sequence[tuple[str, Case]], on_case: Callable[[], None]
    ) -> list[BenchRow]:
        op = get_op(spec.op)
        compiled: Callable[..., Any] | None = None
        compile_failure = ""
        if self.compile:
            compiled = torch.compile(op.reference, dynamic=False, backend=self.compile_backend)
        rows: list[BenchRow] = []
        for dtype, case in cases:
            if self.deadline is not None and time.monotonic() > self.deadline:
                rows.append(self.unmeasured_case(spec, dtype, case, "skipped", TIME_LIMIT_NOTE))
                on_case()
                continue
            try:
                case_rows, failure = self.case_rows(spec, op, compiled, compile_failure, dtype, case)
            except Exception as err:  # e.g. out of memory making the inputs: one row says so, the run goes on
                self._free()
                case_rows, failure = [self.failed_case(spec, dtype, case, err)], ""
            rows += case_rows
            if failure and not compile_failure:
                compile_failure = failure
            on_case()
        return rows

    def case_rows(
        self,
        spec: BenchSpec,
        op: Op,
        compiled: Callable[..., Any] | None,
        compile_failure: str,
        dtype: str,
        case: Case,
    ) -> tuple[list[BenchRow], str]:
        device = self.device
        fwd_args, bwd_args = case_args(spec, DTYPES[dtype], case, device)
        input_bytes = sum(a.numel() * a.element_size() for a in fwd_args if isinstance(a, torch.Tensor))
        regime = "latency" if input_bytes < self.timing.latency_bytes else "bandwidth"

        impls: list[_Impl] = [
            _Impl("eager", lambda: op.reference(*fwd_args), _autograd_step(op.reference, bwd_args, spec.grad_args))
        ]
        new_failure = ""
        if compiled is not None:
            if compile_failure:
                impls.append(_Impl("compile", skip=f"torch.compile failed at an earlier shape: {compile_failure}"))
            else:
                impls.append(
                    _Impl(
                        "compile",
                        lambda: compiled(*fwd_args),
                        _autograd_step(compiled, bwd_args, spec.grad_args),
                        note=f"torch.compile(dynamic=False, backend={self._backend_name}){self.compile_note}",
                    )
                )
        start = time.perf_counter()
        try:
            plan = op.plan(*fwd_args)
        except Exception as err:  # the row says what went wrong; the run goes on
            impls.append(_Impl("kernelgate", skip=f"planning failed: {type(err).__name__}: {err}"))
            plan = None
        tune_ms = (time.perf_counter() - start) * 1e3
        if plan is not None:
            config = ",".join(f"{k}={v}" for k, v in sorted(plan.config.items())) if plan.config else ""
            detail = f": {plan.detail}" if plan.detail and plan.implementation is None else ""
            chosen = plan.name + (f"[{config}]" if config else "")
            note = f"auto: {chosen} ({plan.reason}{detail}); planned in {tune_ms:.0f} ms{self.ahead_note}"
            kg_step = _autograd_step(op, bwd_args, spec.grad_args)
            impls.append(_Impl("kernelgate", lambda: op(*fwd_args), kg_step, note, setup_ms=tune_ms))
            for name, choice in _decision(op, fwd_args, plan).items():
                if isinstance(choice, str):
                    impls.append(_Impl(f"triton:{name}", skip=f"no configuration passed tuning: {choice}"))
                else:
                    impls.append(_triton_impl(op, fwd_args, choice, self.interpret))
        liger = _liger_impl(spec, fwd_args, bwd_args, self.liger_version, self.ahead_note)
        if liger is not None:
            impls.append(liger)

        rows: list[BenchRow] = []
        rows_n, length = spec.rows_and_length(case.shape)
        element = torch.empty((), dtype=DTYPES[dtype]).element_size()
        for direction in self.directions:
            nbytes = (spec.forward_bytes if direction == FORWARD else spec.forward_backward_bytes).count(
                case.shape, element
            )
            formula = (spec.forward_bytes if direction == FORWARD else spec.forward_backward_bytes).formula
            steps: dict[str, Callable[[], Any]] = {}
            results: dict[str, dict[str, Any]] = {}
            for impl in impls:
                base = {"status": "ok", "note": impl.note, "first_call_ms": math.nan}
                results[impl.name] = base
                if impl.skip:
                    base.update(status="skipped", note=impl.skip)
                    continue
                if direction == FORWARD_BACKWARD and impl.make_backward is None:
                    base.update(status="skipped", note=impl.note or "no forward+backward for this implementation")
                    continue
                try:
                    first = time.perf_counter()
                    step = impl.forward if direction == FORWARD else impl.make_backward()  # type: ignore[misc]
                    assert step is not None
                    step()
                    synchronize(device)
                    setup = impl.setup_ms if direction == FORWARD else 0.0
                    base["first_call_ms"] = (time.perf_counter() - first) * 1e3 + setup
                    steps[impl.name] = step
                except Exception as err:  # a failing implementation is a row, not the end of the run
                    message = f"{type(err).__name__}: {err}".replace("\n", " ")[:400]
                    if impl.name == "compile":
                        new_failure = new_failure or message
                        base.update(status="skipped", note=f"torch.compile failed: {message}")
                    else:
                        base.update(status="error", note=message)
                    self._free()
            samples: dict[str, list[float]] = {name: [] for name in steps}
            for _ in range(self.timing.repeats):  # rounds interleave the implementations
                for name, step in steps.items():
                    if name not in samples:
                        continue
                    try:
                        samples[name].append(_time_us(step, device, self.timing))
                    except Exception as err:
                        results[name].update(status="error", note=f"{type(err).__name__}: {err}"[:400])
                        del samples[name]
                        self._free()
            host = self._host_rounds(steps, samples, device) if regime == "latency" else {}
            for name, times in samples.items():
                step = steps[name]
                result = results[name]
                result["time_us"] = statistics.median(times)
                try:
                    if regime == "latency":
                        host_us = host[name]
                        if isinstance(host_us, Exception):
                            raise host_us
                        result["host_us"] = host_us
                    elif direction == FORWARD_BACKWARD and device.type == "cuda":
                        # The steady state of a training loop, reported beside the do_bench time.
                        result["host_us"] = per_call_us(step, device, max(1, self.timing.host_calls // 2))  # 50 steps
                    result["peak_mib"] = _peak_mib(step, device)
                    if name == "kernelgate" and direction == FORWARD_BACKWARD:
                        # Which path the timed steps took after the first: the Function or eager autograd.
                        route = op.step_route(*bwd_args)
                        result["note"] = f"{result['note']}; autograd step: {route.path}: {route.detail}"
                except Exception as err:
                    result["note"] = f"{result['note']}; host cost or memory not measured: {type(err).__name__}: {err}"
                    self._free()
            # The backward's decision is the case's, whichever row ran it: read once.
            backward_ran = (
                _backward_ran(spec, case.shape, dtype, device)
                if direction == FORWARD_BACKWARD and regime == "bandwidth"
                else ""
            )
            for impl in impls:
                r = results[impl.name]
                t = float(r.get("time_us", math.nan))
                gbps = nbytes / (t * 1e-6) / 1e9 if t > 0 else math.nan
                note = str(r["note"])
                if (
                    direction == FORWARD_BACKWARD
                    and impl.name.startswith("triton:")
                    and impl.name in steps
                    and regime == "bandwidth"
                    and device.type == "cuda"
                    and gbps / self.provenance.copy_gbps < TARGETS.forward_backward_fraction
                ):
                    note += _kernels_held(steps[impl.name], device)
                ours = impl.name == "kernelgate" or impl.name.startswith("triton:")
                twin_ran = _twin_ran(spec, impl) if direction == FORWARD_BACKWARD and regime == "bandwidth" else ""
                if twin_ran and impl.name in steps:
                    note += twin_ran  # its gradient came from the twin it ran, not from the op's decision
                elif backward_ran and ours and impl.name in steps:
                    note += backward_ran
                rows.append(
                    BenchRow(
                        op=spec.op,
                        dtype=dtype,
                        shape="x".join(map(str, case.shape)),
                        rows=rows_n,
                        row_length=length,
                        regime=regime,
                        target_bytes=case.target_bytes,
                        direction=direction,
                        impl=impl.name,
                        status=str(r["status"]),
                        time_us=round(t, 3),
                        host_us=round(float(r.get("host_us", math.nan)), 3),
                        bytes=nbytes,
                        byte_formula=formula,
                        gbps=_significant(gbps),
                        frac_of_copy=_significant(gbps / self.provenance.copy_gbps),
                        peak_mib=round(float(r.get("peak_mib", math.nan)), 2),
                        first_call_ms=round(float(r["first_call_ms"]), 2),
                        note=note,
                        **dataclasses.asdict(self.provenance),
                    )
                )
            steps.clear()
        impls.clear()
        self._free()
        return rows, new_failure

    def _host_rounds(
        self, steps: dict[str, Callable[[], Any]], samples: dict[str, list[float]], device: torch.device
    ) -> dict[str, float | Exception]:
        """Each measured implementation's host cost per call at a latency shape: the fastest of HOST_ROUNDS rounds
        of ``host_calls`` calls, the rounds interleaved across the implementations. One that raises gets its
        exception instead, which the caller reports in the row's note."""
        rounds: dict[str, list[float]] = {name: [] for name in samples}
        failed: dict[str, Exception] = {}
        for _ in range(HOST_ROUNDS):
            for name, times in rounds.items():
                if name in failed:
                    continue
                try:
                    times.append(per_call_us(steps[name], device, self.timing.host_calls))
                except Exception as err:
                    failed[name] = err
                    self._free()
        return {name: failed.get(name) or min(times) for name, times in rounds.items()}

    def failed_case(self, spec: BenchSpec, dtype: str, case: Case, err: Exception) -> BenchRow:
        """The row of a case that could not be measured at all."""
        note = f"the case could not be measured: {type(err).__name__}: {err}".replace("\n", " ")[:400]
        return self.unmeasured_case(spec, dtype, case, "error", note)

    def unmeasured_case(self, spec: BenchSpec, dtype: str, case: Case, status: str, note: str) -> BenchRow:
        """One row standing for a case that was not measured, with why."""
        rows_n, length = spec.rows_and_length(case.shape)
        return BenchRow(
            op=spec.op,
            dtype=dtype,
            shape="x".join(map(str, case.shape)),
            rows=rows_n,
            row_length=length,
            regime="",
            target_bytes=case.target_bytes,
            direction=FORWARD,
            impl="kernelgate",
            status=status,
            time_us=math.nan,
            host_us=math.nan,
            bytes=0,
            byte_formula=spec.forward_bytes.formula,
            gbps=math.nan,
            frac_of_copy=math.nan,
            peak_mib=math.nan,
            first_call_ms=math.nan,
            note=note,
            **dataclasses.asdict(self.provenance),
        )

    def _free(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def run(
    ops: Sequence[str] | None = None,
    dtypes: Sequence[str] | None = None,
    *,
    suite: Suite | Path | str | None = None,
    quick: bool = False,
    device: torch.device | str | None = None,
    backward: bool = True,
    compile: bool = True,
    compile_backend: str | Callable[..., Any] = "inductor",
    precompile_workers: int | None = None,
    liger: bool = True,
    interpret: bool = False,
    warmup_ms: int = 5,
    rep_ms: int = 20,
    hold_us: float = DEFAULT_HOLD_US,
    repeats: int = 1,
    cpu_repeats: int = 5,
    host_calls: int | None = None,
    latency_bytes: int = LATENCY_BYTES,
    time_limit_s: float | None = None,
    skip: Collection[tuple[str, str, str]] = (),
    console: Console | None = None,
    on_progress: Callable[[list[BenchRow]], object] | None = None,
) -> list[BenchRow]:
    """Measure ``ops`` (default: every registered op with a bench spec) and return one row per measurement.

    Args:
        ops: op names; each needs a bench spec (:mod:`kernelgate.bench.specs`) and must be registered.
        dtypes: ``float32``, ``float16``, ``bfloat16``; default: the suite's.
        suite: a :class:`Suite`, or the path of a suite file; default: the built-in suite.
        quick: the suite's short variant.
        device: default: the GPU if torch sees one, else the CPU.
        backward: also measure forward+backward.
        compile: also measure ``torch.compile`` of the reference.
        compile_backend: the ``backend`` given to ``torch.compile`` (a name or a callable).
        precompile_workers: on a GPU, processes that compile for the whole run before it measures
            (:mod:`kernelgate.bench.precompile`): torch.compile's graphs (inductor backend), every tuning
            candidate of the buckets kernelgate's calls meet, and Liger-Kernel's kernels, so that first calls and
            tuning load them from the caches; 0: each first call compiles; default (``None``):
            :func:`~kernelgate.bench.precompile.default_workers`.
        liger: also measure Liger-Kernel where it is installed and has the op.
        interpret: run the Triton implementations through Triton's interpreter (CPU tensors).
        warmup_ms, rep_ms: ``do_bench``'s warm-up and measuring time per measurement (GPU).
        hold_us: on a GPU, hold it busy at least this long after each L2 flush (longer for a call whose host issue
            takes longer) so that the host has issued the call before its start event runs (the time is then the
            device's alone; see :func:`_device_time_us`);
            default :data:`DEFAULT_HOLD_US`. 0: ``triton.testing.do_bench`` as it is, which counts the host's
            lateness past the flush.
        repeats: rounds per measurement, interleaving the implementations; the median is kept.
        cpu_repeats: calls timed per round off the GPU.
        host_calls: calls a round of the host-cost measurement (latency shapes: HOST_ROUNDS rounds, the fastest
            kept); default 100 on a GPU, 10 elsewhere.
        latency_bytes: shapes whose inputs total fewer bytes are the latency regime (host cost
            measured, no bandwidth target); default 64 MiB.
        time_limit_s: no case starts after this many seconds from the start of the run; the cases
            left get one ``skipped`` row each (the summary lists them). Default: no limit.
        skip: ``(op, dtype, shape)`` cases not to measure (``shape`` as in the CSV, ``"16384x4096"``),
            such as those an earlier run already measured.
        console: where progress and a table per op and dtype are printed; ``None``: silent.
        on_progress: called with every row so far after each op (to save partial results).

    Raises:
        BenchError: an unknown op or dtype, or a malformed suite.

    >>> from kernelgate.bench import ShapeGroup, Suite
    >>> tiny = Suite(("float32",), {"rowwise": (ShapeGroup(shapes=((2, 8),)),)})
    >>> rows = run(["softmax"], suite=tiny, device="cpu", backward=False, compile=False, cpu_repeats=1)
    >>> sorted({r.impl for r in rows}), rows[0].byte_formula
    (['eager', 'kernelgate'], '2*M*N*e: read x, write y')
    """
    specs = resolve_ops(ops)
    if isinstance(suite, (str, Path)):
        suite = load_suite(suite, quick=quick)
    chosen_suite = suite if suite is not None else default_suite(quick)
    chosen_dtypes = tuple(dtypes) if dtypes else chosen_suite.dtypes
    for d in chosen_dtypes:
        if d not in DTYPES:
            raise BenchError(f"dtype must be one of {', '.join(DTYPES)}; got {d!r}.")
    counts = {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "repeats": repeats, "cpu_repeats": cpu_repeats}
    if host_calls is not None:
        counts["host_calls"] = host_calls
    if precompile_workers is not None and precompile_workers < 0:
        raise BenchError(f"precompile_workers must be >= 0; got {precompile_workers}.")
    if not hold_us >= 0:
        raise BenchError(f"hold_us must be >= 0 microseconds; got {hold_us}.")
    if time_limit_s is not None and not time_limit_s > 0:
        raise BenchError(f"time_limit_s must be > 0 seconds; got {time_limit_s}.")
    run_start = time.monotonic()
    deadline = None if time_limit_s is None else run_start + time_limit_s
    for name, value in counts.items():
        if value < 1:
            raise BenchError(f"{name} must be >= 1; got {value}.")
    if device is None:
        device = "cuda" if torch.cuda.is_available() and not interpret else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if host_calls is None:
        host_calls = GPU_HOST_CALLS if device.type == "cuda" else CPU_HOST_CALLS
    todo = [
        (spec, [(d, c) for d in chosen_dtypes for c in chosen_suite.cases(spec.op, spec.family, spec.dims, d)])
        for spec in specs
    ]
    done = set(skip)
    plan = [
        (spec, kept)
        for spec, cases in todo
        if (kept := [(d, c) for d, c in cases if (spec.op, d, "x".join(map(str, c.shape))) not in done])
    ]
    timing = _Timing(warmup_ms, rep_ms, hold_us, cpu_repeats, repeats, host_calls, latency_bytes)
    if device.type == "cuda":
        timer = f"triton.testing.do_bench median (L2 flushed; warmup {warmup_ms} ms, rep {rep_ms} ms)"
        if hold_us > 0:
            timer = (
                f"device-time median as do_bench (L2 flushed, then the GPU held {hold_us:g} us, or "
                f"{HOLD_PER_ISSUE:g} times the call's host issue time where longer, so the host has issued the call "
                f"before its start event; warmup {warmup_ms} ms, rep {rep_ms} ms)"
            )
    else:
        timer = f"time.perf_counter median of {cpu_repeats} call(s)" + (" (Triton interpreter)" if interpret else "")
    timer += (
        f", {repeats} interleaved round(s); host cost: {host_calls} calls then one synchronise, at latency shapes the "
        f"fastest of {HOST_ROUNDS} rounds interleaved across the implementations"
    )
    from kernelgate import __version__

    with _bench_settings(interpret), _dynamo_limits():
        copy = _copy_gbps(device, timing)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        provenance = Provenance(
            device=str(device),
            gpu=backend.device_name(device),
            driver=_driver(device),
            torch_version=torch.__version__,
            triton_version=backend.triton_version() or "",
            kernelgate_version=__version__,
            kernelgate_commit=_commit(),
            liger_version=_liger_version(),
            timer=timer,
            copy_gbps=round(copy, 1),
            started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        compile_note = ahead_note = ""
        if precompile_workers != 0 and device.type == "cuda" and plan:
            workers = default_workers(device) if precompile_workers is None else precompile_workers
            inductor = compile and compile_backend == "inductor"
            ahead = precompile(
                plan,
                device,
                backward=backward,
                workers=workers,
                backend="inductor" if inductor else None,
                kernelgate=True,
                liger=liger and bool(provenance.liger_version),
            )
            if ahead.compiled and inductor:
                compile_note = f"; {ahead.compiled} of {ahead.jobs} cases' graphs compiled ahead by worker processes"
            if ahead.compiled:
                ahead_note = (
                    f"; its kernels compiled ahead by worker processes ({ahead.compiled} of {ahead.jobs} cases)"
                )
            if console is not None:
                console.print(str(ahead))
        runner = _Runner(
            device,
            timing,
            provenance,
            backward=backward,
            compile=compile,
            compile_backend=compile_backend,
            liger=liger,
            interpret=interpret,
            deadline=deadline,
            compile_note=compile_note,
            ahead_note=ahead_note,
        )
        if console is not None:
            console.print(
                f"kernelgate bench on {device} ({provenance.gpu}): copy {copy:.0f} GB/s; "
                f"{sum(len(c) for _, c in plan)} case(s) of {len(plan)} op(s)"
            )
        return _run_all(runner, plan, console, on_progress or (lambda rows: None), run_start)


def _run_all(
    runner: _Runner,
    plan: Sequence[tuple[BenchSpec, Sequence[tuple[str, Case]]]],
    console: Console | None,
    on_progress: Callable[[list[BenchRow]], object],
    run_start: float,
) -> list[BenchRow]:
    """Measure the plan's ops in turn; with a console, each op's tables and its time (and the run's so far, from
    ``run_start``, time.monotonic()'s: where a time limit falls among the ops) are printed as it ends."""
    rows: list[BenchRow] = []
    if console is None:
        for spec, cases in plan:
            rows += runner.op_rows(spec, cases, lambda: None)
            on_progress(rows)
        return rows
    from rich.progress import Progress

    # Redrawn between cases only: rich's own refresh thread would run beside the measurements. With
    # it running, a host-bound forward+backward step through a Python autograd.Function (whose
    # backward runs on autograd's device thread) took 502 instead of 280 us at 64x4096 bf16 on the
    # H200's host (benchmarks/autograd_step_conditions.py at abbd283; no change at 32768x1024 fp32),
    # which would weigh on Liger-Kernel, torch.compile and kernelgate alike.
    with Progress(console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("measuring", total=sum(len(c) for _, c in plan))

        def advance() -> None:
            progress.advance(task)
            progress.refresh()

        for spec, cases in plan:
            start = time.perf_counter()
            progress.update(task, description=spec.op, refresh=True)
            op_rows = runner.op_rows(spec, cases, advance)
            rows += op_rows
            for dtype in dict.fromkeys(d for d, _ in cases):
                print_table(progress.console, [r for r in op_rows if r.dtype == dtype], f"{spec.op} {dtype}")
            progress.console.print(
                f"{spec.op}: {time.perf_counter() - start:.0f} s ({time.monotonic() - run_start:.0f} s into the run)"
            )
            on_progress(rows)
    return rows
