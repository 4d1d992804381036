"""Registers, local and shared memory of the kernels an implementation launches, read from their cubins.

A kernel holding a row in registers fits as many programs on a multiprocessor as its registers allow; past what
a thread may hold, the rest goes to local memory (spills, or arrays the compiler could not keep in registers):
slow traffic that no timing names. These are the facts behind a bandwidth miss of a kernel that is not
re-reading its rows, and ``kernelgate bench`` adds them to such misses in its summary.

Nothing is launched. Each kernel is compiled (or loaded from Triton's cache) as the implementation's launcher
would launch it, and ``cuobjdump -res-usage`` (shipped with Triton) reads its cubin. On a GPU the kernels are
built for it; without one, :func:`compile_only` builds them for a named architecture through a driver that never
launches, with Triton's real compiler, ptxas included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from kernelgate import backend
from kernelgate.config import Config, config_label
from kernelgate.launch import call_state
from kernelgate.op import TritonImpl, get_op
from kernelgate.selection import run_candidate

if TYPE_CHECKING:
    from kernelgate.bench.report import BenchRow

__all__ = [
    "KernelResources",
    "compile_only",
    "compiled_kernels",
    "cubin_resources",
    "describe",
    "implementation_resources",
    "kernel_notes",
    "step_kernels",
    "step_resources",
]

_USAGE = re.compile(r"Function (\S+):\s+REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")

# Per multiprocessor on sm_90 (the H100 and H200): registers, threads, resident blocks, shared memory a block may
# use (228 KiB, 1 KiB of it reserved per block), and the granularity of a warp's register allocation.
_SM90_REGISTERS = 65536
_SM90_THREADS = 2048
_SM90_BLOCKS = 32
_SM90_SHARED_BYTES = 233472
_SM90_SHARED_RESERVED = 1024
_REGISTER_UNIT = 256


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """One compiled kernel's resources: per thread (registers, local memory) and per block (shared memory)."""

    kernel: str
    num_warps: int
    registers: int
    local_bytes: int
    shared_bytes: int

    @property
    def programs_per_sm(self) -> int:
        """How many of its programs an sm_90 multiprocessor (H100, H200) holds at once, by registers, threads,
        blocks and shared memory.

        >>> KernelResources("k", num_warps=16, registers=101, local_bytes=0, shared_bytes=1024).programs_per_sm
        1
        """
        threads = self.num_warps * 32
        per_warp = -(-max(self.registers, 1) * 32 // _REGISTER_UNIT) * _REGISTER_UNIT
        by_shared = _SM90_SHARED_BYTES // (self.shared_bytes + _SM90_SHARED_RESERVED)
        return max(
            0,
            min(_SM90_REGISTERS // (per_warp * self.num_warps), _SM90_THREADS // threads, _SM90_BLOCKS, by_shared),
        )


@contextlib.contextmanager
def compile_only(arch: int) -> Iterator[None]:
    """Within the block Triton compiles for ``sm_<arch>`` and cannot launch (no GPU needed); the previous
    driver is restored after."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    from kernelgate.compile_ahead import _CompileOnlyDriver

    previous = driver._active  # None where no driver was made yet (none can be on a machine without a GPU)
    driver.set_active(_CompileOnlyDriver(GPUTarget("cuda", arch, 32)))  # type: ignore[arg-type]
    try:
        yield
    finally:
        driver._active = previous


def step_kernels(step: Callable[[], object]) -> list[Any]:
    """The compiled kernels that ``step`` launches through kernelgate, compiled (or loaded from Triton's cache)
    and not run: its outputs are left unwritten."""
    compiled: list[Any] = []
    warm = backend.warm_compiled

    def keep(kernel: Any, grid: Any, args: Any, meta: Any) -> None:
        compiled.append(kernel.warmup(*args, grid=grid, **meta))

    backend.warm_compiled = keep  # type: ignore[assignment]
    call_state.collect = []
    try:
        step()
    finally:
        call_state.collect = None
        backend.warm_compiled = warm  # type: ignore[assignment]
    return compiled


def compiled_kernels(impl: TritonImpl, config: Config | None, values: Sequence[Any]) -> list[Any]:
    """The compiled kernels one call of ``impl`` at ``config`` would launch on ``values`` (see :func:`step_kernels`)."""
    return step_kernels(lambda: run_candidate(impl, config, values, interpret=False, poison=False))


def step_resources(step: Callable[[], object]) -> list[KernelResources]:
    """The resources of each distinct kernel ``step`` launches (:func:`step_kernels`), in launch order."""
    found: list[KernelResources] = []
    for kernel in step_kernels(step):
        for usage in cubin_resources(kernel.asm["cubin"], kernel.metadata.num_warps):
            if usage not in found:
                found.append(usage)
    return found


def cubin_resources(cubin: bytes, num_warps: int) -> list[KernelResources]:
    """Each function's resources in ``cubin``, from ``cuobjdump -res-usage`` (STACK: local memory a thread)."""
    import triton

    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        report = subprocess.run(
            [triton.knobs.nvidia.cuobjdump.path, "-res-usage", file.name], capture_output=True, text=True, check=True
        )
    return [
        KernelResources(name, num_warps, int(reg), int(stack), int(shared))
        for name, reg, stack, shared, _ in _USAGE.findall(report.stdout)
    ]


def implementation_resources(
    op_name: str, shape: tuple[int, ...], dtype: torch.dtype, label: str, device: torch.device
) -> list[KernelResources]:
    """The resources of each kernel that ``label`` (``"single_block[ROWS=1,num_warps=16]"``, as tuning names a
    candidate) of ``op_name`` launches at ``shape`` (the op's ``make_inputs`` shape) and ``dtype``.

    Raises:
        KeyError: no such op, implementation or configuration for these inputs.
    """
    op = get_op(op_name)
    if op.make_inputs is None:
        raise KeyError(f"{op_name} declares no make_inputs")
    values = op.make_inputs(shape, dtype, device)
    name = label.split("[")[0]
    impl = next((i for i in op.implementations if i.name == name), None)
    if impl is None:
        raise KeyError(f"{op_name} has no implementation {name!r}")
    for config in impl.candidate_configs(values):
        if (f"{name}[{config_label(config)}]" if config else name) == label:
            kernels = compiled_kernels(impl, config, values)
            return [r for k in kernels for r in cubin_resources(k.asm["cubin"], k.metadata.num_warps)]
    raise KeyError(f"{label} is not among {op_name}'s candidates at {shape}")


def describe(resources: Sequence[KernelResources], arch: int, triton_version: str, owner: str = "its") -> str:
    """A clause for the summary: each kernel's registers and local memory, and on sm_90 how many of its programs
    a multiprocessor holds; ``owner`` names whose kernels they are (a row's note: "its"; a miss, which may name
    another implementation as the best: "kernelgate's").

    >>> print(describe([KernelResources("_k", 16, 101, 0, 1024)], 90, "3.6.0")[:78])
    ; its kernel _k keeps 101 registers a thread at 16 warps and none in local mem
    """
    parts = []
    for r in resources:
        local = f"{r.local_bytes} bytes a thread in local memory" if r.local_bytes else "none in local memory"
        part = f"{r.kernel} keeps {r.registers} registers a thread at {r.num_warps} warps and {local}"
        if arch == 90:
            n = r.programs_per_sm
            part += f": {n} program{'' if n == 1 else 's'} a multiprocessor, {n * r.num_warps} of its 64 warps"
        parts.append(part)
    if not parts:
        return ""
    kernels = f"{owner} kernel " if len(parts) == 1 else f"{owner} kernels: "
    return f"; {kernels}{'; '.join(parts)} (compiled for sm_{arch} by Triton {triton_version})"


def kernel_notes(
    rows: Sequence[BenchRow], arch: int | None = None
) -> tuple[dict[tuple[str, str, str], str], list[str]]:
    """For each forward bandwidth miss where kernelgate ran a Triton candidate (``report.kernel_cases``), a clause
    with its kernels' resources ("kernelgate's kernel ..."), compiled for this GPU, or for ``sm_<arch>`` without
    launching; and one line per case whose kernels could not be read, saying why.

    ``arch`` None: this GPU's; on a machine without one, no notes. The clause names the architecture and the Triton that
    compiled, which need not be the run's (a CSV redrawn elsewhere).
    """
    from kernelgate.bench.report import kernel_cases
    from kernelgate.bench.suite import DTYPES

    gpu_arch = None
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        gpu_arch = major * 10 + minor
    arch = gpu_arch if arch is None else arch
    if arch is None:
        return {}, []
    device = torch.device("cuda" if arch == gpu_arch else "cpu")
    notes: dict[tuple[str, str, str], str] = {}
    problems: list[str] = []
    version = backend.triton_version() or "?"
    with contextlib.nullcontext() if device.type == "cuda" else compile_only(arch):
        for op, dtype, shape, label in kernel_cases(rows):
            try:
                found = implementation_resources(
                    op, tuple(int(d) for d in shape.split("x")), DTYPES[dtype], label, device
                )
            except Exception as err:  # a case whose kernels cannot be read here keeps its miss without the note
                problems.append(f"{op} {dtype} {shape} {label}: {type(err).__name__}: {err}"[:300])
                continue
            notes[(op, dtype, shape)] = describe(found, arch, version, owner="kernelgate's")
    return notes, problems
