"""cross_entropy_with_grad's ``split_rows`` implementation (each row split over programs that wait for each other,
so a long row is read once) against its ``looped`` one (the row read twice), at the bench's cross_entropy shapes.

For each dtype and shape: the error of split_rows against the reference, the device time of every configuration
of both implementations (``triton.testing.do_bench``, median, L2 flushed), and the step through autograd
(``kernelgate.cross_entropy`` then ``torch.autograd.grad``) with the forward that computes the gradient for
4-byte logits only (``FUSED_GRAD_MIN_BYTES`` 4, as shipped before split_rows) and for 2-byte logits too (2).
Fractions are of the copy bandwidth measured first, over ``2*M*V*e`` bytes (read the logits, write their
gradient).

    python benchmarks/cross_entropy_split_rows.py --out results.json
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate

# The module (kernelgate.ops.cross_entropy, the attribute, is the op).
ce = importlib.import_module("kernelgate.ops.cross_entropy")

SHAPES = ((8192, 32000), (4096, 128256), (2048, 256000))


def _bench(fn: Any) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3  # us


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", action="append", choices=("bfloat16", "float32"))
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    src = torch.empty(64 * 2**20, device=device)
    dst = torch.empty_like(src)
    copy_gbs = 2 * src.numel() * 4 / _bench(lambda: dst.copy_(src)) / 1e3
    print(f"copy {copy_gbs:.0f} GB/s", flush=True)
    op = ce.cross_entropy_with_grad
    impls = {impl.name: impl for impl in op.implementations}
    rows: list[dict[str, Any]] = []
    for dtype_name in args.dtype or ("bfloat16", "float32"):
        dtype = getattr(torch, dtype_name)
        for shape in SHAPES:
            inputs = op.make_inputs(shape, dtype, device)
            nbytes = 2 * inputs[0].numel() * inputs[0].element_size()
            ref_loss, ref_grad = op.reference(*inputs)
            row: dict[str, Any] = {"dtype": dtype_name, "shape": list(shape), "bytes": nbytes}
            loss, grad = impls["split_rows"].launcher(*inputs, config=ce.SPLIT_ROWS_DEFAULT)
            row["split_rows_error"] = {
                "loss": float((loss.float() - ref_loss.float()).abs().max()),
                "grad": float((grad.float() - ref_grad.float()).abs().max()),
                "grad_scale": float(ref_grad.float().abs().max()),
            }
            for name in ("looped", "split_rows"):
                impl = impls[name]
                timings = {}
                for config in impl.configs:
                    if impl.prune is not None and not impl.prune(config, *inputs):
                        continue
                    try:
                        us = _bench(lambda c=config, i=impl, a=inputs: i.launcher(*a, config=c))
                    except Exception as err:  # a configuration that does not compile or fit is skipped
                        print(f"  {name} {dict(config)}: {type(err).__name__}: {err}"[:200], flush=True)
                        continue
                    timings[str(dict(config))] = us
                best = min(timings, key=timings.__getitem__)
                row[name] = {"best": best, "us": timings[best], "fraction": nbytes / timings[best] / 1e3 / copy_gbs,
                             "all": timings}  # fmt: skip
            for min_bytes in (4, 2):
                ce.FUSED_GRAD_MIN_BYTES = min_bytes
                x = inputs[0].detach().clone().requires_grad_()

                def step(x: torch.Tensor = x, rest: tuple[Any, ...] = inputs[1:]) -> Any:
                    return torch.autograd.grad(kernelgate.cross_entropy(x, *rest), x)

                for _ in range(3):
                    step()  # tunes the buckets and observes the incoming gradient
                us = _bench(step)
                row[f"step_fused_from_{min_bytes}_bytes"] = {"us": us, "fraction": nbytes / us / 1e3 / copy_gbs}
            ce.FUSED_GRAD_MIN_BYTES = 4
            rows.append(row)
            print(
                f"{dtype_name} {shape}: looped {row['looped']['us']:.1f} us ({row['looped']['fraction']:.2f}) "
                f"split_rows {row['split_rows']['us']:.1f} us ({row['split_rows']['fraction']:.2f}, "
                f"{row['split_rows']['best']}); step {row['step_fused_from_4_bytes']['us']:.1f} us "
                f"({row['step_fused_from_4_bytes']['fraction']:.2f}) / fused 2-byte too "
                f"{row['step_fused_from_2_bytes']['us']:.1f} us ({row['step_fused_from_2_bytes']['fraction']:.2f}); "
                f"error {row['split_rows_error']}",
                flush=True,
            )
    write_json(args.out, {"provenance": provenance(device), "copy_gbs": copy_gbs, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
