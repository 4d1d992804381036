"""Host cost of a kernelgate call on a cache hit, against calling the launcher or the reference directly.

For each op: N asynchronous calls, then one synchronise, divided by N; the median of several such
rounds. On a GPU the op takes its Triton path (decision cached before timing) and is compared with
calling the same launcher with the same configuration directly; on a CPU it takes the reference
path and is compared with calling the reference directly. On a GPU the launcher is also timed with
every launch through Triton's own launch path (``fast_launch`` off), against kernelgate's fast launch
of a specialisation seen before. Writes a JSON file with provenance.

    python benchmarks/overhead.py --out benchmarks/results/h200/overhead.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate
from kernelgate import backend


def interleaved_us(
    ours: Callable[[], object],
    direct: Callable[[], object],
    device: torch.device,
    calls: int,
    rounds: int,
    direct_settings: dict[str, Any] | None = None,
) -> tuple[float, float, float]:
    """Per-call cost of each function, rounds alternating between them; medians, and the median paired difference.
    ``direct_settings``: kernelgate settings in force during the direct function's rounds only."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def one_round(fn: Callable[[], object]) -> float:
        before = kernelgate.settings()
        if fn is direct and direct_settings:
            kernelgate.configure(**direct_settings)
        try:
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            return (time.perf_counter() - start) / calls * 1e6
        finally:
            kernelgate.configure(**dataclasses.asdict(before))

    for fn in (ours, direct):
        one_round(fn)  # warm-up
    a, b = [], []
    for _ in range(rounds):
        a.append(one_round(ours))
        b.append(one_round(direct))
    return statistics.median(a), statistics.median(b), statistics.median(x - y for x, y in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    kernelgate.configure(warn_fallback=False)
    rows: list[dict[str, Any]] = []
    for op, shape in (
        (kernelgate.softmax, (64, 4096)),
        (kernelgate.rms_norm, (64, 4096)),
        (kernelgate.softmax, (1, 128)),
    ):
        assert op.make_inputs is not None
        values = op.make_inputs(shape, dtype, device)
        with kernelgate.use_mode("triton" if device.type == "cuda" else "auto"):
            plan = op.plan(*values)  # tunes the bucket once; later calls hit the cache
            impl, config = plan.implementation, plan.config
            if impl is not None:
                call = functools.partial(impl.launcher, config=config) if config is not None else impl.launcher
                direct, baseline = functools.partial(call, *values), "launcher"
            else:
                direct, baseline = functools.partial(op.reference, *values), "reference"
            ours, theirs, overhead = interleaved_us(
                functools.partial(op, *values), direct, device, args.calls, args.rounds
            )
            # The launcher again, every launch through Triton's own launch path: what the fast launch saves.
            tritons_path = fast_saves = float("nan")
            if impl is not None:
                same_launcher = functools.partial(call, *values)  # another object: the rounds tell them apart
                _, tritons_path, saves = interleaved_us(
                    direct, same_launcher, device, args.calls, args.rounds, direct_settings={"fast_launch": False}
                )
                fast_saves = -saves
        rows.append(
            {
                "op": op.name,
                "shape": list(shape),
                "dtype": str(dtype).removeprefix("torch."),
                "path": plan.path,
                "implementation": plan.name,
                "baseline": baseline,
                "kernelgate_us": round(ours, 3),
                "direct_us": round(theirs, 3),
                "overhead_us": round(overhead, 3),
                "launcher_through_tritons_path_us": round(tritons_path, 3),
                "fast_launch_saves_us": round(fast_saves, 3),
            }
        )
        print(
            f"{op.name:9} {'x'.join(map(str, shape)):9} {plan.path:10} kernelgate {ours:8.2f} us  "
            f"{baseline} {theirs:8.2f} us  overhead (median paired difference) {overhead:6.2f} us  "
            f"launcher through Triton's path {tritons_path:8.2f} us (fast launch saves {fast_saves:6.2f} us)"
        )
    result = {
        "benchmark": "host cost per call on a cache hit",
        "method": (
            f"{args.calls} asynchronous calls then one synchronize, per-call mean; {args.rounds} rounds alternating "
            f"kernelgate and the direct call; medians, and the median of the paired differences as the overhead"
        ),
        **provenance(device),
        "capability": backend.capability(device),
        "rows": rows,
    }
    write_json(args.out, result)


if __name__ == "__main__":
    main()
