"""Input contracts and declarations: every rule rejects bad input with a teaching error, before anything runs."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import kernelgate
from kernelgate import (
    ChoiceArg,
    DeclarationError,
    DeviceError,
    DimArg,
    InputError,
    InputTypeError,
    InputValueError,
    Op,
    ScalarArg,
    ShapeArg,
    TensorArg,
    TritonImpl,
)
from kernelgate import op as op_module
from kernelgate.config import ConfigSpace


@pytest.fixture(autouse=True)
def quiet_fallbacks() -> None:
    """Valid calls here take the reference on CPU; their FallbackWarning is tested in test_dispatch.py."""
    kernelgate.configure(warn_fallback=False)


@pytest.fixture
def registry() -> Iterator[None]:
    """Restore the op registry after a test that registers ops."""
    saved = dict(op_module._registry)
    yield
    op_module._registry.clear()
    op_module._registry.update(saved)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


# --- tensor rules ------------------------------------------------------------------------------


def test_non_tensor_argument() -> None:
    """A list where a tensor is expected is an InputTypeError naming the argument, the type got and torch.as_tensor."""
    with pytest.raises(
        InputTypeError,
        match=r"^softmax\(\): argument 'x' must be a torch\.Tensor; got list\. "
        r"Convert it first, e\.g\. torch\.as_tensor\(x\)\.$",
    ) as info:
        kernelgate.softmax([1.0, 2.0])
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, InputError)


def test_non_tensor_optional_argument_mentions_none() -> None:
    """An optional tensor argument's message says None is also accepted."""
    with pytest.raises(InputTypeError, match=r"argument 'weight' must be a torch\.Tensor or None; got float\.") as info:
        kernelgate.rms_norm(torch.ones(2, 3), 1.0)
    assert isinstance(info.value, TypeError)


def test_optional_tensor_accepts_none() -> None:
    """None is a valid value of an optional tensor argument, so rms_norm without weight runs."""
    x = torch.ones(2, 3)
    assert kernelgate.rms_norm(x, None).shape == (2, 3)


def test_wrong_dtype() -> None:
    """An int64 tensor passed to softmax is an InputTypeError listing the accepted dtypes and a .to() remedy."""
    with pytest.raises(
        InputTypeError,
        match=r"^softmax\(\): argument 'x' must have dtype float16, bfloat16, float32 or float64; got int64\. "
        r"Convert it first, e\.g\. x\.to\(torch\.float16\)\.$",
    ) as info:
        kernelgate.softmax(torch.arange(6).view(2, 3))
    assert isinstance(info.value, TypeError)


def test_exact_rank() -> None:
    """A 2-D rms_norm weight is an InputValueError naming the rank wanted, the rank and shape received and a reshape."""
    with pytest.raises(
        InputValueError,
        match=r"^rms_norm\(\): argument 'weight' must have 1 dimension\(s\); got 2 \(shape \(1, 4\)\)\. "
        r"Reshape it to 1 dimension\(s\)\.$",
    ) as info:
        kernelgate.rms_norm(torch.ones(3, 4), torch.ones(1, 4))
    assert isinstance(info.value, ValueError)


def test_min_rank() -> None:
    """rms_norm of a 0-dim tensor is an InputValueError asking for at least one dimension and suggesting unsqueeze."""
    with pytest.raises(
        InputValueError,
        match=r"^rms_norm\(\): argument 'x' must have at least 1 dimension\(s\); got 0 \(shape \(\)\)\. "
        r"Add the missing dimension\(s\), e\.g\. x\.unsqueeze\(0\)\.$",
    ) as info:
        kernelgate.rms_norm(torch.tensor(1.0), None)
    assert isinstance(info.value, ValueError)


def test_size_equality() -> None:
    """A weight whose size differs from x.shape[-1] is an InputValueError naming both shapes and the size wanted."""
    with pytest.raises(
        InputValueError,
        match=r"^rms_norm\(\): argument 'weight' must have size 4 in dimension 0 \(= x\.shape\[-1\]\); got 3 "
        r"\(shape \(3,\), x shape \(2, 4\)\)\. Make weight\.shape\[0\] equal x\.shape\[-1\]\.$",
    ) as info:
        kernelgate.rms_norm(torch.ones(2, 4), torch.ones(3))
    assert isinstance(info.value, ValueError)


def test_devices_differ() -> None:
    """Tensors on two devices are a DeviceError naming both devices and a .to() remedy."""
    with pytest.raises(
        DeviceError,
        match=r"^rms_norm\(\): all tensors must be on one device; 'x' is on cpu but 'weight' is on meta\. "
        r"Move them to one device, e\.g\. weight\.to\(x\.device\)\.$",
    ) as info:
        kernelgate.rms_norm(torch.ones(2, 4), torch.ones(4, device="meta"))
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, InputError)


# --- scalar and dim rules ----------------------------------------------------------------------


@pytest.mark.parametrize(("eps", "received"), [("a", "str 'a'"), (True, "bool True"), (None, "NoneType None")])
def test_scalar_type(eps: Any, received: str) -> None:
    """A non-float eps (a string, a bool, None) is an InputTypeError naming the kind wanted and the value received."""
    with pytest.raises(
        InputTypeError,
        match=rf"^rms_norm\(\): argument 'eps' must be a Python float; got {re.escape(received)}\. "
        r"Pass a float, e\.g\. eps=1e-6\.$",
    ) as info:
        kernelgate.rms_norm(torch.ones(2, 4), None, eps)
    assert isinstance(info.value, TypeError)


def test_scalar_int_accepted_for_float() -> None:
    """A Python int is a valid float scalar (eps=0 runs), unlike a bool."""
    x = torch.full((2, 4), 2.0)
    assert kernelgate.rms_norm(x, None, 0).eq(1.0).all()


def test_scalar_range() -> None:
    """A negative eps is an InputValueError giving the allowed closed range and the value received."""
    with pytest.raises(
        InputValueError,
        match=r"^rms_norm\(\): argument 'eps' must be in \[0\.0, inf\]; got -1\.0\. Pass a value in that range\.$",
    ) as info:
        kernelgate.rms_norm(torch.ones(2, 4), None, -1.0)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("eps", [float("nan"), float("inf")])
def test_scalar_non_finite(eps: float) -> None:
    """A NaN or infinite eps is an InputValueError asking for a finite float."""
    with pytest.raises(
        InputValueError,
        match=rf"^rms_norm\(\): argument 'eps' must be a finite float; got {eps!r}\. Pass a finite number\.$",
    ) as info:
        kernelgate.rms_norm(torch.ones(2, 4), None, eps)
    assert isinstance(info.value, ValueError)


def test_scalar_max_bound() -> None:
    """A scalar above its declared max is rejected with both bounds in the message."""
    clamp = Op(
        "kgtest_clamp",
        reference=lambda x, p: x * p,
        args=(TensorArg("x"), ScalarArg("p", kind=float, min=0.0, max=1.0)),
        register=False,
    )
    with pytest.raises(
        InputValueError, match=r"argument 'p' must be in \[0\.0, 1\.0\]; got 1\.5\. Pass a value in that range\.$"
    ):
        clamp(torch.ones(2), 1.5)


@pytest.mark.parametrize("dim", [2, -3])
def test_dim_out_of_range(dim: int) -> None:
    """A softmax dim the tensor lacks is an InputValueError giving the valid range, the shape and a remedy."""
    with pytest.raises(
        InputValueError,
        match=rf"^softmax\(\): argument 'dim' must be in \[-2, 1\] for 'x' of shape \(2, 3\); got {dim}\. "
        r"Pick a dimension that x has\.$",
    ) as info:
        kernelgate.softmax(torch.ones(2, 3), dim)
    assert isinstance(info.value, ValueError)


def test_dim_of_zero_dim_tensor() -> None:
    """A 0-dim tensor accepts dim 0 and -1, as torch.softmax does, and rejects dim 1."""
    x = torch.tensor(3.0)
    assert kernelgate.softmax(x, 0).item() == 1.0
    assert kernelgate.softmax(x, -1).item() == 1.0
    with pytest.raises(InputValueError, match=r"must be in \[-1, 0\] for 'x' of shape \(\); got 1\."):
        kernelgate.softmax(x, 1)


@pytest.mark.parametrize(("dim", "received"), [(1.0, "float 1.0"), (True, "bool True"), ("0", "str '0'")])
def test_dim_not_an_int(dim: Any, received: str) -> None:
    """A softmax dim that is a float, bool or string is an InputTypeError asking for a Python int."""
    with pytest.raises(
        InputTypeError,
        match=rf"^softmax\(\): argument 'dim' must be a Python int; got {re.escape(received)}\. "
        r"Pass an int, e\.g\. dim=-1\.$",
    ) as info:
        kernelgate.softmax(torch.ones(2, 3), dim)
    assert isinstance(info.value, TypeError)


# --- binding (Op._bind) ------------------------------------------------------------------------


def test_missing_argument() -> None:
    """rms_norm without its weight is an InputTypeError naming the missing argument and listing the parameters."""
    with pytest.raises(
        InputTypeError,
        match=r"^rms_norm\(\) is missing argument 'weight'; its parameters are x, weight, eps\. "
        r"Call it as rms_norm\(x, weight, eps=1e-06\)\.$",
    ) as info:
        kernelgate.rms_norm(torch.ones(2, 4))
    assert isinstance(info.value, TypeError)


def test_unknown_keyword() -> None:
    """An unknown keyword is an InputTypeError naming it as unknown and listing the parameters."""
    with pytest.raises(
        InputTypeError,
        match=r"^softmax\(\) got argument 'axis' \(unknown\); its parameters are x, dim\. "
        r"Call it as softmax\(x, dim=-1\)\.$",
    ) as info:
        kernelgate.softmax(torch.ones(2, 3), axis=0)
    assert isinstance(info.value, TypeError)


def test_argument_given_twice() -> None:
    """An argument passed both positionally and by keyword is an InputTypeError saying it was given twice."""
    x = torch.ones(2, 3)
    with pytest.raises(
        InputTypeError,
        match=r"^softmax\(\) got argument 'x' \(given twice\); its parameters are x, dim\. "
        r"Call it as softmax\(x, dim=-1\)\.$",
    ):
        kernelgate.softmax(x, x=x)


def test_too_many_positional() -> None:
    """Three positional arguments to the two-parameter softmax are an InputTypeError counting both."""
    with pytest.raises(
        InputTypeError,
        match=r"^softmax\(\) takes 2 argument\(s\) \(x, dim\); got 3 positional\. Call it as softmax\(x, dim=-1\)\.$",
    ) as info:
        kernelgate.softmax(torch.ones(2, 3), -1, 0)
    assert isinstance(info.value, TypeError)


def test_keywords_and_defaults_bind_like_the_reference() -> None:
    """Keyword arguments and reference defaults bind as in a plain Python call."""
    x = torch.randn(3, 4)
    w = torch.randn(4)
    expected = kernelgate.rms_norm(x, w, 1e-6)
    assert torch.equal(kernelgate.rms_norm(x, weight=w), expected)
    assert torch.equal(kernelgate.rms_norm(eps=1e-6, weight=w, x=x), expected)
    assert torch.equal(kernelgate.softmax(x=x, dim=0), torch.softmax(x, 0))


# --- validation happens first ------------------------------------------------------------------


def test_contract_fails_before_anything_runs() -> None:
    """When the contract rejects a call, neither the Triton launcher nor the reference nor plan's checks run."""
    calls: list[str] = []

    def reference(x: torch.Tensor, eps: float) -> torch.Tensor:
        calls.append("reference")
        return x + eps

    def launcher(x: torch.Tensor, eps: float) -> torch.Tensor:
        calls.append("launcher")
        return x + eps

    def supports(x: torch.Tensor, eps: float) -> str | None:
        calls.append("supports")
        return None

    recorded = Op(
        "kgtest_recorded",
        reference=reference,
        args=(TensorArg("x", min_rank=1), ScalarArg("eps", min=0.0)),
        implementations=(TritonImpl("fake", launcher, supports=supports),),
        register=False,
    )
    bad_calls = [
        lambda: recorded(torch.ones(3), -1.0),
        lambda: recorded(torch.ones(3, dtype=torch.int32), 1.0),
        lambda: recorded(torch.tensor(1.0), 1.0),
        lambda: recorded([1.0], 1.0),
        lambda: recorded(torch.ones(3)),
    ]
    for mode in ("auto", "triton", "reference"):
        with kernelgate.use_interpreter(), kernelgate.use_mode(mode):
            for bad in bad_calls:
                with pytest.raises(InputError):
                    bad()
                with pytest.raises(InputError):
                    recorded.plan(torch.ones(3), float("nan"))
    assert calls == []
    kernelgate.configure(tune=False)  # one valid call runs the launcher once (no gate, no timing)
    with kernelgate.use_interpreter():
        recorded(torch.ones(3), 1.0)
    assert calls == ["supports", "launcher"], "the recorders must see a valid call"
    assert kernelgate.fallbacks() == []


# --- declaration errors ------------------------------------------------------------------------


def _reference_x_w(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


@pytest.mark.parametrize(
    "args",
    [
        (TensorArg("x"),),
        (TensorArg("w"), TensorArg("x")),
        (TensorArg("x"), TensorArg("w"), TensorArg("b")),
        (TensorArg("x"), TensorArg("weight")),
    ],
    ids=["missing", "reordered", "extra", "renamed"],
)
def test_specs_must_match_reference_parameters(args: tuple[TensorArg, ...]) -> None:
    """A contract not listing one spec per reference parameter, in order, is a DeclarationError showing both lists."""
    with pytest.raises(
        DeclarationError,
        match=r"^op 'kgtest_mismatch': the contract must list one spec per reference parameter, in order; "
        r"reference parameters are \['x', 'w'\], specs are \[.*\]\.$",
    ) as info:
        Op("kgtest_mismatch", reference=_reference_x_w, args=args, register=False)
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize(
    ("reference", "args", "refers_to"),
    [
        (
            lambda w, x: x * w,
            (TensorArg("w", sizes={0: ("x", -1)}), TensorArg("x")),
            "'w' refers to 'x'",
        ),
        (lambda x, d: x, (TensorArg("x"), DimArg("d", of="y")), "'d' refers to 'y'"),
        (lambda d, x: x, (DimArg("d", of="x"), TensorArg("x")), "'d' refers to 'x'"),
        (lambda s, d: s, (ScalarArg("s"), DimArg("d", of="s")), "'d' refers to 's'"),
    ],
    ids=["size-later-tensor", "dim-unknown", "dim-later-tensor", "dim-of-scalar"],
)
def test_spec_must_refer_to_an_earlier_tensor(reference: Any, args: tuple[Any, ...], refers_to: str) -> None:
    """A size or dim spec referring to a later, unknown or non-tensor argument is a DeclarationError naming both."""
    with pytest.raises(
        DeclarationError,
        match=rf"^op 'kgtest_refers': spec {refers_to}, which must be a tensor argument listed before it\.$",
    ):
        Op("kgtest_refers", reference=reference, args=args, register=False)


def test_duplicate_implementation_names() -> None:
    """Two implementations with one name are a DeclarationError listing the names."""
    impl = TritonImpl("same", _identity)
    with pytest.raises(
        DeclarationError, match=r"^op 'kgtest_dup_impl': implementation names must be unique; got \['same', 'same'\]\.$"
    ):
        Op("kgtest_dup_impl", reference=_identity, args=(TensorArg("x"),), implementations=(impl, impl), register=False)


def test_implementations_must_be_triton_impls() -> None:
    """A bare function in place of a TritonImpl is a DeclarationError."""
    with pytest.raises(DeclarationError, match=r"implementations must be TritonImpl instances"):
        Op("kgtest_bare", reference=_identity, args=(TensorArg("x"),), implementations=(_identity,), register=False)


@pytest.mark.parametrize("name", ["Softmax", "my-op", "1op", "", "_op", 3])
def test_bad_op_name(name: Any) -> None:
    """An op name that is not a lower-case identifier is a DeclarationError quoting the pattern and the name."""
    with pytest.raises(DeclarationError, match=rf"^op name must match .*; got {re.escape(repr(name))}\.$"):
        Op(name, reference=_identity, args=(TensorArg("x"),), register=False)


def test_reference_must_not_take_varargs() -> None:
    """A reference taking *args cannot be described by a contract and is a DeclarationError."""
    with pytest.raises(DeclarationError, match=r"must not take \*args or \*\*kwargs"):
        Op("kgtest_varargs", reference=lambda *xs: xs, args=(), register=False)


def test_reference_must_be_callable() -> None:
    """A non-callable reference is a DeclarationError."""
    with pytest.raises(DeclarationError, match=r"reference must be callable; got 3\."):
        Op("kgtest_not_callable", reference=3, args=(), register=False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TritonImpl("Bad Name", _identity), r"TritonImpl name must match"),
        (lambda: TritonImpl("ok", 3), r"launcher must be callable"),
        (lambda: TritonImpl("ok", _identity, max_numel=0), r"max_numel must be >= 1; got 0"),
        (lambda: TensorArg("x", dtypes=()), r"dtypes must be a non-empty tuple of torch\.dtype"),
        (lambda: TensorArg("x", dtypes=("float32",)), r"dtypes must be a non-empty tuple of torch\.dtype"),
        (lambda: TensorArg("x", rank=1, min_rank=2), r"rank 1 is below min_rank 2"),
        (lambda: ScalarArg("s", kind=str), r"kind must be float, int or bool"),
    ],
    ids=["impl-name", "impl-launcher", "impl-max-numel", "no-dtypes", "str-dtype", "rank", "scalar-kind"],
)
def test_bad_specs_and_implementations(build: Any, message: str) -> None:
    """Malformed specs and implementations are DeclarationErrors at declaration time."""
    with pytest.raises(DeclarationError, match=message):
        build()


def test_duplicate_registration(registry: None) -> None:
    """Registering a second op under a taken name is a DeclarationError suggesting replace=True, which then works."""
    first = Op("kgtest_registered", reference=_identity, args=(TensorArg("x"),))
    assert kernelgate.get_op("kgtest_registered") is first
    with pytest.raises(
        DeclarationError,
        match=r"^an op named 'kgtest_registered' is already registered\. Choose another name, or pass replace=True",
    ):
        Op("kgtest_registered", reference=_identity, args=(TensorArg("x"),))
    assert kernelgate.get_op("kgtest_registered") is first
    second = Op("kgtest_registered", reference=_identity, args=(TensorArg("x"),), replace=True)
    assert kernelgate.get_op("kgtest_registered") is second
    assert [op.name for op in kernelgate.registered_ops()].count("kgtest_registered") == 1


def test_builtin_names_are_protected(registry: None) -> None:
    """A user op cannot take a built-in op's name by accident."""
    with pytest.raises(DeclarationError, match=r"'softmax' is already registered"):
        Op("softmax", reference=_identity, args=(TensorArg("x"),))
    assert kernelgate.get_op("softmax") is kernelgate.softmax


def test_register_false_keeps_registry_unchanged(registry: None) -> None:
    """An op declared with register=False is callable but not registered."""
    before = [op.name for op in kernelgate.registered_ops()]
    unlisted = Op("kgtest_unlisted", reference=_identity, args=(TensorArg("x"),), register=False)
    assert torch.equal(unlisted(torch.ones(2)), torch.ones(2))
    assert [op.name for op in kernelgate.registered_ops()] == before
    with pytest.raises(KeyError, match=r"no op named 'kgtest_unlisted' is registered; registered ops: .*softmax"):
        kernelgate.get_op("kgtest_unlisted")


def test_huge_int_scalar_is_an_input_error() -> None:
    """An int too large for a float is rejected as not finite, not with a raw OverflowError."""
    with pytest.raises(InputValueError, match=r"argument 'eps' must be a finite float"):
        kernelgate.rms_norm(torch.ones(2, 3), None, 10**400)


def test_sizes_dimension_missing_from_the_tensor() -> None:
    """A size rule on a dimension the tensor lacks is an InputValueError naming the argument."""
    op = kernelgate.Op(
        "kgtest_sizes_rank",
        reference=lambda x, w: x,
        args=(TensorArg("x"), TensorArg("w", sizes={1: ("x", -1)})),
        register=False,
    )
    with pytest.raises(InputValueError, match=r"argument 'w' must have a dimension 1 to match x\.shape\[-1\]"):
        op(torch.ones(3), torch.ones(3))


def test_dim_of_an_optional_tensor_is_a_declaration_error() -> None:
    """A DimArg may not refer to an optional tensor (it would have nothing to index when None)."""
    with pytest.raises(DeclarationError, match=r"DimArg 'd' cannot refer to the optional tensor 'x'"):
        kernelgate.Op(
            "kgtest_dim_optional",
            reference=lambda x, d: x,
            args=(TensorArg("x", optional=True), DimArg("d", of="x")),
            register=False,
        )


def test_non_spec_contract_entries_are_declaration_errors() -> None:
    """Contract entries that are not specs, and references without a signature, raise DeclarationError."""
    with pytest.raises(
        DeclarationError, match=r"must be a TensorArg, ScalarArg, DimArg, ChoiceArg or ShapeArg; got 'x'"
    ):
        kernelgate.Op("kgtest_bad_spec", reference=lambda x: x, args=("x",), register=False)  # type: ignore[arg-type]
    with pytest.raises(DeclarationError, match=r"cannot read the reference's parameters"):
        kernelgate.Op("kgtest_no_sig", reference=max, args=(), register=False)


# --- choice and shape arguments -------------------------------------------------------------------


def _pick(x: torch.Tensor, reduction: str) -> torch.Tensor:
    return x.sum() if reduction == "sum" else x


def _normalise(x: torch.Tensor, normalized_shape: tuple[int, ...]) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, normalized_shape)


PICK = Op(
    "kgtest_pick", reference=_pick, args=(TensorArg("x"), ChoiceArg("reduction", ("none", "sum"))), register=False
)
NORMALISE = Op(
    "kgtest_normalise",
    reference=_normalise,
    args=(TensorArg("x"), ShapeArg("normalized_shape", of="x")),
    register=False,
)


@pytest.mark.parametrize(("value", "error"), [("mean", InputValueError), (None, InputTypeError), (1, InputTypeError)])
def test_choice_outside_the_set(value: Any, error: type[Exception]) -> None:
    """A ChoiceArg names its choices, what came, and the remedy."""
    with pytest.raises(error, match=r"kgtest_pick\(\): argument 'reduction' must be 'none' or 'sum'; got .*Pass one"):
        PICK(torch.ones(2), value)


def test_choice_in_the_set_runs() -> None:
    assert PICK(torch.ones(3), "sum").item() == 3.0


@pytest.mark.parametrize("shape", [(4,), [4], torch.Size([3, 4])])
def test_shape_matching_the_trailing_sizes_runs(shape: Any) -> None:
    """A tuple, list or torch.Size equal to the trailing sizes is accepted, as by torch.nn.functional."""
    x = torch.randn(2, 3, 4)
    assert torch.equal(NORMALISE(x, shape), torch.nn.functional.layer_norm(x, shape))


@pytest.mark.parametrize(
    ("shape", "error", "message"),
    [
        ((5,), InputValueError, r"must equal the trailing sizes of 'x' \(shape \(2, 3, 4\)\); got \(5,\)"),
        ((1, 2, 3, 4), InputValueError, r"must equal the trailing sizes"),
        ((), InputTypeError, r"must be a non-empty tuple of ints; got tuple \(\)"),
        ((4.0,), InputTypeError, r"must be a non-empty tuple of ints"),
        ("4", InputTypeError, r"must be a non-empty tuple of ints"),
        (4, InputTypeError, r"must be a non-empty tuple of ints; got int 4"),
    ],
)
def test_shape_not_matching(shape: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        NORMALISE(torch.randn(2, 3, 4), shape)


@pytest.mark.parametrize(
    ("call", "argument", "received"),
    [
        (lambda t: kernelgate.layer_norm(torch.randn(4, 300), t), "normalized_shape", "Tensor of shape (300,)"),
        (
            lambda t: kernelgate.softmax(torch.randn(4, 300), t[0]),
            "dim",
            "Tensor of shape (), dtype float32 on cpu (its .",
        ),
        (lambda t: kernelgate.rms_norm(torch.randn(4, 300), None, t[0]), "eps", "Tensor of shape (), dtype float32"),
        (
            lambda t: kernelgate.cross_entropy(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), reduction=t),
            "reduction",
            "Tensor of shape (300,), dtype float32 on cpu",
        ),
    ],
)
def test_a_tensor_where_a_python_value_belongs_is_named_by_shape_not_values(
    call: Any, argument: str, received: str
) -> None:
    """A tensor passed for a shape, dim, scalar or choice (layer_norm's weight in normalized_shape's place) is
    described by its shape, dtype and device: the message never prints the tensor's values."""
    values = torch.full((300,), 1234.5)
    with pytest.raises(InputTypeError, match=rf"argument '{argument}' must be .*; got {re.escape(received)}") as info:
        call(values)
    assert "1234" not in str(info.value) and "tensor(" not in str(info.value)
    assert len(str(info.value)) < 300


def test_a_long_shape_is_shown_shortened() -> None:
    with pytest.raises(InputValueError, match=r"got \(0, 1, 2, 3, 4, 5, 6, 7, \.\.\.\)\. Pass x\.shape\[-k:\]"):
        NORMALISE(torch.randn(2, 3, 4), list(range(40)))


def test_param_of_must_name_an_earlier_tensor() -> None:
    with pytest.raises(
        DeclarationError, match=r"spec 'w' refers to 'x', which must be a tensor argument listed before"
    ):
        Op(
            "kgtest_param_of_later",
            reference=lambda w, x: x,
            args=(TensorArg("w", param_of="x"), TensorArg("x")),
            register=False,
        )


def test_shape_of_an_optional_tensor_is_a_declaration_error() -> None:
    with pytest.raises(DeclarationError, match=r"ShapeArg 's' cannot refer to the optional tensor 'x'"):
        Op(
            "kgtest_shape_optional",
            reference=lambda x, s: x,
            args=(TensorArg("x", optional=True), ShapeArg("s", of="x")),
            register=False,
        )


def test_choice_needs_string_choices() -> None:
    with pytest.raises(DeclarationError, match=r"choices must be a non-empty tuple of str"):
        ChoiceArg("reduction", ())


def test_choice_and_shape_in_operator_schemas() -> None:
    """The registered operator carries str and SymInt[] parameters, and runs through torch.ops."""
    from kernelgate.library import schema

    specs = (TensorArg("x"), ShapeArg("normalized_shape", of="x"), ChoiceArg("reduction", ("none",)))
    assert schema("t", specs, "Tensor", ()) == "(Tensor x, SymInt[] normalized_shape, str reduction) -> Tensor"


@pytest.mark.parametrize("values", [(), (4, -1), (2.0,), (True, False), [4, 8]])
def test_config_space_rejects_bad_values(values: Any) -> None:
    """A ConfigSpace parameter takes a non-empty tuple of non-negative ints; anything else is a DeclarationError."""
    with pytest.raises(DeclarationError, match=rf"^ConfigSpace: BLOCK .*; got {re.escape(repr(values))}\.$"):
        ConfigSpace(BLOCK=values)


def test_config_space_takes_a_switch() -> None:
    """0 and 1 make a compile-time switch (a constexpr flag): both are members, 2 is not."""
    space = ConfigSpace(BLOCK=(16,), PREFETCH=(0, 1))
    assert [dict(c) for c in space] == [{"BLOCK": 16, "PREFETCH": 0}, {"BLOCK": 16, "PREFETCH": 1}]
    assert space.validate({"BLOCK": 16, "PREFETCH": 0}) == {"BLOCK": 16, "PREFETCH": 0}
    assert space.validate({"BLOCK": 16, "PREFETCH": 2}) is None


@pytest.mark.parametrize(
    ("layout", "make"),
    [
        ("nested", lambda t: torch.nested.nested_tensor(list(t.unbind()))),
        ("nested", lambda t: torch.nested.nested_tensor(list(t.unbind()), layout=torch.jagged)),
        ("sparse_coo", lambda t: t.to_sparse()),
        ("sparse_csr", lambda t: t.to_sparse_csr()),
    ],
)
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_a_tensor_that_is_not_dense_gets_an_error_that_says_how_to_convert_it(
    layout: str, make: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """A nested or sparse tensor is refused by name, with the conversion to make, after a dense call of the same
    shape too (the hot path's signature of a nested or CSR tensor raises torch's internal error, and the operator has
    no kernel for a jagged one: the contract's error replaces both). Before, torch's errors said "NestedTensorImpl
    doesn't support sizes", "NotImplementedError: kernelgate.softmax.default" or "Could not run 'aten::_softmax'
    with arguments from the 'SparseCPU' backend"."""
    dense = torch.randn(3, 8)
    kernelgate.softmax(dense, -1)
    remedy = (
        r"Pad it first, e\.g\. x\.to_padded_tensor\(0\.0\)"
        if layout == "nested"
        else r"Convert it first, e\.g\. x\.to_dense\(\)"
    )
    got = "a nested tensor" if layout == "nested" else f"layout {layout}"
    with pytest.raises(
        InputTypeError, match=rf"^softmax\(\): argument 'x' must be a dense \(strided\) tensor; got {got}\. {remedy}"
    ):
        kernelgate.softmax(make(dense), -1)


def test_a_sparse_weight_gets_the_same_error() -> None:
    with pytest.raises(
        InputTypeError,
        match=r"^rms_norm\(\): argument 'weight' must be a dense \(strided\) tensor; got layout sparse_coo\. "
        r"Convert it first, e\.g\. weight\.to_dense\(\)\.$",
    ):
        kernelgate.rms_norm(torch.randn(3, 8), torch.ones(8).to_sparse())


@pytest.mark.parametrize("tune", [True, False])
@pytest.mark.parametrize(("mode", "interpret"), [("auto", False), ("triton", True), ("check", True)])
def test_a_sparse_tensor_after_an_expanded_dense_one_of_the_same_signature_gets_the_contract_error(
    mode: str, interpret: bool, tune: bool
) -> None:
    """A sparse COO tensor's strides read as zeros, so its signature on the hot path equals that of a dense tensor
    expanded from one element, whose call is remembered: the route that call found (the reference, or a kernel run
    by the interpreter) fails on it, and the contract's error replaces torch's ("Could not run 'aten::_softmax' with
    arguments from the 'SparseCPU' backend", "unsupported memory format option Contiguous"). Without tuning, check
    mode's route is the kernel's default configuration, and the reference it runs first for the comparison fails."""
    expanded = torch.zeros(()).expand(3, 8)
    sparse = torch.zeros(3, 8).to_sparse()
    assert sparse.stride() == expanded.stride()  # the premise: the two signatures are alike
    old_tune = kernelgate.settings().tune
    kernelgate.configure(tune=tune)
    try:
        with kernelgate.use_mode(mode), kernelgate.use_interpreter(interpret):
            kernelgate.softmax(expanded, -1)
            with pytest.raises(
                InputTypeError,
                match=r"^softmax\(\): argument 'x' must be a dense \(strided\) tensor; got layout sparse_coo\. "
                r"Convert it first, e\.g\. x\.to_dense\(\)",
            ):
                kernelgate.softmax(sparse, -1)
    finally:
        kernelgate.configure(tune=old_tune)
