"""The package's single-block forwards with a row spread over a Hopper thread-block cluster, against its long-row
implementations, on a GPU (or interpreted on the CPU).

At rows of 32768 and longer the row-wise forwards stay below 0.90 of copy: a single block cannot hold a row of
65536 or more (it spills), the looped kernels read each row twice, and the split_rows kernels share a row's
statistics through global memory and a spin wait. On sm_90 a cluster of up to 8 (16 non-portable) blocks on
neighbouring multiprocessors can share shared memory, and Triton compiles a block-wide tensor spread over the
blocks of a cluster when a kernel is launched with ``num_ctas`` > 1: each block holds 1/num_ctas of the row in
registers, and a reduction over the row is combined through distributed shared memory (``mapa``,
``barrier.cluster``), on chip. The kernels are the package's single-block kernels unchanged; only the launch
option differs.

Triton 3.6.0's compiler rejects such a kernel (its CTA-planning pass fails on a reduction of a tensor spread over
the cluster); 3.9.0's lowers it. On a machine with a Triton that cannot, the cubins are built elsewhere:

1. ``--build-cubins DIR`` (Triton that lowers clusters, no GPU needed: compiled for sm_90a through a driver that
   never launches) writes each cluster configuration's cubin and metadata under DIR.
2. ``--cubins DIR`` on the GPU compiles each of those kernels with ``num_ctas`` 1 and the same arguments, replaces
   the compiled kernel's cubin, shared memory size and ``num_ctas`` by the stored ones (the launcher, which sets
   the cluster dimension and a grid of ``num_ctas`` blocks a program, is Triton's own), then checks every
   configuration against the reference (the package's tolerance) before it is timed. ``num_stages`` (which these
   loop-free kernels do not use) keys the replaced kernels apart from the package's own in Triton's cache.

The variants, at each dtype and row length (rows chosen so that x is about 128 MiB): ``cluster`` (the package's
single-block kernel at num_warps 4 to 32 and num_ctas 2, 4, 8 and 16, where a thread holds at most 64 elements)
beside the package's ``split_rows``, ``looped`` and ``single_block``. Results are fractions of a device-to-device
copy measured in the same run (bytes: x read, y written).

At 8ae2238 on the H200 (``benchmarks/results/h200/cluster-rows-8ae2238/``) every cluster configuration matched
the reference, and the cluster was faster than every package implementation only for softmax and log_softmax
bfloat16 512x131072 (4 %), taking 1.02 to 1.36 times the best one's time in 21 of the 24 cases: the package has no
cluster implementation.

    python benchmarks/cluster_rows.py --build-cubins .cubins --op rms_norm --lengths 65536 --out built.json
    python benchmarks/cluster_rows.py --cubins .cubins --op rms_norm --lengths 65536 --out results.json
    python benchmarks/cluster_rows.py --interpret --rows 3 --lengths 20000 --out check.json
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script
from variant_timing import TARGET_BYTES, argument_parser, check_and_time, package_impl, run_cases  # beside it too

import kernelgate
from kernelgate import rowwise
from kernelgate.compile_ahead import compile_ahead, default_workers
from kernelgate.config import ConfigSpace, config_label
from kernelgate.op import Op, TritonImpl
from kernelgate.selection import run_candidate

DEFAULT_LENGTHS = (32768, 65536, 131072)
EPS = 1e-6
OPS = ("softmax", "log_softmax", "rms_norm", "layer_norm")
CLUSTER_CONFIGS = ConfigSpace(ROWS=(1,), num_ctas=(2, 4, 8, 16), num_warps=(4, 8, 16, 32))
# What a replaced kernel takes from the stored metadata, and what it must agree on with the kernel compiled here.
STORED_METADATA = ("name", "num_ctas", "num_warps", "shared", "global_scratch_size", "profile_scratch_size")
# num_stages given to a replaced kernel's launch, so that Triton caches it apart from the package's own.
STAGES_KEY = 8


def _inputs(op_name: str, dtype: torch.dtype, rows: int, n: int, device: torch.device) -> tuple[Op, tuple[Any, ...]]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(rows, n, generator=gen) * 3).to(device=device, dtype=dtype)
    op: Op = getattr(kernelgate, op_name)
    if op_name in ("softmax", "log_softmax"):
        return op, (x, -1)
    w = (torch.rand(n, generator=gen) + 0.5).to(device=device, dtype=dtype)
    if op_name == "layer_norm":
        b = torch.randn(n, generator=gen).to(device=device, dtype=dtype)
        return op, (x + 2.0, (n,), w, b, EPS)
    return op, (x, w, EPS)


def _cluster_variant(op: Op, replaced: bool) -> TritonImpl:
    """The package's single-block forward at the cluster configurations, for rows of any length a cluster holds.

    With ``replaced`` it launches with num_ctas 1 and num_stages ``STAGES_KEY + num_ctas``: the kernels Triton
    compiles for those are swapped for the stored cluster cubins (see :func:`replace_kernels`) before they run.
    """
    package = package_impl(op, "single_block")
    takes_rows = "ROWS" in package.configs.params if package.configs is not None else False

    def launch(*values: Any, config: Any) -> Any:
        config = dict(config)
        if not takes_rows:
            config.pop("ROWS")
        if replaced:
            config["num_stages"] = STAGES_KEY + config["num_ctas"]
            config["num_ctas"] = 1
        return package.launcher(*values, config=config)

    def prune(config: Any, *values: Any) -> bool:
        n_cols = values[0].shape[-1]
        block = rowwise.single_block(n_cols)
        return rowwise.per_thread_ok(block // config["num_ctas"], config["num_warps"])

    return dataclasses.replace(
        package, name="cluster", launcher=launch, configs=CLUSTER_CONFIGS, prune=prune, supports=None,
        default_config=None,
    )  # fmt: skip


def variants(op: Op, replaced: bool) -> list[TritonImpl]:
    return [
        _cluster_variant(op, replaced),
        package_impl(op, "split_rows"),
        package_impl(op, "looped"),
        package_impl(op, "single_block"),
    ]


def _cubin_name(op_name: str, dtype: torch.dtype, shape: Sequence[int], config: Any) -> str:
    return f"{op_name}-{str(dtype).removeprefix('torch.')}-{shape[0]}x{shape[1]}-{config_label(config)}"


def build_cubins(out_dir: Path, op_name: str, dtype: torch.dtype, rows: int, n: int) -> list[dict[str, Any]]:
    """Compile each cluster configuration for sm_90a (no launch) and store its cubin and metadata under ``out_dir``."""
    from kernelgate.bench.resources import compile_only, compiled_kernels, cubin_resources

    op, values = _inputs(op_name, dtype, rows, n, torch.device("cpu"))
    impl = _cluster_variant(op, replaced=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    with compile_only(90):
        for config in impl.candidate_configs(values):
            result: dict[str, Any] = {"variant": impl.name, "config": dict(config)}
            try:
                (kernel,) = compiled_kernels(impl, config, values)
            except Exception as err:
                result["error"] = f"{type(err).__name__}: {err}"[:300]
                results.append(result)
                continue
            name = _cubin_name(op_name, dtype, (rows, n), config)
            (out_dir / f"{name}.cubin").write_bytes(kernel.asm["cubin"])
            meta = {field: getattr(kernel.metadata, field) for field in STORED_METADATA}
            meta["triton_version"] = kernel.metadata.triton_version
            (out_dir / f"{name}.json").write_text(json.dumps(meta))
            (usage,) = cubin_resources(kernel.asm["cubin"], kernel.metadata.num_warps)
            result.update(meta, registers=usage.registers, local_bytes=usage.local_bytes)
            results.append(result)
    return results


def replace_kernels(cubins: Path, impl: TritonImpl, op_name: str, values: Sequence[Any]) -> list[dict[str, Any]]:
    """Compile each of ``impl``'s (replaced) configurations with num_ctas 1, then give the compiled kernel the stored
    cluster cubin, shared memory size and num_ctas; returns a record of any configuration with no stored cubin."""
    from kernelgate.bench.resources import compiled_kernels

    x = values[0]
    missing = []
    for config in impl.candidate_configs(values):
        name = _cubin_name(op_name, x.dtype, tuple(x.shape), config)
        path = cubins / f"{name}.cubin"
        if not path.exists():
            missing.append({"variant": impl.name, "config": dict(config), "error": f"no cubin {path.name}"})
            continue
        meta = json.loads(path.with_suffix(".json").read_text())
        (kernel,) = compiled_kernels(impl, config, values)
        here = {field: getattr(kernel.metadata, field) for field in ("name", "num_warps")}
        scratch = meta["global_scratch_size"] or meta["profile_scratch_size"]
        if here != {field: meta[field] for field in here} or scratch:
            # The launcher here passes no scratch buffers such a kernel would need.
            raise RuntimeError(f"{path.name}: built as {meta}, compiled here as {here}")
        kernel.kernel = kernel.asm["cubin"] = path.read_bytes()
        kernel.metadata = kernel.metadata._replace(num_ctas=meta["num_ctas"], shared=meta["shared"])
        kernel.packed_metadata = (meta["num_warps"], meta["num_ctas"], meta["shared"])
        kernel.module = kernel.function = kernel._run = None  # loaded again, from the new cubin, at its next launch
    return missing


def measure_case(
    op_name: str, cubins: Path | None, dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool
) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of each variant at a ``rows`` x ``n`` input."""
    op, values = _inputs(op_name, dtype, rows, n, device)
    impls = variants(op, replaced=cubins is not None)
    missing = []
    if cubins is not None:
        # The stand-ins compiled in worker processes first: at rows of 131072 each spills heavily, and takes seconds.
        stand_ins = [functools.partial(run_candidate, impls[0], c, values, False, False)
                     for c in impls[0].candidate_configs(values)]  # fmt: skip
        compile_ahead(stand_ins, default_workers())
        missing = replace_kernels(cubins, impls[0], op_name, values)
    if missing:
        impls = impls[1:]
    nbytes = 2 * rows * n * values[0].element_size()
    return missing + check_and_time(op, impls, values, n, nbytes, interpret, record_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(__doc__, DEFAULT_LENGTHS)
    parser.add_argument("--op", action="append", choices=OPS)
    parser.add_argument("--build-cubins", type=Path, help="compile the cluster kernels for sm_90a into this folder")
    parser.add_argument("--cubins", type=Path, help="run the cluster kernels from the cubins in this folder")
    args = parser.parse_args(argv)
    ops = args.op or list(OPS)
    if args.build_cubins is not None:
        cases = []
        for op_name in ops:
            for dtype_name in args.dtype or ["float32", "bfloat16"]:
                dtype = getattr(torch, dtype_name)
                for n in args.lengths:
                    rows = args.rows or max(1, TARGET_BYTES // (n * dtype.itemsize))
                    results = build_cubins(args.build_cubins, op_name, dtype, rows, n)
                    cases.append({"op": op_name, "dtype": dtype_name, "shape": [rows, n], "results": results})
                    built = sum("error" not in r for r in results)
                    print(f"{op_name} {dtype_name} {rows}x{n}: {built} of {len(results)} built", flush=True)
        write_json(args.out, {**provenance(torch.device("cpu")), "cases": cases})
        return 0 if all("error" not in r for c in cases for r in c["results"]) else 1
    groups = [({"op": name}, functools.partial(measure_case, name, args.cubins)) for name in ops]
    return run_cases(args, Path(__file__).name, groups)


if __name__ == "__main__":
    sys.exit(main())
