"""log_softmax and its backward: Triton kernels against the reference and torch autograd, contract, configs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import kernelgate
from kernelgate.ops.log_softmax import log_softmax, log_softmax_backward
from kernelgate.tolerance import assert_close, assert_no_worse

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# 1, odd and prime row lengths, one block exactly, and rows longer than one block (looped kernels).
ROW_SHAPES = [(1,), (1, 1), (3, 1), (5, 17), (2, 3, 31), (7, 509), (4, 1024), (2, 16411)]
INF = float("inf")


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=gen)).to(device=device, dtype=dtype)


def _assert_runs_triton(plan: kernelgate.Plan) -> None:
    assert plan.path in ("triton", "interpreter"), plan


def _torch_grads(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch's gradient of ``fn`` at ``x``, in x's dtype and in float64: (baseline, truth)."""
    results = []
    for dtype in (x.dtype, torch.float64):
        leaf = x.detach().to(dtype).requires_grad_()
        results.append(torch.autograd.grad(fn(leaf), leaf, grad.to(dtype))[0])
    return results[0], results[1]


# --- forward --------------------------------------------------------------------------------------


def _torch_log_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """torch.log_softmax computed in float32 and rounded once, as torch's GPU kernel computes 16-bit inputs."""
    return torch.log_softmax(x, dim, dtype=torch.float32).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_is_torch(dtype: torch.dtype) -> None:
    """The reference is torch.log_softmax; on the CPU, 16-bit inputs are computed in float32, which is
    closer to float64 than torch's CPU kernel, and never further."""
    x = _randn((64, 1000), dtype, torch.device("cpu"))
    y = log_softmax.reference(x)
    assert torch.equal(y, _torch_log_softmax(x, -1))
    if dtype == torch.float32:
        assert torch.equal(y, torch.log_softmax(x, -1))
    else:
        truth = torch.log_softmax(x.double(), -1)
        assert_no_worse(y, torch.log_softmax(x, -1), truth, factor=1.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_matches_torch(target: torch.device, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """log_softmax over the last dim runs a kernel and matches torch.log_softmax (computed in float32) for
    every dtype and size."""
    x = _randn(shape, dtype, target)
    _assert_runs_triton(log_softmax.plan(x))
    y = log_softmax(x)
    assert y.shape == x.shape and y.dtype == dtype
    assert_close(y, _torch_log_softmax(x, -1), reduction_length=shape[-1])


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_any_dim(target: torch.device, dim: int) -> None:
    """log_softmax along a leading dimension (a strided view of x) matches torch.log_softmax, contiguous as
    torch's result (and the fake tensor torch.compile plans with) is; so does its gradient."""
    x = _randn((4, 6, 9), torch.float32, target)
    y = log_softmax(x, dim)
    assert y.is_contiguous()
    assert_close(y, torch.log_softmax(x, dim), reduction_length=x.shape[dim])
    grad = _randn((4, 6, 9), torch.float32, target, seed=1)
    dx = log_softmax_backward(grad, y, dim)
    assert dx.is_contiguous()
    assert_close(dx, log_softmax_backward.reference(grad, y, dim), reduction_length=x.shape[dim])


def test_0_dim(target: torch.device) -> None:
    """A 0-dim tensor's log_softmax is 0, as in torch."""
    x = torch.tensor(2.5, device=target)
    y = log_softmax(x, 0)
    assert y.shape == () and float(y) == 0.0


@pytest.mark.parametrize(
    "make_view",
    [
        pytest.param(lambda x: x[:, :37], id="row-strided"),
        pytest.param(lambda x: x[:, ::2], id="column-strided"),
        pytest.param(lambda x: x.t(), id="transposed"),
        pytest.param(lambda x: x.view(6, 8, 11)[:, 1:7, :].transpose(0, 1), id="unmergeable"),
    ],
)
def test_non_contiguous_inputs(target: torch.device, make_view: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Strided and transposed inputs give torch's result and stay unchanged."""
    base = _randn((48, 11), torch.float16, target)
    x = make_view(base)
    before = base.clone()
    assert_close(log_softmax(x), _torch_log_softmax(x, -1), reduction_length=x.shape[-1])
    assert torch.equal(base, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [7, 16411])
def test_special_values(target: torch.device, dtype: torch.dtype, n: int) -> None:
    """-inf entries, all -inf rows, +inf, NaN and +-1e4 give torch's results, NaN exactly where torch has NaN."""
    x = _randn((7, n), torch.float32, target)
    x[0, : n // 2] = -INF
    x[1, :] = -INF
    x[2, 3] = INF
    x[3, 1] = float("nan")
    x[4, :] = 1e4
    x[5, ::2] = -1e4
    x[6, n - 1] = -INF  # -inf in the last column: the masked tail of a looped block
    x = x.to(dtype)
    y, expected = log_softmax(x), _torch_log_softmax(x, -1)
    assert torch.equal(y.isnan(), expected.isnan()) and torch.equal(expected.isnan(), torch.log_softmax(x, -1).isnan())
    assert expected[[1, 2, 3]].isnan().all()
    assert_close(y, expected, reduction_length=n)


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (2, 0, 3)])
def test_empty_inputs_take_the_reference(shape: tuple[int, ...]) -> None:
    """Empty tensors are valid: they take the reference path with reason "empty-tensor" and match torch."""
    x = torch.empty(shape)
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="empty-tensor"):
        plan = log_softmax.plan(x)
        y = log_softmax(x)
    assert plan.path == "reference" and plan.reason == kernelgate.Reason.EMPTY_TENSOR
    assert y.shape == x.shape


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((torch.zeros(2, 3), 2), kernelgate.InputValueError, r"'dim' must be in \[-2, 1\]"),
        ((torch.zeros(2, 3), 1.0), kernelgate.InputTypeError, "'dim' must be a Python int"),
        ((torch.zeros(2, 3, dtype=torch.int64), -1), kernelgate.InputTypeError, "'x' must have dtype"),
        (([1.0, 2.0], -1), kernelgate.InputTypeError, "'x' must be a torch.Tensor"),
    ],
)
def test_contract_errors(args: tuple[object, ...], error: type[Exception], match: str) -> None:
    """Invalid arguments raise the contract's error, naming the argument, before anything runs."""
    with pytest.raises(error, match=match):
        log_softmax(*args)


def test_backward_contract_errors() -> None:
    """log_softmax_backward rejects a y whose shape differs from grad's."""
    with pytest.raises(kernelgate.InputValueError, match="'y' must have the shape of 'grad'"):
        log_softmax_backward(torch.zeros(2, 3), torch.zeros(2, 4), -1)


# --- backward -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 33), (2, 3, 100), (2, 20000)])
def test_backward_kernel_matches_reference(target: torch.device, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """The backward kernels (single-block and looped) compute the backward reference's dx."""
    y = torch.log_softmax(_randn(shape, torch.float32, target), -1).to(dtype)
    grad = _randn(shape, dtype, target, seed=1)
    _assert_runs_triton(log_softmax_backward.plan(grad, y, -1))
    dx = log_softmax_backward(grad, y, -1)
    assert dx.dtype == dtype
    assert_close(dx, log_softmax_backward.reference(grad, y, -1), reduction_length=shape[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("shape", "dim"), [((5, 33), -1), ((4, 6, 9), 1), ((2, 20000), -1), ((1,), 0)])
def test_gradients_match_torch(target: torch.device, dtype: torch.dtype, shape: tuple[int, ...], dim: int) -> None:
    """Triton forward and backward give a gradient no further from float64 than twice plain PyTorch's,
    also along a leading dim and for long rows."""
    x = _randn(shape, dtype, target).requires_grad_()
    grad = _randn(shape, dtype, target, seed=1)
    (dx,) = torch.autograd.grad(log_softmax(x, dim), x, grad)
    assert dx.dtype == dtype
    assert_no_worse(dx, *_torch_grads(lambda t: torch.log_softmax(t, dim), x, grad))


@pytest.mark.parametrize("n", [7, 16411])
def test_backward_special_values(target: torch.device, n: int) -> None:
    """-inf outputs (zero probability), a NaN output and large gradients give the reference's dx, NaN as it has."""
    x = _randn((4, n), torch.float32, target)
    x[0, : n // 2] = -INF
    x[1, 2] = float("nan")
    y = torch.log_softmax(x, -1)
    grad = _randn((4, n), torch.float32, target, seed=1)
    grad[2] = 1e4 * grad[2].sign()  # large, of either sign: dx does not cancel to ~0 as for a constant row
    grad[3, 0] = -1e4
    dx, expected = log_softmax_backward(grad, y, -1), log_softmax_backward.reference(grad, y, -1)
    assert torch.equal(dx.isnan(), expected.isnan()) and expected[1].isnan().all()
    assert_close(dx, expected, reduction_length=n)
    leaf = x.clone().requires_grad_()
    (truth,) = torch.autograd.grad(torch.log_softmax(leaf, -1), leaf, grad)
    assert torch.equal(expected.isnan(), truth.isnan())


def test_references_pass_float64_gradcheck() -> None:
    """The forward and backward references are differentiable and pass fp64 gradcheck; the op passes
    gradcheck and gradgradcheck through its registered backward."""
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    y = torch.log_softmax(torch.randn(3, 7, dtype=torch.float64), -1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: log_softmax.reference(x, 0), (x,))
    assert torch.autograd.gradcheck(lambda g, y: log_softmax_backward.reference(g, y, -1), (g, y))
    assert torch.autograd.gradcheck(lambda x: log_softmax(x, -1), (x,))
    assert torch.autograd.gradgradcheck(lambda x: log_softmax(x, 0), (x,))


def test_saves_only_its_output() -> None:
    """The forward saves only its output for the backward: no copy of x."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    x = torch.randn(4, 9, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = log_softmax(x, -1)
    assert len(saved) == 1 and saved[0].data_ptr() == y.data_ptr()


@pytest.mark.parametrize(
    ("op", "make"),
    [
        (log_softmax, lambda: (torch.randn(4, 9, requires_grad=True), -1)),
        (log_softmax, lambda: (torch.randn(4, 9, requires_grad=True), 0)),
        (log_softmax_backward, lambda: (torch.randn(4, 9), torch.log_softmax(torch.randn(4, 9), -1), -1)),
    ],
    ids=["log_softmax", "log_softmax-dim0", "log_softmax_backward"],
)
@pytest.mark.parametrize("interpret", [False, True], ids=["reference", "interpreter"])
def test_opcheck(op: kernelgate.Op, make: Callable[[], tuple[object, ...]], interpret: bool) -> None:
    """torch.library.opcheck passes: schema, fake tensors, autograd registration, AOT dispatch."""
    kernelgate.configure(tune=False)
    with kernelgate.use_interpreter(interpret):
        torch.library.opcheck(op.torch_op, make())


def test_compiled_without_graph_breaks() -> None:
    """Under torch.compile(fullgraph=True, dynamic=True) log_softmax along the last and a leading dim traces as an
    operator without a graph break, runs its kernels (interpreted) inside the graph, and gives torch's output and
    gradient; its result is contiguous, as the graph assumes (a view of it is valid)."""
    from torch._dynamo.utils import counters

    def model(x: torch.Tensor, fn: Callable[[torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
        return (fn(x * 2.0, 0).view(-1)[:50] * fn(x, -1).view(-1)[:50]).sum()

    kernelgate.configure(tune=False)
    x = _randn((6, 40), torch.float32, torch.device("cpu")).requires_grad_()
    counters.clear()
    with kernelgate.use_interpreter(), kernelgate.use_mode("triton"):
        y = torch.compile(lambda x: model(x, log_softmax), fullgraph=True, dynamic=True)(x)
        (dx,) = torch.autograd.grad(y, x)
    assert dict(counters["graph_break"]) == {}
    expected = model(x, torch.log_softmax)
    assert_close(y.detach(), expected.detach(), reduction_length=50 * 40)
    assert_no_worse(dx, *_torch_grads(lambda t: model(t, torch.log_softmax), x, torch.ones(())))


# --- GPU, benchmark-sized -------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16384, 4096), (4096, 32768), (65536, 1024)])
def test_large_shapes_compiled(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    """At benchmark-sized shapes the compiled forward and backward kernels match the references."""
    device = torch.device("cuda")
    x = _randn(shape, dtype, device)
    grad = _randn(shape, dtype, device, seed=1)
    with kernelgate.use_mode("triton"):
        y = log_softmax(x)
        assert_close(y, _torch_log_softmax(x, -1), reduction_length=shape[-1])
        dx = log_softmax_backward(grad, y, -1)
    assert_close(dx, log_softmax_backward.reference(grad, y, -1), reduction_length=shape[-1])
