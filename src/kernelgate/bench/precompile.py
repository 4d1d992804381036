"""torch.compile's graphs for a whole bench run, compiled before it in worker processes.

With ``dynamic=False`` torch.compile compiles each (op, dtype, shape, direction) on its first call:
at ac8287c that was 302 of the default suite's 727 s on the H200, one compile after another. Here
worker processes compile the same references on inputs of the same shapes, dtypes and strides before
any measurement starts (the GPU then has nothing to measure, so their own launches disturb nothing),
and the run's first calls find the graphs in inductor's on-disk caches (FX graph, AOT autograd,
Triton kernels) instead of compiling them. The run's own ``torch.compile`` is
unchanged: same configuration, same graphs, its first call still made (and recorded) by the run.

Workers compile in-process (``TORCHINDUCTOR_COMPILE_THREADS=1``, a setting the caches' keys ignore)
so that several of them do not each start a pool of compile processes.

    python -m kernelgate.bench.precompile < jobs.json     # what a worker runs
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from kernelgate.compile_ahead import usable_cpus

if TYPE_CHECKING:
    from kernelgate.bench.specs import BenchSpec
    from kernelgate.bench.suite import Case

__all__ = ["MAX_WORKERS", "WORKER_DEVICE_BYTES", "Precompiled", "default_workers", "precompile"]

# Worker processes: each holds a CUDA context (about 0.5 GB of device memory) and one core, and while it
# compiles a case, that case's inputs and its compiled step's memory: up to a few GiB at the default suite's
# largest (cross_entropy float32 at 2048x256000, 2 GiB of logits). default_workers leaves the run's own
# process a core and gives each worker WORKER_DEVICE_BYTES of the device's memory.
MAX_WORKERS = 16
WORKER_DEVICE_BYTES = 8 << 30
# Longest a run waits for its workers; what they have not compiled by then the run compiles itself.
TIMEOUT_S = 300.0


def default_workers(device: torch.device) -> int:
    """Workers :func:`precompile` starts by default: one fewer than the CPUs this process may use, at most
    MAX_WORKERS, and no more than ``device``'s memory holds at WORKER_DEVICE_BYTES each; at least 1.

    The workers compile one at a time each, so the CPUs bound the work: on the H200 machine (16 CPUs), 8
    workers compiled the default suite's 190 cases in 57 to 59 s while the other 8 CPUs idled.

    >>> 1 <= default_workers(torch.device("cpu")) <= MAX_WORKERS
    True
    """
    workers = min(MAX_WORKERS, usable_cpus() - 1)
    if device.type == "cuda":
        workers = min(workers, torch.cuda.get_device_properties(device).total_memory // WORKER_DEVICE_BYTES)
    return max(1, int(workers))


class Precompiled:
    """What :func:`precompile` did: ``seconds`` spent, ``jobs`` given out, how many were ``compiled``
    and how many ``failed`` (the run compiles whatever is missing itself, and reports any failure in
    its rows; a worker that died or ran out of time answers for none of its jobs)."""

    def __init__(self, seconds: float, jobs: int, compiled: int, failed: int) -> None:
        self.seconds, self.jobs, self.compiled, self.failed = seconds, jobs, compiled, failed

    def __str__(self) -> str:
        missing = self.jobs - self.compiled - self.failed
        tail = "".join(f", {n} {what}" for n, what in ((self.failed, "failed"), (missing, "not answered")) if n)
        return f"torch.compile ahead: {self.compiled} of {self.jobs} case(s) compiled in {self.seconds:.0f} s{tail}"


def precompile(
    plan: Sequence[tuple[BenchSpec, Sequence[tuple[str, Case]]]],
    device: torch.device,
    *,
    backward: bool,
    workers: int | None = None,
    backend: str = "inductor",
    timeout_s: float = TIMEOUT_S,
) -> Precompiled:
    """Compile every case of ``plan`` with torch.compile (inductor) in ``workers`` processes (default:
    :func:`default_workers`); wait for them.

    ``plan`` is the run's: (spec, [(dtype, case), ...]) per op. Each worker gets every ``workers``-th
    case, and compiles the forward and, with ``backward``, the forward+backward step as the run
    calls them. ``backend``: torch.compile's (only inductor's graphs are cached across processes;
    another backend serves tests of this plumbing).
    """
    cases = [(spec.op, dtype, list(case.shape)) for spec, op_cases in plan for dtype, case in op_cases]
    workers = default_workers(device) if workers is None else workers
    start = time.perf_counter()
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    compiled = failed = 0
    with contextlib.ExitStack() as files:
        running = []
        for index in range(min(workers, len(cases))):
            jobs = {"device": str(device), "backward": backward, "backend": backend, "cases": cases[index::workers]}
            replies = files.enter_context(tempfile.TemporaryFile("w+"))  # a file: a worker never blocks on a pipe
            proc = subprocess.Popen(
                [sys.executable, "-m", "kernelgate.bench.precompile"],
                stdin=subprocess.PIPE,
                stdout=replies,
                stderr=subprocess.DEVNULL,
                env=env,
                text=True,
            )
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(jobs))
            proc.stdin.close()
            running.append((proc, replies))
        for proc, replies in running:
            try:
                proc.wait(timeout=max(1.0, timeout_s - (time.perf_counter() - start)))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            replies.seek(0)
            for line in replies:
                compiled += line.startswith("ok ")
                failed += line.startswith("failed ")
    return Precompiled(time.perf_counter() - start, len(cases), compiled, failed)


def compile_cases(jobs: dict[str, Any]) -> list[str]:
    """Compile each of ``jobs["cases"]`` as the run will call it; one line per case, ``ok`` or ``failed ...``."""
    from kernelgate.bench.runner import _autograd_step, _dynamo_limits, case_args
    from kernelgate.bench.specs import SPECS
    from kernelgate.bench.suite import DTYPES, Case
    from kernelgate.op import get_op

    device = torch.device(jobs["device"])
    specs = {spec.op: spec for spec in SPECS}
    compiled: dict[str, Any] = {}
    lines = []
    with _dynamo_limits():
        for name, dtype, shape in jobs["cases"]:
            spec = specs[name]
            if name not in compiled:  # one compiled function per op, as the run keeps
                compiled[name] = torch.compile(get_op(name).reference, dynamic=False, backend=jobs["backend"])
            fn = compiled[name]
            try:
                fwd_args, bwd_args = case_args(spec, DTYPES[dtype], Case(tuple(shape)), device)
                fn(*fwd_args)
                if jobs["backward"]:
                    _autograd_step(fn, bwd_args, spec.grad_args)()()
                lines.append(f"ok {name} {dtype} {shape}")
            except Exception as err:  # the run meets the same failure and reports it in its rows
                lines.append(f"failed {name} {dtype} {shape}: {type(err).__name__}: {err}".replace("\n", " ")[:300])
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return lines


def main() -> int:
    """Worker entry: the jobs as JSON on stdin, one line per case on stdout."""
    for line in compile_cases(json.load(sys.stdin)):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
