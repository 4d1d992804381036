"""Compiling a bucket's tuning candidates in parallel, before the gate runs them one by one.

Tuning a new bucket gates and times every candidate configuration. On a GPU the first launch of
each is mostly Triton compiling it (a few tenths of a second per configuration), one after the
other. :func:`compile_ahead` first runs every candidate's launcher in a *collect* mode: each launch
only asks Triton what it would compile (``warmup`` with a compile hook that records the kernel's
specialization and skips the compile). Worker processes then compile those kernels into Triton's
on-disk cache, several at once, and the gate's launches load them from there.

The workers are plain subprocesses (``python -m kernelgate.compile_ahead``): they never import the
user's ``__main__``, never touch a GPU (a compile-only Triton driver names the target), and are
stopped when idle and at exit. Nothing here can change a result: a kernel the workers did not
compile, for whatever reason, is compiled by the gate's own launch, as it would have been anyway.

``KERNELGATE_COMPILE_WORKERS`` sets how many workers run (0: compile in the tuning process only).

A process can also compile ahead for a later one: within :func:`compiling_untuned_buckets`, with tuning off,
each call that meets a bucket with no decision compiles every candidate of that bucket in this process
(:func:`compile_here`) and then runs untuned, as tuning off does. ``kernelgate bench``'s worker processes do
that for the whole run (:mod:`kernelgate.bench.precompile`), so the run's tuning finds its kernels in Triton's
cache instead of compiling them bucket by bucket.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, NamedTuple

from kernelgate.launch import call_state

__all__ = [
    "CompileCount",
    "CompileJob",
    "Outcome",
    "collect_jobs",
    "compile_ahead",
    "compile_here",
    "compiling_untuned",
    "compiling_untuned_buckets",
    "count_compiles",
    "default_workers",
    "shutdown",
    "usable_cpus",
]

# Workers left idle this long are stopped; the next tuning starts new ones.
IDLE_STOP_S = 60.0
# A batch still compiling after this long is abandoned; the gate compiles what is missing.
BATCH_TIMEOUT_S = 300.0


class CompileJob(NamedTuple):
    """One kernel to compile: where its ``@triton.jit`` function lives, and Triton's specialization."""

    module: str
    name: str
    specialization: str  # JSON, as Triton's compile hook serialises it (``JITFunction.preload`` reads it)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform says, else the machine's count).

    >>> usable_cpus() >= 1
    True
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """Workers used when ``KERNELGATE_COMPILE_WORKERS`` is not set: the CPUs this process may use, at most 16.

    >>> 1 <= default_workers() <= 16
    True
    """
    return max(0, min(16, usable_cpus()))


# Set by compiling_untuned_buckets: process-wide, since a backward runs on autograd's device thread.
_untuned_compiles = 0


@contextlib.contextmanager
def compiling_untuned_buckets() -> Iterator[None]:
    """Within the block, a call with tuning off that meets a bucket with no decision first compiles all of the
    bucket's candidates in this process (see the module's docstring); on every thread."""
    global _untuned_compiles
    _untuned_compiles += 1
    try:
        yield
    finally:
        _untuned_compiles -= 1


def compiling_untuned() -> bool:
    """Whether :func:`compiling_untuned_buckets` is active.

    >>> compiling_untuned()
    False
    """
    return _untuned_compiles > 0


def _compile_hook(previous: Callable[..., Any] | None) -> Callable[..., Any]:
    def hook(**kwargs: Any) -> Any:
        jobs = call_state.collect
        if jobs is None:  # another thread compiling, or not collecting: Triton as usual
            return previous(**kwargs) if previous is not None else None
        info, compile_args = kwargs.get("fn"), kwargs.get("compile") or {}
        data = compile_args.get("specialization_data")
        module, name = getattr(info, "module", ""), getattr(info, "name", "")
        # A kernel a worker cannot import by name (defined in __main__ or inside a function) is
        # left for the gate to compile.
        if data and module and module != "__main__" and name and "." not in name:
            jobs.append(CompileJob(module, name, data))
        return True  # skip this compile: the launch returns without running anything

    return hook


@contextlib.contextmanager
def collect_jobs() -> Iterator[list[CompileJob]]:
    """Within the block, launches on this thread compile and run nothing and yield the jobs instead.

    ``kernelgate.launch`` calls ``warmup`` in place of a launch; Triton binds the arguments and,
    for a kernel it has not compiled in this process, asks the compile hook, which records the job.
    """
    import triton

    runtime = triton.knobs.runtime
    previous = runtime.jit_cache_hook
    jobs: list[CompileJob] = []
    runtime.jit_cache_hook = _compile_hook(previous)
    call_state.collect = jobs
    try:
        yield jobs
    finally:
        call_state.collect = None
        runtime.jit_cache_hook = previous


class CompileCount:
    """Kernels Triton compiled, and kernels it loaded from its on-disk cache, while :func:`count_compiles` ran.

    A kernel this process had already loaded is neither: Triton keeps it in memory and asks nothing.
    """

    def __init__(self) -> None:
        self.compiled = 0
        self.loaded = 0
        self.seconds_compiling = 0.0

    def __str__(self) -> str:
        return f"{self.compiled} compiled ({self.seconds_compiling:.1f} s), {self.loaded} loaded from the cache"


@contextlib.contextmanager
def count_compiles() -> Iterator[CompileCount | None]:
    """Count, within the block, the kernels Triton compiles and those it finds in its on-disk cache.

    Through Triton's compilation listener (``triton.knobs.compilation.listener``), chained to any listener
    already set; yields None where this Triton has none. After :func:`compile_ahead` every candidate's kernels
    should load from the cache: a count of compiled ones says the workers' entries were missed (another cache
    directory, or another specialization), and the gate paid for compiling them one by one.
    """
    try:
        import triton

        compilation = triton.knobs.compilation
        previous = compilation.listener
    except (ImportError, AttributeError):
        yield None
        return
    count = CompileCount()

    def listener(**kwargs: Any) -> None:
        if kwargs.get("cache_hit"):
            count.loaded += 1
        else:
            count.compiled += 1
            total_us = getattr(kwargs.get("times"), "total", 0)  # CompileTimes, in microseconds
            count.seconds_compiling += total_us / 1e6 if isinstance(total_us, (int, float)) else 0.0
        if previous is not None:
            previous(**kwargs)

    compilation.listener = listener
    try:
        yield count
    finally:
        compilation.listener = previous


class _Worker:
    """One compile subprocess; requests and replies are JSON lines."""

    def __init__(self, target: tuple[Any, ...]) -> None:
        import triton

        env = dict(os.environ)
        # The worker imports kernel modules by name, from where this process finds them, and
        # writes where this process's Triton reads its cache.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env["TRITON_CACHE_DIR"] = str(triton.knobs.cache.dir)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kernelgate.compile_ahead", json.dumps(list(target))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )

    def compile(self, job: CompileJob) -> str | None:
        """Compile ``job``; ``None`` when done, else why not."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(json.dumps(list(job)) + "\n")
            stdin.flush()
            line = stdout.readline()
        except (OSError, ValueError) as err:
            return f"worker gone: {err}"
        if not line:
            return f"worker exited (status {self.process.poll()})"
        reply = json.loads(line)
        return None if reply.get("ok") else str(reply.get("error", "unknown error"))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class _Pool:
    """Workers for one Triton target, started on demand and stopped after :data:`IDLE_STOP_S` idle."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.target: tuple[Any, ...] | None = None
        self.idle: list[_Worker] = []
        self.timer: threading.Timer | None = None
        # Why workers cannot run in this process (every one of a batch died), once that is known:
        # compiling ahead then stops, instead of starting new workers for every bucket.
        self.broken: str | None = None

    def run(self, target: tuple[Any, ...], jobs: Sequence[CompileJob], workers: int) -> list[str | None]:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
            if self.target != target:
                self._stop_all()
                self.target = target
            taken = self.idle[:workers]
            del self.idle[:workers]
        results: list[str | None] = ["not compiled"] * len(jobs)
        while len(taken) < min(workers, len(jobs)):
            try:
                taken.append(_Worker(target))
            except OSError as err:  # no interpreter to start: the gate compiles everything itself
                self.broken = f"worker could not start: {err}"
                break
        if not taken:
            return results
        queue = list(enumerate(jobs))
        queue_lock = threading.Lock()

        def drain(worker: _Worker) -> None:
            while True:
                with queue_lock:
                    if not queue:
                        return
                    index, job = queue.pop(0)
                results[index] = worker.compile(job)

        pool = ThreadPoolExecutor(max_workers=len(taken))
        futures = [pool.submit(drain, w) for w in taken]
        done_by = time.monotonic() + BATCH_TIMEOUT_S
        healthy = []
        for worker, future in zip(taken, futures, strict=True):
            try:
                future.result(timeout=max(0.0, done_by - time.monotonic()))
                healthy.append(worker)
            except Exception:  # timed out: the worker may be stuck in a compile
                worker.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            self.idle += [w for w in healthy if w.process.poll() is None]
            self.timer = threading.Timer(IDLE_STOP_S, self.stop)
            self.timer.daemon = True
            self.timer.start()
        if results and all(r is not None and r.startswith("worker ") for r in results):
            self.broken = results[0]
        return results

    def _stop_all(self) -> None:
        for worker in self.idle:
            worker.stop()
        self.idle.clear()

    def stop(self) -> None:
        with self.lock:
            self._stop_all()


_pool = _Pool()


def shutdown() -> None:
    """Stop the idle compile workers now (they also stop after a minute idle, and at exit)."""
    _pool.stop()


atexit.register(shutdown)


class Outcome(NamedTuple):
    """What :func:`compile_ahead` did: jobs found, compiled by the workers, seconds spent."""

    jobs: int
    compiled: int
    seconds: float


def compile_ahead(launches: Sequence[Callable[[], object]], workers: int) -> Outcome:
    """Compile, in parallel worker processes, what each of ``launches`` would compile.

    Each callable runs in collect mode (see :func:`collect_jobs`): it should call launchers with
    the inputs the gate will use, so the specializations match. Exceptions from a launcher are
    ignored here (the gate meets them again, and reports them).
    """
    start = time.monotonic()
    if workers <= 0 or _pool.broken is not None:
        return Outcome(0, 0, 0.0)
    from triton.runtime.driver import driver

    unique = _collect(launches)
    if not unique:
        return Outcome(0, 0, time.monotonic() - start)
    target = driver.active.get_current_target()
    key = (target.backend, target.arch, target.warp_size)
    results = _pool.run(key, unique, workers)
    return Outcome(len(unique), sum(r is None for r in results), time.monotonic() - start)


def _collect(launches: Sequence[Callable[[], object]]) -> list[CompileJob]:
    """The distinct jobs ``launches`` would compile (see :func:`collect_jobs`); a launcher's exception is ignored."""
    with collect_jobs() as jobs:
        for launch in launches:
            try:
                launch()
            except Exception:  # the gate runs this candidate again and reports its error
                continue
    return list(dict.fromkeys(jobs))


def compile_here(launches: Sequence[Callable[[], object]]) -> Outcome:
    """Compile what each of ``launches`` would compile, in this process, one kernel after another (into Triton's
    on-disk cache, and this process's memory); a kernel that fails to compile is left for its launch to report."""
    start = time.monotonic()
    unique = _collect(launches)
    return Outcome(len(unique), sum(_compile_job(job) is None for job in unique), time.monotonic() - start)


def _compile_job(job: CompileJob) -> str | None:
    """Compile ``job`` for the active driver's target; ``None`` when done, else why not."""
    module, name, specialization = job
    try:
        getattr(importlib.import_module(module), name).preload(specialization)
    except Exception as err:
        return f"{type(err).__name__}: {err}"[:500]
    return None


# --- the worker process ----------------------------------------------------------------------------


class _CompileOnlyDriver:
    """A Triton driver for a process that compiles and never launches: it names the target."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def _serve(target_json: str, requests: IO[str], replies: IO[str]) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    driver.set_active(_CompileOnlyDriver(GPUTarget(*json.loads(target_json))))  # type: ignore[arg-type]
    for line in requests:
        error = _compile_job(CompileJob(*json.loads(line)))  # on error the tuning process compiles it itself
        reply: dict[str, Any] = {"ok": True} if error is None else {"error": error}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main(argv: Sequence[str]) -> int:
    """Worker entry: ``python -m kernelgate.compile_ahead '["cuda", 90, 32]'``, jobs on stdin."""
    # Replies go to the original stdout; anything else that prints goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _serve(argv[0], sys.stdin, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
