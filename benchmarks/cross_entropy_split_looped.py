"""cross_entropy_with_grad's ``split_looped`` implementation at a wider space of configurations than the package
tunes, against its looped and split_rows implementations.

``split_looped`` splits a row over programs as split_rows does, each taking a segment of BLOCK_N columns: it streams
the segment for its partial sums (STREAM_N columns at a time, NUM_STAGES in flight), waits for the row's other
programs, then streams the segment again to write its gradient (``_cross_entropy_fwd_grad_split_looped_kernel``).
The package tunes the configurations this script found fastest on an H100 (``SPLIT_LOOPED_CONFIGS``);
``split_looped_wide`` is the same launcher and kernel at WIDE_CONFIGS, in every floating dtype, for rows longer than
its least segment: shorter segments and reads, more warps, fewer stages.

For each dtype and shape (the bench's cross_entropy shapes, or ``--shapes``), every implementation runs at every
configuration that suits the input, compiled ahead in worker processes, each checked against the reference (the
package's tolerance) before it is timed (``do_bench``: L2 flushed, median). Fractions are of a device-to-device copy
measured in the same run, over ``2*M*V*e + 8*M`` bytes. With ``--interpret`` the kernels run on the CPU through
Triton's interpreter and are only checked.

    python benchmarks/cross_entropy_split_looped.py --dtype bfloat16 --out results.json
    python benchmarks/cross_entropy_split_looped.py --interpret --shapes 5x2500 --out check.json
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from variant_timing import check_and_time, package_impl, run_cases, shapes_argument_parser  # beside this script

from kernelgate.config import Config, ConfigSpace
from kernelgate.op import TritonImpl

# The package module (kernelgate.cross_entropy is the op object of the same name).
ce = importlib.import_module("kernelgate.ops.cross_entropy")

SHAPES = ((8192, 32000), (4096, 128256), (2048, 256000))


WIDE_CONFIGS = ConfigSpace(
    BLOCK_N=(2048, 8192, 16384, 32768), STREAM_N=(1024, 2048, 4096, 8192), num_warps=(4, 8, 16), NUM_STAGES=(1, 3)
)


def _wide_variant() -> TritonImpl:
    """The package's split_looped implementation at WIDE_CONFIGS: rows longer than a segment of the least length,
    reads no longer than the segment, at least 4 elements a thread."""

    def supports(logits: torch.Tensor, *args: Any) -> str | None:
        n = logits.shape[-1]
        least = min(WIDE_CONFIGS.params["BLOCK_N"])
        return None if n > least else f"rows of {n} fit one segment (at most {least})"

    def prune(config: Config, logits: torch.Tensor, *args: Any) -> bool:
        per_thread = config["STREAM_N"] // (32 * config["num_warps"])
        return config["STREAM_N"] <= config["BLOCK_N"] < logits.shape[-1] and per_thread >= 4

    split_looped = package_impl(ce.cross_entropy_with_grad, "split_looped")
    return dataclasses.replace(
        split_looped,
        name="split_looped_wide",
        configs=WIDE_CONFIGS,
        dtypes=ce.DTYPES,
        supports=supports,
        prune=prune,
    )


def variants() -> list[TritonImpl]:
    """The package's looped, split_rows and split_looped implementations of cross_entropy_with_grad, and
    split_looped at the wider space."""
    op = ce.cross_entropy_with_grad
    return [package_impl(op, name) for name in ("looped", "split_rows", "split_looped")] + [_wide_variant()]


def measure_case(dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of each variant at ``rows`` x ``n`` logits of the op's
    inputs."""
    op = ce.cross_entropy_with_grad
    values = op.make_inputs((rows, n), dtype, device)
    nbytes = 2 * rows * n * dtype.itemsize + 8 * rows
    return check_and_time(op, variants(), values, n, nbytes, interpret, record_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = shapes_argument_parser(__doc__, SHAPES).parse_args(argv)
    return run_cases(args, Path(__file__).name, [({}, measure_case)])


if __name__ == "__main__":
    sys.exit(main())
