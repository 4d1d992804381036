"""Which path a call takes, and the visible record of every fallback.

Modes: ``auto`` runs the fastest correct path measured for the shape bucket (see
:mod:`kernelgate.selection`) and the reference wherever no Triton implementation can run;
``reference`` always runs the reference; ``triton`` runs the fastest Triton candidate that passed
the correctness gate or raises :class:`~kernelgate.errors.TritonUnavailableError`; ``check`` is
``auto`` plus a comparison with the reference on sampled calls (:mod:`kernelgate.check`).

The mode comes from, most specific first: a :func:`use_mode` context naming the op, the op's own
``mode`` attribute, a :func:`use_mode` context for all ops, then ``KERNELGATE_MODE``.

Every call that runs the reference in ``auto`` mode is counted per (op, reason), readable with
:func:`fallbacks`, and warned about once per (op, reason).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import threading
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from kernelgate.config import Config, config_label
from kernelgate.errors import FallbackWarning, SettingsError, user_stacklevel
from kernelgate.settings import Mode, parse_mode

if TYPE_CHECKING:
    from kernelgate.op import Op, TritonImpl

__all__ = ["FallbackRecord", "Plan", "Reason", "fallbacks", "reset_fallbacks", "use_interpreter", "use_mode"]


class Reason(str, enum.Enum):
    """Why a call took the path it took.

    A Triton path is ``tuned`` (measured just now), ``cached`` (a stored decision) or
    ``default-config`` (tuning off, or a CUDA graph being captured, and no stored decision). The
    reference path is ``reference-faster`` when measurement chose it, ``mode-reference`` when asked
    for, and otherwise a fallback whose reason is counted and warned about.
    """

    TUNED = "tuned"
    CACHED = "cached"
    DEFAULT_CONFIG = "default-config"
    REFERENCE_FASTER = "reference-faster"
    MODE_REFERENCE = "mode-reference"
    GATE_FAILED = "gate-failed"
    NON_FINITE = "non-finite-inputs"
    DEMOTED = "demoted"
    NO_IMPLEMENTATION = "no-implementation"
    TRITON_MISSING = "triton-missing"
    NO_GPU_DRIVER = "no-gpu-driver"
    CPU_TENSORS = "cpu-tensors"
    NO_TENSORS = "no-tensors"
    REQUIRES_GRAD = "requires-grad"
    FUNC_TRANSFORM = "func-transform"
    JIT_TRACE = "jit-trace"
    EMPTY_TENSOR = "empty-tensor"
    DTYPE = "dtype-unsupported"
    TOO_MANY_ELEMENTS = "too-many-elements"
    GRID_TOO_LARGE = "grid-too-large"
    SHAPE = "shape-unsupported"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Plan:
    """The path a call takes: an implementation (``None`` for the reference), why, and details."""

    implementation: TritonImpl | None
    reason: Reason | str
    detail: str = ""
    interpret: bool = False
    config: Config | None = None
    key: str | None = None
    device: torch.device | None = None

    def __repr__(self) -> str:
        config = f", config={config_label(self.config)!r}" if self.config else ""
        detail = f", detail={self.detail!r}" if self.detail else ""
        return f"Plan(path={self.path!r}, implementation={self.name!r}{config}, reason={str(self.reason)!r}{detail})"

    @property
    def is_fallback(self) -> bool:
        """Whether the reference runs for want of a usable Triton path (not by choice or measurement)."""
        return self.implementation is None and self.reason not in (Reason.MODE_REFERENCE, Reason.REFERENCE_FASTER)

    @property
    def path(self) -> str:
        """``"triton"``, ``"interpreter"`` or ``"reference"``."""
        if self.implementation is None:
            return "reference"
        return "interpreter" if self.interpret else "triton"

    @property
    def name(self) -> str:
        """The implementation's name, or ``"reference"``."""
        return "reference" if self.implementation is None else self.implementation.name


# --- modes -------------------------------------------------------------------------------------

_mode_all: contextvars.ContextVar[Mode | None] = contextvars.ContextVar("kernelgate_mode", default=None)
# Never mutated: use_mode() sets a new dict.
_mode_ops: contextvars.ContextVar[dict[str, Mode]] = contextvars.ContextVar("kernelgate_op_modes", default={})  # noqa: B039
_interpret: contextvars.ContextVar[bool | None] = contextvars.ContextVar("kernelgate_interpret", default=None)
# Whether use_mode or use_interpreter has ever been entered in this process: until then every call's mode is
# its op's or the settings', and its interpreter choice the settings', without reading the context variables
# (about 0.1 us of a call's 1 to 2 us of dispatch).
overridden = False


@contextlib.contextmanager
def use_mode(mode: str, *, op: str | Op | None = None) -> Iterator[None]:
    """Run the enclosed calls in ``mode``, for every op or only for ``op`` (an op or a registered op's name).

    >>> import torch, kernelgate
    >>> with kernelgate.use_mode("reference"):
    ...     kernelgate.softmax(torch.zeros(2)).tolist()
    [0.5, 0.5]
    """
    global overridden
    checked = parse_mode(mode, source="use_mode(mode)")
    if isinstance(op, str):
        from kernelgate.op import get_op

        try:
            get_op(op)
        except KeyError as err:
            raise SettingsError(f"use_mode(op={op!r}): {err.args[0]} Name a registered op, or pass the op.") from err
    elif op is not None:
        op = op.name
    overridden = True
    if op is None:
        token = _mode_all.set(checked)
        try:
            yield
        finally:
            _mode_all.reset(token)
    else:
        ops_token = _mode_ops.set({**_mode_ops.get(), op: checked})
        try:
            yield
        finally:
            _mode_ops.reset(ops_token)


@contextlib.contextmanager
def use_interpreter(enabled: bool = True) -> Iterator[None]:
    """Run the Triton implementations of the enclosed calls through Triton's interpreter.

    Kernels then run on CPU tensors and a ``breakpoint()`` inside a kernel stops in pdb.
    """
    global overridden
    overridden = True
    token = _interpret.set(enabled)
    try:
        yield
    finally:
        _interpret.reset(token)


Overrides = tuple[Mode | None, dict[str, Mode], bool | None]


def current_overrides() -> Overrides:
    """The modes and interpreter choice that ``use_mode`` / ``use_interpreter`` set for this context."""
    return _mode_all.get(), _mode_ops.get(), _interpret.get()


@contextlib.contextmanager
def restore_overrides(overrides: Overrides) -> Iterator[None]:
    """Apply overrides captured by :func:`current_overrides` (autograd runs a backward on its own thread)."""
    tokens = (_mode_all.set(overrides[0]), _mode_ops.set(overrides[1]), _interpret.set(overrides[2]))
    try:
        yield
    finally:
        _interpret.reset(tokens[2])
        _mode_ops.reset(tokens[1])
        _mode_all.reset(tokens[0])


def effective_mode(op_name: str, op_mode: Mode | None, default: Mode) -> Mode:
    """The mode a call of ``op_name`` runs in (see the module docstring for the precedence)."""
    per_op = _mode_ops.get()
    if per_op and op_name in per_op:
        return per_op[op_name]
    if op_mode is not None:
        return op_mode
    return _mode_all.get() or default


def effective_interpret(default: bool) -> bool:
    """Whether Triton implementations run through the interpreter for this call."""
    value = _interpret.get()
    return default if value is None else value


# --- fallback record ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FallbackRecord:
    """How often ``op`` ran the reference for ``reason``, with the latest detail."""

    op: str
    reason: str
    count: int
    detail: str


_lock = threading.Lock()
_counts: dict[tuple[str, str], int] = {}
_details: dict[tuple[str, str], str] = {}


def fallback_key(op_name: str, plan: Plan) -> tuple[str, str]:
    """The counter key of a fallback plan: (op, reason); precomputed by memoised routes."""
    return (op_name, str(plan.reason))


def record_fallback(op_name: str, plan: Plan, warn: bool) -> None:
    """Count a fallback and warn the first time this (op, reason) is seen."""
    count_fallback((op_name, str(plan.reason)), plan, warn)


def count_fallback(key: tuple[str, str], plan: Plan, warn: bool) -> None:
    """Count a fallback under ``key`` = (op, reason); warn the first time the key is seen."""
    with _lock:
        count = _counts.get(key)
        _counts[key] = 1 if count is None else count + 1
        if count is None:
            _details[key] = plan.detail
    if count is None and warn:
        warnings.warn(
            f"kernelgate: {key[0]} ran the reference implementation ({plan.reason}): {plan.detail}. "
            f"This warning is shown once per op and reason; kernelgate.fallbacks() counts them, "
            f"KERNELGATE_WARN=0 silences it.",
            FallbackWarning,
            stacklevel=user_stacklevel(),
        )


def fallbacks() -> list[FallbackRecord]:
    """Every (op, reason) that took the reference path since the start (or the last reset).

    >>> reset_fallbacks(); fallbacks()
    []
    """
    with _lock:
        return [FallbackRecord(op, reason, n, _details[(op, reason)]) for (op, reason), n in sorted(_counts.items())]


def reset_fallbacks() -> None:
    """Forget the fallback counts, so the next fallback of each (op, reason) warns again."""
    with _lock:
        _counts.clear()
        _details.clear()
