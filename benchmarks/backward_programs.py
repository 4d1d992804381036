"""The norms' backward at its tuned implementation, with fewer or more programs per multiprocessor.

A norm's backward writes float32 partial sums of its weight's gradient (layer_norm: and its bias's), a row of
``n_cols`` a program (single-block and looped) or a row group (split), then summed over the rows (by torch's
``sum(dim=0)`` up to 281e662, by ``rowwise.sum_partials`` since). On the H200, layer_norm float32 at 4096x8192
spent 41.6 us a step in torch's two sums (528 rows of 8192) against 114.5 in its backward kernel, where
Liger-Kernel's 132 rows took 9.8 (``results/h200/profile-misses-0db8ffc/``).
This times, for each case, the backward op's tuned launcher with ``BWD_PROGRAMS_PER_SM`` (the op module's
constant) and ``rowwise.single_block_backward_programs_per_sm`` (the single-block backwards' rule, where the tree
has it) set to each of ``--per-sm``, and the partial sums' ``sum(dim=0)`` alone at each row count (and, in a tree
with ``rowwise.sum_partials``, that kernel's sum of them into the weight's dtype), so the kernel's cost and the
sums' can be told apart. With ``--impl``, it times that implementation at every configuration tuning would try
for the case, at each of ``--per-sm``, and reports the fastest configuration for each. Writes JSON with provenance.

    python benchmarks/backward_programs.py --out programs.json
    python benchmarks/backward_programs.py --case add_rms_norm:2048x16384:float32 --impl single_block --out sb.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script
from triton.testing import do_bench

import kernelgate
from kernelgate import rowwise
from kernelgate.op import get_op

# The partial-sums kernel (rowwise.sum_partials), in a tree that has one: timed beside torch's sum.
sum_partials = getattr(rowwise, "sum_partials", None)

CASES = (
    "layer_norm:262144x128:float32",
    "layer_norm:32768x1024:float32",
    "layer_norm:16384x2048:float32",
    "layer_norm:8192x4096:float32",
    "layer_norm:4096x8192:float32",
    "layer_norm:131072x512:bfloat16",
    "layer_norm:16384x4096:bfloat16",
    "layer_norm:8192x8192:bfloat16",
    "rms_norm:16384x2048:float32",
    "rms_norm:4096x8192:float32",
    "rms_norm:16384x4096:bfloat16",
    "rms_norm:8192x8192:bfloat16",
)


def _backward_args(op: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype)

    if op == "layer_norm":
        return randn(rows, cols), randn(rows, cols), (cols,), randn(cols), randn(cols), 1e-5
    if op == "add_rms_norm":  # grad, grad_s, s, weight, eps
        return randn(rows, cols), randn(rows, cols), randn(rows, cols), randn(cols), 1e-6
    return randn(rows, cols), randn(rows, cols), randn(cols), 1e-6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", help="op:ROWSxCOLS:dtype (default: a list of misses and more)")
    parser.add_argument(
        "--per-sm",
        default="1,2,4",
        help="programs per multiprocessor to try (default 1,2,4); 0: the launcher as it is, the constant untouched",
    )
    parser.add_argument(
        "--impl", help="time this implementation (e.g. single_block) at each configuration it would be tuned over"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    per_sm_values = [int(v) for v in args.per_sm.split(",")]
    kernelgate.configure(warn_fallback=False)
    results = []
    for case in args.case or CASES:
        name, shape, dtype_name = case.split(":")
        rows, cols = (int(v) for v in shape.split("x"))
        # add_rms_norm's backward launches rms_norm's kernels through rms_norm's launcher and constant.
        module = importlib.import_module(f"kernelgate.ops.{'rms_norm' if name == 'add_rms_norm' else name}")
        op = get_op(f"{name}_backward")
        values = _backward_args(name, rows, cols, getattr(torch, dtype_name), device)
        op(*values)  # tunes the bucket
        plan = op.plan(*values)
        if args.impl is not None:
            impl = next((i for i in op.implementations if i.name == args.impl), None)
            if impl is None or impl.configs is None:
                print(f"{case}: no implementation {args.impl} with configurations; skipped")
                continue
            configs = [dict(c) for c in impl.configs if impl.prune is None or impl.prune(c, *values)]
        elif plan.implementation is None:
            print(f"{case}: the reference is planned; skipped")
            continue
        else:
            impl, configs = plan.implementation, [dict(plan.config or {})]
        timings, best_configs = {}, {}
        for per_sm in per_sm_values:
            with _programs_per_sm(module, per_sm):
                times = [
                    (float(do_bench(functools.partial(impl.launcher, *values, config=c), return_mode="median")), c)
                    for c in configs
                ]
            timings[per_sm], best_configs[per_sm] = min(times, key=lambda t: t[0])
        config = best_configs[per_sm_values[0]]
        sums, kernel_sums = {}, {}
        weight = values[-3] if name == "layer_norm" else values[-2]  # dbias: weight's shape too
        for per_sm in filter(None, per_sm_values):
            partial = torch.randn(min(rows, per_sm * sms), cols, device=device)
            sums[per_sm] = float(do_bench(functools.partial(partial.sum, dim=0), return_mode="median"))
            if sum_partials is not None:  # the tree's own partial-sums kernel, where it has one
                kernel = functools.partial(sum_partials, partial[None], [weight])
                kernel_sums[per_sm] = float(do_bench(kernel, return_mode="median"))
        row: dict[str, Any] = {
            "case": case,
            "implementation": impl.name,
            "config": dict(config),
            "fastest_config": dict(best_configs) if args.impl else None,
            "launcher_us": {k: round(v * 1e3, 1) for k, v in timings.items()},
            "sum_us": {k: round(v * 1e3, 1) for k, v in sums.items()},
            "sum_partials_us": {k: round(v * 1e3, 1) for k, v in kernel_sums.items()},
        }
        results.append(row)
        print(
            f"{case:34} {impl.name:13} launcher "
            + "  ".join(f"{k}/SM {v:7.1f}" for k, v in row["launcher_us"].items())
            + "   one sum "
            + "  ".join(f"{k}/SM {v:5.1f}" for k, v in row["sum_us"].items())
            + ("   sum_partials " if kernel_sums else "")
            + "  ".join(f"{k}/SM {v:5.1f}" for k, v in row["sum_partials_us"].items())
            + ("".join(f"\n    {k}/SM fastest at {c}" for k, c in best_configs.items()) if args.impl else "")
        )
    write_json(
        args.out,
        {
            "benchmark": "norm backwards' tuned launchers by programs per multiprocessor, and their partial sums",
            **provenance(device),
            "multiprocessors": sms,
            "cases": results,
        },
    )


@contextlib.contextmanager
def _programs_per_sm(module: Any, per_sm: int) -> Iterator[None]:
    """The op module's programs per multiprocessor, and the single-block backwards' rule, at ``per_sm`` (0: as they
    are) for the block's duration."""
    constant = module.BWD_PROGRAMS_PER_SM
    rule = getattr(rowwise, "single_block_backward_programs_per_sm", None)
    if per_sm:
        module.BWD_PROGRAMS_PER_SM = per_sm
        if rule is not None:
            rowwise.single_block_backward_programs_per_sm = lambda block: per_sm
    try:
        yield
    finally:
        module.BWD_PROGRAMS_PER_SM = constant
        if rule is not None:
            rowwise.single_block_backward_programs_per_sm = rule


if __name__ == "__main__":
    main()
