"""Running every configuration of an op's Triton implementations against its reference (shared by the tests)."""

from __future__ import annotations

from typing import Any

import torch

from kernelgate.config import LAUNCH_OPTIONS, Config
from kernelgate.op import Op, TritonImpl
from kernelgate.selection import compare, float64_truth, run_candidate
from kernelgate.tolerance import assert_no_worse


def distinct_configs(impl: TritonImpl, values: tuple[Any, ...], interpret: bool) -> list[Config | None]:
    """The configurations ``impl`` keeps for ``values``; under the interpreter, which ignores launch
    options (num_warps), one per set of kernel parameters."""
    configs = impl.candidate_configs(values)
    if not interpret:
        return configs
    kept: dict[tuple[tuple[str, int], ...], Config | None] = {}
    for config in configs:
        key = tuple(sorted((k, v) for k, v in (config or {}).items() if k not in LAUNCH_OPTIONS))
        kept.setdefault(key, config)
    return list(kept.values())


def _outputs(result: Any) -> list[torch.Tensor]:
    return [result] if isinstance(result, torch.Tensor) else list(result)


def check_every_config(op: Op, values: tuple[Any, ...], interpret: bool) -> set[str]:
    """Run every configuration of every implementation that accepts ``values``, into NaN-filled outputs.

    Each output must match the reference under the tolerance policy, element by element, except
    those in ``op.normwise_outputs`` (sums over rows whose terms cancel): those must be no further
    from a float64 reference than twice the reference's own error in the inputs' dtype. Returns the
    names of the implementations that ran (at least one must).
    """
    expected = op.reference(*values)
    elementwise_truth = float64_truth(op, values)
    truth = None
    if op.normwise_outputs:
        truth = op.reference(
            *(v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values)
        )
    ran: set[str] = set()
    for impl in op.implementations:
        if impl.supports is not None and impl.supports(*values) is not None:
            continue
        for config in distinct_configs(impl, values, interpret):
            result = run_candidate(impl, config, values, interpret, poison=True)
            if truth is None:
                mismatch = compare(result, expected, op.reduction_length(*values), truth=elementwise_truth)
                assert mismatch is None, (impl.name, config, mismatch)
            else:
                got, want, exact = _outputs(result), _outputs(expected), _outputs(truth)
                for index, (g, w, t) in enumerate(zip(got, want, exact, strict=True)):
                    if index in op.normwise_outputs:
                        assert_no_worse(g, w, t)
                    else:
                        mismatch = compare(g, w, op.reduction_length(*values))
                        assert mismatch is None, (impl.name, config, index, mismatch)
            ran.add(impl.name)
    assert ran, f"no implementation of {op.name} accepts these inputs"
    return ran
