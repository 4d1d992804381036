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

import contextlib
import dataclasses
import enum
import functools
import hashlib
import importlib
import inspect
import json
import pickle
import re
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from kernelgate import backend, library
from kernelgate import log as launch_log
from kernelgate.bucket import pow2, stride_class
from kernelgate.cache import decision_cache
from kernelgate.compile_ahead import compiling_untuned
from kernelgate.config import Config, ConfigSpace, config_label
from kernelgate.contract import ArgSpec, TensorArg, check_inputs, validate_specs
from kernelgate.dispatch import (
    Plan,
    Reason,
    count_fallback,
    effective_interpret,
    effective_mode,
    fallback_key,
    record_fallback,
)
from kernelgate.errors import CacheWarning, DeclarationError, InputTypeError, TritonUnavailableError, user_stacklevel
from kernelgate.launch import LazyKernel, Unsupported, call_state, kernel_source
from kernelgate.library import Backward
from kernelgate.selection import clone_args, compile_candidates_here, device_step_us, time_autograd_step, tune
from kernelgate.settings import Mode, Settings, parse_mode, settings

__all__ = ["HALF_AND_FLOAT", "Op", "StepRoute", "TritonImpl", "get_op", "registered_ops"]

HALF_AND_FLOAT: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
INT32_LIMIT = 2**31 - 1
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_GPU_DEVICE_TYPES = ("cuda", "xpu")


@dataclasses.dataclass(frozen=True)
class TritonImpl:
    """One Triton implementation of an op.

    Attributes:
        name: short name, unique within the op (``"single_block"``); appears in logs and ``doctor``.
        launcher: called with the op's arguments (and ``config=`` when ``configs`` is declared);
            allocates outputs with :func:`kernelgate.empty` and calls :func:`kernelgate.launch`.
            It runs only on inputs that passed the contract and the checks below.
        kernels: the ``@triton.jit`` kernels the launcher launches; their source is hashed into
            every tuning decision, so an edited kernel is tuned again.
        dtypes: dtypes the kernels handle; other dtypes take the reference path.
        max_numel: largest element count (and index extent) of any tensor the kernels can address;
            the default suits 32-bit offsets.
        supports: optional check of further limits, called with the op's arguments; returns
            ``None`` when the inputs can run, else a sentence saying why not.
        configs: the launch configurations to tune over, or ``None`` for a launcher that takes none.
        default_config: the configuration used without tuning: a member of ``configs``, or a
            function of the op's arguments returning one. Default: the first that ``prune`` keeps.
        prune: optional ``prune(config, *args) -> bool``: whether ``config`` suits these inputs
            (block sizes that fit the row, register and shared-memory limits). Runs before
            anything compiles.
    """

    name: str
    launcher: Callable[..., Any]
    kernels: tuple[Any, ...] = ()
    dtypes: tuple[torch.dtype, ...] = HALF_AND_FLOAT
    max_numel: int = INT32_LIMIT
    supports: Callable[..., str | None] | None = None
    configs: ConfigSpace | None = None
    default_config: Config | Callable[..., Config] | None = None
    prune: Callable[..., bool] | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise DeclarationError(f"TritonImpl name must match {_NAME.pattern}; got {self.name!r}.")
        if not callable(self.launcher):
            raise DeclarationError(f"TritonImpl {self.name!r}: launcher must be callable; got {self.launcher!r}.")
        if self.max_numel < 1:
            raise DeclarationError(f"TritonImpl {self.name!r}: max_numel must be >= 1; got {self.max_numel}.")
        if self.configs is not None and not isinstance(self.configs, ConfigSpace):
            raise DeclarationError(f"TritonImpl {self.name!r}: configs must be a ConfigSpace; got {self.configs!r}.")
        if self.configs is None and (self.default_config is not None or self.prune is not None):
            raise DeclarationError(f"TritonImpl {self.name!r}: default_config and prune need configs.")
        if isinstance(self.default_config, Mapping):
            assert self.configs is not None
            if self.configs.validate(self.default_config) is None:
                raise DeclarationError(
                    f"TritonImpl {self.name!r}: default_config {dict(self.default_config)} is not in {self.configs!r}."
                )

    def candidate_configs(self, values: Sequence[Any]) -> list[Config | None]:
        """The configurations to try for these inputs: the space, pruned (``[None]`` without one)."""
        if self.configs is None:
            return [None]
        return [c for c in self.configs if self.prune is None or self.prune(c, *values)]

    def default_for(self, values: Sequence[Any]) -> Config | None:
        """The configuration used without tuning, or ``None`` (no config space)."""
        if self.configs is None:
            return None
        if self.default_config is None:
            kept = self.candidate_configs(values)
            return kept[0] if kept else next(iter(self.configs))
        chosen = self.default_config(*values) if callable(self.default_config) else self.default_config
        valid = self.configs.validate(chosen)
        if valid is None:
            raise DeclarationError(
                f"TritonImpl {self.name!r}: default_config gave {chosen!r}, not in {self.configs!r}."
            )
        return valid

    def source_hash(self) -> str:
        """A hash of the kernels' and launcher's source and the config space (imports the kernels).

        A ``@triton.jit`` kernel counts by its source and that of the ``@triton.jit`` helpers and constexpr
        globals it reaches (:func:`~kernelgate.launch.kernel_source`), so editing a shared helper retunes, and
        every process computes the same hash whatever it hashed or ran before.
        """
        cached = self.__dict__.get("_source_hash")
        if cached is not None:
            return str(cached)
        digest = hashlib.sha256(repr(self.configs).encode())
        for item in (*self.kernels, self.launcher):
            resolved = item.resolve() if isinstance(item, LazyKernel) else item
            src = kernel_source(resolved) or getattr(resolved, "src", None)
            if src is None:
                try:
                    src = inspect.getsource(getattr(resolved, "fn", resolved))
                except (OSError, TypeError):
                    src = getattr(resolved, "__qualname__", repr(resolved))
            digest.update(str(src).encode())
        value = digest.hexdigest()[:16]
        object.__setattr__(self, "_source_hash", value)  # computed once; the declaration stays frozen
        return value


# The settings module itself (the package re-exports a function of the same name): the hot path
# reads its current settings and generation without a function call; and the dispatch module, whose
# flag of override contexts it reads likewise.
_settings_module = importlib.import_module("kernelgate.settings")
_dispatch_module = importlib.import_module("kernelgate.dispatch")


def _index_extent(t: torch.Tensor) -> int:
    """How many elements a kernel's offsets span to address every element of ``t``."""
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))


_registry: dict[str, Op] = {}
_registry_lock = threading.Lock()


def registered_ops() -> list[Op]:
    """Every registered op (the built-in ones and those users declared), by name."""
    with _registry_lock:
        return [_registry[name] for name in sorted(_registry)]


def lookup(name: str) -> Op:
    """The registered op called ``name`` (for the PyTorch operator's implementation)."""
    return _registry[name]


class _InsideTorchOp(threading.local):
    active: bool = False


inside_torch_op = _InsideTorchOp()


def _unpickle_op(name: str) -> Op:
    """The op an unpickled object names: this process's registered op of that name."""
    with _registry_lock:
        op = _registry.get(name)
    if op is None:
        raise pickle.UnpicklingError(
            f"the object being unpickled holds the kernelgate op {name!r}, which this process has not registered. "
            f"Import the module that declares it before unpickling."
        )
    return op


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
    (see :mod:`kernelgate.dispatch` and :mod:`kernelgate.selection`), runs it on the tensors'
    device and, when the launch log is on, appends a row. The checks and the choice are memoised
    per exact input signature, so a repeated call pays a dictionary lookup.

    Args:
        name: lower-case identifier; the op's registry key, log value and CLI argument.
        reference: the plain-PyTorch function that defines the op's result.
        args: one spec per reference parameter, in order.
        implementations: Triton implementations, tried in order.
        bucket: ``bucket(*args) -> tuple``: which calls share a tuning decision (see
            :mod:`kernelgate.bucket`); default: each dimension of each tensor rounded up to a
            power of two.
        reduction_length: ``reduction_length(*args) -> int``: how many inputs each output
            reduces over, which scales the tolerance; default 1.
        normwise_outputs: indices of outputs that are sums of terms of both signs over many rows
            (weight gradients): the gate compares them by the norm of the error, since a correct
            kernel that adds in another order misses elementwise bounds where the sum cancels.
        mutates: names of tensor arguments the op writes in place; tuning runs on copies of them.
        backward: how gradients are computed (:class:`kernelgate.Backward`); default: autograd of
            the reference, recomputed from the saved inputs.
        returns: the operator schema's return type: ``"Tensor"`` or e.g. ``"(Tensor, Tensor)"``.
        make_inputs: ``make_inputs(shape, dtype, device) -> args``: valid random arguments whose
            main tensor has ``shape``, for ``kernelgate doctor``, ``tune`` and ``bench``.
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
        bucket: Callable[..., tuple[Any, ...]] | None = None,
        reduction_length: Callable[..., int] | None = None,
        mutates: Sequence[str] = (),
        backward: Backward | None = None,
        normwise_outputs: Sequence[int] = (),
        returns: str = "Tensor",
        make_inputs: Callable[[tuple[int, ...], torch.dtype, torch.device], tuple[Any, ...]] | None = None,
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
        tensor_names = [s.name for s in args if isinstance(s, TensorArg)]
        unknown = [m for m in mutates if m not in tensor_names]
        if unknown:
            raise DeclarationError(f"op {name!r}: mutates names {unknown}, which are not tensor arguments.")
        self.name = name
        self.reference = reference
        self.args = tuple(args)
        self.implementations = impls
        self.bucket = bucket or _default_bucket
        self.reduction_length: Callable[..., int] = reduction_length or (lambda *args: 1)
        self.mutates = tuple(mutates)
        self.normwise_outputs = tuple(normwise_outputs)
        self.mutated_positions = tuple(i for i, s in enumerate(self.args) if s.name in self.mutates)
        self.make_inputs = make_inputs
        self.backward = backward
        self.mode: Mode | None = None
        self._names = tuple(p.name for p in params)
        self._defaults = {p.name: p.default for p in params if p.default is not p.empty}
        self._tensor_positions = tuple(i for i, s in enumerate(self.args) if isinstance(s, TensorArg))
        self._memo: dict[tuple[Any, ...], _Route] = {}
        # Autograd call signatures (_dispatch's key, grad on) whose steps run eager autograd of the reference for
        # good: the forward route that decided it, and the memo epoch it was decided in (_memo_epoch).
        self._eager_steps: dict[tuple[Any, ...], tuple[_Route, int]] = {}
        # Whether the forward eager autograd runs is fixed per signature (a Backward may choose it per call from
        # state, as cross_entropy's does; then no verdict is kept).
        self._static_forward = backward is None or backward.forward is None or isinstance(backward.forward, Op)
        self._arity = len(params)
        self._calls = 0
        self.__signature__ = inspect.signature(reference)
        self.__doc__ = reference.__doc__
        self.__name__ = name
        _all_ops.add(self)
        self.torch_op: Any = None
        self._function: Any = None  # the eager autograd path, made on first use
        if register:
            with _registry_lock:
                if name in _registry and not replace:
                    raise DeclarationError(
                        f"an op named {name!r} is already registered. Choose another name, or pass replace=True "
                        f"to replace it."
                    )
                _registry[name] = self
            # torch.ops.kernelgate.<name>: fake tensors, autograd and torch.compile.
            self.torch_op = library.register(self, returns)

    def __repr__(self) -> str:
        impls = ", ".join(i.name for i in self.implementations) or "none"
        return f"<kernelgate op {self.name!r}: Triton implementations [{impls}]>"

    # An op is one object per name, as a function is: copies are the op itself, and a registered op pickles by
    # its name, so that a module, a functools.partial or a process pool's task that holds one copies and pickles.

    def __copy__(self) -> Op:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Op:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        if _registry.get(self.name) is not self:
            raise pickle.PicklingError(
                f"kernelgate op {self.name!r} is not registered (declared with register=False, or replaced since), "
                f"and an op pickles by its registered name; declare it registered to pickle what holds it."
            )
        return (_unpickle_op, (self.name,))

    def set_mode(self, mode: str | None) -> None:
        """Pin this op's mode (``None`` follows the global setting)."""
        self.mode = None if mode is None else parse_mode(mode, source=f"{self.name}.set_mode(mode)")

    def clear_memo(self) -> None:
        """Forget memoised call plans (after the decision cache changed)."""
        global _memo_epoch
        self._memo = {}
        self._eager_steps = {}
        # Another op's kept eager-step verdicts may rest on this op's routes (its Backward's forward).
        _memo_epoch += 1

    # --- binding and planning ---------------------------------------------------------------

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
        """Check the inputs and return the path a call with them takes (tuning the bucket if it is new)."""
        current = settings()
        mode = effective_mode(self.name, self.mode, current.mode)
        return self._resolve(self._bind(args, kwargs), mode, effective_interpret(current.interpret), current)

    def explain(self, *args: Any, **kwargs: Any) -> Plan:
        """Like :meth:`plan`, but never tunes: an untuned bucket reports its default configuration."""
        current = settings()
        mode = effective_mode(self.name, self.mode, current.mode)
        interpret = effective_interpret(current.interpret)
        return self._resolve(self._bind(args, kwargs), mode, interpret, current, allow_tune=False)

    def _resolve(
        self, values: tuple[Any, ...], mode: Mode, interpret: bool, current: Settings, allow_tune: bool = True
    ) -> Plan:
        """Validate the inputs and choose the path (without the memo)."""
        device = check_inputs(self.name, self.args, values)
        eligible, refusal = self._eligible(values, device, mode, interpret)
        if not eligible:
            assert refusal is not None
            return refusal
        assert device is not None
        key = self._decision_key(values, device, interpret)
        cache = decision_cache(current.cache_dir)
        entry = self._valid_entry(cache.get(key), f"{cache.path}:{key}")
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if entry is None and current.tune and not capturing and allow_tune:
            try:
                entry, results = tune(self, values, device, eligible, interpret, current.tune_margin)
            except Unsupported as err:
                return Plan(None, err.reason, err.detail, key=key, device=device)
            cache.put(key, entry)
            self._log_tuning(current, values, device, mode, results, entry)
            entry = self._valid_entry(entry, f"{cache.path}:{key}")
            assert entry is not None
            reason: Reason = Reason.TUNED
        else:
            reason = Reason.CACHED
        if entry is None:
            impl = eligible[0]
            if capturing:
                detail = "a CUDA graph is being captured"
            elif not current.tune:
                detail = "tuning is off (KERNELGATE_TUNE=off)"
                if allow_tune and compiling_untuned() and not interpret:
                    compiled = compile_candidates_here(self, values, eligible)
                    detail += f"; {compiled.compiled} of its candidates' {compiled.jobs} kernels compiled ahead"
            else:
                detail = "no decision is cached for this bucket yet; the first call tunes it"
            return Plan(impl, Reason.DEFAULT_CONFIG, detail, interpret, impl.default_for(values), key, device)
        winner, best = entry["winner"], entry["best"]
        for choice in (winner, best):
            if choice is not None and not self._accepts(choice, eligible, values):
                # The bucket's decision was made on inputs its implementation accepts; these differ
                # (a refused length, a pruned config), so this call takes the first eligible default.
                impl = eligible[0]
                detail = f"the bucket's decision ({choice[0].name}) does not accept these inputs"
                return Plan(impl, Reason.DEFAULT_CONFIG, detail, interpret, impl.default_for(values), key, device)
        if mode == "triton":
            if best is None:
                return Plan(None, Reason.GATE_FAILED, entry["reason"], key=key, device=device)
            return Plan(best[0], reason, "", interpret, best[1], key, device)
        if winner is None:
            why = Reason.DEMOTED if entry.get("demoted") else Reason.REFERENCE_FASTER
            if best is None and why is Reason.REFERENCE_FASTER:
                why = Reason.GATE_FAILED
            return Plan(None, why, entry["reason"], key=key, device=device)
        return Plan(winner[0], reason, "", interpret, winner[1], key, device)

    def _eligible(
        self, values: tuple[Any, ...], device: torch.device | None, mode: Mode, interpret: bool
    ) -> tuple[list[TritonImpl], Plan | None]:
        """The implementations that can run these inputs here, or the reason none can."""
        if mode == "reference":
            return [], Plan(None, Reason.MODE_REFERENCE, "mode is 'reference'")
        if not self.implementations:
            return [], Plan(None, Reason.NO_IMPLEMENTATION, f"{self.name} declares no Triton implementation")
        if device is None:
            return [], Plan(None, Reason.NO_TENSORS, "the call has no tensor argument")
        status = backend.status()
        if status.triton_version is None:
            detail = f"triton cannot be imported ({status.triton_error}); pip install triton"
            return [], Plan(None, Reason.TRITON_MISSING, detail)
        if interpret:
            if not status.interpreter:
                return [], Plan(None, Reason.TRITON_MISSING, "this Triton has no interpreter")
        elif device.type not in _GPU_DEVICE_TYPES:
            if not status.gpu:
                return [], Plan(
                    None,
                    Reason.NO_GPU_DRIVER,
                    "no GPU driver is active (kernelgate doctor shows why); KERNELGATE_INTERPRET=1 runs the "
                    "Triton kernels on the CPU through Triton's interpreter",
                )
            return [], Plan(
                None,
                Reason.CPU_TENSORS,
                f"the tensors are on {device.type}; Triton compiles for GPU tensors (move them to the GPU, "
                f"or set KERNELGATE_INTERPRET=1 to interpret the kernels)",
            )
        elif not status.gpu:
            return [], Plan(None, Reason.NO_GPU_DRIVER, f"no Triton GPU driver is active ({status.driver_error})")
        tensors = [values[i] for i in self._tensor_positions if values[i] is not None]
        # Inside the PyTorch operator autograd is handled by its registered backward; outside it
        # (an unregistered op) a Triton output would silently lack a gradient.
        if torch.is_grad_enabled() and not inside_torch_op.active and any(t.requires_grad for t in tensors):
            detail = "an input requires grad and the Triton implementations have no backward"
            return [], Plan(None, Reason.REQUIRES_GRAD, detail)
        for t in tensors:
            if t.numel() == 0:
                return [], Plan(None, Reason.EMPTY_TENSOR, f"an input is empty (shape {tuple(t.shape)})")
        eligible: list[TritonImpl] = []
        first: Plan | None = None
        for impl in self.implementations:
            refusal = self._refusal(impl, values, tensors)
            if refusal is None:
                if impl.candidate_configs(values):
                    eligible.append(impl)
                    continue
                refusal = Plan(None, Reason.SHAPE, f"{impl.name}: every configuration is pruned for these inputs")
            first = first or refusal
        return eligible, first

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

    # --- decisions --------------------------------------------------------------------------

    def source_hash(self) -> str:
        """A hash over every implementation's kernels, launcher and config space."""
        return hashlib.sha256("".join(i.source_hash() for i in self.implementations).encode()).hexdigest()[:16]

    def _decision_key(self, values: tuple[Any, ...], device: torch.device, interpret: bool) -> str:
        from kernelgate import __version__

        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        parts = [
            self.name,
            list(self.bucket(*values)),
            [str(t.dtype).removeprefix("torch.") for t in tensors],
            [stride_class(t) for t in tensors],
            [t.data_ptr() % 16 == 0 for t in tensors],
            "interpreter" if interpret else backend.device_name(device),
            backend.capability(device),
            torch.__version__,
            backend.triton_version() or "",
            __version__,
            self.source_hash(),
        ]
        return json.dumps(parts, separators=(",", ":"), default=str)

    @staticmethod
    def _accepts(choice: tuple[TritonImpl, Config | None], eligible: list[TritonImpl], values: tuple[Any, ...]) -> bool:
        impl, config = choice
        if impl not in eligible:
            return False
        return config is None or impl.prune is None or impl.prune(config, *values)

    def _valid_entry(self, entry: Mapping[str, Any] | None, key: str) -> dict[str, Any] | None:
        """The cache entry with its implementations resolved, or ``None`` if absent or invalid (warned once)."""
        if entry is None:
            return None
        try:
            winner = self._resolve_choice(entry["implementation"], entry.get("config"))
            best_raw = entry.get("best_triton")
            best = (
                None if best_raw is None else self._resolve_choice(best_raw["implementation"], best_raw.get("config"))
            )
            if best is None and best_raw is not None:
                raise ValueError("best_triton names the reference")
            return {
                "winner": winner,
                "best": best,
                "reason": str(entry.get("reason", "")),
                "demoted": bool(entry.get("demoted")),
            }
        except (KeyError, TypeError, ValueError) as err:
            if key not in _warned_entries:
                _warned_entries.add(key)
                warnings.warn(
                    f"kernelgate: ignoring a decision-cache entry for {self.name} that does not fit its declaration "
                    f"({err}); the bucket is tuned again.",
                    CacheWarning,
                    stacklevel=user_stacklevel(),
                )
            return None

    def _resolve_choice(self, name: object, config: object) -> tuple[TritonImpl, Config | None] | None:
        if name == "reference":
            return None
        impl = next((i for i in self.implementations if i.name == name), None)
        if impl is None:
            raise ValueError(f"unknown implementation {name!r}")
        if impl.configs is None:
            if config is not None:
                raise ValueError(f"{name} takes no configuration")
            return impl, None
        valid = impl.configs.validate(config)
        if valid is None:
            raise ValueError(f"configuration {config!r} is not in {name}'s space {impl.configs!r}")
        return impl, valid

    # --- the call path ----------------------------------------------------------------------

    def run_reference(self, *values: Any) -> Any:
        """The reference on ``values`` as every path of kernelgate runs it: with ``torch.autocast`` off.

        The kernels compute in float32 and return their inputs' dtypes whether or not autocast is on, as an op
        called through ``torch.library`` without an autocast rule does; autocast would run some references'
        torch ops in float32 on a GPU (softmax, layer_norm) and return float32. The reference path would then
        return another dtype than the kernels for the same call, and the correctness gate would refuse every
        candidate of a bucket first called under autocast.
        """
        if _any_autocast():
            with _autocast_off(values):
                return self.reference(*values)
        return self.reference(*values)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        values = args if not kwargs and len(args) == self._arity else self._bind(args, kwargs)
        # torch.compile traces the op as one node (the operator); plain eager calls skip the
        # PyTorch dispatcher unless autograd or a trace needs it (decided in _dispatch).
        if self.torch_op is not None and torch.compiler.is_compiling():
            return self.torch_op(*values)
        if _functorch_active():
            return self._run_under_func_transform(values)
        if _jit_tracing():
            return self._run_under_jit_trace(values)
        return self._dispatch(values, self.torch_op is not None)

    def _autograd_call(self, values: tuple[Any, ...], key: tuple[Any, ...] | None = None) -> Any:
        """A call that autograd or a trace must see; ``key``: _dispatch's signature of it, where every tensor
        is plain (``None``: one is not, or it could not be hashed).

        Eager autograd of plain tensors goes through the op's own ``torch.autograd.Function``: the
        same save and backward as the operator's, at about two thirds of its host cost (no
        dispatcher round trip, no schema work per call). Traces, tensor subclasses and mutating ops go
        through the PyTorch operator (a call under a torch.func transform never comes here:
        :meth:`_run_under_func_transform`). A signature whose steps run eager autograd of the reference for good
        skips the forward's route and the step's verdict.
        """
        if self.mutates:
            return self.torch_op(*values)
        if key is None:
            for v in values:
                if isinstance(v, torch.Tensor) and type(v) is not torch.Tensor and type(v) is not torch.nn.Parameter:
                    return self.torch_op(*values)
            route = self.forward_route(values)
        else:
            try:
                kept = self._eager_steps.get(key)
            except TypeError:  # an unhashable argument
                kept, key = None, None
            if kept is not None and kept[1] == _memo_epoch:
                route = kept[0]
                if route.fallback_key is not None:
                    count_fallback(
                        route.fallback_key, route.plan, (_settings_module._current or settings()).warn_fallback
                    )
                return self.run_reference(*values) if _any_autocast() else self.reference(*values)
            route = self.forward_route(values)
        if route is not None and self._steps_eagerly(values, route):
            # Eager autograd of the reference: the same work as the Function where both passes run the
            # reference, or a step timed faster than the Function's (whose host cost is 250 to 600 us a
            # step on the H200's host, several times a small kernel's time). Either verdict is final for
            # the signature (the Function, which alone could change it, no longer runs it).
            if key is not None and self._static_forward:
                if len(self._eager_steps) >= MEMO_LIMIT:
                    self._eager_steps = {}
                self._eager_steps[key] = (route, _memo_epoch)
            if route.fallback_key is not None:
                count_fallback(route.fallback_key, route.plan, (_settings_module._current or settings()).warn_fallback)
            return self.run_reference(*values)
        if self._function is None:
            self._function = library.autograd_function(self)
        # The route rides along, so the Function's forward runs it without building the signature again.
        return self._function.apply(route, *values)

    def _run_under_func_transform(self, values: tuple[Any, ...]) -> Any:
        """A call under a torch.func transform (vmap, grad, vjp, jvp, jacrev, hessian): the reference, whose torch
        ops the transforms batch and differentiate. A kernel cannot take vmap's batched tensors (they have no
        storage), and the operator's autograd (torch.library's generated ``autograd.Function``, which has no
        ``setup_context``) raises under the differentiating ones; kernelgate's Function has none either. The
        inputs are checked as any call's; counted and warned as a fallback (``func-transform``), and refused in
        mode ``triton``."""
        check_inputs(self.name, self.args, values)
        return self._run_reference_instead(
            values,
            Reason.FUNC_TRANSFORM,
            "a torch.func transform (vmap, grad, jacrev...) applies to this call; it can batch and differentiate the "
            "reference's torch ops, not the kernels",
        )

    def _run_under_jit_trace(self, values: tuple[Any, ...]) -> Any:
        """A call while ``torch.jit.trace`` records: the trace records torch ops, and would keep a kernel's output as a
        constant, so a registered op runs as its operator (the trace calls ``kernelgate::<name>``, which dispatches
        each call of the traced module as usual), and an unregistered one runs its reference, whose torch ops the
        trace records (a fallback, ``jit-trace``; refused in mode ``triton``). The inputs are checked first, with the
        trace off: while it records, a tensor's sizes are tensors."""
        with _jit_trace_paused():
            check_inputs(self.name, self.args, values)
        if self.torch_op is not None:
            return self.torch_op(*values)
        return self._run_reference_instead(
            values,
            Reason.JIT_TRACE,
            "torch.jit.trace is recording this call and the op has no torch operator (it was declared with "
            "register=False): the trace can record the reference's torch ops, not a kernel",
        )

    def _run_reference_instead(self, values: tuple[Any, ...], reason: Reason, detail: str) -> Any:
        """The reference, for a call whose context no kernel can serve (``reason``, ``detail``): counted and warned as
        a fallback, run as asked in mode ``reference``, refused in mode ``triton``."""
        current = _settings_module._current or settings()
        mode = effective_mode(self.name, self.mode, current.mode)
        plan = (
            Plan(None, Reason.MODE_REFERENCE, "mode is 'reference'")
            if mode == "reference"
            else Plan(None, reason, detail)
        )
        return self._run_reference(plan, values, mode, current, 0.0)

    def _steps_eagerly(self, values: tuple[Any, ...], route: _Route) -> bool:
        """Whether eager autograd of the reference should run instead of kernelgate's Function, for the
        memoised route of the forward of ``values`` (mode ``auto`` or ``reference``, see :meth:`forward_route`).

        A forward planned to the reference whose backward is the reference too (an op without a backward
        op differentiates its reference anyway; with one, its backward must have run once through the
        Function and called no Triton implementation): eager autograd does the same work with less host time.

        Where the forward or that backward ran a kernel chosen by tuning, the two steps are timed once for
        the signature, after the Function's first step (:meth:`_eager_step_is_faster`), and eager autograd
        runs only where it is faster. The Function's host cost can outweigh what the kernels save: on the
        H200's host a Function step costs 250 to 600 us of host time (rms_norm forward+backward at 64x4096:
        592 us through the Function against 148 for eager autograd; layer_norm float32 at 8192x1024, its
        forward planned to a kernel: 991 against 129). Where the kernels' device time is the larger, the
        Function wins the timing and keeps them; on a GPU, where eager autograd's step is mostly the device's
        time, the device's time per step decides (:meth:`_eager_step_wins_on_the_device`). A backward in mode
        ``triton`` keeps the Function, as asked; a forward in mode ``triton`` never gets here
        (:meth:`forward_route`).
        """
        verdict = self._step_verdict(route)
        if verdict is _StepVerdict.TIME:
            # Timed with autocast off, as the route runs the reference (run_reference) and the kernels ignore it.
            with _autocast_off(values):
                route.eager_step = self._eager_step_is_faster(values, route)
            verdict = _StepVerdict.TIMED
        return verdict is _StepVerdict.REFERENCE_BOTH or (verdict is _StepVerdict.TIMED and bool(route.eager_step))

    def _step_verdict(self, route: _Route) -> _StepVerdict:
        """Where the autograd step of a memoised forward route stands (see :meth:`_steps_eagerly`)."""
        if route.reference_ok and (self.backward is None or route.backward_reference is True):
            return _StepVerdict.REFERENCE_BOTH
        if route.backward_reference is None:
            return _StepVerdict.FIRST_STEP
        if route.backward_forced:
            return _StepVerdict.BACKWARD_FORCED
        if not route.reference_ok and self.backward is not None and not self.backward.may_step_eagerly:
            return _StepVerdict.KEPT_FOR_MEMORY
        return _StepVerdict.TIME if route.eager_step is None else _StepVerdict.TIMED

    def step_route(self, *args: Any, **kwargs: Any) -> StepRoute:
        """How an eager autograd call with these arguments runs, as earlier calls of its signature decided:
        through kernelgate's Function (its kernels, forward and backward) or eager autograd of the reference,
        and why. Runs and times nothing; call it after a training step to see what the steps ran."""
        values = self._bind(args, kwargs)
        current = settings()
        forward = (self.backward.forward_op(values) if self.backward is not None else None) or self
        mode = effective_mode(forward.name, forward.mode, current.mode)
        if current.log_path is not None:
            return StepRoute("function", "a launch log is on: every autograd call runs kernelgate's Function")
        if mode not in ("auto", "reference"):
            return StepRoute("function", f"mode {mode}: every autograd call runs kernelgate's Function")
        route = self.forward_route(values)
        if route is None:
            return StepRoute(
                "undecided", "no autograd call of this signature yet: the first runs kernelgate's Function"
            )
        verdict = self._step_verdict(route)
        if verdict is _StepVerdict.TIMED:
            return StepRoute("eager" if route.eager_step else "function", route.step_detail, *route.step_us)
        return StepRoute(_STEP_VERDICT_PATH[verdict], verdict.value)

    def _eager_step_is_faster(self, values: tuple[Any, ...], route: _Route) -> bool | None:
        """Whether eager autograd of the reference steps (forward, then backward) faster than kernelgate's Function
        on these inputs, unless the Function is faster by the step margin (:data:`STEP_MARGIN`, or the tuning
        margin if larger); ``None`` where it cannot be timed now (a CUDA graph is being captured: the next call
        decides).

        Timed on the inputs themselves, detached (no ``.grad`` is touched, no random state drawn), with an
        incoming gradient of ones. With tuning off nothing is timed: the Function keeps the backward's kernel.
        """
        current = _settings_module._current or settings()
        if not current.tune:
            route.step_detail = "tuning is off: kernelgate's Function keeps its kernels, untimed"
            return False
        device = next(v.device for v in values if isinstance(v, torch.Tensor))
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        if self._function is None:
            self._function = library.autograd_function(self)
        leaves = tuple(
            v.detach().requires_grad_() if isinstance(v, torch.Tensor) and v.requires_grad else v for v in values
        )
        wanted = [v for v in leaves if isinstance(v, torch.Tensor) and v.requires_grad]
        apply = self._function.apply
        function_step = lambda *v: apply(route, *v)  # the leaves' signature is the route's
        # The fastest of interleaved rounds of steps back to back: the host's time per step is noisy. On the
        # H200, one timing of each chose eager autograd for softmax at 262144x128 float32, whose steps back to
        # back then took 263 us against the Function's 231; three rounds of do_bench and host timing kept
        # the Function in 18 of 190 cases of the default suite where it was then measured slower than eager.
        eager_rounds: list[float] = []
        function_rounds: list[float] = []
        for _ in range(STEP_ROUTE_ROUNDS):
            try:
                eager_rounds.append(time_autograd_step(self.reference, leaves, wanted, device))
            except torch.cuda.OutOfMemoryError:  # eager autograd does not fit where the Function does: keep it
                route.step_detail = "eager autograd ran out of memory while timed: kernelgate's Function is kept"
                return False
            function_rounds.append(time_autograd_step(function_step, leaves, wanted, device))
        eager_us, function_us = min(eager_rounds), min(function_rounds)
        margin = max(current.tune_margin, STEP_MARGIN)
        eager = eager_us * (1 - margin) <= function_us
        route.step_us = (eager_us, function_us)
        # The rounds' spread says how far one timing can be trusted where the host's time per step drifts.
        route.step_detail = (
            f"timed once: a step through eager autograd {eager_us:.1f} us, through kernelgate's Function "
            f"{function_us:.1f} us (margin {margin:.0%}; rounds: eager {eager_us:.1f} to {max(eager_rounds):.1f} us, "
            f"the Function {function_us:.1f} to {max(function_rounds):.1f} us)"
        )
        if eager and device.type == "cuda":
            steps = (self.reference, function_step)
            eager = self._eager_step_wins_on_the_device(leaves, wanted, device, route, steps, (eager_us, function_us))
        return eager

    def _eager_step_wins_on_the_device(
        self,
        leaves: tuple[Any, ...],
        wanted: list[torch.Tensor],
        device: torch.device,
        route: _Route,
        steps: tuple[Callable[..., Any], Callable[..., Any]],
        back_to_back: tuple[float, float],
    ) -> bool:
        """Whether eager autograd should run, its step back to back not beaten by the Function's (``back_to_back``:
        both, in us). Where eager autograd's step keeps the device busy for at least :data:`STEP_DEVICE_SHARE` of its
        time back to back, the device's time per step decides instead: eager autograd unless the Function's is
        shorter by the step margin.

        A step back to back alone is bound by the host where the Function's is (its host time is 250 to 700 us a
        step on the H200's host), but in a model whose device is busy with other work while the host issues the
        next op, that host time is hidden and the device's time is what a step costs. An op whose eager step
        keeps the device busy for much of the time the host takes to issue it sits among such work. In a decoder's
        training step on the H200 (``benchmarks/model_step.py``, 8 layers of width 2048 at 8192 tokens), running
        each norm through the Function made the whole step 0.6 to 1 % faster than eager autograd's norms, which
        the steps back to back had chosen (layer_norm bfloat16 at 8192x2048: 142.4 us back to back through eager
        autograd, 389.7 through the Function; on the device, the host's time hidden, 114.5 against 95.8). Where
        eager's step is mostly the host's time too (at 64x4096 and 512x4096, 15 to 16 % of it the device's), a
        model calling it is likely bound by the host as well, and the steps back to back decide.
        """
        hold_us = STEP_HOLD_FACTOR * max(back_to_back)  # past the host's time to issue either step
        eager_rounds: list[float] = []
        function_rounds: list[float] = []
        # The events and the hold go on the tensors' device, which need not be the current one.
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            try:
                for _ in range(STEP_DEVICE_ROUNDS):
                    eager_rounds.append(device_step_us(steps[0], leaves, wanted, device, hold_us))
                    function_rounds.append(device_step_us(steps[1], leaves, wanted, device, hold_us))
            except torch.cuda.OutOfMemoryError:  # the steps back to back ran; their verdict stands
                route.step_detail += "; the device's time per step ran out of memory while timed, so it was not used"
                return True
        eager_device, function_device = min(eager_rounds), min(function_rounds)
        device_bound = eager_device >= STEP_DEVICE_SHARE * back_to_back[0]
        current = _settings_module._current or settings()
        margin = max(current.tune_margin, STEP_MARGIN)
        eager = not device_bound or eager_device * (1 - margin) <= function_device
        share = eager_device / back_to_back[0]
        verdict = (
            f"at least {STEP_DEVICE_SHARE:.0%}, so the device's time decides"
            if device_bound
            else f"under {STEP_DEVICE_SHARE:.0%}, so the steps back to back decide"
        )
        route.step_detail += (
            f"; on the device, the host's time hidden: eager autograd {eager_device:.1f} us a step, the Function "
            f"{function_device:.1f} us; the device's share of eager autograd's step back to back is {share:.0%}, "
            f"{verdict}"
        )
        return eager

    def forward_route(self, values: tuple[Any, ...]) -> _Route | None:
        """The memoised route of the forward of ``values`` as the Function runs it (without grad, through this
        op or its Backward's ``forward``), in mode ``auto`` or ``reference`` without logging; else ``None``.

        The key is the one _dispatch memoises for that call, with grad mode off; before the first call
        of a signature there is none.
        """
        current = _settings_module._current or settings()
        if current.log_path is not None:
            return None
        # The op the Function's forward runs: this one, or the Backward's forward with statistics.
        forward = (self.backward.forward_op(values) if self.backward is not None else None) or self
        mode = effective_mode(forward.name, forward.mode, current.mode)
        if mode not in ("auto", "reference"):
            return None
        signature: list[Any] = [
            mode, effective_interpret(current.interpret), _settings_module._generation, False, inside_torch_op.active
        ]  # fmt: skip
        for v in values:
            if isinstance(v, torch.Tensor):
                signature.append((v.dtype, v.shape, v.stride(), v.device, v.requires_grad))
            else:
                signature.append((type(v), v))
        try:
            return forward._memo.get(tuple(signature))
        except TypeError:  # an unhashable argument
            return None

    def _call_untraced(self, values: tuple[Any, ...]) -> Any:
        """The op's own dispatch, as the PyTorch operator's implementation runs it."""
        return self._dispatch(values, False)

    def _dispatch(self, values: tuple[Any, ...], via_operator: bool) -> Any:
        # The hot path: everything a plan depends on is read cheaply into a signature, and a
        # signature seen before skips validation and planning. Kept flat on purpose (each Python
        # call costs about 0.1 us, and the whole path aims at about 2 us). With ``via_operator``,
        # a tensor that needs autograd, or one that is not plain (fake, functional: a trace such
        # as AOT autograd's of a backward), sends the call through the PyTorch operator instead.
        current = _settings_module._current or settings()
        if _dispatch_module.overridden:
            mode = effective_mode(self.name, self.mode, current.mode)
            interpret = effective_interpret(current.interpret)
        else:
            mode, interpret = self.mode or current.mode, current.interpret
        grad = torch.is_grad_enabled()
        # The same key as forward_route builds (there with grad off): keep the two in step.
        signature = [mode, interpret, _settings_module._generation, grad, inside_torch_op.active]
        autograd = subclass = False
        try:
            for v in values:
                if isinstance(v, torch.Tensor):
                    requires_grad = v.requires_grad
                    if via_operator:
                        if type(v) is not torch.Tensor and type(v) is not torch.nn.Parameter:
                            subclass = True
                            break
                        if grad and requires_grad:
                            autograd = True
                    signature.append((v.dtype, v.shape, v.stride(), v.device, requires_grad))
                else:
                    signature.append((type(v), v))
        except RuntimeError:  # a tensor without sizes or strides (nested, sparse CSR): the contract's error says why
            check_inputs(self.name, self.args, values)
            raise
        if subclass:
            try:
                return self._autograd_call(values)
            except NotImplementedError:  # the subclass has no kernel for the operator (a jagged nested tensor)
                check_inputs(self.name, self.args, values)
                raise
        memo_key: tuple[Any, ...] | None = tuple(signature)
        if autograd:
            return self._autograd_call(values, memo_key)
        try:
            route = self._memo.get(memo_key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable argument: the contract rejects it below
            route, memo_key = None, None
        if route is None:
            plan = self._resolve(values, mode, interpret, current)
            route = _Route(self.name, plan)
            # A default config chosen while tuning is on (during graph capture) is not remembered,
            # so the bucket is tuned on the first call outside the capture. Later calls of a
            # bucket tuned now report the decision as cached.
            if memo_key is not None and not (plan.reason is Reason.DEFAULT_CONFIG and current.tune):
                if len(self._memo) >= MEMO_LIMIT:
                    self._memo = {}
                tuned = plan.reason is Reason.TUNED
                self._memo[memo_key] = (
                    _Route(self.name, dataclasses.replace(plan, reason=Reason.CACHED)) if tuned else route
                )
        return self._run_route(route, values, mode, current)

    def run_memoised(self, route: _Route, values: tuple[Any, ...]) -> Any:
        """Run ``values`` on ``route``, the memoised route :meth:`forward_route` found for them (the Function's
        forward: the call _dispatch would make, without building the signature again)."""
        current = _settings_module._current or settings()
        return self._run_route(route, values, effective_mode(self.name, self.mode, current.mode), current)

    def _run_route(self, route: _Route, values: tuple[Any, ...], mode: Mode, current: Settings) -> Any:
        if current.log_path is None and mode != "check":
            if route.run is not None:
                call_state.triton_runs += 1
                if mode == "triton":
                    call_state.forced_runs += 1
                try:
                    if route.guard_index is None or route.guard_index == torch.cuda.current_device():
                        return route.run(*values)
                    with torch.cuda.device(route.guard_index):
                        return route.run(*values)
                except Unsupported as err:
                    return self._run_reference(Plan(None, err.reason, err.detail), values, mode, current, 0.0)
                except RuntimeError:
                    self._check_after_failure(values)
                    raise
            if route.reference_ok and mode != "triton":
                if route.fallback_key is not None:
                    count_fallback(route.fallback_key, route.plan, current.warn_fallback)
                # run_reference's check inline: this is the reference route's hot path.
                try:
                    return self.run_reference(*values) if _any_autocast() else self.reference(*values)
                except RuntimeError:
                    self._check_after_failure(values)
                    raise
        return self._call_slow(route.plan, values, mode, current)

    def _check_after_failure(self, values: tuple[Any, ...]) -> None:
        """Check the inputs of a remembered route that raised: their signature matched a call's that passed the
        checks, yet they may not (a sparse COO tensor's strides read as zeros, as those of a dense tensor expanded
        from one element do), and the contract's error then replaces torch's. Inputs that pass leave the route's
        own error to propagate."""
        check_inputs(self.name, self.args, values)

    def _call_slow(self, plan: Plan, values: tuple[Any, ...], mode: Mode, current: Settings) -> Any:
        """A call that logs, checks, interprets or runs the reference."""
        log_path = current.log_path
        start = time.perf_counter() if log_path is not None else 0.0
        if plan.implementation is not None:
            if mode == "triton":
                call_state.forced_runs += 1
            try:
                expected = self._check_expected(values, current) if mode == "check" else None
            except RuntimeError:  # the reference failed on the inputs: the contract's error first, if they break it
                self._check_after_failure(values)
                raise
            try:
                result, launches, notes = self._run_triton(plan, values, log_path is not None)
            except Unsupported as err:
                plan = Plan(None, err.reason, err.detail)
            except RuntimeError:
                self._check_after_failure(values)
                raise
            else:
                if expected is not None:
                    from kernelgate.check import check_result

                    reference_result, before, after = expected
                    if check_result(self, plan, values, result, reference_result, before, current):
                        result = self._adopt_reference(values, reference_result, after)
                if log_path is not None:
                    self._log(log_path, plan, mode, values, start, launches, notes)
                return result
        return self._run_reference(plan, values, mode, current, start)

    def _run_reference(self, plan: Plan, values: tuple[Any, ...], mode: Mode, current: Settings, start: float) -> Any:
        if mode == "triton" and plan.reason is not Reason.MODE_REFERENCE:
            raise TritonUnavailableError(
                f"{self.name}(): mode 'triton' was requested, but no Triton implementation can run these inputs: "
                f"{plan.reason}: {plan.detail}. Use mode 'auto' to fall back to the reference, or change the inputs."
            )
        if plan.is_fallback:
            record_fallback(self.name, plan, current.warn_fallback)
        try:
            result = self.run_reference(*values)
        except RuntimeError:
            self._check_after_failure(values)
            raise
        if current.log_path is not None:
            self._log(current.log_path, plan, mode, values, start or time.perf_counter(), [], [])
        return result

    def _run_triton(self, plan: Plan, values: tuple[Any, ...], logging: bool) -> tuple[Any, list[Any], list[str]]:
        impl, device = plan.implementation, plan.device
        assert impl is not None and device is not None
        state = call_state
        state.triton_runs += 1
        launches: list[Any] = []
        notes: list[str] = []
        saved = state.interpret, state.launches, state.notes
        state.interpret = plan.interpret
        if logging:
            state.launches, state.notes = launches, notes
        try:
            call = impl.launcher
            if plan.interpret or device.type != "cuda" or device.index == torch.cuda.current_device():
                result = call(*values, config=plan.config) if impl.configs is not None else call(*values)
            else:
                with torch.cuda.device(device):
                    result = call(*values, config=plan.config) if impl.configs is not None else call(*values)
        finally:
            state.interpret, state.launches, state.notes = saved
        return result, launches, notes

    # --- check mode -------------------------------------------------------------------------

    def _adopt_reference(self, values: tuple[Any, ...], expected: Any, after: tuple[Any, ...]) -> Any:
        """After a demotion: the reference's result; what it wrote into copies of the mutated
        arguments is copied into the caller's tensors, and a returned copy becomes the caller's tensor."""
        for i in self.mutated_positions:
            if isinstance(values[i], torch.Tensor):
                values[i].copy_(after[i])
                if expected is after[i]:
                    expected = values[i]
        return expected

    def _check_expected(
        self, values: tuple[Any, ...], current: Settings
    ) -> tuple[Any, tuple[Any, ...], tuple[Any, ...]] | None:
        """For a sampled call in check mode: the reference's result, the inputs as they were before the
        call, and the arguments the reference ran on (its writes to mutated arguments are in there)."""
        self._calls += 1
        if self._calls % current.check_every:
            return None
        before = clone_args(values, self.mutated_positions)
        after = clone_args(before, self.mutated_positions)
        return self.run_reference(*after), before, after

    # --- logging ----------------------------------------------------------------------------

    def _log_tuning(
        self,
        current: Settings,
        values: tuple[Any, ...],
        device: torch.device,
        mode: Mode,
        results: Sequence[Any],
        entry: Mapping[str, Any],
    ) -> None:
        if current.log_path is None:
            return
        for r in results:
            reason = r.verdict + (f": {r.detail}" if r.detail else "")
            self._write_row(
                current.log_path,
                r.implementation,
                config_label(r.config) if r.config else "",
                "tune",
                reason,
                r.time_us or 0.0,
                mode,
                values,
                device,
            )
        winner = entry["implementation"]
        label = config_label(entry["config"]) if entry.get("config") else ""
        self._write_row(
            current.log_path,
            winner,
            label,
            "tune-winner",
            str(entry["reason"]),
            float(entry["reference_us"]),
            mode,
            values,
            device,
        )

    def _log(
        self,
        path: Path,
        plan: Plan,
        mode: Mode,
        values: tuple[Any, ...],
        start: float,
        launches: list[Any],
        notes: list[str],
    ) -> None:
        device = plan.device or next((v.device for v in values if isinstance(v, torch.Tensor)), None)
        capturing = device is not None and device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if device is not None and device.type == "cuda" and not capturing:
            torch.cuda.synchronize(device)  # the log is opt-in; its wall time covers the kernels
        wall_us = (time.perf_counter() - start) * 1e6
        config = ";".join(f"{name}{list(grid)}{sorted(meta.items())}" for name, grid, meta in launches)
        reason = str(plan.reason) + (f": {plan.detail}" if plan.detail else "") + "".join(f"; {n}" for n in notes)
        if capturing:
            reason += "; during CUDA graph capture (not synchronised)"
        self._write_row(path, plan.name, config, plan.path, reason, wall_us, mode, values, device)

    def _write_row(
        self,
        path: Path,
        implementation: str,
        config: str,
        route: str,
        reason: str,
        wall_us: float,
        mode: Mode,
        values: tuple[Any, ...],
        device: torch.device | None,
    ) -> None:
        from kernelgate import __version__

        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        launch_log.write(
            path,
            launch_log.LogRow(
                op=self.name,
                implementation=implementation,
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
                path=route,
                reason=reason,
                wall_us=round(wall_us, 2),
            ),
        )


MEMO_LIMIT = 4096
# Counts clear_memo calls: an eager-step verdict kept from an earlier epoch may rest on a forgotten route.
_memo_epoch = 0
# Interleaved rounds in which the forward+backward step is timed both ways (Op._eager_step_is_faster), each
# round STEP_CALLS steps back to back (selection.time_autograd_step).
STEP_ROUTE_ROUNDS = 5
# The least margin by which kernelgate's Function must beat eager autograd's step to be kept (the tuning margin
# where that is larger). Steps through autograd vary more between timings than kernels do: in the H200's
# default suite, Function steps timed faster than eager once were measured slower in the bench.
STEP_MARGIN = 0.05
# Where eager autograd's step keeps the device busy for at least this share of its time back to back, the device's
# time per step decides the step route (Op._eager_step_wins_on_the_device). On the H200, the share was 15 to 16 %
# for the norms at 64x4096 and 512x4096 bfloat16, 61 to 100 % at 8192x2048 and larger, whose eager steps back to
# back varied from 111 to 154 us in different processes (rms_norm) against 94 us on the device.
STEP_DEVICE_SHARE = 0.5
# That timing holds the GPU this many times the slower step back to back before each step it times, so the host
# has issued the step before its start event runs; and takes the fastest of this many interleaved rounds.
STEP_HOLD_FACTOR = 2.0
STEP_DEVICE_ROUNDS = 2


@dataclasses.dataclass(frozen=True)
class StepRoute:
    """How eager autograd calls of one signature run (:meth:`Op.step_route`).

    Attributes:
        path: ``"function"`` (kernelgate's Function, its kernels), ``"eager"`` (eager autograd of the
            reference) or ``"undecided"`` (the next autograd calls decide).
        detail: why, in a sentence.
        eager_us, function_us: the steps timed back to back, where the decision was timed (the device's times,
            where measured, are in ``detail``).
    """

    path: str
    detail: str
    eager_us: float | None = None
    function_us: float | None = None


class _StepVerdict(enum.Enum):
    REFERENCE_BOTH = "the forward and its backward both run the reference: eager autograd does the same work"
    FIRST_STEP = "the Function's first step has not run its backward yet; the next autograd call decides"
    BACKWARD_FORCED = "the backward runs in mode triton: kernelgate's Function keeps its kernel"
    KEPT_FOR_MEMORY = "the op keeps its Function under a kernel forward (Backward(may_step_eagerly=False))"
    TIME = "the next autograd call times the step both ways"
    TIMED = "timed once for the signature"


# The path each verdict that needs no timing gives (TIMED reads the route's timing).
_STEP_VERDICT_PATH = {
    _StepVerdict.REFERENCE_BOTH: "eager",
    _StepVerdict.FIRST_STEP: "undecided",
    _StepVerdict.BACKWARD_FORCED: "function",
    _StepVerdict.KEPT_FOR_MEMORY: "function",
    _StepVerdict.TIME: "undecided",
}


class _Route:
    """A memoised plan with what the hot path needs precomputed."""

    __slots__ = (
        "backward_forced", "backward_reference", "eager_step", "fallback_key", "guard_index", "plan", "reference_ok",
        "run", "step_detail", "step_us",
    )  # fmt: skip

    def __init__(self, op_name: str, plan: Plan) -> None:
        self.plan = plan
        self.reference_ok = plan.implementation is None
        # For a forward planned to the reference: whether its backward, through the Function, ran the
        # reference too (None until a backward has run).
        self.backward_reference: bool | None = None
        # Whether that backward ran a kernel in mode "triton" (asked for, so the Function keeps it).
        self.backward_forced = False
        # Where it ran a kernel chosen by tuning: whether eager autograd of the reference steps faster than
        # the Function (None until timed, see Op._eager_step_is_faster).
        self.eager_step: bool | None = None
        # What decided eager_step, for Op.step_route: the two steps' times, and a sentence.
        self.step_us: tuple[float, float] | tuple[()] = ()
        self.step_detail = ""
        self.fallback_key = fallback_key(op_name, plan) if plan.is_fallback else None
        impl, device = plan.implementation, plan.device
        self.run: Callable[..., Any] | None = None
        self.guard_index: int | None = None
        if impl is not None and device is not None and not plan.interpret:
            self.run = (
                functools.partial(impl.launcher, config=plan.config) if impl.configs is not None else impl.launcher
            )
            # With several GPUs the launch must happen on the tensors' device, not the current one.
            if device.type == "cuda" and torch.cuda.device_count() > 1:
                self.guard_index = device.index if device.index is not None else torch.cuda.current_device()


_warned_entries: set[str] = set()
_all_ops: weakref.WeakSet[Op] = weakref.WeakSet()


# Whether a torch.func transform (vmap, grad, ...) applies to the call being made (one C call).
_functorch_active: Callable[[], bool] = torch._C._are_functorch_transforms_active


# Whether torch.jit.trace is recording (one C call).
_jit_tracing: Callable[[], bool] = torch._C._is_tracing


@contextlib.contextmanager
def _jit_trace_paused() -> Iterator[None]:
    """torch.jit.trace's recording off for the block (input checks read sizes, which it records as tensors)."""
    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)  # type: ignore[attr-defined]  # not in torch's stubs
    try:
        yield
    finally:
        torch._C._set_tracing_state(state)  # type: ignore[attr-defined]


# Whether torch.autocast is on for any device type (one C call; torch < 2.4's API lacks it).
_any_autocast: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", lambda: torch.is_autocast_enabled())


def _autocast_off(values: Sequence[Any]) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` off for the device type of the tensors among ``values`` (one device by the contract); a
    device type autocast does not know (meta) has no autocast to turn off."""
    device = next((v.device for v in values if isinstance(v, torch.Tensor)), None)
    if device is None:
        return contextlib.nullcontext()
    try:
        return torch.autocast(device_type=device.type, enabled=False)
    except RuntimeError:
        return contextlib.nullcontext()


def clear_memos() -> None:
    """Forget every op's memoised plans (the decision cache or its directory changed)."""
    for op in list(_all_ops):
        op.clear_memo()


def _default_bucket(*values: Any) -> tuple[Any, ...]:
    return tuple(tuple(pow2(s) for s in v.shape) for v in values if isinstance(v, torch.Tensor))
