"""Peak GPU memory of forward + backward: eager torch, torch.compile of eager, and kernelgate ops.

For each op and shape: allocate the input (requires grad) and an upstream gradient, reset the peak
counter, run forward and ``torch.autograd.grad`` (so no ``.grad`` accumulation adds traffic or
memory), and report the peak allocated above what was live before. Writes JSON with provenance.

    python benchmarks/memory.py --out benchmarks/results/h200/memory.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate

SHAPES = [(16384, 4096), (4096, 32768), (65536, 1024)]


def _peak_mib(
    fn: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor], x: torch.Tensor, w: torch.Tensor | None
) -> float:
    grad = torch.randn_like(x)
    inputs = [t for t in (x, w) if t is not None]
    # Warm-up of forward and backward: compilation and tuning (of the backward ops too) allocate,
    # and are not what is measured.
    torch.autograd.grad(fn(x, w), inputs, grad)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn(x, w)
    torch.autograd.grad(out, inputs, grad)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/memory.py measures GPU memory; no CUDA device is visible here.", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    eager: dict[str, Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]] = {
        "softmax": lambda x, w: torch.softmax(x, -1),
        "rms_norm": lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6),
    }
    ours: dict[str, Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]] = {
        "softmax": lambda x, w: kernelgate.softmax(x, -1),
        "rms_norm": lambda x, w: kernelgate.rms_norm(x, w, 1e-6),
    }
    rows: list[dict[str, Any]] = []
    for op in ("softmax", "rms_norm"):
        variants = {"eager": eager[op], "torch.compile": torch.compile(eager[op]), "kernelgate": ours[op]}
        for shape in SHAPES:
            x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True) if op == "rms_norm" else None
            input_mib = x.numel() * x.element_size() / 2**20
            for name, fn in variants.items():
                peak = _peak_mib(fn, x, w)
                rows.append(
                    {
                        "op": op,
                        "shape": list(shape),
                        "dtype": args.dtype,
                        "variant": name,
                        "peak_mib": round(peak, 1),
                        "peak_over_input": round(peak / input_mib, 2),
                    }
                )
                print(
                    f"{op:9} {'x'.join(map(str, shape)):11} {name:14} peak {peak:9.1f} MiB "
                    f"({peak / input_mib:.2f} x the input)"
                )
    result = {
        "benchmark": "peak GPU memory of forward + backward above what was live before",
        **provenance(torch.device("cuda")),
        "rows": rows,
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
