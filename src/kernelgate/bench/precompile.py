"""A bench run's compiling, done before it in worker processes: torch.compile's graphs, kernelgate's candidates
and Liger-Kernel's kernels.

With ``dynamic=False`` torch.compile compiles each (op, dtype, shape, direction) on its first call:
at ac8287c that was 302 of the default suite's 727 s on the H200, one compile after another. Here
worker processes compile the same references on inputs of the same shapes, dtypes and strides before
any measurement starts (the GPU then has nothing to measure, so their own launches disturb nothing),
and the run's first calls find the graphs in inductor's on-disk caches (FX graph, AOT autograd,
Triton kernels) instead of compiling them. The run's own ``torch.compile`` is
unchanged: same configuration, same graphs, its first call still made (and recorded) by the run.

The same workers call kernelgate's op on each case, forward and forward+backward, with tuning off and
:func:`~kernelgate.compile_ahead.compiling_untuned_buckets` on: every bucket the calls meet, the backward's
included, has all its tuning candidates compiled into Triton's on-disk cache, and the run's tuning then loads
them. Bucket by bucket in the run, the compiling waited on each bucket's slowest kernel: at ae7fd03 on the
H200 it took 142.5 of the 282 s the default suite spent tuning, for about 4,450 kernels. The workers tune and
cache nothing (their decision cache is a scratch directory). They also call Liger-Kernel's functions once on
each case, so that its Triton kernels, compiled on first call, are in the cache too (53 s of first calls at
ae7fd03).

Workers compile in-process (``TORCHINDUCTOR_COMPILE_THREADS=1``, a setting the caches' keys ignore)
so that several of them do not each start a pool of compile processes.

    python -m kernelgate.bench.precompile < jobs.json     # what a worker runs
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
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
# process a core and gives each worker WORKER_DEVICE_BYTES of the device's memory. At 8 GiB the H100 machine ran 9
# workers on its 16 CPUs, and its precompile took 243 s (96385aa); at 6 GiB it runs 13. A worker lets a case's
# tensors go before the next case's are made, and reports the most its allocator held (the console line's "at most").
MAX_WORKERS = 16
WORKER_DEVICE_BYTES = 6 << 30
# A queued group of cases (precompile's queue folder); a worker claims one by renaming it.
GROUP_SUFFIX = ".group"
# Longest a run waits for its workers; what they have not compiled by then the run compiles itself.
TIMEOUT_S = 300.0
# A step that runs out of device memory is tried again this many times, after the worker frees its cached memory and
# waits OOM_WAIT_S times the attempt's number: the other workers' peaks pass (each frees its cache after every case).
# On an H100 at 96385aa one case of the default suite failed so (cross_entropy float32 8192x32000, 1000 MiB asked with
# 231 MiB free among 9 workers) and was left to the run to compile.
OOM_RETRIES = 2
OOM_WAIT_S = 5.0


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
    its rows; a worker that died or ran out of time answers for none of its jobs); ``parts``: what was
    compiled ahead (torch.compile's graphs, kernelgate's candidates, Liger-Kernel's kernels); ``failed_by``: of the
    failed cases, how many failed in each part (Liger-Kernel refusing a shape is one); ``first_failure``: the first
    failed case and its error as its worker wrote them (at most 300 characters), shown after the counts;
    ``part_seconds``: the workers' seconds in each part, summed over them (where the precompile's time goes);
    ``workers``: how many ran; ``worker_seconds``: each answering worker's own time, start to last case (how evenly
    the work was shared); ``peak_device_bytes``: the most device memory one worker's allocator held at once (what a
    worker needs, against WORKER_DEVICE_BYTES), for ``peak_case``."""

    def __init__(
        self,
        seconds: float,
        jobs: int,
        compiled: int,
        failed: int,
        parts: Sequence[str] = ("torch.compile",),
        failed_by: Mapping[str, int] | None = None,
        first_failure: str = "",
        part_seconds: Mapping[str, float] | None = None,
        workers: int = 0,
        worker_seconds: Sequence[float] = (),
        peak_device_bytes: int = 0,
        peak_case: str = "",
    ) -> None:
        self.seconds, self.jobs, self.compiled, self.failed = seconds, jobs, compiled, failed
        self.part_seconds = dict(part_seconds or {})
        self.workers = workers
        self.worker_seconds = sorted(worker_seconds)
        self.peak_device_bytes, self.peak_case = peak_device_bytes, peak_case
        self.parts = tuple(parts)
        self.failed_by = dict(failed_by or {})
        self.first_failure = first_failure

    def __str__(self) -> str:
        missing = self.jobs - self.compiled - self.failed
        which = ", ".join(f"{part} {n}" for part, n in self.failed_by.items() if n)
        failed = f"failed ({which})" if which else "failed"
        tail = "".join(f", {n} {what}" for n, what in ((self.failed, failed), (missing, "not answered")) if n)
        first = f"; the first: {self.first_failure}" if self.failed and self.first_failure else ""
        by = f" by {self.workers} worker process{'es' if self.workers != 1 else ''}" if self.workers else ""
        spent = ", ".join(f"{part} {s:.0f} s" for part, s in self.part_seconds.items())
        each = []  # one worker's span and memory: how evenly the work was shared, what a worker needs
        if self.worker_seconds:
            fastest, slowest = round(self.worker_seconds[0]), round(self.worker_seconds[-1])
            each.append(f"{fastest} s" if fastest == slowest else f"{fastest} to {slowest} s")
        if self.peak_device_bytes:
            at = f" ({self.peak_case})" if self.peak_case else ""
            each.append(f"at most {self.peak_device_bytes / (1 << 30):.1f} GiB of device memory{at}")
        notes = ([f"their time: {spent}"] if spent else []) + ([f"a worker's {', '.join(each)}"] if each else [])
        detail = f" ({'; '.join(notes)})" if notes else ""
        return (
            f"{', '.join(self.parts)} ahead: {self.compiled} of {self.jobs} case(s) compiled in "
            f"{self.seconds:.0f} s{by}{detail}{tail}{first}"
        )


def precompile(
    plan: Sequence[tuple[BenchSpec, Sequence[tuple[str, Case]]]],
    device: torch.device,
    *,
    backward: bool,
    workers: int | None = None,
    backend: str | None = "inductor",
    kernelgate: bool = False,
    liger: bool = False,
    timeout_s: float = TIMEOUT_S,
) -> Precompiled:
    """Compile every case of ``plan`` in ``workers`` processes (default: :func:`default_workers`); wait for them.

    ``plan`` is the run's: (spec, [(dtype, case), ...]) per op. Its cases are grouped by op, dtype and row length
    (whose kernels are mostly the same, so one worker compiles them once), and the groups queued, the largest and
    then the longest rows (the most candidates) first: each worker takes the next group when it is done with one,
    so the workers finish about together. (Dealt out before they started, by count, the same cases kept the
    H100's slowest of 13 workers busy for 140 s and its fastest for 95.) Each worker compiles the forward and,
    with ``backward``, the forward+backward step as the run calls them: with torch.compile and ``backend`` (only
    inductor's graphs are cached across processes; another backend serves tests of this plumbing; ``None``: not
    compiled), with ``kernelgate``'s candidates, with ``liger``'s kernels.
    """
    cases = [(spec.op, dtype, list(case.shape)) for spec, op_cases in plan for dtype, case in op_cases]
    specs = {spec.op: spec for spec, _ in plan}
    groups: dict[tuple[str, str, int], list[Any]] = {}
    for op, dtype, shape in cases:
        groups.setdefault((op, dtype, specs[op].rows_and_length(tuple(shape))[1]), []).append([op, dtype, shape])
    queued = [groups[key] for key in sorted(groups, key=lambda key: (len(groups[key]), key[2]), reverse=True)]
    workers = default_workers(device) if workers is None else workers
    parts = [
        name
        for name, wanted in (("torch.compile", backend), ("kernelgate", kernelgate), ("Liger-Kernel", liger))
        if wanted
    ]
    start = time.perf_counter()
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    compiled = failed = 0
    failed_by = dict.fromkeys(parts, 0)  # a failing part's lines name it: "failed op dtype shape: part: error"
    part_seconds: dict[str, float] = {}  # each worker's last line: "seconds {part: seconds, ...}"
    # and the line before it: "worker {"seconds": s, "peak_device_bytes": n, "peak_case": "op dtype shape"}"
    worker_seconds: list[float] = []
    peak_device_bytes, peak_case = 0, ""
    first_failure = ""  # what the first failed case's line says (the run's output shows it)
    with contextlib.ExitStack() as files:
        queue = Path(files.enter_context(tempfile.TemporaryDirectory(prefix="kernelgate-precompile-queue-")))
        for position, group in enumerate(queued):
            (queue / f"{position:06d}{GROUP_SUFFIX}").write_text(json.dumps(group))
        jobs = {
            "device": str(device),
            "backward": backward,
            "backend": backend,
            "kernelgate": kernelgate,
            "liger": liger,
            "queue": str(queue),
        }
        running = []
        for _ in range(max(1, min(workers, len(queued))) if cases else 0):
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
                if line.startswith("seconds "):
                    for part, spent in json.loads(line.removeprefix("seconds ")).items():
                        part_seconds[part] = part_seconds.get(part, 0.0) + spent
                    continue
                if line.startswith("worker "):
                    worker = json.loads(line.removeprefix("worker "))
                    worker_seconds.append(worker["seconds"])
                    if worker["peak_device_bytes"] > peak_device_bytes:
                        peak_device_bytes, peak_case = worker["peak_device_bytes"], worker.get("peak_case", "")
                    continue
                compiled += line.startswith("ok ")
                if line.startswith("failed "):
                    failed += 1
                    first_failure = first_failure or line.removeprefix("failed ").strip()
                    for part in failed_by:
                        failed_by[part] += f": {part}: " in line or f"; {part}: " in line
    return Precompiled(
        time.perf_counter() - start,
        len(cases),
        compiled,
        failed,
        parts,
        failed_by,
        first_failure,
        part_seconds,
        len(running),
        worker_seconds,
        peak_device_bytes,
        peak_case,
    )


def claimed_cases(queue: Path) -> Iterator[list[Any]]:
    """The cases of each group in ``queue`` (a folder of ``NNNNNN.group`` files, each a JSON list of cases) this
    process claims, in the folder's order: a group is claimed by renaming its file, which one process alone can do,
    so the workers sharing the folder each compile a group once between them, taking the next when done."""
    while True:
        for path in sorted(queue.glob(f"*{GROUP_SUFFIX}")):
            mine = path.with_name(f"{path.name}.{os.getpid()}")
            try:
                path.rename(mine)
            except OSError:  # another worker took it first
                continue
            yield from json.loads(mine.read_text())
            break
        else:
            return


def compile_cases(
    jobs: dict[str, Any],
    cases: Iterable[list[Any]],
    part_seconds: dict[str, float] | None = None,
    peak: dict[str, Any] | None = None,
) -> list[str]:
    """Compile each of ``cases`` (``[op, dtype, shape]``; a worker's: those it claims, :func:`claimed_cases`) as the
    run will call it, as ``jobs`` asks; one line per case, ``ok`` or ``failed ...``. The seconds each part's steps
    took are added to ``part_seconds``; on a GPU, ``peak`` gets the most device memory the allocator held for one
    case (``bytes``) and which case (``case``)."""
    from kernelgate.bench.runner import _dynamo_limits
    from kernelgate.bench.specs import SPECS
    from kernelgate.compile_ahead import compiling_untuned_buckets
    from kernelgate.dispatch import use_mode
    from kernelgate.settings import configure, settings

    device = torch.device(jobs["device"])
    specs = {spec.op: spec for spec in SPECS}
    compiled: dict[str, Any] = {}
    lines = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(_dynamo_limits())
        if jobs.get("kernelgate"):
            # Untuned, so nothing is timed here and no decision made: a scratch cache, the launch log off.
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="kernelgate-precompile-"))
            stack.callback(configure, **dataclasses.asdict(settings()))
            configure(tune=False, warn_fallback=False, log_path=None, cache_dir=Path(scratch))
            stack.enter_context(use_mode("auto"))
            stack.enter_context(compiling_untuned_buckets())
        for name, dtype, shape in cases:
            lines.append(_compile_case(jobs, specs[name], dtype, shape, compiled, part_seconds))
            # The case's tensors went with _compile_case's frame, so its memory can be handed back. (Held while the
            # next case's were made, they doubled a worker's peak wherever a large case came before another.)
            if device.type == "cuda":
                held = torch.cuda.max_memory_reserved(device)
                if peak is not None and held > peak.get("bytes", 0):
                    peak.update(bytes=held, case=f"{name} {dtype} {shape}")
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
    return lines


def _compile_case(
    jobs: dict[str, Any],
    spec: BenchSpec,
    dtype: str,
    shape: list[int],
    compiled: dict[str, Any],
    part_seconds: dict[str, float] | None,
) -> str:
    """Compile one case as the run will call it (``compiled``: the torch.compile'd reference per op, made on first
    use); ``ok ...`` or ``failed ...`` with each failing part's error."""
    from kernelgate.bench.runner import case_args
    from kernelgate.bench.suite import DTYPES, Case
    from kernelgate.op import get_op

    name, device = spec.op, torch.device(jobs["device"])
    try:
        fwd_args, bwd_args = case_args(spec, DTYPES[dtype], Case(tuple(shape)), device)
        if jobs.get("backend") and name not in compiled:  # one compiled function per op, as the run keeps
            compiled[name] = torch.compile(get_op(name).reference, dynamic=False, backend=jobs["backend"])
        steps = _case_steps(jobs, spec, compiled.get(name), fwd_args, bwd_args)
    except Exception as err:  # the run meets the same failure and reports it in its rows
        return f"failed {name} {dtype} {shape}: {type(err).__name__}: {err}".replace("\n", " ")[:300]
    failures = []
    for part, step in steps:
        started = time.perf_counter()
        try:
            _run_with_memory_retries(step, device)
        except Exception as err:
            failures.append(f"{part}: {type(err).__name__}: {err}")
        if part_seconds is not None:
            part_seconds[part] = part_seconds.get(part, 0.0) + time.perf_counter() - started
    if failures:
        return f"failed {name} {dtype} {shape}: {'; '.join(failures)}".replace("\n", " ")[:300]
    return f"ok {name} {dtype} {shape}"


def _run_with_memory_retries(step: Callable[[], Any], device: torch.device) -> None:
    """``step()``, tried again up to OOM_RETRIES times where it runs out of device memory (the last error raised)."""
    for attempt in range(OOM_RETRIES + 1):
        try:
            step()
            return
        except torch.OutOfMemoryError:
            if attempt == OOM_RETRIES:
                raise
        if device.type == "cuda":
            torch.cuda.empty_cache()
        time.sleep(OOM_WAIT_S * (attempt + 1))


def _case_steps(
    jobs: dict[str, Any],
    spec: BenchSpec,
    compiled: Callable[..., Any] | None,
    fwd_args: tuple[Any, ...],
    bwd_args: tuple[Any, ...],
) -> list[tuple[str, Callable[[], Any]]]:
    """(what, a call as the run makes it) for each part ``jobs`` asks for: the forward, and with ``backward`` the
    forward+backward step (its first call makes it, the second runs it)."""
    from kernelgate.bench.runner import _autograd_step
    from kernelgate.op import get_op

    steps: list[tuple[str, Callable[[], Any]]] = []

    def add(part: str, forward: Callable[..., Any], backward: Callable[..., Any]) -> None:
        steps.append((part, functools.partial(forward, *fwd_args)))
        if jobs["backward"]:
            make = _autograd_step(backward, bwd_args, spec.grad_args)
            steps.append((part, lambda: make()()))

    if compiled is not None:
        add("torch.compile", compiled, compiled)
    if jobs.get("kernelgate"):
        add("kernelgate", get_op(spec.op), get_op(spec.op))
    # Liger-Kernel launches compiled Triton kernels: on GPUs only, as the run measures it.
    if jobs.get("liger") and spec.liger is not None and torch.device(jobs["device"]).type == "cuda":
        with contextlib.suppress(ImportError):  # no counterpart in this Liger-Kernel: the run's row says so
            add("Liger-Kernel", spec.liger(fwd_args), spec.liger(bwd_args))
    return steps


def main() -> int:
    """Worker entry: the jobs as JSON on stdin (their cases: the groups it claims from ``queue``), one line per case
    on stdout, then ``worker`` and this process's
    seconds and the most device memory its allocator held, then ``seconds`` and each part's."""
    started = time.perf_counter()
    jobs = json.load(sys.stdin)
    part_seconds: dict[str, float] = {}
    peak: dict[str, Any] = {}
    for line in compile_cases(jobs, claimed_cases(Path(jobs["queue"])), part_seconds, peak):
        print(line, flush=True)
    own = {"seconds": time.perf_counter() - started, "peak_device_bytes": peak.get("bytes", 0)}
    print(f"worker {json.dumps({**own, 'peak_case': peak.get('case', '')})}", flush=True)
    print(f"seconds {json.dumps(part_seconds)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
