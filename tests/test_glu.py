"""swiglu and geglu, forward and backward: Triton kernels against the references and torch autograd, packed and
separate inputs, the contract, and every configuration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import kernelgate
from every_config import check_every_config
from kernelgate.ops.glu import geglu, geglu_backward, swiglu, swiglu_backward
from kernelgate.tolerance import assert_close, assert_no_worse

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Output shapes: 1, odd and prime sizes, leading dims, and rows longer than the largest block.
SHAPES = [(1,), (7,), (5, 17), (2, 3, 31), (4, 256), (3, 4099)]
INF, NAN = float("inf"), float("nan")


class Variant:
    """One of swiglu, geglu (erf) and geglu (tanh): the op, its backward, options and torch's own function."""

    def __init__(self, name: str, op: kernelgate.Op, backward: kernelgate.Op, options: tuple[Any, ...]) -> None:
        self.name, self.op, self.backward, self.options = name, op, backward, options

    def torch(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """Plain PyTorch: the activation of gate times up."""
        act = F.silu(gate) if self.op is swiglu else F.gelu(gate, approximate=self.options[0])
        return act * up

    def __repr__(self) -> str:
        return self.name


VARIANTS = [
    Variant("swiglu", swiglu, swiglu_backward, ()),
    Variant("geglu", geglu, geglu_backward, ("none",)),
    Variant("geglu-tanh", geglu, geglu_backward, ("tanh",)),
]


def _randn(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0, scale: float = 1.0
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen)).to(device=device, dtype=dtype)


def _inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, packed: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(gate, up) for an output of ``shape``: two tensors, or one of twice the last dim and None.

    gate spans the activation's curved range and tails (scale 3); up and grad are of scale 1.
    """
    gate = _randn((*shape[:-1], 2 * shape[-1]) if packed else shape, dtype, device, scale=3.0)
    if packed:
        gate[..., shape[-1] :] /= 3.0
        return gate, None
    return gate, _randn(shape, dtype, device, seed=1)


def _halves(gate: torch.Tensor, up: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if up is not None:
        return gate, up
    half = gate.shape[-1] // 2
    return gate[..., :half], gate[..., half:]


def _assert_runs_triton(plan: kernelgate.Plan) -> None:
    assert plan.path in ("triton", "interpreter"), plan


def _assert_matches_reference(variant: Variant, y: torch.Tensor, gate: torch.Tensor, up: torch.Tensor | None) -> None:
    """``y`` is the reference's activation(gate) * up, under the tolerance policy."""
    g, u = _halves(gate, up)
    assert_close(y, variant.op.reference(g, u, *variant.options))


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_is_torch(variant: Variant, dtype: torch.dtype) -> None:
    """The reference is activation(gate) * up in plain PyTorch; on the CPU, geglu's is computed in float64, which
    is never further from float64 than torch's own CPU result and gives gelu(+inf) = +inf as torch's GPU kernel."""
    gate = _randn((64, 1000), dtype, torch.device("cpu"), scale=3.0)
    up = _randn((64, 1000), dtype, torch.device("cpu"), seed=1)
    y = variant.op.reference(gate, up, *variant.options)
    expected = variant.torch(gate, up)
    if variant.op is swiglu:
        assert torch.equal(y, expected)
    else:
        assert torch.equal(y, variant.torch(gate.double(), up.double()).to(dtype))
        assert_no_worse(y, expected, variant.torch(gate.double(), up.double()), factor=1.0)
        inf = torch.tensor([INF], dtype=dtype)
        assert variant.op.reference(inf, torch.ones(1, dtype=dtype), *variant.options).item() == INF


# --- forward --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_reference(
    target: torch.device, variant: Variant, packed: bool, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    """The forward kernel runs and matches activation(gate) * up for every dtype and size, packed or separate."""
    gate, up = _inputs(shape, dtype, target, packed)
    _assert_runs_triton(variant.op.plan(gate, up, *variant.options))
    y = variant.op(gate, up, *variant.options)
    assert y.shape == shape and y.dtype == dtype and y.is_contiguous()
    _assert_matches_reference(variant, y, gate, up)


def _view(kind: str, base: torch.Tensor) -> torch.Tensor:
    """A non-contiguous view of the (48, 44) tensor ``base``, of even last dim."""
    if kind == "row-strided":
        return base[:, :16]
    if kind == "column-strided":
        return base[:, ::2]
    if kind == "transposed":
        return base.t()
    return base.view(6, 8, 44)[:, 1:7, :].transpose(0, 1)  # leading dims that cannot be merged


VIEWS = ["row-strided", "column-strided", "transposed", "unmergeable"]


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
@pytest.mark.parametrize("kind", VIEWS)
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
def test_non_contiguous_inputs(target: torch.device, variant: Variant, kind: str, packed: bool) -> None:
    """Strided and transposed views (of separate inputs, or of the packed tensor) give torch's result and stay
    unchanged; separate inputs of different layouts too."""
    base = _randn((48, 44), torch.float16, target, scale=3.0)
    other = _randn((48, 44), torch.float16, target, seed=1)
    before = base.clone()
    gate = _view(kind, base)
    up = None if packed else _view(kind, other)
    y = variant.op(gate, up, *variant.options)
    assert y.is_contiguous()
    _assert_matches_reference(variant, y, gate, up)
    if not packed:  # one contiguous, one strided
        up = up.contiguous()  # type: ignore[union-attr]
        _assert_matches_reference(variant, variant.op(gate, up, *variant.options), gate, up)
    assert torch.equal(base, before)


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
def test_0_dim_and_mixed_dtypes(target: torch.device, variant: Variant) -> None:
    """0-dim gate and up work; gate and up of different dtypes give the promoted dtype, as torch's product does."""
    g, u = torch.tensor(1.5, device=target), torch.tensor(-2.0, device=target)
    assert_close(variant.op(g, u, *variant.options), variant.torch(g, u))
    gate = _randn((5, 33), torch.bfloat16, target, scale=3.0)
    up = _randn((5, 33), torch.float32, target, seed=1)
    y = variant.op(gate, up, *variant.options)
    assert y.dtype == torch.float32
    _assert_matches_reference(variant, y, gate.float(), up)


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
def test_special_values(target: torch.device, variant: Variant, dtype: torch.dtype, packed: bool) -> None:
    """+-1e4, +-inf and NaN in gate or up give the reference's result, NaN exactly where it has NaN."""
    specials = torch.tensor([1e4, -1e4, INF, -INF, NAN, 0.0, 1.0, -1.0])
    n = len(specials)
    gate = specials.repeat_interleave(n).view(1, n * n)  # every gate special against every up special
    up = specials.repeat(n).view(1, n * n)
    gate, up = gate.to(device=target, dtype=dtype), up.to(device=target, dtype=dtype)
    if packed:
        gate, up = torch.cat([gate, up], dim=-1), None
    y = variant.op(gate, up, *variant.options)
    expected = variant.op.reference(gate, up, *variant.options)
    assert torch.equal(y.isnan(), expected.isnan())
    assert_close(y, expected)


@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("shape", [(0, 4), (5, 0), (2, 0, 6)])
def test_empty_inputs_take_the_reference(shape: tuple[int, ...], packed: bool) -> None:
    """Empty tensors are valid: they take the reference path with reason "empty-tensor"."""
    gate = torch.empty(shape)
    up = None if packed else torch.empty(shape)
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="empty-tensor"):
        plan = swiglu.plan(gate, up)
        y = swiglu(gate, up)
        dgate, dup = geglu_backward(torch.empty(y.shape), gate, up, "tanh")
    assert plan.path == "reference" and plan.reason == kernelgate.Reason.EMPTY_TENSOR
    assert y.shape == (*shape[:-1], shape[-1] // 2 if packed else shape[-1])
    assert dgate.shape == shape and dup.shape == ((0,) if packed else shape)


def test_float64_takes_the_reference() -> None:
    """float64 is valid for the ops but not for the kernels: reference path with reason "dtype-unsupported"."""
    x = torch.randn(3, 8, dtype=torch.float64)
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="dtype-unsupported"):
        assert geglu.plan(x, None, "none").reason == kernelgate.Reason.DTYPE
        assert torch.equal(geglu(x, None, "none"), F.gelu(x[:, :4]) * x[:, 4:])


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: swiglu(torch.zeros(2, 7)), kernelgate.InputValueError, "'gate' must have an even last dimension"),
        (lambda: geglu(torch.zeros(3), None, "tanh"), kernelgate.InputValueError, "even last dimension.*got 3"),
        (lambda: swiglu(torch.tensor(1.0)), kernelgate.InputValueError, "at least one dimension when 'up' is None"),
        (lambda: swiglu(torch.zeros(2, 4), torch.zeros(2, 5)), kernelgate.InputValueError, "'up' must have the shape"),
        (lambda: swiglu(torch.zeros(2, 4), torch.zeros(4)), kernelgate.InputValueError, "'up' must have the shape"),
        (lambda: geglu(torch.zeros(2, 4), None, "exact"), kernelgate.InputValueError, "'approximate' must be"),
        (lambda: geglu(torch.zeros(2, 4), None, None), kernelgate.InputTypeError, "'approximate' must be"),
        (lambda: swiglu(torch.zeros(2, 4, dtype=torch.int32)), kernelgate.InputTypeError, "'gate' must have dtype"),
        (
            lambda: swiglu_backward(torch.zeros(2, 4), torch.zeros(2, 4), None),
            kernelgate.InputValueError,
            r"'grad' must have the shape of the forward output, \(2, 2\)",
        ),
        (
            lambda: geglu_backward(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 4), "none"),
            kernelgate.InputValueError,
            "'grad' must have the shape",
        ),
    ],
    ids=[
        "odd-packed",
        "odd-packed-1d",
        "0-dim-packed",
        "shape-mismatch",
        "broadcast",
        "bad-approximate",
        "approximate-not-str",
        "int-dtype",
        "backward-grad-shape-packed",
        "backward-grad-shape",
    ],
)
@pytest.mark.parametrize("path", ["reference", "triton"])
def test_contract_errors(call: Callable[[], object], error: type[Exception], match: str, path: str) -> None:
    """Invalid arguments raise an error naming the argument and the remedy, on the reference path and on the
    Triton path alike, before anything launches."""
    kernelgate.configure(tune=False)
    with kernelgate.use_interpreter(), kernelgate.use_mode(path), pytest.raises(error, match=match):
        call()


# --- backward -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7,), (2, 3, 31), (3, 4099)])
def test_backward_kernel_matches_reference(
    target: torch.device, variant: Variant, packed: bool, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    """The backward kernel computes the backward reference's (dgate, dup); packed, one gradient of gate's shape."""
    gate, up = _inputs(shape, dtype, target, packed)
    grad = _randn(shape, dtype, target, seed=2)
    args = (grad, gate, up, *variant.options)
    _assert_runs_triton(variant.backward.plan(*args))
    got, expected = variant.backward(*args), variant.backward.reference(*args)
    assert got[0].shape == gate.shape and got[0].is_contiguous()
    assert got[1].shape == ((0,) if packed else shape)
    for a, e in zip(got, expected, strict=True):
        assert_close(a, e)


def test_backward_reference_matches_torch_autograd() -> None:
    """The backward references give torch autograd's gradients in float64, also at +-1e4, +-inf and NaN (NaN where
    autograd has NaN)."""
    special = torch.tensor([1e4, -1e4, INF, -INF, NAN], dtype=torch.float64)
    gate = torch.cat([3 * torch.randn(40, dtype=torch.float64), special])
    up = torch.randn(45, dtype=torch.float64)
    grad = torch.randn(45, dtype=torch.float64)
    for variant in VARIANTS:
        leaves = (gate.clone().requires_grad_(), up.clone().requires_grad_())
        truth = torch.autograd.grad(variant.torch(*leaves), leaves, grad)
        got = variant.backward.reference(grad, gate, up, *variant.options)
        for a, t in zip(got, truth, strict=True):
            torch.testing.assert_close(a, t, equal_nan=True, rtol=1e-12, atol=1e-12)


def _torch_grads(
    variant: Variant, inputs: tuple[torch.Tensor, ...], grad: torch.Tensor, packed: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Plain PyTorch's gradients of each input, in the inputs' dtype and in float64: [(baseline, truth), ...]."""
    results = []
    for dtype in (inputs[0].dtype, torch.float64):
        leaves = tuple(t.detach().to(dtype).requires_grad_() for t in inputs)
        out = variant.torch(*_halves(leaves[0], None)) if packed else variant.torch(*leaves)
        results.append(torch.autograd.grad(out, leaves, grad.to(dtype)))
    return list(zip(results[0], results[1], strict=True))


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 33), (2, 3, 100)])
def test_gradients_match_torch(
    target: torch.device, variant: Variant, packed: bool, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    """Through autograd, the Triton forward and backward give gradients of gate and up no further from float64 than
    twice plain PyTorch's; a packed input gets one gradient."""
    gate, up = _inputs(shape, dtype, target, packed)
    inputs = (gate,) if up is None else (gate, up)
    leaves = tuple(t.requires_grad_() for t in inputs)
    grad = _randn(shape, dtype, target, seed=2)
    got = torch.autograd.grad(variant.op(*leaves, *((None,) if packed else ()), *variant.options), leaves, grad)
    for g, (baseline, truth) in zip(got, _torch_grads(variant, inputs, grad, packed), strict=True):
        assert g.dtype == dtype and g.shape == truth.shape
        assert_no_worse(g, baseline, truth)


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
def test_backward_special_values(target: torch.device, variant: Variant, packed: bool) -> None:
    """+-1e4, +-inf and NaN in gate, up or grad give the backward reference's gradients, NaN where it has NaN."""
    specials = torch.tensor([1e4, -1e4, INF, -INF, NAN, 0.0, 2.0, -2.0])
    n = len(specials)
    gate = specials.repeat_interleave(n).view(1, n * n).to(target)
    up = torch.randn(1, n * n).to(target)
    grad = specials.repeat(n).view(1, n * n).to(target)
    if packed:
        gate, up = torch.cat([gate, up], dim=-1), None
    got = variant.backward(grad, gate, up, *variant.options)
    expected = variant.backward.reference(grad, gate, up, *variant.options)
    for a, e in zip(got, expected, strict=True):
        assert torch.equal(a.isnan(), e.isnan())
        assert_close(a, e)


def test_ops_pass_float64_gradcheck() -> None:
    """Through their registered backward (reference path in float64), the ops pass gradcheck, packed and separate,
    and the backward references are themselves differentiable."""
    gate = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    for variant in VARIANTS:
        opts = variant.options
        assert torch.autograd.gradcheck(lambda g, u, opts=opts, v=variant: v.op(g, u, *opts), (gate, up))
        assert torch.autograd.gradcheck(lambda g, opts=opts, v=variant: v.op(g, None, *opts), (gate,))
        assert torch.autograd.gradcheck(
            lambda d, g, u, opts=opts, v=variant: v.backward.reference(d, g, u, *opts), (grad, gate, up)
        )


def test_saves_only_the_inputs() -> None:
    """The forward saves only its inputs for the backward (the activation is recomputed): no extra tensor."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    gate = torch.randn(4, 8, requires_grad=True)
    up = torch.randn(4, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        swiglu(gate, up)
    assert sorted(t.data_ptr() for t in saved) == sorted((gate.data_ptr(), up.data_ptr()))


def _opcheck_cases() -> list[Any]:
    def rg(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, requires_grad=True)

    return [
        pytest.param(swiglu, lambda: (rg(4, 9), rg(4, 9)), id="swiglu"),
        pytest.param(swiglu, lambda: (rg(4, 10), None), id="swiglu-packed"),
        pytest.param(geglu, lambda: (rg(4, 9), rg(4, 9), "none"), id="geglu"),
        pytest.param(geglu, lambda: (rg(4, 10), None, "tanh"), id="geglu-tanh-packed"),
        pytest.param(
            swiglu_backward, lambda: (torch.randn(4, 9), torch.randn(4, 9), torch.randn(4, 9)), id="swiglu_bwd"
        ),
        pytest.param(swiglu_backward, lambda: (torch.randn(4, 5), torch.randn(4, 10), None), id="swiglu_bwd-packed"),
        pytest.param(
            geglu_backward, lambda: (torch.randn(4, 9), torch.randn(4, 9), torch.randn(4, 9), "tanh"), id="geglu_bwd"
        ),
        pytest.param(
            geglu_backward, lambda: (torch.randn(4, 5), torch.randn(4, 10), None, "none"), id="geglu_bwd-packed"
        ),
    ]


@pytest.mark.parametrize(("op", "make"), _opcheck_cases())
@pytest.mark.parametrize("interpret", [False, True], ids=["reference", "interpreter"])
def test_opcheck(op: kernelgate.Op, make: Callable[[], tuple[object, ...]], interpret: bool) -> None:
    """torch.library.opcheck passes: schema (with the str option), fake tensors, autograd registration, AOT dispatch."""
    kernelgate.configure(tune=False)
    with kernelgate.use_interpreter(interpret):
        torch.library.opcheck(op.torch_op, make())


def _mlp(x: torch.Tensor, w: torch.Tensor, swiglu_fn: Callable[..., Any], geglu_fn: Callable[..., Any]) -> torch.Tensor:
    """A projection to 64 features, then a packed swiglu of the first 32 times a separate geglu of the rest."""
    h = x @ w
    return swiglu_fn(h[..., :32], None) * geglu_fn(h[..., 32:48], h[..., 48:], "tanh")


def test_compiled_without_graph_breaks() -> None:
    """Under torch.compile(fullgraph=True, dynamic=True) swiglu and geglu trace as operators without a graph
    break, run their kernels (interpreted) inside the graph, and give the references' output and a gradient
    no further from float64 than twice eager torch's."""
    from torch._dynamo.utils import counters

    def eager_swiglu(gate: torch.Tensor, up: None) -> torch.Tensor:
        return Variant("", swiglu, swiglu_backward, ()).torch(*_halves(gate, up))

    def eager_geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str) -> torch.Tensor:
        return F.gelu(gate, approximate=approximate) * up

    kernelgate.configure(tune=False)
    x = _randn((8, 12), torch.float32, torch.device("cpu"))
    w = _randn((12, 64), torch.float32, torch.device("cpu"), seed=1).requires_grad_()
    counters.clear()
    with kernelgate.use_interpreter(), kernelgate.use_mode("triton"):
        compiled = torch.compile(lambda x, w: _mlp(x, w, swiglu, geglu), fullgraph=True, dynamic=True)
        y = compiled(x, w)
        (dw,) = torch.autograd.grad(y, w, torch.ones_like(y))
    assert dict(counters["graph_break"]) == {}
    assert_close(y, _mlp(x, w, swiglu.reference, geglu.reference).detach())
    results = []
    for dtype in (torch.float32, torch.float64):
        leaf = w.detach().to(dtype).requires_grad_()
        out = _mlp(x.to(dtype), leaf, eager_swiglu, eager_geglu)
        results.append(torch.autograd.grad(out, leaf, torch.ones_like(out))[0])
    assert_no_worse(dw, *results)


# --- configurations -------------------------------------------------------------------------------


def _config_values(
    variant: Variant, backward: bool, packed: bool, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[Any, ...]:
    gate, up = _inputs(shape, dtype, device, packed)
    if backward:
        return (_randn(shape, dtype, device, seed=2), gate, up, *variant.options)
    return (gate, up, *variant.options)


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("shape", [(3, 100), (2, 2500)])
def test_every_config_matches_the_reference(
    target: torch.device, variant: Variant, backward: bool, packed: bool, shape: tuple[int, ...]
) -> None:
    """Every configuration the implementation keeps gives the reference's result (outputs poisoned with NaN)."""
    op = variant.backward if backward else variant.op
    for dtype in (torch.float32, torch.bfloat16):
        check_every_config(op, _config_values(variant, backward, packed, shape, dtype, target), target.type == "cpu")


@pytest.mark.parametrize("op", [swiglu, geglu, swiglu_backward, geglu_backward], ids=lambda op: op.name)
def test_make_inputs_are_valid(op: kernelgate.Op) -> None:
    """make_inputs (used by tune, bench and doctor) gives arguments the op accepts."""
    assert op.make_inputs is not None
    values = op.make_inputs((4, 64), torch.float32, torch.device("cpu"))
    result = op(*values)
    assert (result if isinstance(result, torch.Tensor) else result[0]).shape == (4, 64)


# --- GPU, benchmark-sized -------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16384, 4096), (4096, 32768), (65536, 1024)])
def test_large_shapes_compiled(variant: Variant, packed: bool, dtype: torch.dtype, shape: tuple[int, int]) -> None:
    """At benchmark-sized shapes (the shape of gate; packed, of [gate | up]) the compiled forward and backward
    kernels match the references."""
    device = torch.device("cuda")
    out_shape = (shape[0], shape[1] // 2) if packed else shape
    gate = _randn(shape, dtype, device)
    up = None if packed else _randn(shape, dtype, device, seed=1)
    grad = _randn(out_shape, dtype, device, seed=2)
    with kernelgate.use_mode("triton"):
        y = variant.op(gate, up, *variant.options)
        got = variant.backward(grad, gate, up, *variant.options)
    assert_close(y, variant.op.reference(gate, up, *variant.options))
    for a, e in zip(got, variant.backward.reference(grad, gate, up, *variant.options), strict=True):
        assert_close(a, e)
