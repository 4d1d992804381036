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
import contextlib
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

from kernelgate.bench.resources import compile_only, compiled_kernels, cubin_resources
from kernelgate.config import config_label
from kernelgate.op import get_op


def measure(op_name: str, shape: tuple[int, ...], dtype: torch.dtype, impls: list[str] | None) -> list[dict[str, Any]]:
    """One row per (implementation, configuration, kernel) of ``op_name`` at ``shape``: its resource usage."""
    op = get_op(op_name)
    if op.make_inputs is None:
        raise SystemExit(f"{op_name} declares no make_inputs, so no inputs can be made for it; pick another op")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    values = op.make_inputs(shape, dtype, device)
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
                for usage in cubin_resources(kernel.asm["cubin"], kernel.metadata.num_warps):
                    rows.append(
                        {
                            "implementation": impl.name,
                            "config": label,
                            "kernel": kernel.name,
                            "num_warps": usage.num_warps,
                            "function": usage.kernel,
                            "registers": usage.registers,
                            "stack_bytes": usage.local_bytes,
                            "shared_bytes": usage.shared_bytes,
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
    on_gpu = torch.cuda.is_available()
    with contextlib.nullcontext() if on_gpu else compile_only(args.arch):
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
            "target": "this GPU" if on_gpu else f"sm_{args.arch} (compile only)",
            "op": args.op,
            "shape": list(shape),
            "dtype": args.dtype,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
