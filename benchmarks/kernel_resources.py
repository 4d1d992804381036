"""Registers and local memory of an op's kernels at every configuration tuning would try, without running them.

A kernel whose threads need more registers than the block's share keeps the rest in local memory (spills, or
arrays the compiler could not keep in registers): slow memory traffic that no timing names. This compiles each
implementation of ``--op`` at each of its candidate configurations for ``--shape`` and ``--dtype``, as tuning
would, and reads each compiled kernel's resource usage from its cubin (``cuobjdump -res-usage``, shipped with
Triton): registers a thread, local memory a thread (STACK: spill slots and local arrays), shared memory a block.
Nothing is launched, so it runs without a GPU: Triton's real compiler, ptxas included, builds for ``--arch``
(default 90, the H100/H200 class) through a compile-only driver. On a GPU it compiles for that GPU.

    python benchmarks/kernel_resources.py --op rms_norm_backward --shape 4096x16384 --dtype bfloat16 --out r.json

Writes JSON with provenance (the Triton that compiled, the target) and prints one line per kernel.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch
import triton
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

from kernelgate import backend, compile_ahead
from kernelgate.config import config_label
from kernelgate.launch import call_state
from kernelgate.op import get_op
from kernelgate.selection import run_candidate

USAGE = re.compile(r"Function (\S+):\s+REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def _compile_only_target(arch: int) -> Any:
    """Make Triton compile for sm_``arch`` with no GPU (a driver that names the target and never launches)."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    target = GPUTarget("cuda", arch, 32)
    driver.set_active(compile_ahead._CompileOnlyDriver(target))  # type: ignore[arg-type]
    return target


def _resources(cubin: bytes, cuobjdump: str) -> list[dict[str, Any]]:
    """Each function's registers, local (STACK) and shared memory in a cubin, from ``cuobjdump -res-usage``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        report = subprocess.run([cuobjdump, "-res-usage", file.name], capture_output=True, text=True, check=True)
    return [
        {"function": name, "registers": int(reg), "stack_bytes": int(stack), "shared_bytes": int(shared)}
        for name, reg, stack, shared, _ in USAGE.findall(report.stdout)
    ]


def compiled_kernels(impl: Any, config: Any, values: tuple[Any, ...]) -> list[Any]:
    """The compiled kernels one call of ``impl`` at ``config`` launches, compiled (or loaded from Triton's cache)
    and not run."""
    compiled: list[Any] = []
    warm = backend.warm_compiled

    def keep(kernel: Any, grid: Any, args: Any, meta: Any) -> None:
        compiled.append(kernel.warmup(*args, grid=grid, **meta))

    backend.warm_compiled = keep  # type: ignore[assignment]
    call_state.collect = []
    try:
        run_candidate(impl, config, values, interpret=False, poison=False)
    finally:
        call_state.collect = None
        backend.warm_compiled = warm  # type: ignore[assignment]
    return compiled


def measure(op_name: str, shape: tuple[int, ...], dtype: torch.dtype, impls: list[str] | None) -> list[dict[str, Any]]:
    """One row per (implementation, configuration, kernel) of ``op_name`` at ``shape``: its resource usage."""
    op = get_op(op_name)
    if op.make_inputs is None:
        raise SystemExit(f"{op_name} declares no make_inputs, so no inputs can be made for it; pick another op")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    values = op.make_inputs(shape, dtype, device)
    cuobjdump = triton.knobs.nvidia.cuobjdump.path
    rows = []
    for impl in op.implementations:
        if impls is not None and impl.name not in impls:
            continue
        if impl.supports is not None and (why := impl.supports(*values)) is not None:
            print(f"{impl.name}: not for these inputs ({why})")
            continue
        for config in impl.candidate_configs(values):
            label = config_label(config) if config else ""
            try:
                kernels = compiled_kernels(impl, config, values)
            except Exception as err:  # a configuration the compiler rejects is reported, not fatal
                rows.append({"implementation": impl.name, "config": label, "error": f"{type(err).__name__}: {err}"})
                continue
            for kernel in kernels:
                for usage in _resources(kernel.asm["cubin"], cuobjdump):
                    rows.append(
                        {
                            "implementation": impl.name,
                            "config": label,
                            "kernel": kernel.name,
                            "num_warps": kernel.metadata.num_warps,
                            **usage,
                        }
                    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", required=True, help="a built-in op with make_inputs, e.g. rms_norm_backward")
    parser.add_argument("--shape", required=True, help="ROWSxCOLS (the op's make_inputs shape), e.g. 4096x16384")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--impl", action="append", help="only this implementation (repeatable; default: all)")
    parser.add_argument("--arch", type=int, default=90, help="without a GPU: compile for sm_ARCH (default 90)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    shape = tuple(int(v) for v in args.shape.split("x"))
    target = None if torch.cuda.is_available() else _compile_only_target(args.arch)
    rows = measure(args.op, shape, getattr(torch, args.dtype), args.impl)
    for row in rows:
        if "error" in row:
            print(f"{row['implementation']}[{row['config']}]: {row['error'][:200]}")
        else:
            print(
                f"{row['implementation'] + '[' + row['config'] + ']':58} {row['kernel']:34} warps {row['num_warps']:2}"
                f"  registers {row['registers']:3}  local {row['stack_bytes']:5} B  shared {row['shared_bytes']:6} B"
            )
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    write_json(
        args.out,
        {
            "benchmark": "kernel resources (cuobjdump -res-usage of each compiled kernel), nothing launched",
            **provenance(device),
            "target": f"sm_{target.arch} (compile only)" if target is not None else "this GPU",
            "op": args.op,
            "shape": list(shape),
            "dtype": args.dtype,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
