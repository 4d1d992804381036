"""Check mode: compare the chosen implementation with the reference on sampled calls.

On a mismatch the inputs are saved with ``torch.save`` (beside the decision cache, under
``failures/``) and the report names the op, implementation, configuration, shapes, errors, the
first mismatching index, the saved file and the command that replays it. Then, as configured, the
call raises :class:`~kernelgate.errors.CheckError`, or warns and demotes the decision so later
calls of that bucket run the reference.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kernelgate.cache import decision_cache, default_cache_dir
from kernelgate.config import config_label
from kernelgate.errors import CheckError, CheckWarning, user_stacklevel
from kernelgate.selection import compare, float64_truth

if TYPE_CHECKING:
    from kernelgate.dispatch import Plan
    from kernelgate.op import Op
    from kernelgate.settings import Settings

__all__ = ["check_result", "save_case"]


def save_case(op: Op, plan: Plan, inputs: tuple[Any, ...], directory: Path) -> Path:
    """Save a call's inputs and chosen path so ``kernelgate replay FILE`` can run it again."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{op.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 10**6}.pt"
    torch.save(
        {
            "op": op.name,
            "implementation": plan.name,
            "config": dict(plan.config) if plan.config else None,
            "interpret": plan.interpret,
            "args": [v.detach().cpu() if isinstance(v, torch.Tensor) else v for v in inputs],
            "devices": [str(v.device) if isinstance(v, torch.Tensor) else None for v in inputs],
        },
        path,
    )
    return path


def check_result(
    op: Op,
    plan: Plan,
    inputs: tuple[Any, ...],
    result: Any,
    expected: Any,
    original: tuple[Any, ...],
    current: Settings,
) -> bool:
    """Compare ``result`` with ``expected``; on a mismatch, report and raise, or demote and return True."""
    mismatch = compare(
        result, expected, op.reduction_length(*original), op.normwise_outputs, float64_truth(op, original)
    )
    if mismatch is None:
        return False
    directory = (current.cache_dir or default_cache_dir()) / "failures"
    try:
        saved = str(save_case(op, plan, original, directory))
        replay = f"python -m kernelgate replay {saved}"
    except OSError as err:
        saved, replay = f"(could not save the inputs: {err})", "(no replay file)"
    shapes = ", ".join(
        f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for v in original if isinstance(v, torch.Tensor)
    )
    config = config_label(plan.config) if plan.config else "-"
    report = (
        f"kernelgate check: {op.name} implementation {plan.name} (config {config}) differs from the reference "
        f"for inputs {shapes}: {mismatch}. Inputs saved to {saved}; replay with: {replay}"
    )
    if current.check_action == "raise":
        raise CheckError(report)
    if plan.key is not None:
        cache = decision_cache(current.cache_dir)
        entry = dict(cache.get(plan.key) or {"op": op.name})
        entry.update(
            implementation="reference",
            config=None,
            best_triton=None,
            demoted=True,
            reason=f"demoted by check mode: {mismatch}",
        )
        cache.put(plan.key, entry)
        op.clear_memo()
    warnings.warn(report + " This bucket now runs the reference.", CheckWarning, stacklevel=user_stacklevel())
    return True
