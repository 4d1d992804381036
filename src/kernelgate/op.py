"""Declaring an op: one reference, an input contract, and the Triton implementations behind it.

>>> import torch
>>> from kernelgate import Op, TensorArg, ScalarArg
>>> def scale_reference(x: torch.Tensor, alpha: float) -> torch.Tensor:
...     return x * alpha
>>> scale = Op("doc_scale", reference=scale_reference,
...            args=(TensorArg("x"), ScalarArg("alpha")), register=False)
>>> scale(torch.ones(2), 3.0).tolist()
[3.0, 3.0]

``docs/first-op.md`` walks through a complete op with its Triton kernel.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelgate import backend
from kernelgate import log as launch_log
from kernelgate.contract import ArgSpec, TensorArg, check_inputs, validate_specs
from kernelgate.dispatch import Plan, Reason, effective_interpret, effective_mode, record_fallback
from kernelgate.errors import DeclarationError, InputTypeError, TritonUnavailableError
from kernelgate.launch import Unsupported, call_state
from kernelgate.settings import Mode, parse_mode, settings

__all__ = ["HALF_AND_FLOAT", "Op", "TritonImpl", "get_op", "registered_ops"]

HALF_AND_FLOAT: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
INT32_LIMIT = 2**31 - 1
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_GPU_DEVICE_TYPES = ("cuda", "xpu")


@dataclasses.dataclass(frozen=True)
class TritonImpl:
    """One Triton implementation of an op.

    Attributes:
        name: short name, unique within the op (``"single_block"``); appears in logs and ``doctor``.
        launcher: called with the op's arguments; allocates outputs and calls
            :func:`kernelgate.launch` for each kernel. It runs only on inputs that passed the
            contract and the checks below.
        kernels: the ``@triton.jit`` kernels the launcher launches (listed for tooling).
        dtypes: dtypes the kernels handle; other dtypes take the reference path.
        max_numel: largest element count (and index extent) of any tensor the kernels can address;
            the default suits 32-bit offsets.
        supports: optional check of further limits, called with the op's arguments; returns
            ``None`` when the inputs can run, else a sentence saying why not.
    """

    name: str
    launcher: Callable[..., Any]
    kernels: tuple[Any, ...] = ()
    dtypes: tuple[torch.dtype, ...] = HALF_AND_FLOAT
    max_numel: int = INT32_LIMIT
    supports: Callable[..., str | None] | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise DeclarationError(f"TritonImpl name must match {_NAME.pattern}; got {self.name!r}.")
        if not callable(self.launcher):
            raise DeclarationError(f"TritonImpl {self.name!r}: launcher must be callable; got {self.launcher!r}.")
        if self.max_numel < 1:
            raise DeclarationError(f"TritonImpl {self.name!r}: max_numel must be >= 1; got {self.max_numel}.")


def _index_extent(t: torch.Tensor) -> int:
    """How many elements a kernel's offsets span to address every element of ``t``."""
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))


_registry: dict[str, Op] = {}
_registry_lock = threading.Lock()


def registered_ops() -> list[Op]:
    """Every registered op (the built-in ones and those users declared), by name."""
    with _registry_lock:
        return [_registry[name] for name in sorted(_registry)]


def get_op(name: str) -> Op:
    """The registered op called ``name``.

    >>> get_op("softmax").name
    'softmax'
    """
    with _registry_lock:
        op = _registry.get(name)
    if op is None:
        known = ", ".join(sorted(_registry)) or "none"
        raise KeyError(f"no op named {name!r} is registered; registered ops: {known}.")
    return op


class Op:
    """An operation declared once: a plain-PyTorch reference, its input contract, Triton implementations.

    Call it like the reference. Each call checks the inputs against the contract, picks the path
    (see :mod:`kernelgate.dispatch`), runs it on the tensors' device and, when the launch log is
    on, appends a row.

    Args:
        name: lower-case identifier; the op's registry key, log value and CLI argument.
        reference: the plain-PyTorch function that defines the op's result.
        args: one spec per reference parameter, in order.
        implementations: Triton implementations, tried in order.
        example: builds small valid arguments on a device, for ``kernelgate doctor`` and ``demo``.
        register: add the op to the registry (``registered_ops``, the CLI).
        replace: allow replacing a registered op of the same name (for notebooks that re-run).
    """

    def __init__(
        self,
        name: str,
        *,
        reference: Callable[..., Any],
        args: Sequence[ArgSpec],
        implementations: Sequence[TritonImpl] = (),
        example: Callable[[torch.device], tuple[Any, ...]] | None = None,
        register: bool = True,
        replace: bool = False,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise DeclarationError(f"op name must match {_NAME.pattern}; got {name!r}.")
        if not callable(reference):
            raise DeclarationError(f"op {name!r}: reference must be callable; got {reference!r}.")
        try:
            params = list(inspect.signature(reference).parameters.values())
        except (TypeError, ValueError) as err:
            raise DeclarationError(
                f"op {name!r}: cannot read the reference's parameters ({err}); pass a Python function."
            ) from err
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            raise DeclarationError(f"op {name!r}: the reference must not take *args or **kwargs.")
        validate_specs(name, tuple(args), [p.name for p in params])
        impls = tuple(implementations)
        if not all(isinstance(i, TritonImpl) for i in impls):
            raise DeclarationError(f"op {name!r}: implementations must be TritonImpl instances.")
        if len({i.name for i in impls}) != len(impls):
            raise DeclarationError(f"op {name!r}: implementation names must be unique; got {[i.name for i in impls]}.")
        self.name = name
        self.reference = reference
        self.args = tuple(args)
        self.implementations = impls
        self.example = example
        self.mode: Mode | None = None
        self._names = tuple(p.name for p in params)
        self._defaults = {p.name: p.default for p in params if p.default is not p.empty}
        self._tensor_positions = tuple(i for i, s in enumerate(self.args) if isinstance(s, TensorArg))
        self.__signature__ = inspect.signature(reference)
        self.__doc__ = reference.__doc__
        self.__name__ = name
        if register:
            with _registry_lock:
                if name in _registry and not replace:
                    raise DeclarationError(
                        f"an op named {name!r} is already registered. Choose another name, or pass replace=True "
                        f"to replace it."
                    )
                _registry[name] = self

    def __repr__(self) -> str:
        impls = ", ".join(i.name for i in self.implementations) or "none"
        return f"<kernelgate op {self.name!r}: Triton implementations [{impls}]>"

    def set_mode(self, mode: str | None) -> None:
        """Pin this op's mode (``None`` follows the global setting)."""
        self.mode = None if mode is None else parse_mode(mode, source=f"{self.name}.set_mode(mode)")

    # --- the call path ----------------------------------------------------------------------

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        names = self._names
        if not kwargs and len(args) == len(names):
            return args
        if len(args) > len(names):
            raise InputTypeError(
                f"{self.name}() takes {len(names)} argument(s) ({', '.join(names)}); got {len(args)} positional. "
                f"Call it as {self._usage()}."
            )
        values = list(args)
        for name in names[len(args) :]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in self._defaults:
                values.append(self._defaults[name])
            else:
                raise InputTypeError(
                    f"{self.name}() is missing argument {name!r}; its parameters are {', '.join(names)}. "
                    f"Call it as {self._usage()}."
                )
        if kwargs:
            unknown = next(iter(kwargs))
            reason = "given twice" if unknown in names else "unknown"
            raise InputTypeError(
                f"{self.name}() got argument {unknown!r} ({reason}); its parameters are {', '.join(names)}. "
                f"Call it as {self._usage()}."
            )
        return tuple(values)

    def _usage(self) -> str:
        params = [f"{n}={self._defaults[n]!r}" if n in self._defaults else n for n in self._names]
        return f"{self.name}({', '.join(params)})"

    def plan(self, *args: Any, **kwargs: Any) -> Plan:
        """Check the inputs and return the path a call with them would take, without running it."""
        values = self._bind(args, kwargs)
        device = check_inputs(self.name, self.args, values)
        current = settings()
        mode = effective_mode(self.name, self.mode, current.mode)
        return self._plan(values, device, mode, effective_interpret(current.interpret))

    def _plan(self, values: tuple[Any, ...], device: torch.device | None, mode: Mode, interpret: bool) -> Plan:
        if mode == "reference":
            return Plan(None, Reason.MODE_REFERENCE, "mode is 'reference'")
        if not self.implementations:
            return Plan(None, Reason.NO_IMPLEMENTATION, f"{self.name} declares no Triton implementation")
        if device is None:
            return Plan(None, Reason.NO_TENSORS, "the call has no tensor argument")
        status = backend.status()
        if status.triton_version is None:
            detail = f"triton cannot be imported ({status.triton_error}); pip install triton"
            return Plan(None, Reason.TRITON_MISSING, detail)
        if interpret:
            if not status.interpreter:
                return Plan(None, Reason.TRITON_MISSING, "this Triton has no interpreter")
        elif device.type not in _GPU_DEVICE_TYPES:
            if not status.gpu:
                return Plan(
                    None,
                    Reason.NO_GPU_DRIVER,
                    "no GPU driver is active (kernelgate doctor shows why); KERNELGATE_INTERPRET=1 runs the "
                    "Triton kernels on the CPU through Triton's interpreter",
                )
            return Plan(
                None,
                Reason.CPU_TENSORS,
                f"the tensors are on {device.type}; Triton compiles for GPU tensors (move them to the GPU, "
                f"or set KERNELGATE_INTERPRET=1 to interpret the kernels)",
            )
        elif not status.gpu:
            return Plan(None, Reason.NO_GPU_DRIVER, f"no Triton GPU driver is active ({status.driver_error})")
        tensors = [values[i] for i in self._tensor_positions if values[i] is not None]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            detail = "an input requires grad and the Triton implementations have no backward"
            return Plan(None, Reason.REQUIRES_GRAD, detail)
        for t in tensors:
            if t.numel() == 0:
                return Plan(None, Reason.EMPTY_TENSOR, f"an input is empty (shape {tuple(t.shape)})")
        first: Plan | None = None
        for impl in self.implementations:
            refusal = self._refusal(impl, values, tensors)
            if refusal is None:
                reason = Reason.MODE_TRITON if mode == "triton" else Reason.FIRST_ELIGIBLE
                return Plan(impl, reason, "", interpret)
            first = first or refusal
        assert first is not None
        return first

    def _refusal(self, impl: TritonImpl, values: tuple[Any, ...], tensors: list[torch.Tensor]) -> Plan | None:
        for t in tensors:
            if t.dtype not in impl.dtypes:
                handled = ", ".join(map(str, impl.dtypes))
                return Plan(None, Reason.DTYPE, f"{impl.name} handles {handled}, not {t.dtype}")
            if t.numel() > impl.max_numel or _index_extent(t) > impl.max_numel:
                return Plan(
                    None,
                    Reason.TOO_MANY_ELEMENTS,
                    f"{impl.name} addresses at most {impl.max_numel} elements; an input has {t.numel()} "
                    f"(index extent {_index_extent(t)})",
                )
        if impl.supports is not None:
            why = impl.supports(*values)
            if why is not None:
                return Plan(None, Reason.SHAPE, f"{impl.name}: {why}")
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        values = self._bind(args, kwargs)
        device = check_inputs(self.name, self.args, values)
        current = settings()
        mode = effective_mode(self.name, self.mode, current.mode)
        plan = self._plan(values, device, mode, effective_interpret(current.interpret))
        logging = current.log_path is not None
        start = time.perf_counter() if logging else 0.0
        if plan.implementation is not None:
            try:
                result, launches, notes = self._run_triton(plan, values, device, logging)
            except Unsupported as err:
                plan = Plan(None, err.reason, err.detail)
                launches, notes = [], []
            else:
                if logging:
                    self._log(current.log_path, plan, mode, values, device, start, launches, notes)
                return result
        if mode == "triton" and plan.reason is not Reason.MODE_REFERENCE:
            raise TritonUnavailableError(
                f"{self.name}(): mode 'triton' was requested, but no Triton implementation can run these inputs: "
                f"{plan.reason}: {plan.detail}. Use mode 'auto' to fall back to the reference, or change the inputs."
            )
        if plan.reason is not Reason.MODE_REFERENCE:
            record_fallback(self.name, plan, current.warn_fallback)
        result = self.reference(*values)
        if logging:
            self._log(current.log_path, plan, mode, values, device, start, [], [])
        return result

    def _run_triton(
        self, plan: Plan, values: tuple[Any, ...], device: torch.device | None, logging: bool
    ) -> tuple[Any, list[Any], list[str]]:
        impl = plan.implementation
        assert impl is not None and device is not None
        state = call_state
        launches: list[Any] = []
        notes: list[str] = []
        saved = state.interpret, state.launches, state.notes
        state.interpret = plan.interpret
        if logging:
            state.launches, state.notes = launches, notes
        try:
            if plan.interpret or device.type != "cuda" or device.index == torch.cuda.current_device():
                result = impl.launcher(*values)
            else:
                with torch.cuda.device(device):
                    result = impl.launcher(*values)
        finally:
            state.interpret, state.launches, state.notes = saved
        return result, launches, notes

    def _log(
        self,
        path: Any,
        plan: Plan,
        mode: Mode,
        values: tuple[Any, ...],
        device: torch.device | None,
        start: float,
        launches: list[Any],
        notes: list[str],
    ) -> None:
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)  # the log is opt-in; its wall time covers the kernels
        wall_us = (time.perf_counter() - start) * 1e6
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        config = ";".join(f"{name}{list(grid)}{sorted(meta.items())}" for name, grid, meta in launches)
        reason = str(plan.reason) + (f": {plan.detail}" if plan.detail else "") + "".join(f"; {n}" for n in notes)
        from kernelgate import __version__

        launch_log.write(
            path,
            launch_log.LogRow(
                op=self.name,
                implementation=plan.name,
                config=config,
                shapes=";".join(str(list(t.shape)) for t in tensors),
                dtypes=";".join(str(t.dtype).removeprefix("torch.") for t in tensors),
                device=str(device),
                device_name=backend.device_name(device) if device is not None else "",
                capability=backend.capability(device) if device is not None else "",
                torch_version=torch.__version__,
                triton_version=backend.triton_version() or "",
                kernelgate_version=__version__,
                mode=mode,
                path=plan.path,
                reason=reason,
                wall_us=round(wall_us, 2),
            ),
        )
