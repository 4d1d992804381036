"""add_rms_norm (forward and fused backward) and rms_norm's looped backward against plain PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch._dynamo.utils import counters

import kernelgate
from kernelgate.op import Op
from kernelgate.ops.add_rms_norm import add_rms_norm, add_rms_norm_backward
from kernelgate.ops.rms_norm import rms_norm, rms_norm_backward
from kernelgate.rowwise import MAX_SINGLE_BLOCK_FORWARD
from kernelgate.tolerance import assert_close, assert_no_worse

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# 1, odd and prime row lengths, leading dims, and a row longer than one block (looped kernels).
ROW_SHAPES = [(1,), (3, 1), (5, 17), (2, 3, 31), (7, 509), (2, MAX_SINGLE_BLOCK_FORWARD + 65)]
EPS = 1e-5


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=gen)).to(device=device, dtype=dtype)


def _torch_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + residual
    return torch.nn.functional.rms_norm(s, s.shape[-1:], weight, eps), s


def _assert_forward(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None) -> None:
    y, s = add_rms_norm(x, residual, weight, EPS)
    want_y, want_s = _torch_add_rms_norm(x, residual, weight)
    assert s.dtype == want_s.dtype and y.dtype == want_y.dtype and y.shape == s.shape == x.shape
    assert torch.equal(s, want_s)  # s is x + residual rounded once, bit for bit
    assert_close(y, want_y, reduction_length=x.shape[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("with_weight", [True, False])
def test_forward_matches_torch(
    target: torch.device, dtype: torch.dtype, shape: tuple[int, ...], with_weight: bool
) -> None:
    """add_rms_norm runs a Triton kernel and returns x + residual exactly and F.rms_norm of it within tolerance."""
    x, residual = _randn(shape, dtype, target), _randn(shape, dtype, target, seed=1)
    w = _randn(shape[-1:], dtype, target, seed=2) if with_weight else None
    plan = add_rms_norm.plan(x, residual, w, EPS)
    assert plan.path in ("triton", "interpreter"), plan
    assert plan.name == ("looped" if shape[-1] > MAX_SINGLE_BLOCK_FORWARD else "single_block")
    _assert_forward(x, residual, w)


def test_mixed_dtypes_follow_torch_promotion(target: torch.device) -> None:
    """bfloat16 x plus float32 residual gives float32 s and y, as x + residual does in torch."""
    x = _randn((4, 40), torch.bfloat16, target)
    residual = _randn((4, 40), torch.float32, target, seed=1)
    _assert_forward(x, residual, _randn((40,), torch.float32, target, seed=2))


@pytest.mark.parametrize(
    "make_view",
    [
        pytest.param(lambda t: t[:, :37], id="row-strided"),
        pytest.param(lambda t: t[:, ::2], id="column-strided"),
        pytest.param(lambda t: t.t(), id="transposed"),
        pytest.param(lambda t: t.view(6, 8, 11)[:, 1:7, :].transpose(0, 1), id="unmergeable"),
    ],
)
@pytest.mark.parametrize("which", ["x", "residual", "both"])
def test_non_contiguous_inputs(
    target: torch.device, make_view: Callable[[torch.Tensor], torch.Tensor], which: str
) -> None:
    """Strided and transposed x or residual give torch's results, and the inputs stay unchanged."""
    base_x, base_r = _randn((48, 11), torch.float16, target), _randn((48, 11), torch.float16, target, seed=1)
    before = base_x.clone(), base_r.clone()
    x = make_view(base_x) if which in ("x", "both") else make_view(base_x).contiguous()
    residual = make_view(base_r) if which in ("residual", "both") else make_view(base_r).contiguous()
    n = x.shape[-1]
    w = _randn((2 * n,), torch.float16, target, seed=2)[::2]  # a strided weight too
    _assert_forward(x, residual, w)
    assert torch.equal(base_x, before[0]) and torch.equal(base_r, before[1])


@pytest.mark.parametrize("n", [7, 16411])
def test_nan_and_inf_propagate_as_in_torch(target: torch.device, n: int) -> None:
    """NaN, inf + -inf and an overflowing sum give NaN/inf exactly where torch has them, in y and in s."""
    x, residual = _randn((4, n), torch.float16, target), _randn((4, n), torch.float16, target, seed=1)
    x[0, 3] = float("nan")
    x[1, 2], residual[1, 2] = float("inf"), -float("inf")
    x[2, 1], residual[2, 1] = 60000.0, 60000.0  # overflows float16: s is inf, that row's y NaN or 0
    y, s = add_rms_norm(x, residual, None, EPS)
    want_y, want_s = _torch_add_rms_norm(x.cpu(), residual.cpu(), None)  # the definition: torch on the CPU
    assert torch.equal(s.isnan().cpu(), want_s.isnan()) and torch.equal(s.isinf().cpu(), want_s.isinf())
    assert_close(s.cpu(), want_s)
    assert_close(y.cpu(), want_y, reduction_length=n)


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (2, 0, 3)])
def test_empty_inputs_take_the_reference(shape: tuple[int, ...]) -> None:
    """Empty tensors take the reference path with reason "empty-tensor" and give torch's shapes."""
    x = torch.empty(shape)
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="empty-tensor"):
        plan = add_rms_norm.plan(x, x, None, EPS)
        y, s = add_rms_norm(x, x, None, EPS)
    assert plan.path == "reference" and plan.reason == kernelgate.Reason.EMPTY_TENSOR
    assert y.shape == s.shape == x.shape


def test_float64_takes_the_reference() -> None:
    """float64 is valid for the op but not for the kernels: reference path with reason "dtype-unsupported"."""
    x = torch.randn(3, 5, dtype=torch.float64)
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="dtype-unsupported"):
        assert add_rms_norm.plan(x, x, None, EPS).reason == kernelgate.Reason.DTYPE
        y, s = add_rms_norm(x, x, None, EPS)
    assert torch.equal(s, 2 * x) and torch.equal(y, torch.nn.functional.rms_norm(2 * x, (5,), None, EPS))


def test_mismatched_shapes_are_refused() -> None:
    """A residual of another shape is an input error that names both shapes."""
    with pytest.raises(kernelgate.InputValueError, match=r"'residual' must have the shape of 'x', \(3, 5\)"):
        add_rms_norm(torch.randn(3, 5), torch.randn(3, 4), None)


# --- gradients --------------------------------------------------------------------------------


def _leaves(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, with_weight: bool
) -> tuple[torch.Tensor, ...]:
    x, residual = _randn(shape, dtype, device), _randn(shape, dtype, device, seed=1)
    w = _randn(shape[-1:], dtype, device, seed=2) if with_weight else None
    return tuple(t.requires_grad_() for t in (x, residual, w) if t is not None)


def _torch_grads(
    inputs: tuple[torch.Tensor, ...], grad_y: torch.Tensor | None, grad_s: torch.Tensor | None, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """Plain PyTorch's gradients (unfused add then rms_norm), computed in ``dtype``."""
    leaves = tuple(t.detach().to(dtype).requires_grad_() for t in inputs)
    y, s = _torch_add_rms_norm(leaves[0], leaves[1], leaves[2] if len(leaves) > 2 else None)
    outputs = [o for o, g in ((y, grad_y), (s, grad_s)) if g is not None]
    grads = [g.to(dtype) for g in (grad_y, grad_s) if g is not None]
    return torch.autograd.grad(outputs, leaves, grads, allow_unused=True, materialize_grads=True)


def _assert_grads_no_worse(
    got: tuple[torch.Tensor, ...],
    inputs: tuple[torch.Tensor, ...],
    grad_y: torch.Tensor | None,
    grad_s: torch.Tensor | None,
) -> None:
    baseline = _torch_grads(inputs, grad_y, grad_s, inputs[0].dtype)
    truth = _torch_grads(inputs, grad_y, grad_s, torch.float64)
    for a, b, t in zip(got, baseline, truth, strict=True):
        assert_no_worse(a, b, t)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 100), (11, 16411)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_gradients_match_torch(
    target: torch.device, dtype: torch.dtype, shape: tuple[int, ...], with_weight: bool
) -> None:
    """With gradients for both y and s, the fused Triton backward gives x, residual and weight gradients no further
    from float64 than twice plain PyTorch's (also for rows on the looped kernels), and x's equals residual's."""
    inputs = _leaves(shape, dtype, target, with_weight)
    grad_y, grad_s = _randn(shape, dtype, target, seed=3), _randn(shape, dtype, target, seed=4)
    y, s = add_rms_norm(*inputs[:2], inputs[2] if with_weight else None, EPS)
    got = torch.autograd.grad((y, s), inputs, (grad_y, grad_s))
    assert torch.equal(got[0], got[1])
    _assert_grads_no_worse(got, inputs, grad_y, grad_s)
    assert kernelgate.fallbacks() == []


@pytest.mark.parametrize("shape", [(5, 40), (2, 20000)])
def test_gradients_when_only_y_is_used(target: torch.device, shape: tuple[int, ...]) -> None:
    """A loss of y alone (no gradient reaches s) gives torch's gradients of x, residual and weight."""
    inputs = _leaves(shape, torch.bfloat16, target, with_weight=True)
    grad_y = _randn(shape, torch.bfloat16, target, seed=3)
    y, _ = add_rms_norm(*inputs, EPS)
    got = torch.autograd.grad(y, inputs, grad_y)
    _assert_grads_no_worse(got, inputs, grad_y, None)


@pytest.mark.parametrize("shape", [(5, 40), (2, 20000)])
def test_gradients_when_only_s_is_used(target: torch.device, shape: tuple[int, ...]) -> None:
    """A loss of s alone passes s's gradient unchanged to x and residual, and none (zero) to the weight."""
    x, residual, w = _leaves(shape, torch.float16, target, with_weight=True)
    grad_s = _randn(shape, torch.float16, target, seed=4)
    _, s = add_rms_norm(x, residual, w, EPS)
    dx, dr, dw = torch.autograd.grad(s, (x, residual, w), grad_s, allow_unused=True, materialize_grads=True)
    assert torch.equal(dx, grad_s) and torch.equal(dr, grad_s)
    assert torch.equal(dw, torch.zeros_like(w))


def test_mixed_dtype_gradients_take_each_inputs_dtype(target: torch.device) -> None:
    """With bfloat16 x and float32 residual, each input's gradient has its own dtype, as in torch."""
    x = _randn((3, 50), torch.bfloat16, target).requires_grad_()
    residual = _randn((3, 50), torch.float32, target, seed=1).requires_grad_()
    y, s = add_rms_norm(x, residual, None, EPS)
    dx, dr = torch.autograd.grad((y.sum() + s.sum()), (x, residual))
    want_dx, want_dr = torch.autograd.grad(sum(t.sum() for t in _torch_add_rms_norm(x, residual, None)), (x, residual))
    assert (dx.dtype, dr.dtype) == (torch.bfloat16, torch.float32)
    assert_close(dr, want_dr, reduction_length=50)
    assert_close(dx, want_dx, reduction_length=50)


def test_backward_kernel_without_grad_s(target: torch.device) -> None:
    """add_rms_norm_backward with grad_s None equals rms_norm_backward of s (the fused add is skipped)."""
    grad, s, w = _randn((6, 70), torch.float32, target), _randn((6, 70), torch.float32, target, seed=1), None
    dx, dw = add_rms_norm_backward(grad, None, s, w, EPS)
    want_dx, want_dw = rms_norm_backward.reference(grad, s, w, EPS)
    assert_close(dx, want_dx, reduction_length=76)
    assert dw.shape == want_dw.shape == (0,)


def test_references_pass_float64_gradcheck() -> None:
    """The op, through its registered backward, and the backward's reference pass float64 gradcheck."""
    x, r, gy, gs = (torch.randn(3, 7, dtype=torch.float64, requires_grad=True) for _ in range(4))
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    kernelgate.configure(warn_fallback=False)
    assert torch.autograd.gradcheck(lambda x, r, w: add_rms_norm(x, r, w, EPS), (x, r, w))
    assert torch.autograd.gradcheck(lambda x, r: add_rms_norm(x, r, None, EPS), (x, r))
    assert torch.autograd.gradcheck(
        lambda gy, gs, s, w: add_rms_norm_backward.reference(gy, gs, s, w, EPS), (gy, gs, x, w)
    )


def test_saved_tensors_are_only_s_and_weight() -> None:
    """The forward keeps only the sum s and the weight for the backward: neither x nor residual, no rstd buffer."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    kernelgate.configure(warn_fallback=False)
    x, r = torch.randn(4, 9, requires_grad=True), torch.randn(4, 9, requires_grad=True)
    w = torch.randn(9, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, s = add_rms_norm(x, r, w, EPS)
    assert sorted(t.data_ptr() for t in saved) == sorted((s.data_ptr(), w.data_ptr()))


@pytest.mark.parametrize(
    ("op", "make"),
    [
        (
            add_rms_norm,
            lambda: (torch.randn(4, 9, requires_grad=True), torch.randn(4, 9), torch.randn(9, requires_grad=True), EPS),
        ),
        (add_rms_norm, lambda: (torch.randn(4, 9, requires_grad=True), torch.randn(4, 9), None, EPS)),
        (add_rms_norm_backward, lambda: (torch.randn(4, 9), torch.randn(4, 9), torch.randn(4, 9), torch.randn(9), EPS)),
        (add_rms_norm_backward, lambda: (torch.randn(4, 9), None, torch.randn(4, 9), None, EPS)),
    ],
    ids=["add_rms_norm", "add_rms_norm-no-weight", "add_rms_norm_backward", "add_rms_norm_backward-no-grad_s"],
)
@pytest.mark.parametrize("interpret", [False, True], ids=["reference", "interpreter"])
def test_opcheck(op: Op, make: Callable[[], tuple[object, ...]], interpret: bool) -> None:
    """torch.library.opcheck passes: schema, fake tensors, autograd registration, AOT dispatch."""
    kernelgate.configure(tune=False, warn_fallback=False)
    with kernelgate.use_interpreter(interpret):
        torch.library.opcheck(op.torch_op, make())


@pytest.mark.parametrize("uses", ["y", "both"])
def test_compiled_block_without_graph_breaks(target: torch.device, uses: str) -> None:
    """Under torch.compile(fullgraph=True) a loss of y alone, or of y and s, gives eager torch's gradients
    without a graph break."""

    def loss(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, fused: bool) -> torch.Tensor:
        y, s = add_rms_norm(x, r, w, EPS) if fused else _torch_add_rms_norm(x, r, w)
        return (y * y).sum() + ((y[:, :1] * s).sum() if uses == "both" else 0.0)

    inputs = _leaves((6, 48), torch.float32, target, with_weight=True)
    counters.clear()
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True)(*inputs, True), inputs)
    assert dict(counters["graph_break"]) == {}
    baseline, truth = (
        torch.autograd.grad(loss(*leaves, False), leaves)
        for leaves in (inputs, tuple(t.detach().double().requires_grad_() for t in inputs))
    )
    for a, b, t in zip(got, baseline, truth, strict=True):
        assert_no_worse(a, b, t)


# --- rms_norm's looped backward ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_long_rows_backward_runs_the_looped_kernel(
    target: torch.device, dtype: torch.dtype, with_weight: bool
) -> None:
    """Rows longer than one block take rms_norm_backward's looped kernel (no fallback) and give gradients of x
    and weight no further from float64 than twice plain PyTorch's, also where a program takes several rows."""
    shape = (11, 16411)
    x = _randn(shape, dtype, target).requires_grad_()
    w = _randn(shape[-1:], dtype, target, seed=2).requires_grad_() if with_weight else None
    grad = _randn(shape, dtype, target, seed=3)
    plain_w = w.detach() if w is not None else None
    assert rms_norm_backward.plan(grad, x.detach(), plain_w, EPS).name == "looped"
    inputs = (x, w) if w is not None else (x,)
    got = torch.autograd.grad(rms_norm(x, w, EPS), inputs, grad)
    assert kernelgate.fallbacks() == []
    baseline, truth = (_torch_rms_norm_grads(inputs, grad, dtype_) for dtype_ in (dtype, torch.float64))
    for a, b, t in zip(got, baseline, truth, strict=True):
        assert_no_worse(a, b, t)


def _torch_rms_norm_grads(
    inputs: tuple[torch.Tensor, ...], grad: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    leaves = tuple(t.detach().to(dtype).requires_grad_() for t in inputs)
    y = torch.nn.functional.rms_norm(leaves[0], leaves[0].shape[-1:], leaves[1] if len(leaves) > 1 else None, EPS)
    return torch.autograd.grad(y, leaves, grad.to(dtype))


# --- every configuration -----------------------------------------------------------------------

# (op, shape of the main tensor): a row in one block, and a row longer than one block; the backward's
# 11 rows give the interpreter's programs two rows each but the last, which gets one.
# --- GPU, at benchmark sizes --------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16384, 4096), (4096, 32768)])
def test_large_shapes_compiled(shape: tuple[int, int]) -> None:
    """At benchmark-sized bfloat16 shapes the compiled forward and backward match plain PyTorch."""
    device = torch.device("cuda")
    inputs = _leaves(shape, torch.bfloat16, device, with_weight=True)
    grad_y, grad_s = _randn(shape, torch.bfloat16, device, seed=3), _randn(shape, torch.bfloat16, device, seed=4)
    with kernelgate.use_mode("triton"):
        y, s = add_rms_norm(*inputs, EPS)
        want_y, want_s = _torch_add_rms_norm(*inputs)
        assert torch.equal(s, want_s)
        assert_close(y, want_y, reduction_length=shape[-1])
        got = torch.autograd.grad((y, s), inputs, (grad_y, grad_s))
    _assert_grads_no_worse(got, inputs, grad_y, grad_s)
