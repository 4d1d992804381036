"""The built-in ops' Triton kernels against their references, under the interpreter and on the GPU."""

from __future__ import annotations

import pytest
import torch

import kernelgate
from kernelgate.tolerance import assert_close, assert_no_worse

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# 1, odd and prime row lengths, one block exactly, and rows longer than one block (looped kernels).
ROW_SHAPES = [(1,), (1, 1), (3, 1), (5, 17), (2, 3, 31), (7, 509), (4, 1024), (2, 16411)]


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=gen)).to(device=device, dtype=dtype)


def _assert_runs_triton(plan: kernelgate.Plan) -> None:
    assert plan.path in ("triton", "interpreter"), plan


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_softmax_matches_reference(target: torch.device, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """softmax over the last dim runs the expected kernel and matches the reference for every dtype and size."""
    x = _randn(shape, dtype, target)
    _assert_runs_triton(kernelgate.softmax.plan(x))
    y = kernelgate.softmax(x)
    assert y.shape == x.shape and y.dtype == dtype
    assert_close(y, torch.softmax(x, -1), reduction_length=shape[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_matches_reference(
    target: torch.device, dtype: torch.dtype, shape: tuple[int, ...], with_weight: bool
) -> None:
    """rms_norm with and without weight runs the expected kernel and matches F.rms_norm for every dtype and size."""
    x = _randn(shape, dtype, target)
    w = _randn(shape[-1:], dtype, target, seed=1) if with_weight else None
    _assert_runs_triton(kernelgate.rms_norm.plan(x, w))
    y = kernelgate.rms_norm(x, w, 1e-5)
    assert y.shape == x.shape and y.dtype == dtype
    assert_close(y, torch.nn.functional.rms_norm(x, shape[-1:], w, 1e-5), reduction_length=shape[-1])


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_softmax_any_dim(target: torch.device, dim: int) -> None:
    """softmax along a leading dimension (a strided view of x) matches torch.softmax."""
    x = _randn((4, 6, 9), torch.float32, target)
    assert_close(kernelgate.softmax(x, dim), torch.softmax(x, dim), reduction_length=x.shape[dim])


def test_softmax_0_dim(target: torch.device) -> None:
    """A 0-dim tensor's softmax is 1, as in torch."""
    x = torch.tensor(2.5, device=target)
    assert_close(kernelgate.softmax(x, 0), torch.softmax(x, 0))


@pytest.mark.parametrize(
    "make_view",
    [
        pytest.param(lambda x: x[:, :37], id="row-strided"),
        pytest.param(lambda x: x[:, ::2], id="column-strided"),
        pytest.param(lambda x: x.t(), id="transposed"),
        pytest.param(lambda x: x.view(6, 8, 11)[:, 1:7, :].transpose(0, 1), id="unmergeable"),
    ],
)
def test_non_contiguous_inputs(target: torch.device, make_view: object) -> None:
    """Strided and transposed inputs give the same numbers as on a contiguous copy, and stay unchanged."""
    base = _randn((48, 11), torch.float16, target)
    x = make_view(base)  # type: ignore[operator]
    before = base.clone()
    w = _randn(x.shape[-1:], torch.float16, target, seed=2)
    assert_close(kernelgate.softmax(x), torch.softmax(x, -1), reduction_length=x.shape[-1])
    assert_close(
        kernelgate.rms_norm(x, w), torch.nn.functional.rms_norm(x, x.shape[-1:], w, 1e-6), reduction_length=x.shape[-1]
    )
    assert torch.equal(base, before)


def test_rms_norm_strided_weight(target: torch.device) -> None:
    """A strided weight is read correctly."""
    x = _randn((3, 10), torch.float32, target)
    w = _randn((20,), torch.float32, target, seed=3)[::2]
    assert_close(kernelgate.rms_norm(x, w), torch.nn.functional.rms_norm(x, (10,), w, 1e-6), reduction_length=10)


@pytest.mark.parametrize("n", [7, 16411])
def test_softmax_special_values(target: torch.device, n: int) -> None:
    """-inf entries, all -inf rows, +inf and NaN give the same results (NaN where torch has NaN) as torch."""
    x = _randn((5, n), torch.float32, target)
    x[0, : n // 2] = -float("inf")
    x[1, :] = -float("inf")
    x[2, 3] = float("inf")
    x[3, 1] = float("nan")
    x[4, :] = 1e4
    assert_close(kernelgate.softmax(x), torch.softmax(x, -1), reduction_length=n)


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (2, 0, 3)])
def test_empty_inputs_take_the_reference(shape: tuple[int, ...]) -> None:
    """Empty tensors are valid: they take the reference path with reason "empty-tensor" and match torch."""
    x = torch.empty(shape)
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="empty-tensor"):
        plan = kernelgate.softmax.plan(x)
        y = kernelgate.softmax(x)
    assert plan.path == "reference" and plan.reason == kernelgate.Reason.EMPTY_TENSOR
    assert y.shape == x.shape


def test_float64_takes_the_reference() -> None:
    """float64 is valid for the op but not for the kernels: reference path with reason "dtype-unsupported"."""
    x = torch.randn(3, 5, dtype=torch.float64)
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="dtype-unsupported"):
        assert kernelgate.softmax.plan(x).reason == kernelgate.Reason.DTYPE
        assert torch.equal(kernelgate.softmax(x), torch.softmax(x, -1))


def test_inputs_are_not_modified(target: torch.device) -> None:
    """The kernels write only their outputs."""
    x = _randn((4, 33), torch.bfloat16, target)
    w = _randn((33,), torch.bfloat16, target, seed=4)
    x0, w0 = x.clone(), w.clone()
    kernelgate.softmax(x)
    kernelgate.rms_norm(x, w)
    assert torch.equal(x, x0) and torch.equal(w, w0)


@pytest.mark.gpu
def test_kernel_runs_on_the_tensors_device_not_the_current_one() -> None:
    """With the current device set elsewhere, the launch still happens on the inputs' device."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs to tell the tensors' device from the current one")
    x = _randn((8, 100), torch.float32, torch.device("cuda", 1))
    with torch.cuda.device(0), kernelgate.use_mode("triton"):
        y = kernelgate.softmax(x)
    assert y.device == x.device
    assert_close(y, torch.softmax(x, -1), reduction_length=100)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["triton", "auto"])
def test_forward_and_backward_run_on_the_second_gpu(mode: str) -> None:
    """Tensors on cuda:1 with cuda:0 current: forward and backward, tuned or forced, first call and the
    memoised (fast-launch) calls after it, all give the reference's numbers on cuda:1 and leave cuda:0 current."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs to tell the tensors' device from the current one")
    device = torch.device("cuda", 1)
    x = _randn((64, 1000), torch.float32, device)
    w = _randn((1000,), torch.float32, device, seed=3)
    dy = _randn((64, 1000), torch.float32, device, seed=4)
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    expected = torch.nn.functional.rms_norm(xr, (1000,), wr, 1e-6)
    want_dx, want_dw = torch.autograd.grad(expected, (xr, wr), dy)
    # The weight's gradient sums over rows whose terms cancel: held to no worse than twice torch's error
    # against float64, as the norms' own tests do.
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    (true_dw,) = torch.autograd.grad(torch.nn.functional.rms_norm(x64, (1000,), w64, 1e-6), (w64,), dy.double())
    with torch.cuda.device(0), kernelgate.use_mode(mode):
        for _ in range(3):  # the first call plans (and tunes in auto); later ones take the memoised route
            xk, wk = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
            y = kernelgate.rms_norm(xk, wk, 1e-6)
            dx, dw = torch.autograd.grad(y, (xk, wk), dy)
            assert torch.cuda.current_device() == 0
            assert y.device == dx.device == dw.device == device
            assert_close(y, expected, reduction_length=1000)
            assert_close(dx, want_dx, reduction_length=1000)
            assert_no_worse(dw, want_dw, true_dw)


def test_interpreting_leaves_triton_language_unpatched() -> None:
    """After an interpreted call, triton.language is as before, so later compiled launches still work."""
    import triton.language as tl

    watched = {"range": tl.range, "reduce": tl.reduce, "sum": tl.sum, "max": tl.max, "load": tl.load}
    index, bool_ = tl.tensor.__dict__.get("__index__"), tl.tensor.__dict__.get("__bool__")
    with kernelgate.use_interpreter(), kernelgate.use_mode("triton"):
        kernelgate.softmax(torch.randn(2, 20000))
        kernelgate.rms_norm(torch.randn(2, 30), None)
    assert {name: getattr(tl, name) for name in watched} == watched
    assert tl.tensor.__dict__.get("__index__") is index and tl.tensor.__dict__.get("__bool__") is bool_


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16384, 4096), (4096, 32768), (65536, 1024), (3, 131071)])
def test_large_shapes_compiled(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    """At benchmark-sized shapes the compiled kernels match the references for every dtype."""
    x = _randn(shape, dtype, torch.device("cuda"))
    w = _randn(shape[-1:], dtype, torch.device("cuda"), seed=5)
    with kernelgate.use_mode("triton"):
        assert_close(kernelgate.softmax(x), torch.softmax(x, -1), reduction_length=shape[-1])
        expected = torch.nn.functional.rms_norm(x, shape[-1:], w, 1e-6)
        assert_close(kernelgate.rms_norm(x, w), expected, reduction_length=shape[-1])


@pytest.mark.parametrize("n", [7, 16411])
def test_rms_norm_of_a_row_with_inf(target: torch.device, n: int) -> None:
    """A row holding inf has an infinite mean square: its finite entries give 0 and inf gives NaN, as the
    definition (torch on the CPU) says, on every device."""
    x = _randn((3, n), torch.float32, target)
    x[1, 2] = float("inf")
    x[2, 0] = float("nan")
    y = kernelgate.rms_norm(x, None, 1e-6)
    expected = torch.nn.functional.rms_norm(x.cpu().double(), (n,), None, 1e-6).float()
    assert_close(y.cpu(), expected, reduction_length=n)
    assert int(y[1].isnan().sum()) == 1 and int((y[1] == 0).sum()) == n - 1
