"""Tuning ahead of time: decide a list of (op, shape, dtype) buckets before the program needs them.

>>> spec = TuneSpec.parse("softmax", "4096x4096", "bfloat16"); spec.shape, spec.dtype
((4096, 4096), torch.bfloat16)

Each decision is saved to the cache as soon as it is made, so an interrupted run keeps what it
finished. A bucket decided before keeps its decision unless ``retune`` asks for a new one (a decision
that a later measurement contradicts: ``kernelgate bench`` names such buckets). ``kernelgate tune`` is
the command-line face of :func:`tune_specs`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from kernelgate.cache import decision_cache
from kernelgate.dispatch import Plan, Reason, use_mode
from kernelgate.op import clear_memos, get_op
from kernelgate.settings import configure, settings

__all__ = ["TuneResult", "TuneSpec", "load_specs", "tune_specs"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclasses.dataclass(frozen=True)
class TuneSpec:
    """One bucket to decide: a registered op, the shape of its main tensor, a dtype."""

    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def parse(cls, op: str, shape: str | Sequence[int], dtype: str) -> TuneSpec:
        """Build a spec from text: ``shape`` like ``"4096x4096"``, ``dtype`` like ``"bfloat16"``.

        Raises:
            ValueError: with what was expected, what came, and the accepted forms.
        """
        get_op(op)  # raises KeyError naming the registered ops
        if isinstance(shape, str):
            try:
                dims = tuple(int(d) for d in shape.lower().split("x"))
            except ValueError as err:
                raise ValueError(f"shape must look like 4096x4096 (sizes joined by 'x'); got {shape!r}.") from err
        else:
            dims = tuple(int(d) for d in shape)
        if not dims or any(d < 0 for d in dims):
            raise ValueError(f"shape must have at least one size, none negative; got {shape!r}.")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}.")
        return cls(op, dims, DTYPES[dtype])

    def __str__(self) -> str:
        return f"{self.op} {'x'.join(map(str, self.shape))} {str(self.dtype).removeprefix('torch.')}"


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """What tuning one spec gave: the plan (with its reason and detail), or why there is none."""

    spec: TuneSpec
    plan: Plan | None
    seconds: float
    # "tuned", "retuned" (decided again, replacing the cached decision), "cached", "not tunable" (e.g. no GPU),
    # "skipped" (over budget), "error"
    status: str
    detail: str = ""


def load_specs(path: Path) -> list[TuneSpec]:
    """Read specs from a JSON file: ``[{"op": "softmax", "shape": [4096, 4096], "dtype": "bfloat16"}, ...]``."""
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of {{op, shape, dtype}} objects; got {type(data).__name__}.")
    specs = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or set(item) != {"op", "shape", "dtype"}:
            raise ValueError(f"{path}: entry {i} must be an object with keys op, shape, dtype; got {item!r}.")
        specs.append(TuneSpec.parse(item["op"], item["shape"], item["dtype"]))
    return specs


def tune_specs(
    specs: Sequence[TuneSpec],
    device: torch.device,
    *,
    budget_s: float | None = None,
    on_result: Callable[[TuneResult], None] | None = None,
    retune: bool = False,
) -> list[TuneResult]:
    """Decide each spec's bucket on ``device`` (tuning is on for this call even if pinned off).

    Specs not started within ``budget_s`` seconds are skipped. Decisions are saved as they are made. A bucket
    with a cached decision keeps it, or with ``retune`` is tuned again and its new decision replaces the old.
    """
    results: list[TuneResult] = []
    start = time.monotonic()
    previous = settings().tune
    configure(tune=True)
    try:
        for spec in specs:
            began = time.monotonic()
            if budget_s is not None and began - start > budget_s:
                result = TuneResult(spec, None, 0.0, "skipped", f"over the {budget_s:g} s budget")
            else:
                op = get_op(spec.op)
                try:
                    if op.make_inputs is None:
                        raise ValueError(f"{op.name} declares no make_inputs, so it cannot be tuned from a shape")
                    values = op.make_inputs(spec.shape, spec.dtype, device)
                    with use_mode("auto"):
                        before = op.explain(*values)
                        decided = before.reason is not Reason.DEFAULT_CONFIG and before.key is not None
                        if retune and decided:
                            assert before.key is not None
                            decision_cache(settings().cache_dir).remove([before.key])
                            clear_memos()
                        plan = op.plan(*values)
                    if before.reason is Reason.DEFAULT_CONFIG:
                        status = "tuned"
                    elif decided:
                        status = "retuned" if retune else "cached"
                    else:
                        status = "not tunable"
                    result = TuneResult(spec, plan, time.monotonic() - began, status)
                except Exception as err:  # one bad spec does not end the run
                    result = TuneResult(spec, None, time.monotonic() - began, "error", f"{type(err).__name__}: {err}")
            results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        configure(tune=previous)
    return results
