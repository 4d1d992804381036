"""Measured selection: gate every candidate against the reference, time the ones that pass, pick.

For a new key (op, shape bucket, dtypes, layouts, device, versions, kernel source), the candidates
are the reference and every (Triton implementation, configuration) eligible for the inputs. Each
Triton candidate first runs on the inputs (clones of those the op mutates) into outputs filled with
NaN and is compared with the reference under the tolerance policy; a failing or crashing candidate
is excluded, with its error recorded. The rest are timed (GPU: ``triton.testing.do_bench``, L2
flushed, median; CPU: wall clock, median), and a Triton candidate replaces the reference only when
it is faster by the configured margin: ties go to the reference. A narrow lead in timings bound by
the host (see CONFIRM_WITHIN) must hold in a second timing, the candidate and the reference
alternating. On a GPU the candidates' kernels are first compiled in parallel
(:mod:`kernelgate.compile_ahead`), so the gate mostly loads them.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import torch

from kernelgate.compile_ahead import Outcome, compile_ahead, compile_here, count_compiles, default_workers
from kernelgate.config import Config, config_label
from kernelgate.dispatch import Reason
from kernelgate.launch import Unsupported, call_state
from kernelgate.settings import settings
from kernelgate.tolerance import assert_close, assert_close_normwise, assert_close_or_no_worse, magnitude, tolerance

if TYPE_CHECKING:
    from kernelgate.op import Op, TritonImpl

__all__ = [
    "CandidateResult",
    "Mismatch",
    "compare",
    "compile_candidates_here",
    "float64_truth",
    "output_tensors",
    "per_call_us",
    "run_candidate",
    "screen_us",
    "synchronize",
    "time_autograd_step",
    "time_us",
    "tune",
]

# Timing effort per candidate (milliseconds of warm-up and of measurement on the GPU).
GPU_WARMUP_MS = 5
GPU_REP_MS = 20
CPU_REPEATS = 5
HOST_CALLS = 50
# Host time is measured in full (3 x HOST_CALLS calls, each round then synchronised) only when the
# time to issue HOST_PROBE_CALLS calls shows it may decide the result: at least HOST_BOUND_FRACTION
# of the device time. Otherwise the full measurement only waits for the GPU: 150 calls of a 150 us
# kernel are 22 ms per candidate, about half of a backward bucket's tuning at 128 MiB.
HOST_PROBE_CALLS = 10
HOST_BOUND_FRACTION = 0.8
# On a GPU, with more passing candidates than FINALISTS, each is first screened (screen_us: the device's
# time, the median of SCREEN_ROUNDS calls, the rounds interleaved across the candidates, one synchronise in all),
# and only the fastest FINALISTS, plus the fastest configuration of each implementation, get the full timing
# above. Ranks from the screen are close to the full one's; the full timing, the host's included, decides. The
# screen leaves the host out: configurations of one implementation share its launcher, and each
# implementation's fastest is a finalist. In the default bench suite at d8fc470 on the H200, timing the passing
# candidates took 128 s of 313 s of tuning, about 35 candidates screened for 5 timed in full per bucket: by those
# counts, most of it was the screen's do_bench per candidate (1 ms warm-up, 3 ms measuring, then a host probe).
FINALISTS = 4
SCREEN_ROUNDS = 5
# The short timing of the head-to-head confirmation (CONFIRM_WITHIN), host included.
SCREEN_WARMUP_MS = 1
SCREEN_REP_MS = 3
# A Triton candidate that beats the reference by the margin, but takes at least CONFIRM_WITHIN of its time, where
# either timing is the host's (bounded_by_host), is timed again head to head with it: CONFIRM_ROUNDS rounds each,
# alternating (on a GPU with the short timing), and it wins only if the fastest rounds of each still differ by the
# margin. The fastest of many timed candidates is biased low by the timing's noise; the device's timings repeat
# within about 0.5 %, but where a call is bound by the host's launch time that noise is as large as the margin:
# on the H200, geglu float32 at 64x4096 was tuned to a kernel at 20.9 us against the reference's 22.8, and the
# bench then measured that kernel's call at 34.9 us against eager's 20.4 (benchmarks/results/h200/default-d156be4/).
# Each side's fastest round, not its median: the host's noise only adds time, and a median let two slow rounds of
# the host's decide. On the H200, rms_norm float32 65536x512's kernel (68.8 us against the reference's 91.7) timed
# 68.45, 127.41 and 130.7 us in its rounds against 91.26, 90.72 and 91.68, and the reference was kept at a 25 %
# loss (benchmarks/results/h200/norm-backward-9904764-5f9af52/).
CONFIRM_WITHIN = 0.75
CONFIRM_ROUNDS = 3
# Forward+backward steps timed back to back per round of the step route (time_autograd_step). Each round
# costs STEP_CALLS + 1 steps; a full do_bench and host timing of a step cost about ten times that.
STEP_CALLS = 10


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """How a result differs from the reference."""

    max_abs: float
    max_rel: float
    first_index: tuple[int, ...] | None
    output: int

    def __str__(self) -> str:
        where = f" first at index {list(self.first_index)}" if self.first_index is not None else ""
        out = f" in output {self.output}" if self.output else ""
        return f"max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g}{out};{where}"


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    """One candidate's fate in a selection."""

    implementation: str
    config: Config | None
    verdict: str  # "pass", "screened" (passed, slower in the screen), "mismatch", "error", "unsupported"
    time_us: float | None = None
    detail: str = ""
    screen_us: float | None = None  # its time in the screen, where there was one (see FINALISTS)

    @property
    def label(self) -> str:
        return self.implementation + (f"[{config_label(self.config)}]" if self.config else "")


def _outputs(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    return [r for r in result if isinstance(r, torch.Tensor)]


def compare(
    actual: Any,
    expected: Any,
    reduction_length: int,
    normwise: Sequence[int] = (),
    truth: Callable[[], Any] | None = None,
) -> Mismatch | None:
    """``None`` when every output matches its reference under the tolerance policy, else the mismatch.

    Outputs whose index is in ``normwise`` (sums that cancel, see ``Op(normwise_outputs=...)``)
    are compared by the norm of the error rather than element by element. ``truth`` (see
    :func:`float64_truth`), called at most once and only after an element falls outside the policy's
    bounds, gives the reference's outputs in float64: an output whose elements outside the bounds are
    each no further from it than the reference's (:func:`~kernelgate.tolerance.assert_close_or_no_worse`)
    matches.
    """
    got, want = _outputs(actual), _outputs(expected)
    if len(got) != len(want):
        return Mismatch(float("inf"), float("inf"), None, 0)
    exact: list[Any] | None = None
    for index, (a, e) in enumerate(zip(got, want, strict=True)):
        try:
            if a.shape != e.shape or a.dtype != e.dtype:
                raise AssertionError("shape or dtype differs")
            if index in normwise:
                assert_close_normwise(a, e, reduction_length=reduction_length)
                continue
            try:
                assert_close(a, e, reduction_length=reduction_length)
            except AssertionError:
                if truth is None or not e.dtype.is_floating_point:
                    raise
                exact = exact if exact is not None else _float64_outputs(truth, len(want))
                if exact[index] is None:
                    raise
                assert_close_or_no_worse(a, e, exact[index], reduction_length=reduction_length)
        except AssertionError:
            return _describe(a, e, index)
    return None


def float64_truth(op: Op, values: Sequence[Any]) -> Callable[[], Any] | None:
    """A function computing ``op``'s reference on ``values`` with their floating-point tensors copied to float64,
    once (later calls return the same outputs), for :func:`compare`; ``None`` for an op that writes into its
    arguments."""
    if op.mutates:
        return None

    @functools.cache
    def truth() -> Any:
        return op.run_reference(*map(_in_float64, values))

    return truth


def _in_float64(value: Any) -> Any:
    """A floating-point tensor copied to float64 (a copy even if it is float64); anything else as it is."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.float64, copy=True)
    return value


def _float64_outputs(truth: Callable[[], Any], count: int) -> list[Any]:
    """The outputs of ``truth()``, ``None`` each where it cannot give them (it raised: a reference without float64,
    out of memory), so that those outputs keep the policy's verdict."""
    try:
        outputs = _outputs(truth())
    except Exception:  # the policy's verdict stands without a float64 result
        return [None] * count
    if len(outputs) != count:
        return [None] * count
    return [o if isinstance(o, torch.Tensor) and o.dtype == torch.float64 else None for o in outputs]


def _describe(actual: torch.Tensor, expected: torch.Tensor, output: int) -> Mismatch:
    if actual.shape != expected.shape:
        return Mismatch(float("inf"), float("inf"), None, output)
    a, e = actual.double(), expected.double()
    diff = (a - e).abs()
    bad_nan = a.isnan() != e.isnan()
    diff = torch.where(a.isnan() & e.isnan(), torch.zeros_like(diff), diff)
    diff = torch.where(bad_nan, torch.full_like(diff, float("inf")), diff)
    rel = diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
    tol = torch.zeros_like(diff)
    bound = tolerance(expected.dtype) if expected.dtype.is_floating_point else None
    if bound is not None:
        tol = bound.atol * magnitude(expected) + bound.rtol * e.abs()
    bad = (diff > tol) | bad_nan
    first = tuple(int(i) for i in bad.nonzero()[0].tolist()) if bool(bad.any()) else None
    return Mismatch(float(diff.max()) if diff.numel() else 0.0, float(rel.max()) if rel.numel() else 0.0, first, output)


def _non_finite(values: Sequence[Any]) -> bool:
    """Whether a floating-point tensor among ``values`` holds inf or NaN (synchronises; tuning only)."""
    return any(
        isinstance(v, torch.Tensor) and v.dtype.is_floating_point and not bool(torch.isfinite(v).all()) for v in values
    )


def clone_args(values: Sequence[Any], mutated: Sequence[int]) -> tuple[Any, ...]:
    """``values`` with each mutated tensor replaced by a copy of the same size and strides."""
    if not mutated:
        return tuple(values)
    out = list(values)
    for i in mutated:
        t = values[i]
        if isinstance(t, torch.Tensor):
            out[i] = t.new_empty_strided(t.size(), t.stride()).copy_(t)
    return tuple(out)


def run_candidate(impl: TritonImpl, config: Config | None, values: Sequence[Any], interpret: bool, poison: bool) -> Any:
    """Run one Triton candidate; outputs allocated with ``kernelgate.empty*`` are NaN-filled when ``poison``."""
    state = call_state
    saved = state.interpret, state.poison
    state.interpret, state.poison = interpret, poison
    try:
        return impl.launcher(*values, config=config) if impl.configs is not None else impl.launcher(*values)
    finally:
        state.interpret, state.poison = saved


def time_us(fn: Callable[[], object], device: torch.device, *, screen: bool = False) -> float:
    """What one call of ``fn`` costs, in microseconds (``screen``: a shorter, rougher timing on a GPU).

    On a GPU: the larger of the device time (``do_bench``: L2 flushed, median) and the host time
    per call (calls issued back to back, then one synchronise), since a small kernel is bounded by
    how fast the host can launch it, which ``do_bench`` alone does not see. Elsewhere: wall clock.
    """
    if device.type in ("cuda", "xpu"):
        from triton.testing import do_bench

        warmup, rep = (SCREEN_WARMUP_MS, SCREEN_REP_MS) if screen else (GPU_WARMUP_MS, GPU_REP_MS)
        device_us = float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median")) * 1e3
        return bounded_by_host(fn, _synchronize_for(device), device_us)
    fn()
    times = []
    for _ in range(CPU_REPEATS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def screen_us(fns: Sequence[Callable[[], object]]) -> list[float]:
    """Each of ``fns``' device time on the current GPU, roughly, in microseconds (see FINALISTS): after one warm-up
    call each, SCREEN_ROUNDS rounds of one call of each, every call after an L2 flush and timed by events around
    it; the median of each one's rounds. One synchronise in all. The flush before each call keeps the device busy
    while the host issues it (a 256 MiB write, about 80 us on the H200), so a call's host time counts only beyond
    that."""
    from triton import runtime

    driver = runtime.driver.active
    device = driver.get_device_interface()
    cache = driver.get_empty_cache_for_benchmark()
    for fn in fns:
        fn()
    events = [
        [(device.Event(enable_timing=True), device.Event(enable_timing=True)) for _ in range(SCREEN_ROUNDS)]
        for _ in fns
    ]
    for round_ in range(SCREEN_ROUNDS):
        for fn, pairs in zip(fns, events, strict=True):
            start, end = pairs[round_]
            driver.clear_cache(cache)
            start.record()
            fn()
            end.record()
    device.synchronize()
    return [float(statistics.median(start.elapsed_time(end) for start, end in pairs)) * 1e3 for pairs in events]


def autograd_step(
    forward: Callable[..., Any], inputs: tuple[Any, ...], wanted: Sequence[torch.Tensor]
) -> Callable[[], object]:
    """One forward+backward step, as a function: ``forward(*inputs)`` then ``torch.autograd.grad`` of its outputs
    that require grad, with respect to ``wanted``, for incoming gradients of ones (made once, here)."""
    outputs = [t for t in output_tensors(forward(*inputs)) if t.requires_grad]
    grads = [torch.ones_like(t) for t in outputs]
    del outputs  # their graph and saved tensors are not held while the steps run

    def step() -> object:
        outs = [t for t in output_tensors(forward(*inputs)) if t.requires_grad]
        return torch.autograd.grad(outs, wanted, grads, allow_unused=True)

    return step


def time_autograd_step(
    forward: Callable[..., Any], inputs: tuple[Any, ...], wanted: Sequence[torch.Tensor], device: torch.device
) -> float:
    """What one forward+backward step (:func:`autograd_step`) costs in a training loop, in microseconds: after one
    step to warm up, STEP_CALLS steps issued back to back, then one synchronise, per step. Back to back, the host
    issues the next step while the device runs this one, so the time is the larger of the two, as in training (L2
    is not flushed between steps there either)."""
    step = autograd_step(forward, inputs, wanted)
    step()
    return per_call_us(step, device, STEP_CALLS)


def device_step_us(
    forward: Callable[..., Any],
    inputs: tuple[Any, ...],
    wanted: Sequence[torch.Tensor],
    device: torch.device,
    hold_us: float,
) -> float:
    """The device's time for one forward+backward step (:func:`autograd_step`) on a CUDA GPU, in microseconds: the
    median of STEP_CALLS steps, each issued while the GPU is held busy for ``hold_us`` and timed by events around
    it. With a hold longer than the host takes to issue the step, the host's time is not counted: what the step
    costs where other work keeps the GPU busy while the host issues it, as in a model."""
    step = autograd_step(forward, inputs, wanted)
    step()
    cycles = round(hold_us * spin_cycles_per_us(device))
    starts = [timing_event() for _ in range(STEP_CALLS)]
    ends = [timing_event() for _ in range(STEP_CALLS)]
    for first, last in zip(starts, ends, strict=True):
        spin(cycles)
        first.record()
        step()
        last.record()
    synchronize(device)
    return float(statistics.median(first.elapsed_time(last) for first, last in zip(starts, ends, strict=True))) * 1e3


@functools.cache
def spin_cycles_per_us(device: torch.device) -> float:
    """How many of :func:`spin`'s cycles the GPU spins per microsecond (measured once per device)."""
    start, end = timing_event(), timing_event()
    cycles = 2_000_000
    spin(cycles)  # the first call may include a module load
    start.record()
    spin(cycles)
    end.record()
    synchronize(device)
    return cycles / (float(start.elapsed_time(end)) * 1e3)


def timing_event() -> torch.cuda.Event:
    """A CUDA event that records time."""
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def spin(cycles: int) -> None:
    """Keep the current stream's GPU busy for about ``cycles`` clock cycles."""
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]


def per_call_us(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    """Microseconds per call of ``fn``: ``calls`` calls issued back to back, then one synchronise."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / calls * 1e6


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def output_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors an op returned: itself, or those of a tuple or list."""
    items = value if isinstance(value, tuple | list) else (value,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def _per_call_us(fn: Callable[[], object], sync: Callable[[], object], calls: int, *, wait: bool) -> float:
    """Host time per call of ``fn``, ``calls`` calls back to back after a synchronise: until the last is issued, or
    (``wait``) until the device has run them all."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter()
    sync()
    return ((time.perf_counter() if wait else issued) - start) / calls * 1e6


def _synchronize_for(device: torch.device) -> Callable[[], object]:
    return torch.cuda.synchronize if device.type == "cuda" else torch.xpu.synchronize


def bounded_by_host(fn: Callable[[], object], sync: Callable[[], object], device_us: float) -> float:
    """``device_us``, or the host time per call of ``fn`` where that is larger (calls back to back).

    A probe first times how long the host takes to issue HOST_PROBE_CALLS calls, without waiting for
    the GPU (a call that synchronises is timed with its wait, which only makes the probe cautious).
    Only when that reaches HOST_BOUND_FRACTION of ``device_us`` is the host timed in full: the
    median of three rounds of HOST_CALLS calls, each round synchronised.
    """
    if _per_call_us(fn, sync, HOST_PROBE_CALLS, wait=False) < HOST_BOUND_FRACTION * device_us:
        return device_us
    return max(device_us, statistics.median(_per_call_us(fn, sync, HOST_CALLS, wait=True) for _ in range(3)))


def _bound_by_host(fn: Callable[[], object], timed_us: float, device: torch.device) -> bool:
    """Whether a timing of ``fn`` (``timed_us``) is the host's: on a GPU, where issuing HOST_PROBE_CALLS calls takes
    HOST_BOUND_FRACTION of it or more; elsewhere always (the timing is the wall clock)."""
    if device.type not in ("cuda", "xpu"):
        return True
    return _per_call_us(fn, _synchronize_for(device), HOST_PROBE_CALLS, wait=False) >= HOST_BOUND_FRACTION * timed_us


def _head_to_head(
    candidate: Callable[[], object], reference: Callable[[], object], device: torch.device
) -> dict[str, list[float]]:
    """The candidate's and the reference's times in CONFIRM_ROUNDS rounds each, alternating (see CONFIRM_WITHIN)."""
    timings: dict[str, list[float]] = {"triton_us": [], "reference_us": []}
    for _ in range(CONFIRM_ROUNDS):
        timings["triton_us"].append(round(time_us(candidate, device, screen=True), 2))
        timings["reference_us"].append(round(time_us(reference, device, screen=True), 2))
    return timings


def _candidate_launches(op: Op, values: tuple[Any, ...], impls: Sequence[TritonImpl]) -> list[Callable[[], object]]:
    """A launch of each candidate on ``values``, each on its own copy of the tensors the op mutates, made when the
    launch is called and let go after it: made up front, the copies were held all at once (a logits-sized
    gradient buffer a candidate for cross_entropy_backward_into)."""

    def launch(impl: TritonImpl, config: Config | None) -> object:
        return run_candidate(impl, config, clone_args(values, op.mutated_positions), False, False)

    return [functools.partial(launch, impl, config) for impl in impls for config in impl.candidate_configs(values)]


def _compile_candidates(op: Op, values: tuple[Any, ...], impls: Sequence[TritonImpl]) -> Outcome:
    """Compile every candidate's kernels in parallel worker processes before the gate runs them."""
    workers = settings().compile_workers
    return compile_ahead(_candidate_launches(op, values, impls), default_workers() if workers is None else workers)


def compile_candidates_here(op: Op, values: tuple[Any, ...], impls: Sequence[TritonImpl]) -> Outcome:
    """Compile every candidate's kernels for ``values``' bucket in this process, tuning nothing (see
    :func:`kernelgate.compile_ahead.compiling_untuned_buckets`)."""
    return compile_here(_candidate_launches(op, values, impls))


def _time_passing(
    passed: Sequence[tuple[TritonImpl, Config | None, tuple[Any, ...]]], device: torch.device, interpret: bool
) -> list[CandidateResult]:
    """Time the candidates that passed the gate: screened first when there are many (see FINALISTS)."""

    def call(i: int) -> Callable[[], object]:
        impl, config, args = passed[i]
        return functools.partial(run_candidate, impl, config, args, interpret, False)

    finalists = set(range(len(passed)))
    screened: dict[int, float] = {}
    if device.type != "cpu" and len(passed) > FINALISTS:
        screened = dict(enumerate(screen_us([call(i) for i in range(len(passed))])))
        ranked = sorted(screened, key=screened.__getitem__)
        finalists = set(ranked[:FINALISTS])
        for name in {impl.name for impl, _, _ in passed}:
            finalists.add(next(i for i in ranked if passed[i][0].name == name))
    results = []
    for i, (impl, config, _) in enumerate(passed):
        if i in finalists:
            full_us = time_us(call(i), device)
            results.append(CandidateResult(impl.name, config, "pass", full_us, screen_us=screened.get(i)))
        else:
            detail = f"{screened[i]:.1f} us in the screen; not among the {FINALISTS} fastest"
            results.append(CandidateResult(impl.name, config, "screened", detail=detail, screen_us=screened[i]))
    return results


def tune(
    op: Op,
    values: tuple[Any, ...],
    device: torch.device,
    impls: Sequence[TritonImpl],
    interpret: bool,
    margin: float,
) -> tuple[dict[str, Any], list[CandidateResult]]:
    """Gate and time every candidate; return the cache entry describing the winners, and the results.

    Runs with ``device`` current: a kernel launches on the current device, and inputs on another GPU
    than the current one would otherwise be read from the wrong device and fail every gate.
    """
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            return _tune_here(op, values, device, impls, interpret, margin)
    return _tune_here(op, values, device, impls, interpret, margin)


def _alloc_retries(device: torch.device) -> int:
    """How many times the caching allocator has freed its cache to retry a failed device allocation on ``device`` (0
    off a CUDA GPU)."""
    if device.type != "cuda":
        return 0
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))


def _tune_here(
    op: Op,
    values: tuple[Any, ...],
    device: torch.device,
    impls: Sequence[TritonImpl],
    interpret: bool,
    margin: float,
) -> tuple[dict[str, Any], list[CandidateResult]]:
    """:func:`tune` on the current device."""
    reduction = op.reduction_length(*values)
    expected = op.run_reference(*clone_args(values, op.mutated_positions))
    truth = float64_truth(op, values)
    retries_before = _alloc_retries(device)
    started = time.perf_counter()
    ahead = _compile_candidates(op, values, impls) if device.type != "cpu" and not interpret else None
    compiled = time.perf_counter()
    results: list[CandidateResult] = []
    passed: list[tuple[TritonImpl, Config | None, tuple[Any, ...]]] = []
    unsupported: Unsupported | None = None
    with count_compiles() as gate_kernels:
        for impl in impls:
            for config in impl.candidate_configs(values):
                args = clone_args(values, op.mutated_positions)
                try:
                    out = run_candidate(impl, config, args, interpret, poison=True)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                except Unsupported as err:
                    unsupported = unsupported or err
                    results.append(CandidateResult(impl.name, config, "unsupported", detail=str(err)))
                    continue
                except Exception as err:  # a config that fails to compile or run is skipped, not fatal
                    detail = f"{type(err).__name__}: {err}"[:500]
                    results.append(CandidateResult(impl.name, config, "error", detail=detail))
                    continue
                mismatch = compare(out, expected, reduction, op.normwise_outputs, truth)
                if mismatch is not None:
                    results.append(CandidateResult(impl.name, config, "mismatch", detail=str(mismatch)))
                    continue
                # The passing candidates are timed on one copy of the tensors the op mutates, the first one's:
                # each keeping its own held a bucket's worth at once (cross_entropy_backward_into: a
                # logits-sized buffer a candidate).
                passed.append((impl, config, passed[0][2] if passed else args))
    gated = time.perf_counter()
    results += _time_passing(passed, device, interpret)
    if unsupported is not None and not any(r.verdict == "pass" for r in results):
        raise unsupported  # a limit of these exact inputs (not of the bucket): nothing is cached
    if not any(r.verdict == "pass" for r in results) and _non_finite(values):
        # Where inputs hold inf or NaN, a correct kernel and the reference may differ (torch's own
        # kernels differ by device there): the bucket is not condemned on such inputs.
        raise Unsupported(
            Reason.NON_FINITE,
            "no Triton candidate matched the reference on inputs holding inf or NaN; the decision cache is "
            "not written, so a later process tunes the bucket again (this one keeps the reference for these "
            "call signatures)",
        )
    timed = time.perf_counter()
    reference = functools.partial(op.run_reference, *clone_args(values, op.mutated_positions))
    reference_us = time_us(reference, device)
    passing = sorted((r for r in results if r.verdict == "pass"), key=lambda r: r.time_us or 0.0)
    best = passing[0] if passing else None
    head_to_head: dict[str, list[float]] | None = None
    if best is not None and best.time_us is not None:
        best_us, confirmed = best.time_us, ""
        impl, config, args = next(p for p in passed if p[0].name == best.implementation and p[1] == best.config)
        candidate = functools.partial(run_candidate, impl, config, args, interpret, False)
        if CONFIRM_WITHIN * reference_us <= best_us < reference_us * (1 - margin) and (
            _bound_by_host(candidate, best_us, device) or _bound_by_host(reference, reference_us, device)
        ):
            head_to_head = _head_to_head(candidate, reference, device)
            first = f" (first timed {best.time_us:.1f} us against {reference_us:.1f})"
            best_us, reference_us = min(head_to_head["triton_us"]), min(head_to_head["reference_us"])
            confirmed = f" in {CONFIRM_ROUNDS} rounds head to head{first}"
        if best_us < reference_us * (1 - margin):
            winner, why = (
                best,
                f"{best.label} {best_us:.1f} us beats the reference {reference_us:.1f} us by > {margin:.0%}",
            )
        else:
            winner, why = (
                None,
                f"reference {reference_us:.1f} us; best Triton {best.label} {best_us:.1f} us "
                f"is not faster by {margin:.0%}",
            )
        why += confirmed
    else:
        winner, why = None, "no Triton candidate passed the correctness gate"
    finalists_screen = {r.label: round(r.screen_us, 2) for r in results if r.verdict == "pass" and r.screen_us}
    alloc_retries = _alloc_retries(device) - retries_before
    entry = {
        "op": op.name,
        "implementation": winner.implementation if winner else "reference",
        "config": dict(winner.config) if winner and winner.config else None,
        "best_triton": {"implementation": best.implementation, "config": dict(best.config) if best.config else None}
        if best
        else None,
        "reason": why,
        "reference_us": round(reference_us, 2),
        # Where the best candidate's lead was confirmed (CONFIRM_WITHIN): each side's timings, alternating.
        **({"head_to_head": head_to_head} if head_to_head is not None else {}),
        # The finalists' times in the screen (the device's alone), beside their full timing in "candidates" (the
        # host's where larger): where a finalist's device time decides, a wide gap says one timing was disturbed.
        **({"finalists_screen_us": finalists_screen} if finalists_screen else {}),
        # Where the caching allocator freed its cache and retried a device allocation while tuning (each retry
        # synchronises the device, inside whichever timing it fell in).
        **({"alloc_retries": alloc_retries} if alloc_retries else {}),
        "candidates": {
            r.label: round(r.time_us, 2) if r.time_us is not None else f"{r.verdict}: {r.detail}"[:300] for r in results
        },
        "source": "tuned",
        # Where the tuning time went: compiling ahead (with how many of its kernels the workers
        # built), running each candidate once against the reference (loading, or compiling what
        # was not built ahead: gate_kernels counts each), timing the passing candidates (how many
        # passed, how many of them got the full timing after the short one), and timing the reference.
        "seconds": {
            "compile_ahead": round(compiled - started, 3),
            "compiled_ahead": f"{ahead.compiled}/{ahead.jobs}" if ahead is not None else "off",
            "gate": round(gated - compiled, 3),
            "gate_kernels": str(gate_kernels) if gate_kernels is not None and not interpret else "not counted",
            "timing": round(timed - gated, 3),
            "timed": f"{len(passed)} passed, {sum(r.verdict == 'pass' for r in results)} in full",
            "timing_reference": round(time.perf_counter() - timed, 3),
        },
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return entry, results
