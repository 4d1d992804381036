"""Run one implementation of an op at one configuration a few times, for a profiler to watch.

Where a kernel is short of the bandwidth target and its timing alone cannot say why, the hardware counters can
(memory throughput, occupancy, what the warps wait on). This makes the op's inputs as tuning does
(``make_inputs``) and launches ``--impl`` at ``--config`` ``--calls`` times, synchronising after each, so that a
profiler such as Nsight Compute can skip the first launch (which compiles) and read the next:

    ncu --clock-control none --kernel-name regex:^_ --launch-skip 1 --launch-count 1 --section SpeedOfLight \\
        python benchmarks/run_kernel.py --op softmax --shape 512x131072 --dtype bfloat16 --impl split_rows \\
        --config BLOCK_N=8192,num_warps=8

``benchmarks/run_gpu.sh counters`` runs it that way for each of ``CASES``. Off a GPU it runs the kernels through
Triton's interpreter (small shapes only), which checks the arguments and nothing else.
"""

from __future__ import annotations

import argparse

import torch

from kernelgate.op import get_op
from kernelgate.selection import run_candidate, synchronize
from kernelgate.tuning import DTYPES


def parse_config(text: str) -> dict[str, int]:
    """``"BLOCK_N=8192,num_warps=8"`` as a dict; ``""`` as an empty one.

    >>> parse_config("BLOCK_N=8192,num_warps=8")
    {'BLOCK_N': 8192, 'num_warps': 8}
    """
    config = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise SystemExit(f"--config must look like BLOCK_N=8192,num_warps=8; got {text!r}")
        config[name.strip()] = int(value)
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", required=True)
    parser.add_argument("--shape", required=True, help="like 512x131072")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--impl", required=True, help="an implementation of the op, e.g. split_rows")
    parser.add_argument("--config", default="", help="its configuration, e.g. BLOCK_N=8192,num_warps=8")
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    op = get_op(args.op)
    impls = {impl.name: impl for impl in op.implementations}
    if args.impl not in impls:
        raise SystemExit(f"--impl must be one of {', '.join(impls)} for {args.op}; got {args.impl!r}")
    impl = impls[args.impl]
    if op.make_inputs is None:
        raise SystemExit(f"{args.op} declares no make_inputs, so no inputs can be made for it; pick another op")
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    shape = tuple(int(d) for d in args.shape.lower().split("x"))
    values = op.make_inputs(shape, DTYPES[args.dtype], device)
    config: dict[str, int] | None = parse_config(args.config)
    if impl.configs is None:
        if config:
            raise SystemExit(f"{args.impl} takes no configuration; got --config {args.config!r}")
        config = None
    elif impl.configs.validate(config) is None:
        raise SystemExit(f"--config {args.config!r} is not in {args.impl}'s space {impl.configs!r}")
    for _ in range(args.calls):
        run_candidate(impl, config, values, not gpu, False)
        synchronize(device)
    print(f"{args.op} {args.shape} {args.dtype} {args.impl}[{args.config}]: {args.calls} call(s) on {device}")


if __name__ == "__main__":
    main()
