"""layer_norm and layer_norm_backward: Triton kernels against torch.nn.functional.layer_norm and its autograd."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import kernelgate
from kernelgate.config import Config
from kernelgate.errors import InputTypeError, InputValueError
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.layer_norm import PREFETCH_MIN_BLOCK, layer_norm, layer_norm_backward
from kernelgate.rowwise import MAX_SINGLE_BLOCK_FORWARD
from kernelgate.selection import compare, run_candidate
from kernelgate.tolerance import assert_close, assert_no_worse

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EPS = 1e-5
# 1, odd and prime row lengths, and one block exactly.
SHAPES = [(1,), (3, 1), (5, 17), (2, 3, 31), (7, 509), (4, 1024)]
# Which of weight and bias are given.
AFFINE = ["weight-bias", "weight", "bias", "none"]
# A row longer than one block (the looped kernels), kept short for the interpreter.
LONG = (2, MAX_SINGLE_BLOCK_FORWARD + 65)  # beyond any single block: the looped kernels, forward and backward
# The looped kernels at a block far shorter than the row: many blocks and a ragged last one, cheaply.
SMALL_BLOCK: Config = {"BLOCK_N": 64, "num_warps": 2}
# The looped forward with each block's load issued a block ahead (the backward ignores PREFETCH).
SMALL_BLOCK_PREFETCH: Config = {**SMALL_BLOCK, "PREFETCH": 1}


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=gen) + 1).to(device=device, dtype=dtype)


def _affine(
    affine: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    w = _randn(shape, dtype, device, seed=1) if affine.startswith("weight") else None
    b = _randn(shape, dtype, device, seed=2) if affine.endswith("bias") else None
    return w, b


def _expected(
    x: torch.Tensor, normalized_shape: tuple[int, ...], w: torch.Tensor | None, b: torch.Tensor | None
) -> torch.Tensor:
    """F.layer_norm in float64, rounded to x's dtype.

    Not F.layer_norm in x's dtype: torch's CPU kernel forms y = x * (rstd * w) + (b - mean * rstd * w),
    which cancels, and rows of zero variance (rstd = 1 / sqrt(eps)) come out up to 1e-5 off in float16.
    """
    w64, b64 = (t.double() if t is not None else None for t in (w, b))
    return F.layer_norm(x.double(), normalized_shape, w64, b64, EPS).to(x.dtype)


def _impl(op: Op, name: str) -> TritonImpl:
    return next(i for i in op.implementations if i.name == name)


def _run(op: Op, name: str, config: Config | None, *values: Any) -> Any:
    """One implementation of ``op`` under ``config``, into NaN-filled outputs; interpreted for CPU tensors."""
    device = next(v for v in values if isinstance(v, torch.Tensor)).device
    return run_candidate(_impl(op, name), config, values, device.type == "cpu", poison=True)


def _torch_grads(
    x: torch.Tensor,
    normalized_shape: tuple[int, ...],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    grad: torch.Tensor,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Plain PyTorch's gradients of (x, weight, bias) that are given, in x's dtype and in float64."""
    results = []
    for dtype in (x.dtype, torch.float64):
        leaves = [t.detach().to(dtype).requires_grad_() if t is not None else None for t in (x, weight, bias)]
        y = F.layer_norm(leaves[0], normalized_shape, leaves[1], leaves[2], EPS)  # type: ignore[arg-type]
        wanted = [t for t in leaves if t is not None]
        results.append(torch.autograd.grad(y, wanted, grad.to(dtype)))
    return results[0], results[1]


def _assert_backward_matches(got: tuple[torch.Tensor, ...], values: tuple[Any, ...]) -> None:
    """dx within the tolerance policy of the reference's; dweight and dbias no further from the float64
    reference than twice the reference in their dtype.

    dweight and dbias are sums over rows whose terms cancel, so a few of their elements are small
    against the terms; no elementwise bound fits those, whichever order the sums take.
    """
    grad, x, normalized_shape, w, b, eps = values
    expected = layer_norm_backward.reference(*values)
    assert compare(got[0], expected[0], math.prod(normalized_shape)) is None
    w64, b64 = (t.double() if t is not None else None for t in (w, b))
    truth = layer_norm_backward.reference(grad.double(), x.double(), normalized_shape, w64, b64, eps)
    for index, given in ((1, w), (2, b)):
        if given is None:
            assert got[index].numel() == 0
        else:
            assert_no_worse(got[index], expected[index], truth[index])


def _check_grads(
    x: torch.Tensor, normalized_shape: tuple[int, ...], w: torch.Tensor | None, b: torch.Tensor | None
) -> None:
    """layer_norm's gradients of every given input are no further from float64 than twice plain PyTorch's."""
    grad = _randn(x.shape, x.dtype, x.device, seed=3)
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    wanted = [t for t in leaves if t is not None]
    y = layer_norm(leaves[0], normalized_shape, leaves[1], leaves[2], EPS)
    got = torch.autograd.grad(y, wanted, grad)
    baseline, truth = _torch_grads(x, normalized_shape, w, b, grad)
    for g, base, true in zip(got, baseline, truth, strict=True):
        assert g.shape == true.shape
        assert_no_worse(g, base, true)


# --- forward ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", AFFINE)
def test_forward_matches_torch(target: torch.device, dtype: torch.dtype, shape: tuple[int, ...], affine: str) -> None:
    """layer_norm with any of weight and bias runs the single-block kernel and matches F.layer_norm."""
    x = _randn(shape, dtype, target)
    w, b = _affine(affine, shape[-1:], dtype, target)
    assert layer_norm.plan(x, shape[-1:], w, b, EPS).name == "single_block"
    y = layer_norm(x, shape[-1:], w, b, EPS)
    assert y.shape == x.shape and y.dtype == dtype
    assert_close(y, _expected(x, shape[-1:], w, b), reduction_length=shape[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", ["weight-bias", "none"])
def test_long_rows_forward(target: torch.device, dtype: torch.dtype, affine: str) -> None:
    """Rows longer than one block run the looped kernel and match F.layer_norm."""
    x = _randn(LONG, dtype, target)
    w, b = _affine(affine, LONG[-1:], dtype, target)
    assert layer_norm.plan(x, LONG[-1:], w, b, EPS).name == "looped"
    assert_close(layer_norm(x, LONG[-1:], w, b, EPS), _expected(x, LONG[-1:], w, b), reduction_length=LONG[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("config", [SMALL_BLOCK, SMALL_BLOCK_PREFETCH], ids=["", "prefetch"])
def test_looped_forward_with_many_blocks(target: torch.device, dtype: torch.dtype, affine: str, config: Config) -> None:
    """The looped kernel at a block far shorter than the row (ragged last block) matches F.layer_norm, with and
    without PREFETCH."""
    x = _randn((3, 300), dtype, target)
    w, b = _affine(affine, (300,), dtype, target)
    y = _run(layer_norm, "looped", config, x, (300,), w, b, EPS)
    assert_close(y, _expected(x, (300,), w, b), reduction_length=300)


@pytest.mark.parametrize(
    ("shape", "normalized_shape"), [((2, 3, 4, 5), (4, 5)), ((2, 3, 4, 5), (3, 4, 5)), ((3, 4), (3, 4))]
)
@pytest.mark.parametrize("affine", ["weight-bias", "none"])
def test_multi_dim_normalized_shape(
    target: torch.device, shape: tuple[int, ...], normalized_shape: tuple[int, ...], affine: str
) -> None:
    """A normalised shape of several dims normalises over them together, weight and bias of that shape."""
    x = _randn(shape, torch.float32, target)
    w, b = _affine(affine, normalized_shape, torch.float32, target)
    expected = _expected(x, normalized_shape, w, b)
    assert_close(layer_norm(x, normalized_shape, w, b, EPS), expected, reduction_length=x[0].numel())
    assert_close(layer_norm(x, list(normalized_shape), w, b, EPS), expected, reduction_length=x[0].numel())


@pytest.mark.parametrize(
    ("make_view", "normalized_shape"),
    [
        pytest.param(lambda x: x[:, :7], (7,), id="row-strided"),
        pytest.param(lambda x: x[:, ::2], (6,), id="column-strided"),
        pytest.param(lambda x: x.t(), (48,), id="transposed"),
        pytest.param(lambda x: x.view(6, 8, 12)[:, 1:7, :].transpose(0, 1), (12,), id="unmergeable"),
        pytest.param(lambda x: x.view(6, 8, 12)[:, :, :5], (8, 5), id="multi-dim-strided"),
        pytest.param(lambda x: x.view(6, 8, 12).transpose(1, 2), (12, 8), id="multi-dim-transposed"),
    ],
)
def test_non_contiguous_inputs(target: torch.device, make_view: Any, normalized_shape: tuple[int, ...]) -> None:
    """Strided and transposed inputs (and a strided weight) give F.layer_norm's result and stay unchanged."""
    base = _randn((48, 12), torch.float16, target)
    x = make_view(base)
    before = base.clone()
    n = math.prod(normalized_shape)
    if len(normalized_shape) == 1:
        w = _randn((2 * n,), torch.float16, target, seed=1)[::2]  # a weight of stride 2
    else:
        w = _randn(normalized_shape[::-1], torch.float16, target, seed=1).t()  # a transposed weight
    b = _randn(normalized_shape, torch.float16, target, seed=2)
    y = layer_norm(x, normalized_shape, w, b, EPS)
    assert_close(y, _expected(x, normalized_shape, w, b), reduction_length=n)
    assert torch.equal(base, before)


@pytest.mark.parametrize(
    ("name", "config"),
    [("single_block", {"ROWS": 2, "num_warps": 4}), ("looped", SMALL_BLOCK), ("looped", SMALL_BLOCK_PREFETCH)],
)
def test_constant_rows(target: torch.device, name: str, config: Config) -> None:
    """Rows of zero variance normalise to zero (the output is the bias), as in F.layer_norm."""
    x = torch.tensor([3.7, 0.0, -1e4, 1e-3], device=target)[:, None].expand(4, 300).contiguous()
    w, b = _affine("weight-bias", (300,), torch.float32, target)
    y = _run(layer_norm, name, config, x, (300,), w, b, EPS)
    assert_close(y, _expected(x, (300,), w, b), reduction_length=300)
    assert_close(y, b.expand(4, 300))


@pytest.mark.parametrize(
    ("name", "n", "config"),
    [("single_block", 300, None), ("looped", 300, SMALL_BLOCK), ("looped", 300, SMALL_BLOCK_PREFETCH)],
)
def test_large_offsets_do_not_cancel(target: torch.device, name: str, n: int, config: Config | None) -> None:
    """float32 rows of 1e4 + noise: the result and gradients are no further from float64 than plain PyTorch's."""
    x = 1e4 + _randn((3, n), torch.float32, target) / 3
    w, b = _affine("weight-bias", (n,), torch.float32, target)
    config = config or {"ROWS": 2, "num_warps": 4}
    y = _run(layer_norm, name, config, x, (n,), w, b, EPS)
    assert_no_worse(y, F.layer_norm(x, (n,), w, b, EPS), F.layer_norm(x.double(), (n,), w.double(), b.double(), EPS))
    grad = _randn((3, n), torch.float32, target, seed=3)
    got = _run(layer_norm_backward, name, config, grad, x, (n,), w, b, EPS)
    baseline, truth = _torch_grads(x, (n,), w, b, grad)
    for g, base, true in zip(got, baseline, truth, strict=True):
        assert_no_worse(g, base, true)


def test_long_rows_with_a_large_offset(target: torch.device) -> None:
    """The looped kernels at a real long row keep the precision of a row without offset."""
    x = 1e4 + _randn(LONG, torch.float32, target) / 3
    w, b = _affine("weight-bias", LONG[-1:], torch.float32, target)
    truth = F.layer_norm(x.double(), LONG[-1:], w.double(), b.double(), EPS)
    assert_no_worse(layer_norm(x, LONG[-1:], w, b, EPS), F.layer_norm(x, LONG[-1:], w, b, EPS), truth)
    _check_grads(x, LONG[-1:], w, b)


@pytest.mark.parametrize(
    ("name", "config"), [("single_block", None), ("looped", SMALL_BLOCK), ("looped", SMALL_BLOCK_PREFETCH)]
)
def test_nan_propagates(target: torch.device, name: str, config: Config | None) -> None:
    """A NaN makes its own row NaN, in the forward and in dx, and leaves the other rows alone, as in torch."""
    x = _randn((3, 200), torch.float32, target)
    x[1, 150] = float("nan")
    w, b = _affine("weight-bias", (200,), torch.float32, target)
    config = config or {"ROWS": 2, "num_warps": 4}
    y = _run(layer_norm, name, config, x, (200,), w, b, EPS)
    expected = F.layer_norm(x, (200,), w, b, EPS)
    assert y[1].isnan().all() and not y[[0, 2]].isnan().any()
    assert_close(y, expected, reduction_length=200)
    grad = _randn((3, 200), torch.float32, target, seed=3)
    dx, _, _ = _run(layer_norm_backward, name, config, grad, x, (200,), w, b, EPS)
    assert dx[1].isnan().all() and not dx[[0, 2]].isnan().any()


@pytest.mark.parametrize(("shape", "normalized_shape"), [((0, 5), (5,)), ((2, 0, 3), (3,)), ((4, 0), (0,))])
def test_empty_inputs_take_the_reference(shape: tuple[int, ...], normalized_shape: tuple[int, ...]) -> None:
    """Empty tensors are valid: they take the reference path with reason "empty-tensor" and match torch."""
    x = torch.empty(shape)
    w = torch.ones(normalized_shape)
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="empty-tensor"):
        plan = layer_norm.plan(x, normalized_shape, w, None, EPS)
        y = layer_norm(x, normalized_shape, w, None, EPS)
    assert plan.path == "reference" and plan.reason == kernelgate.Reason.EMPTY_TENSOR
    assert torch.equal(y, F.layer_norm(x, normalized_shape, w, None, EPS))


def test_float64_takes_the_reference() -> None:
    """float64 is valid for the op but not for the kernels: reference path with reason "dtype-unsupported"."""
    x = torch.randn(3, 5, dtype=torch.float64)
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="dtype-unsupported"):
        assert torch.equal(layer_norm(x, (5,), None, None, EPS), F.layer_norm(x, (5,), None, None, EPS))


# --- contract errors -------------------------------------------------------------------------


ALL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@pytest.mark.parametrize("x_dtype", ALL_DTYPES)
def test_weight_and_bias_dtypes_are_refused_exactly_where_torch_refuses_them(x_dtype: torch.dtype) -> None:
    """The contract takes the weight and bias dtypes F.layer_norm takes (x's, or float32 for both where x is 16-bit)
    and refuses the rest with an InputTypeError naming them, forward and backward alike: without it, a Triton
    kernel computed a result for inputs the reference refuses, and elsewhere torch's own error came instead."""
    x = torch.randn(2, 8, dtype=x_dtype)
    for w_dtype in (*ALL_DTYPES, None):
        for b_dtype in (*ALL_DTYPES, None):
            w = None if w_dtype is None else torch.randn(8, dtype=w_dtype)
            b = None if b_dtype is None else torch.randn(8, dtype=b_dtype)
            try:
                expected = F.layer_norm(x, (8,), w, b, EPS)
            except RuntimeError:
                expected = None
            if expected is None:
                for op, args in ((layer_norm, (x,)), (layer_norm_backward, (x, x))):
                    with pytest.raises(InputTypeError, match=r"must (have x's dtype|share one dtype: x's)") as info:
                        op(*args, (8,), w, b, EPS)
                    assert all(name in str(info.value) for name, t in (("weight", w), ("bias", b)) if t is not None)
            else:
                assert_close(layer_norm(x, (8,), w, b, EPS), expected, reduction_length=8)
                layer_norm_backward(x, x, (8,), w, b, EPS)


@pytest.mark.parametrize(
    ("normalized_shape", "error", "match"),
    [
        ((5,), InputValueError, r"'normalized_shape' must equal the trailing sizes of 'x' \(shape \(2, 3, 4\)\)"),
        ((2, 4), InputValueError, r"got \(2, 4\)"),
        ((1, 2, 3, 4), InputValueError, r"must equal the trailing sizes"),
        ((), InputTypeError, r"must be a non-empty tuple of ints"),
        ((4.0,), InputTypeError, r"must be a non-empty tuple of ints"),
        (4, InputTypeError, r"got int 4"),
    ],
)
def test_normalized_shape_mismatch_is_an_input_error(normalized_shape: Any, error: type, match: str) -> None:
    """A normalised shape that is not x's trailing sizes is refused before anything runs, naming both."""
    x = torch.randn(2, 3, 4)
    with pytest.raises(error, match=match):
        layer_norm(x, normalized_shape, None, None, EPS)
    with pytest.raises(error, match=match):
        layer_norm_backward(x, x, normalized_shape, None, None, EPS)


@pytest.mark.parametrize("path", ["reference", "interpreter", "interpreter-tuning"])
@pytest.mark.parametrize(
    ("normalized_shape", "weight_shape", "bias_shape", "bad"),
    [
        ((4,), (5,), None, "weight"),
        ((4,), (1, 4), None, "weight"),
        ((4,), (4,), (4, 1), "bias"),
        ((3, 4), (12,), None, "weight"),
        ((3, 4), (3, 4), (4,), "bias"),
        ((3, 4), (4, 3), (3, 4), "weight"),
    ],
)
def test_affine_of_the_wrong_shape_is_an_input_error(
    path: str,
    normalized_shape: tuple[int, ...],
    weight_shape: tuple[int, ...],
    bias_shape: tuple[int, ...] | None,
    bad: str,
) -> None:
    """A weight or bias whose shape is not normalized_shape is an InputValueError naming it, on every path
    (torch raises a RuntimeError for these)."""
    x = torch.randn(2, 3, 4)
    w = torch.randn(weight_shape)
    b = torch.randn(bias_shape) if bias_shape is not None else None
    with pytest.raises(RuntimeError, match="to be of same shape as normalized_shape"):
        F.layer_norm(x, normalized_shape, w, b, EPS)
    kernelgate.configure(tune=path == "interpreter-tuning")
    mode = "reference" if path == "reference" else "triton"
    match = re.escape(f"argument '{bad}' must have the shape normalized_shape = {tuple(normalized_shape)}")
    with kernelgate.use_interpreter(path != "reference"), kernelgate.use_mode(mode):
        with pytest.raises(InputValueError, match=match):
            layer_norm(x, normalized_shape, w, b, EPS)
        with pytest.raises(InputValueError, match=match):
            layer_norm_backward(x, x, normalized_shape, w, b, EPS)


def test_negative_eps_is_an_input_error() -> None:
    """eps must be >= 0."""
    with pytest.raises(InputValueError, match=r"'eps' must be in \[0.0, inf\]; got -1.0"):
        layer_norm(torch.randn(2, 4), (4,), None, None, -1.0)


# --- backward --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 100), (50, 300)])
@pytest.mark.parametrize("affine", AFFINE)
def test_gradients_match_torch(target: torch.device, dtype: torch.dtype, shape: tuple[int, ...], affine: str) -> None:
    """Gradients of x, weight and bias (summed without atomics) are no further from float64 than twice plain
    PyTorch's."""
    x = _randn(shape, dtype, target)
    w, b = _affine(affine, shape[-1:], dtype, target)
    _check_grads(x, shape[-1:], w, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", ["weight-bias", "bias"])
def test_long_rows_gradients(target: torch.device, dtype: torch.dtype, affine: str) -> None:
    """Rows longer than one block take the looped backward kernel, with the same precision."""
    x = _randn(LONG, dtype, target)
    w, b = _affine(affine, LONG[-1:], dtype, target)
    assert layer_norm_backward.plan(x, x, LONG[-1:], w, b, EPS).name == "looped"
    _check_grads(x, LONG[-1:], w, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", AFFINE)
def test_looped_backward_with_many_blocks(target: torch.device, dtype: torch.dtype, affine: str) -> None:
    """The looped backward at a block far shorter than the row, over several rows per program, matches the
    reference's dx, dweight and dbias (see _assert_backward_matches)."""
    x = _randn((9, 300), dtype, target)
    grad = _randn((9, 300), dtype, target, seed=3)
    w, b = _affine(affine, (300,), dtype, target)
    values = (grad, x, (300,), w, b, EPS)
    _assert_backward_matches(_run(layer_norm_backward, "looped", SMALL_BLOCK, *values), values)


@pytest.mark.parametrize("affine", ["weight-bias", "none"])
def test_multi_dim_gradients(target: torch.device, affine: str) -> None:
    """With a normalised shape of two dims, dweight and dbias have that shape and match torch."""
    x = _randn((2, 5, 6, 7), torch.float32, target)
    w, b = _affine(affine, (6, 7), torch.float32, target)
    _check_grads(x, (6, 7), w, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("name", "config", "n"), [
    ("single_block", {"ROWS": 2, "num_warps": 1, "PREFETCH": 0}, 300),
    ("looped", SMALL_BLOCK, 300),
    ("split", {"BLOCK_N": 1024, "num_warps": 4}, 8200),
])  # fmt: skip
def test_dweight_and_dbias_never_share_memory(
    target: torch.device, dtype: torch.dtype, name: str, config: Config, n: int
) -> None:
    """Each backward's dweight and dbias are separate tensors in their parameters' dtype and shape, summed from
    their own partial sums: a custom operator's outputs may not alias each other."""
    x = _randn((3, n), dtype, target)
    grad = _randn((3, n), dtype, target, seed=3)
    w, b = _affine("weight-bias", (n,), dtype, target)
    values = (grad, x, (n,), w, b, EPS)
    dx, dw, db = _run(layer_norm_backward, name, config, *values)
    assert dw.dtype == db.dtype == dtype and dw.shape == db.shape == (n,)
    assert dw.untyped_storage().data_ptr() != db.untyped_storage().data_ptr()
    _assert_backward_matches((dx, dw, db), values)


def test_backward_returns_empty_tensors_for_missing_affine(target: torch.device) -> None:
    """layer_norm_backward returns empty dweight and dbias where weight and bias are None, as rms_norm_backward."""
    x = _randn((3, 10), torch.float32, target)
    dx, dw, db = layer_norm_backward(x, x, (10,), None, None, EPS)
    assert dx.shape == x.shape and dw.shape == (0,) and db.shape == (0,)


def test_saved_tensors_are_only_the_inputs() -> None:
    """layer_norm saves x, weight and bias for its backward: no normalised copy, no mean or rstd buffer."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    x = torch.randn(4, 9, requires_grad=True)
    w = torch.randn(9, requires_grad=True)
    b = torch.randn(9, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer_norm(x, (9,), w, b, EPS)
    assert sorted(t.data_ptr() for t in saved) == sorted(t.data_ptr() for t in (x, w, b))


def test_reference_passes_float64_gradcheck() -> None:
    """The op (its registered backward on the reference path) and the backward reference pass gradcheck."""
    x = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: layer_norm(x, (2, 4), w, b, EPS), (x, w, b))
    assert torch.autograd.gradcheck(lambda x: layer_norm(x, (4,), None, None, EPS), (x,))
    assert torch.autograd.gradcheck(
        lambda g, x, w: layer_norm_backward.reference(g, x, (2, 4), w, b, EPS)[0], (g, x, w)
    )


@pytest.mark.parametrize(
    ("op", "make"),
    [
        (
            layer_norm,
            lambda: (torch.randn(4, 9, requires_grad=True), [9], torch.randn(9, requires_grad=True),
                     torch.randn(9, requires_grad=True), EPS),
        ),
        (layer_norm, lambda: (torch.randn(4, 9, requires_grad=True), [9], None, torch.randn(9), EPS)),
        (layer_norm, lambda: (torch.randn(2, 3, 4, requires_grad=True), [3, 4], torch.randn(3, 4), None, EPS)),
        (layer_norm_backward, lambda: (torch.randn(4, 9), torch.randn(4, 9), [9], torch.randn(9), torch.randn(9), EPS)),
    ],
    ids=["layer_norm", "layer_norm-bias-only", "layer_norm-2d", "layer_norm_backward"],
)  # fmt: skip
@pytest.mark.parametrize("interpret", [False, True], ids=["reference", "interpreter"])
def test_opcheck(op: Op, make: Callable[[], tuple[Any, ...]], interpret: bool) -> None:
    """torch.library.opcheck passes: schema, fake tensors, autograd registration, AOT dispatch."""
    kernelgate.configure(tune=False)
    with kernelgate.use_interpreter(interpret):
        torch.library.opcheck(op.torch_op, make())  # type: ignore[operator]


# --- every configuration -----------------------------------------------------------------------

# --- benchmark-sized shapes (GPU only) -----------------------------------------------------------

GPU_SHAPES = [(16384, 4096), (4096, 32768), (65536, 1024), (3, 131071)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_large_shapes_forward(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    """At benchmark-sized shapes every implementation that accepts the shape (default config) matches F.layer_norm."""
    device = torch.device("cuda")
    x = _randn(shape, dtype, device)
    w, b = _affine("weight-bias", shape[-1:], dtype, device)
    values = (x, shape[-1:], w, b, EPS)
    expected = _expected(x, shape[-1:], w, b)
    for impl in layer_norm.implementations:
        if impl.supports is None or impl.supports(*values) is None:
            y = run_candidate(impl, impl.default_for(values), values, False, poison=True)
            assert_close(y, expected, reduction_length=shape[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_large_shapes_backward(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    """At benchmark-sized shapes every backward implementation that accepts the shape (default config) gives
    gradients no further from float64 than twice plain PyTorch's."""
    device = torch.device("cuda")
    x = _randn(shape, dtype, device)
    w, b = _affine("weight-bias", shape[-1:], dtype, device)
    grad = _randn(shape, dtype, device, seed=3)
    values = (grad, x, shape[-1:], w, b, EPS)
    baseline, truth = _torch_grads(x, shape[-1:], w, b, grad)
    for impl in layer_norm_backward.implementations:
        if impl.supports is None or impl.supports(*values) is None:
            got = run_candidate(impl, impl.default_for(values), values, False, poison=True)
            for g, base, true in zip(got, baseline, truth, strict=True):
                assert_no_worse(g, base, true)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_autograd_on_the_gpu(dtype: torch.dtype) -> None:
    """Through autograd on the GPU (mode triton), layer_norm's gradients match torch's at a long-row shape."""
    x = _randn((64, 32768), dtype, torch.device("cuda"))
    w, b = _affine("weight-bias", (32768,), dtype, torch.device("cuda"))
    with kernelgate.use_mode("triton"):
        _check_grads(x, (32768,), w, b)


def test_looped_forward_tunes_prefetch_at_long_blocks() -> None:
    """At a long row the tuner tries the looped forward with and without PREFETCH, PREFETCH only at blocks of
    PREFETCH_MIN_BLOCK or more; the backward's configurations have no PREFETCH."""
    n = 65536
    x = torch.empty(4, n)
    configs = _impl(layer_norm, "looped").candidate_configs((x, (n,), None, None, EPS))
    with_prefetch = {(c["BLOCK_N"], c["num_warps"]) for c in configs if c["PREFETCH"]}
    without = {(c["BLOCK_N"], c["num_warps"]) for c in configs if not c["PREFETCH"]}
    assert with_prefetch == {(b, w) for b, w in without if b >= PREFETCH_MIN_BLOCK} != set()
    assert min(b for b, _ in without) < PREFETCH_MIN_BLOCK
    backward = _impl(layer_norm_backward, "looped").candidate_configs((x, x, (n,), None, None, EPS))
    assert backward and all("PREFETCH" not in c for c in backward)
