"""Tune one bucket several times from an empty decision cache, then time its timed candidates head to head: do the
tuner's times repeat, and do they agree with the candidates' own?

In the default suite at 3af2135 on an H100 (``benchmarks/results/h100/default-3af2135/``), tuning timed rms_norm's
bf16 1024x65536 split_rows forward at 107.2 us and kept looped (105.7), where split_rows' own row of the same run
then took 99.1 us, and at c4b9da2 tuning had timed it 99.5 and kept it. Every split_rows configuration of that
bucket's screen was 8 to 13 % slower than its later row. One cause it could be: the multiprocessors' clock, low
after the compile-ahead phase leaves the GPU idle, hurting the kernel that waits for its row's partial sums more
than the one that streams. This script measures that.

Each round waits ``--idle-s`` seconds (the GPU idle), runs the GPU busy for ``--warm-ms`` milliseconds where given,
reads the multiprocessors' clock (``nvidia-smi``), and tunes the bucket with a fresh decision cache: the tuner's time
of every candidate it timed in full. Then every candidate any round timed in full is timed again, ``--direct-rounds``
rounds interleaved across them (``kernelgate.selection.time_us``, the tuner's own timing). Writes a JSON file with
provenance; prints a line a candidate. With ``--interpret`` the kernels run through Triton's interpreter on the CPU
(wall-clock times, no clock reading): a check that the script runs.

    python benchmarks/tuning_repeatability.py --op rms_norm --shape 1024x65536 --dtype bfloat16 --out r.json
    python benchmarks/tuning_repeatability.py --op rms_norm --shape 1024x65536 --dtype bfloat16 --warm-ms 200 \\
        --out r-warm.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script
from variant_timing import parse_shape  # beside this script

import kernelgate
from kernelgate.config import config_label
from kernelgate.op import get_op
from kernelgate.selection import run_candidate, time_us


def label_of(config: Any) -> str:
    """A configuration as the decision cache labels it (``BLOCK_N=8192,num_warps=32``)."""
    return config_label(config) if config else ""


def sm_clock_mhz() -> int | None:
    """The first GPU's multiprocessor clock now, from ``nvidia-smi`` (``None`` where it cannot say)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
        return int(out.stdout.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def busy(milliseconds: float, device: torch.device) -> None:
    """Keep the GPU busy for about ``milliseconds`` (matrix products), then synchronise."""
    a = torch.randn(2048, 2048, device=device)
    end = time.perf_counter() + milliseconds / 1e3
    while time.perf_counter() < end:
        for _ in range(10):
            a = a @ a
            a = a / a.norm()
        torch.cuda.synchronize(device)


def tuned_times(cache_dir: Path, op_name: str) -> dict[str, float]:
    """The times of the candidates the decision cache in ``cache_dir`` holds for ``op_name`` (those timed in full)."""
    entries = json.loads((cache_dir / "decisions-v1.json").read_text())["entries"]
    times: dict[str, float] = {}
    for key, entry in entries.items():
        if json.loads(key)[0] == op_name:
            times.update({c: t for c, t in entry["candidates"].items() if isinstance(t, (int, float))})
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", required=True, help="a built-in op's name, e.g. rms_norm")
    parser.add_argument("--shape", required=True, type=parse_shape, help="ROWSxLENGTH, e.g. 1024x65536")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--rounds", type=int, default=4, help="tunings from an empty cache (default 4)")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds the GPU idles before each tuning")
    parser.add_argument("--warm-ms", type=float, default=0.0, help="milliseconds of GPU work before each tuning")
    parser.add_argument("--direct-rounds", type=int, default=3, help="interleaved rounds of the direct timing")
    parser.add_argument("--interpret", action="store_true", help="run the kernels through Triton's interpreter")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.direct_rounds < 1:
        parser.error(f"--rounds and --direct-rounds take 1 or more; got {args.rounds} and {args.direct_rounds}")
    if not args.interpret and not torch.cuda.is_available():
        print("benchmarks/tuning_repeatability.py tunes on a GPU; none is visible (--interpret checks it runs).")
        return 2
    device = torch.device("cpu" if args.interpret else "cuda")
    op = get_op(args.op)
    if op.make_inputs is None:
        parser.error(f"--op {args.op} has no example inputs to tune with; pick a built-in row-wise op")
    values = op.make_inputs(args.shape, getattr(torch, args.dtype), device)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch, kernelgate.use_interpreter(args.interpret):
        for index in range(args.rounds):
            time.sleep(args.idle_s)
            if args.warm_ms and device.type == "cuda":
                busy(args.warm_ms, device)
            clock = sm_clock_mhz() if device.type == "cuda" else None
            cache_dir = Path(scratch) / f"round-{index}"
            kernelgate.configure(cache_dir=cache_dir, tune=True)
            op.clear_memo()
            plan = op.plan(*values)
            rounds.append({"sm_clock_mhz": clock, "chosen": plan.name, "config": dict(plan.config or {}),
                           "tuned_us": tuned_times(cache_dir, op.name)})  # fmt: skip
        labels = sorted({label for r in rounds for label in r["tuned_us"]})
        by_label = {f"{impl.name}[{label_of(c)}]" if c else impl.name: (impl, c)
                    for impl in op.implementations for c in impl.candidate_configs(values)}  # fmt: skip
        direct: dict[str, list[float]] = {label: [] for label in labels if label in by_label}
        for _ in range(args.direct_rounds):
            for label in direct:
                impl, config = by_label[label]
                call = functools.partial(run_candidate, impl, config, values, args.interpret, False)
                direct[label].append(round(time_us(call, device), 2))
    for label in labels:
        tuned = [r["tuned_us"].get(label) for r in rounds]
        shown = " ".join("-" if t is None else f"{t:8.1f}" for t in tuned)
        own = f"{statistics.median(direct[label]):8.1f}" if direct.get(label) else "-"
        print(f"{label:60s} tuned {shown}   direct {own}")
    print("chosen:", ", ".join(f"{r['chosen']}[{label_of(r['config'])}] at {r['sm_clock_mhz']} MHz" for r in rounds))
    settings = {"op": op.name, "shape": list(args.shape), "dtype": args.dtype, "idle_s": args.idle_s}
    write_json(
        args.out, {**provenance(device), **settings, "warm_ms": args.warm_ms, "rounds": rounds, "direct_us": direct}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
