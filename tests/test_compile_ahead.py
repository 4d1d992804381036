"""Compiling candidates ahead in worker processes: the workers build exactly what the process would.

On the CPU the process runs Triton with a compile-only driver for an H100-class target (sm_90), so
Triton's real compiler (ptxas included) runs here with no GPU; on a GPU the driver is the real one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

import kernelgate
from kernelgate import compile_ahead
from kernelgate.compile_ahead import CompileJob
from kernelgate.errors import SettingsError
from kernelgate.launch import launch


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def _softmax_launches(device: str, rows_per_program: list[int], warps: list[int]) -> list[Any]:
    from kernelgate.ops.softmax.kernels import _softmax_fwd_kernel

    x = torch.randn(64, 96, device=device)
    y = torch.empty_like(x)

    def one(rows: int, num_warps: int) -> Any:
        meta = {"ROWS": rows, "BLOCK_N": 128, "num_warps": num_warps}
        return lambda: launch(_softmax_fwd_kernel, (1,), x, y, 96, 96, 64, 96, **meta)

    return [one(r, w) for r in rows_per_program for w in warps]


def test_workers_compile_exactly_what_the_process_then_loads(triton_cache: Path) -> None:
    """Jobs are collected without compiling or running; the workers' cache entries are what the process uses.

    After the workers ran, compiling the same launches in the process adds nothing to the cache:
    every kernel came from the workers' entries (a different specialization would be a new entry).
    """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # Same configurations twice: a job is compiled once.
    launches = _softmax_launches(device, [1, 2, 4], [1, 2]) * 2
    with compile_ahead.collect_jobs() as jobs:
        for run in launches:
            run()
    assert len(jobs) == 12 and len(set(jobs)) == 6, "each launch asks once; nothing was compiled in between"
    assert {job.name for job in jobs} == {"_softmax_fwd_kernel"}
    assert not triton_cache.exists() or not any(triton_cache.rglob("*.cubin")), "collecting compiles nothing"

    outcome = compile_ahead.compile_ahead(launches, workers=2)
    assert (outcome.jobs, outcome.compiled) == (6, 6), outcome
    built = _files(triton_cache)
    assert len([p for p in built if p.suffix == ".cubin"]) == 6

    from kernelgate.backend import warm_compiled
    from kernelgate.ops.softmax.kernels import _softmax_fwd_kernel

    x = torch.randn(64, 96, device=device)
    with compile_ahead.count_compiles() as count:
        for rows in (1, 2, 4):
            for num_warps in (1, 2):
                meta = {"ROWS": rows, "BLOCK_N": 128, "num_warps": num_warps}
                warm_compiled(_softmax_fwd_kernel, (1,), (x, torch.empty_like(x), 96, 96, 64, 96), meta)
    assert _files(triton_cache) == built, "the process found every kernel in the workers' cache entries"
    assert count is not None and (count.compiled, count.loaded) == (0, 6), str(count)


def test_count_compiles_tells_compiled_from_loaded(triton_cache: Path) -> None:
    """Within count_compiles, a kernel Triton builds counts as compiled (with its compile time), one it then finds
    in its on-disk cache in a fresh in-memory state as loaded; the listener set before is restored and still called."""
    import triton

    from kernelgate.backend import warm_compiled
    from kernelgate.ops.softmax.kernels import _softmax_fwd_kernel

    x = torch.randn(8, 96, device="cuda" if torch.cuda.is_available() else "cpu")
    seen: list[bool] = []
    triton.knobs.compilation.listener = lambda **kwargs: seen.append(kwargs["cache_hit"])
    meta = {"ROWS": 16, "BLOCK_N": 128, "num_warps": 4}  # a configuration no other test compiles
    try:
        with compile_ahead.count_compiles() as count:
            warm_compiled(_softmax_fwd_kernel, (1,), (x, torch.empty_like(x), 96, 96, 8, 96), meta)
            _softmax_fwd_kernel.device_caches.clear()  # as a new process: Triton must look in its cache again
            warm_compiled(_softmax_fwd_kernel, (1,), (x, torch.empty_like(x), 96, 96, 8, 96), meta)
        assert triton.knobs.compilation.listener is not None and seen == [False, True]
    finally:
        triton.knobs.compilation.listener = None
    assert count is not None and (count.compiled, count.loaded) == (1, 1) and count.seconds_compiling > 0, str(count)


def test_a_job_that_fails_in_a_worker_is_reported_and_the_pool_goes_on(triton_cache: Path) -> None:
    """A job the worker cannot build gets its error back; the next job on the same worker still compiles."""
    with compile_ahead.collect_jobs() as jobs:
        _softmax_launches("cuda" if torch.cuda.is_available() else "cpu", [8], [4])[0]()
    from triton.runtime.driver import driver

    target = driver.active.get_current_target()
    bad = CompileJob("kernelgate.no_such_module", "_kernel", jobs[0].specialization)
    results = compile_ahead._pool.run((target.backend, target.arch, target.warp_size), [bad, jobs[0]], workers=1)
    assert results[0] is not None and "ModuleNotFoundError" in results[0]
    assert results[1] is None


def test_workers_that_cannot_start_turn_compiling_ahead_off(
    triton_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When every worker of a batch dies (here: an interpreter that exits at once), the process stops
    starting workers: later buckets compile in the process, without the cost of failed starts."""
    # A configuration no other test compiles, so this process has not built it yet.
    launches = _softmax_launches("cuda" if torch.cuda.is_available() else "cpu", [32], [2])
    monkeypatch.setattr(compile_ahead, "_pool", compile_ahead._Pool())
    monkeypatch.setattr(compile_ahead.sys, "executable", "/bin/false")
    first = compile_ahead.compile_ahead(launches, workers=2)
    assert (first.jobs, first.compiled) == (1, 0)
    assert compile_ahead._pool.broken is not None and compile_ahead._pool.broken.startswith("worker ")
    assert compile_ahead.compile_ahead(launches, workers=2) == compile_ahead.Outcome(0, 0, 0.0)


def test_a_worker_that_cannot_be_started_is_no_error(triton_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter path that does not exist makes compiling ahead a no-op with a reason, never an exception."""
    launches = _softmax_launches("cuda" if torch.cuda.is_available() else "cpu", [64], [2])
    monkeypatch.setattr(compile_ahead, "_pool", compile_ahead._Pool())
    monkeypatch.setattr(compile_ahead.sys, "executable", str(triton_cache / "no-such-python"))
    outcome = compile_ahead.compile_ahead(launches, workers=2)
    assert (outcome.jobs, outcome.compiled) == (1, 0)
    assert compile_ahead._pool.broken is not None and compile_ahead._pool.broken.startswith("worker could not start")


def test_no_workers_compiles_nothing_ahead(triton_cache: Path) -> None:
    outcome = compile_ahead.compile_ahead(_softmax_launches("cpu", [1], [1]), workers=0)
    assert outcome == compile_ahead.Outcome(0, 0, 0.0)
    assert not triton_cache.exists() or not _files(triton_cache)


def test_compile_workers_setting() -> None:
    """KERNELGATE_COMPILE_WORKERS: unset means automatic (None), an integer >= 0 is taken, else a clear error."""
    assert kernelgate.Settings.from_env({}).compile_workers is None
    assert kernelgate.Settings.from_env({"KERNELGATE_COMPILE_WORKERS": "0"}).compile_workers == 0
    assert kernelgate.Settings.from_env({"KERNELGATE_COMPILE_WORKERS": " 4 "}).compile_workers == 4
    with pytest.raises(SettingsError, match=r"KERNELGATE_COMPILE_WORKERS must be an integer; got 'many'"):
        kernelgate.Settings.from_env({"KERNELGATE_COMPILE_WORKERS": "many"})
    with pytest.raises(SettingsError, match=r"must be an integer >= 0; got -1"):
        kernelgate.configure(compile_workers=-1)
    assert 0 <= compile_ahead.default_workers() <= 16
    assert compile_ahead.default_workers() <= (os.cpu_count() or 1)


def _as_if_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> str:
    """The device to test on: the GPU where there is one, else CPU tensors taken as a GPU's by dispatch, so that a
    plan is made for them (the compile-only driver of ``triton_cache`` compiles for sm_90; nothing may launch)."""
    if torch.cuda.is_available():
        return "cuda"
    import dataclasses

    from kernelgate import backend, op

    monkeypatch.setattr(op, "_GPU_DEVICE_TYPES", (*op._GPU_DEVICE_TYPES, "cpu"))
    status = dataclasses.replace(backend.status(), target="cuda", driver_error=None)
    monkeypatch.setattr(backend, "status", lambda: status)
    return "cpu"


def test_an_untuned_bucket_compiles_its_candidates_for_a_later_process(
    triton_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within compiling_untuned_buckets and with tuning off, planning a new bucket compiles every candidate of it
    into Triton's cache, decides and caches nothing, and a process that then tunes the bucket loads every kernel
    from the cache. explain() compiles nothing."""
    from kernelgate.ops.softmax import softmax
    from kernelgate.selection import _candidate_launches

    device = _as_if_on_a_gpu(monkeypatch)
    kernelgate.configure(tune=False)
    x = torch.randn(8, 200, device=device)  # rows of 200: a length no other test compiles
    with compile_ahead.compiling_untuned_buckets():
        assert compile_ahead.compiling_untuned()
        kernelgate.softmax.explain(torch.randn(8, 232, device=device), -1)
        assert not triton_cache.exists() or not any(triton_cache.rglob("*.cubin")), "explain() compiles nothing"
        plan = softmax.plan(x, -1)
    assert not compile_ahead.compiling_untuned()
    assert plan.reason is kernelgate.Reason.DEFAULT_CONFIG, plan
    eligible, _ = softmax._eligible((x, -1), x.device, "auto", False)
    launches = _candidate_launches(softmax, (x, -1), eligible)
    kernels = len({p for p in triton_cache.rglob("*.cubin")})
    assert len(launches) > kernels > 1, "every candidate's kernel was compiled (several share one)"
    assert f"; {kernels} of its candidates' {kernels} kernels compiled ahead" in plan.detail, plan.detail
    kernelgate.configure(tune=True)
    assert softmax.explain(x, -1).reason is kernelgate.Reason.DEFAULT_CONFIG, "no decision was cached"
    for impl in eligible:  # as a new process: nothing in memory, so Triton looks in its cache
        for kernel in impl.kernels:
            kernel.resolve().device_caches.clear()
    with compile_ahead.count_compiles() as count:
        again = compile_ahead.compile_here(launches)
    assert (again.jobs, again.compiled) == (kernels, kernels)
    assert count is not None and (count.compiled, count.loaded) == (0, kernels), str(count)


def test_a_candidate_launch_copies_the_mutated_tensors_when_called_and_lets_them_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Compiling ahead builds a launch per candidate; each works on its own copy of the tensors the op writes in
    place (cross_entropy_backward_into's dlogits), made when the launch runs, not when the list is built, so the
    copies of a bucket's candidates are never all held at once (a logits-sized buffer each)."""
    import weakref

    from kernelgate import selection
    from kernelgate.ops.cross_entropy import cross_entropy_backward_into as op

    device = torch.device(_as_if_on_a_gpu(monkeypatch))
    values = (torch.ones((), device=device), *op.make_inputs((4, 64), torch.float32, device)[1:])  # a unit gradient
    (dlogits_at,) = op.mutated_positions
    eligible, plan = op._eligible(values, device, "auto", False)
    assert eligible, plan
    copies: list[weakref.ref[torch.Tensor]] = []
    alive_at_each_call: list[int] = []

    def run_candidate(impl: Any, config: Any, args: tuple[Any, ...], interpret: bool, poison: bool) -> None:
        alive_at_each_call.append(sum(ref() is not None for ref in copies))
        assert args[dlogits_at] is not values[dlogits_at] and torch.equal(args[dlogits_at], values[dlogits_at])
        copies.append(weakref.ref(args[dlogits_at]))

    monkeypatch.setattr(selection, "run_candidate", run_candidate)
    launches = selection._candidate_launches(op, values, eligible)
    assert len(launches) > 1
    for candidate in launches:
        candidate()
    assert alive_at_each_call == [0] * len(launches), alive_at_each_call


def test_the_passing_candidates_are_timed_on_one_copy_of_the_mutated_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tuning gates each candidate on its own copy of the tensors the op writes in place, then times the passing
    ones on one copy (the first's) rather than keeping a copy each (a logits-sized buffer a candidate for
    cross_entropy_backward_into), and never on the caller's tensor."""
    from kernelgate import selection
    from kernelgate.ops.cross_entropy import cross_entropy_backward_into as op

    cpu = torch.device("cpu")
    values = (torch.ones(()), *op.make_inputs((4, 64), torch.float32, cpu)[1:])  # a unit gradient
    (dlogits_at,) = op.mutated_positions
    eligible, plan = op._eligible(values, cpu, "auto", True)
    assert eligible, plan
    timed: list[Any] = []
    time_passing = selection._time_passing

    def record(passed: Any, *args: Any) -> Any:
        timed.extend(passed)
        return time_passing(passed, *args)

    monkeypatch.setattr(selection, "_time_passing", record)
    selection.tune(op, values, cpu, eligible, True, 0.02)
    assert len(timed) > 1, "several candidates passed the gate"
    assert len({id(args[dlogits_at]) for _, _, args in timed}) == 1
    assert timed[0][2][dlogits_at] is not values[dlogits_at]
