"""Input contracts: what each argument of an op must be, checked before anything launches.

An op lists one spec per parameter of its reference, in order:

>>> import torch
>>> specs = (TensorArg("x", min_rank=1), TensorArg("weight", rank=1, sizes={0: ("x", -1)}),
...          ScalarArg("eps", kind=float, min=0.0))

Checks read only shapes, dtypes, devices and Python scalars, so they never synchronise the GPU.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, Union

import torch

from kernelgate.errors import DeclarationError, DeviceError, InputTypeError, InputValueError

__all__ = ["FLOAT_DTYPES", "ArgSpec", "ChoiceArg", "DimArg", "ScalarArg", "ShapeArg", "TensorArg", "check_inputs"]

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_short = reprlib.Repr()  # keyword arguments need Python 3.12
_short.maxstring = _short.maxother = 60
_short.maxlist = _short.maxtuple = 8


def _received(value: Any) -> str:
    """What a non-tensor argument got, for an error message: its type and a short repr (a tensor, passed where a
    scalar, dim, shape or choice was wanted, by its shape, dtype and device, never by its values).

    >>> _received(torch.zeros(300)), _received(1.5), _received(tuple(range(20)))
    ('Tensor of shape (300,), dtype float32 on cpu', 'float 1.5', 'tuple (0, 1, 2, 3, 4, 5, 6, 7, ...)')
    """
    if isinstance(value, torch.Tensor):
        what = f"Tensor of shape {_shape(value)}, dtype {_dtype_name(value.dtype)} on {value.device}"
        return what + (" (its .item() is a Python number)" if value.dim() == 0 else "")
    return f"{type(value).__name__} {_short.repr(value)}"


def _join(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


@dataclasses.dataclass(frozen=True)
class TensorArg:
    """A tensor parameter.

    Attributes:
        name: the parameter's name in the reference.
        dtypes: dtypes the op accepts (the reference must handle all of them).
        rank: exact number of dimensions, or ``None``.
        min_rank: least number of dimensions.
        sizes: ``{dim: (other_tensor, other_dim)}``: this tensor's size in ``dim`` must equal the
            other tensor's size in ``other_dim`` (negative dims count from the end).
        optional: whether ``None`` is accepted.
        same_shape_as: name of an earlier tensor argument whose shape this one must have.
        param_of: name of an earlier tensor argument this one is an elementwise parameter of (a norm's weight
            or bias): its dtype must be that tensor's, or float32 where that tensor is float16 or bfloat16 (a
            model's parameters kept in float32 under mixed precision), and the parameters of one tensor share
            one dtype: the rule of :func:`torch.nn.functional.layer_norm`, which rejects the other mixes.
    """

    name: str
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    rank: int | None = None
    min_rank: int = 0
    sizes: Mapping[int, tuple[str, int]] = dataclasses.field(default_factory=dict)
    optional: bool = False
    same_shape_as: str | None = None
    param_of: str | None = None

    def __post_init__(self) -> None:
        if not self.dtypes or not all(isinstance(d, torch.dtype) for d in self.dtypes):
            raise DeclarationError(f"TensorArg {self.name!r}: dtypes must be a non-empty tuple of torch.dtype.")
        if self.rank is not None and self.rank < self.min_rank:
            raise DeclarationError(f"TensorArg {self.name!r}: rank {self.rank} is below min_rank {self.min_rank}.")


@dataclasses.dataclass(frozen=True)
class ScalarArg:
    """A Python scalar parameter (``float``, ``int`` or ``bool``) with an optional closed range.

    Floats must also be finite. ``bool`` is never accepted where a number is expected.
    """

    name: str
    kind: type = float
    min: float | None = None
    max: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in (float, int, bool):
            raise DeclarationError(f"ScalarArg {self.name!r}: kind must be float, int or bool; got {self.kind!r}.")


@dataclasses.dataclass(frozen=True)
class DimArg:
    """An ``int`` naming a dimension of the tensor parameter ``of`` (negative values count from the end)."""

    name: str
    of: str


@dataclasses.dataclass(frozen=True)
class ChoiceArg:
    """A string parameter taking one of a fixed set of values (``reduction="mean"``)."""

    name: str
    choices: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.choices or not all(isinstance(c, str) for c in self.choices):
            raise DeclarationError(f"ChoiceArg {self.name!r}: choices must be a non-empty tuple of str.")


@dataclasses.dataclass(frozen=True)
class ShapeArg:
    """A sequence of ints equal to the trailing sizes of the tensor parameter ``of``.

    As ``normalized_shape`` in :func:`torch.nn.functional.layer_norm`: ``(N,)`` for a tensor of shape
    ``(..., N)``. A tuple (or ``torch.Size``) keeps calls on the fast path; a list works too.
    """

    name: str
    of: str


ArgSpec = Union[TensorArg, ScalarArg, DimArg, ChoiceArg, ShapeArg]  # noqa: UP007 (a runtime alias)
_SPEC_TYPES = (TensorArg, ScalarArg, DimArg, ChoiceArg, ShapeArg)


def validate_specs(op_name: str, specs: Sequence[ArgSpec], param_names: Sequence[str]) -> None:
    """Reject a contract that does not describe the reference's parameters one to one."""
    for spec in specs:
        if not isinstance(spec, _SPEC_TYPES):
            raise DeclarationError(
                f"op {op_name!r}: each contract entry must be a TensorArg, ScalarArg, DimArg, ChoiceArg or "
                f"ShapeArg; got {spec!r}."
            )
    names = [s.name for s in specs]
    if names != list(param_names):
        raise DeclarationError(
            f"op {op_name!r}: the contract must list one spec per reference parameter, in order; "
            f"reference parameters are {list(param_names)}, specs are {names}."
        )
    earlier_tensors: set[str] = set()
    for spec in specs:
        refs = [other for other, _ in spec.sizes.values()] if isinstance(spec, TensorArg) else []
        refs += [spec.same_shape_as] if isinstance(spec, TensorArg) and spec.same_shape_as else []
        refs += [spec.param_of] if isinstance(spec, TensorArg) and spec.param_of else []
        refs += [spec.of] if isinstance(spec, (DimArg, ShapeArg)) else []
        optional = {s.name for s in specs if isinstance(s, TensorArg) and s.optional}
        if isinstance(spec, (DimArg, ShapeArg)) and spec.of in optional:
            raise DeclarationError(
                f"op {op_name!r}: {type(spec).__name__} {spec.name!r} cannot refer to the optional tensor {spec.of!r}."
            )
        for ref in refs:
            if ref not in earlier_tensors:
                raise DeclarationError(
                    f"op {op_name!r}: spec {spec.name!r} refers to {ref!r}, which must be a tensor argument "
                    f"listed before it."
                )
        if isinstance(spec, TensorArg):
            earlier_tensors.add(spec.name)


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _check_tensor(op: str, spec: TensorArg, value: Any, values: Mapping[str, Any]) -> torch.Tensor | None:
    if value is None and spec.optional:
        return None
    if not isinstance(value, torch.Tensor):
        allowed = "a torch.Tensor or None" if spec.optional else "a torch.Tensor"
        raise InputTypeError(
            f"{op}(): argument {spec.name!r} must be {allowed}; got {type(value).__name__}. "
            f"Convert it first, e.g. torch.as_tensor({spec.name})."
        )
    if value.is_nested:
        raise InputTypeError(
            f"{op}(): argument {spec.name!r} must be a dense (strided) tensor; got a nested tensor. Pad it first, "
            f"e.g. {spec.name}.to_padded_tensor(0.0), or call {op} on each tensor of {spec.name}.unbind()."
        )
    if value.layout != torch.strided:
        raise InputTypeError(
            f"{op}(): argument {spec.name!r} must be a dense (strided) tensor; got layout "
            f"{str(value.layout).removeprefix('torch.')}. Convert it first, e.g. {spec.name}.to_dense()."
        )
    if value.dtype not in spec.dtypes:
        names = _join([_dtype_name(d) for d in spec.dtypes])
        raise InputTypeError(
            f"{op}(): argument {spec.name!r} must have dtype {names}; got {_dtype_name(value.dtype)}. "
            f"Convert it first, e.g. {spec.name}.to(torch.{_dtype_name(spec.dtypes[0])})."
        )
    ndim = value.dim()
    if spec.rank is not None and ndim != spec.rank:
        raise InputValueError(
            f"{op}(): argument {spec.name!r} must have {spec.rank} dimension(s); got {ndim} (shape {_shape(value)}). "
            f"Reshape it to {spec.rank} dimension(s)."
        )
    if ndim < spec.min_rank:
        raise InputValueError(
            f"{op}(): argument {spec.name!r} must have at least {spec.min_rank} dimension(s); got {ndim} "
            f"(shape {_shape(value)}). Add the missing dimension(s), e.g. {spec.name}.unsqueeze(0)."
        )
    if spec.same_shape_as is not None and values[spec.same_shape_as] is not None:
        other = values[spec.same_shape_as]
        if value.shape != other.shape:
            raise InputValueError(
                f"{op}(): argument {spec.name!r} must have the shape of {spec.same_shape_as!r}, "
                f"{_shape(other)}; got {_shape(value)}. Pass tensors of one shape."
            )
    for dim, (other_name, other_dim) in spec.sizes.items():
        other = values[other_name]
        if other is None:
            continue
        if not (-other.dim() <= other_dim < other.dim()):
            raise InputValueError(
                f"{op}(): argument {other_name!r} must have a dimension {other_dim} to match {spec.name!r}; "
                f"got shape {_shape(other)}. Pass a tensor with that dimension."
            )
        if not (-ndim <= dim < ndim):
            raise InputValueError(
                f"{op}(): argument {spec.name!r} must have a dimension {dim} to match {other_name}.shape[{other_dim}]; "
                f"got shape {_shape(value)}. Pass a tensor with that dimension."
            )
        want, got = other.shape[other_dim], value.shape[dim]
        if want != got:
            raise InputValueError(
                f"{op}(): argument {spec.name!r} must have size {want} in dimension {dim} "
                f"(= {other_name}.shape[{other_dim}]); got {got} (shape {_shape(value)}, {other_name} shape "
                f"{_shape(other)}). Make {spec.name}.shape[{dim}] equal {other_name}.shape[{other_dim}]."
            )
    return value


def _check_scalar(op: str, spec: ScalarArg, value: Any) -> None:
    kind = spec.kind.__name__
    if spec.kind is bool:
        ok = isinstance(value, bool)
    elif spec.kind is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    else:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok:
        got = _received(value)
        example = {"float": "1e-6", "int": "1", "bool": "True"}[kind]
        raise InputTypeError(
            f"{op}(): argument {spec.name!r} must be a Python {kind}; got {got}. Pass a {kind}, e.g. "
            f"{spec.name}={example}."
        )
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if spec.kind is float and not finite:
        raise InputValueError(
            f"{op}(): argument {spec.name!r} must be a finite float; got {value!r}. Pass a finite number."
        )
    if (spec.min is not None and value < spec.min) or (spec.max is not None and value > spec.max):
        low = "-inf" if spec.min is None else spec.min
        high = "inf" if spec.max is None else spec.max
        raise InputValueError(
            f"{op}(): argument {spec.name!r} must be in [{low}, {high}]; got {value!r}. Pass a value in that range."
        )


def _check_dim(op: str, spec: DimArg, value: Any, values: Mapping[str, Any]) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        got = _received(value)
        raise InputTypeError(
            f"{op}(): argument {spec.name!r} must be a Python int; got {got}. Pass an int, e.g. {spec.name}=-1."
        )
    tensor = values[spec.of]
    span = max(tensor.dim(), 1)  # a 0-dim tensor accepts dim 0 and -1, as in torch
    if not (-span <= value < span):
        raise InputValueError(
            f"{op}(): argument {spec.name!r} must be in [{-span}, {span - 1}] for {spec.of!r} of shape "
            f"{_shape(tensor)}; got {value}. Pick a dimension that {spec.of} has."
        )


def _check_choice(op: str, spec: ChoiceArg, value: Any) -> None:
    if not isinstance(value, str) or value not in spec.choices:
        options = _join([repr(c) for c in spec.choices])
        raise (InputValueError if isinstance(value, str) else InputTypeError)(
            f"{op}(): argument {spec.name!r} must be {options}; got {_received(value)}. Pass one of those strings."
        )


def _check_shape(op: str, spec: ShapeArg, value: Any, values: Mapping[str, Any]) -> None:
    ok = isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0
    if not ok or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value):
        raise InputTypeError(
            f"{op}(): argument {spec.name!r} must be a non-empty tuple of ints; got "
            f"{_received(value)}. Pass the trailing sizes of {spec.of!r}, e.g. {spec.name}={spec.of}.shape[-1:]."
        )
    tensor = values[spec.of]
    tail = tuple(tensor.shape[tensor.dim() - len(value) :]) if len(value) <= tensor.dim() else None
    if tail != tuple(int(v) for v in value):
        raise InputValueError(
            f"{op}(): argument {spec.name!r} must equal the trailing sizes of {spec.of!r} (shape "
            f"{_shape(tensor)}); got {_short.repr(tuple(value))}. Pass {spec.of}.shape[-k:] for the k dimensions to "
            "normalise."
        )


def check_inputs(op: str, specs: Sequence[ArgSpec], args: Sequence[Any]) -> torch.device | None:
    """Check ``args`` against ``specs``; return the tensors' common device (``None`` if no tensor).

    Raises:
        InputTypeError, InputValueError, DeviceError: with a message naming the argument, the
            expectation, what was received and the remedy.
    """
    values = {spec.name: value for spec, value in zip(specs, args, strict=True)}
    device: torch.device | None = None
    first = ""
    for spec, value in zip(specs, args, strict=True):
        if isinstance(spec, TensorArg):
            tensor = _check_tensor(op, spec, value, values)
            if tensor is None:
                continue
            if device is None:
                device, first = tensor.device, spec.name
            elif tensor.device != device:
                raise DeviceError(
                    f"{op}(): all tensors must be on one device; {first!r} is on {device} but {spec.name!r} is on "
                    f"{tensor.device}. Move them to one device, e.g. {spec.name}.to({first}.device)."
                )
        elif isinstance(spec, ScalarArg):
            _check_scalar(op, spec, value)
        elif isinstance(spec, DimArg):
            _check_dim(op, spec, value, values)
        elif isinstance(spec, ChoiceArg):
            _check_choice(op, spec, value)
        else:
            _check_shape(op, spec, value, values)
    _check_param_dtypes(op, specs, values)
    return device


# Where a tensor is float16 or bfloat16, its parameters may be kept in float32 (TensorArg.param_of).
_MIXED_PRECISION = (torch.float16, torch.bfloat16)


def _check_param_dtypes(op: str, specs: Sequence[ArgSpec], values: Mapping[str, Any]) -> None:
    """The dtype rule of :attr:`TensorArg.param_of`, once every argument is otherwise valid."""
    of_tensor: dict[str, list[str]] = {}
    for spec in specs:
        if isinstance(spec, TensorArg) and spec.param_of is not None and values[spec.name] is not None:
            of_tensor.setdefault(spec.param_of, []).append(spec.name)
    for owner, names in of_tensor.items():
        base = values[owner].dtype
        dtypes = {values[name].dtype for name in names}
        if dtypes == {base} or (base in _MIXED_PRECISION and dtypes == {torch.float32}):
            continue
        kept = "parameters" if len(names) > 1 else "a parameter"
        allowed = f"({_dtype_name(base)})"
        if base in _MIXED_PRECISION:
            allowed += f" or float32 ({kept} kept in float32 under mixed precision)"
        conversions = " and ".join(f"{name}.to({owner}.dtype)" for name in names)
        if len(names) == 1:
            got = _dtype_name(values[names[0]].dtype)
            raise InputTypeError(
                f"{op}(): argument {names[0]!r} must have {owner}'s dtype {allowed}; got {got}. "
                f"Convert it, e.g. {conversions}."
            )
        got = ", ".join(f"{name} {_dtype_name(values[name].dtype)}" for name in names)
        arguments = " and ".join(repr(name) for name in names)
        raise InputTypeError(
            f"{op}(): arguments {arguments} must share one dtype: {owner}'s {allowed}; got {got}. "
            f"Convert them, e.g. {conversions}."
        )
