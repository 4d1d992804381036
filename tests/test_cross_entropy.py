"""cross_entropy's kernels against torch.nn.functional.cross_entropy: every reduction, weights, smoothing, ignored
rows, extreme and non-finite logits, layouts, errors, gradients, configurations, and large vocabularies on the GPU."""

from __future__ import annotations

import csv
import functools
import importlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kernelgate
from every_config import check_every_config, distinct_configs
from kernelgate.errors import InputTypeError, InputValueError
from kernelgate.ops.cross_entropy import (
    cross_entropy,
    cross_entropy_backward,
    cross_entropy_backward_into,
    cross_entropy_with_grad,
    cross_entropy_with_stats,
)
from kernelgate.selection import compare, run_candidate
from kernelgate.tolerance import assert_close, assert_no_worse

# The module (kernelgate.ops.cross_entropy, the attribute, is the op).
cross_entropy_module = importlib.import_module("kernelgate.ops.cross_entropy")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
REDUCTIONS = ["none", "mean", "sum"]
SMOOTHING = [0.0, 0.1, 1.0]
IGNORE = -100


@pytest.fixture(autouse=True)
def _quiet_fallbacks() -> None:
    """Tests of the reference path fall back on purpose; the warning would only add noise."""
    kernelgate.configure(warn_fallback=False)


def _logits(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=gen)).to(device=device, dtype=dtype)


def _target(n_rows: int, n_classes: int, device: torch.device, ignored: tuple[int, ...] = (1,)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    target = torch.randint(0, n_classes, (n_rows,), generator=gen)
    for row in ignored:
        if row < n_rows:
            target[row] = IGNORE
    return target.to(device)


def _weight(n_classes: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    return (0.25 + torch.rand(n_classes, generator=gen)).to(device=device, dtype=dtype)


def _torch_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    label_smoothing: float,
    reduction: str,
    ignore_index: int = IGNORE,
) -> torch.Tensor:
    """torch's loss on float32-upcast logits, in the logits' dtype: what a float32-accumulating kernel computes."""
    x = logits if logits.dtype == torch.float32 else logits.float()
    w = None if weight is None else weight.float()
    loss = F.cross_entropy(
        x, target, w, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction
    )
    return loss.to(logits.dtype)


def _args(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, label_smoothing: float, reduction: str
) -> tuple[object, ...]:
    return logits, target, weight, IGNORE, label_smoothing, reduction


def _assert_runs_triton(op: kernelgate.Op, *args: object) -> None:
    plan = op.plan(*args)
    assert plan.path in ("triton", "interpreter"), plan


# --- forward ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", SMOOTHING)
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("shape", [(7, 33), (3, 2999)])
def test_forward_matches_torch(
    target: torch.device,
    dtype: torch.dtype,
    reduction: str,
    label_smoothing: float,
    with_weight: bool,
    shape: tuple[int, int],
) -> None:
    """Every reduction, smoothing and class weighting, with an ignored row, gives torch's loss on float32 logits."""
    logits = _logits(shape, dtype, target)
    labels = _target(shape[0], shape[1], target)
    weight = _weight(shape[1], target, dtype) if with_weight else None
    args = _args(logits, labels, weight, label_smoothing, reduction)
    _assert_runs_triton(cross_entropy, *args)
    loss = cross_entropy(*args)
    expected = _torch_loss(logits, labels, weight, label_smoothing, reduction)
    assert loss.shape == expected.shape and loss.dtype == dtype
    assert_close(loss, expected, reduction_length=cross_entropy.reduction_length(*args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("with_weight", "label_smoothing"), [(False, 0.0), (True, 0.1)])
def test_long_rows_loop_over_the_vocabulary(
    target: torch.device, dtype: torch.dtype, with_weight: bool, label_smoothing: float
) -> None:
    """Rows longer than one block (20011 classes) run the looped kernels; loss and gradient match torch."""
    logits = _logits((2, 20011), dtype, target)
    labels = _target(2, 20011, target, ignored=())
    weight = _weight(20011, target) if with_weight else None
    args = _args(logits, labels, weight, label_smoothing, "mean")
    assert cross_entropy.plan(*args).name == "looped"
    loss = cross_entropy(*args)
    assert_close(loss, _torch_loss(logits, labels, weight, label_smoothing, "mean"), reduction_length=20013)
    grad = torch.tensor(1.5, dtype=dtype, device=target)
    assert cross_entropy_backward.plan(grad, *args).name == "looped"
    _assert_no_worse_than_torch(
        cross_entropy_backward(grad, *args), logits, labels, weight, label_smoothing, "mean", grad
    )


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_long_rows_whose_first_blocks_are_masked(target: torch.device, label_smoothing: float) -> None:
    """A row whose first blocks are all -inf (a masked part of the vocabulary) keeps an empty running sum until
    its first finite logit, instead of NaN from -inf - -inf: loss and gradient match torch."""
    logits = _logits((2, 20011), torch.float32, target)
    logits[:, :12000] = float("-inf")
    labels = torch.tensor([12345, 20000], device=target)
    args = _args(logits, labels, None, label_smoothing, "none")
    expected = F.cross_entropy(logits, labels, label_smoothing=label_smoothing, reduction="none")
    assert_close(cross_entropy(*args), expected, reduction_length=20011)
    grad = torch.ones(2, device=target)
    x = logits.clone().requires_grad_()
    torch_loss = F.cross_entropy(x, labels, label_smoothing=label_smoothing, reduction="none")
    (torch_dx,) = torch.autograd.grad(torch_loss, x, grad)
    assert_close(cross_entropy_backward(grad, *args), torch_dx, reduction_length=20011)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_all_targets_ignored(target: torch.device, reduction: str, with_weight: bool, label_smoothing: float) -> None:
    """With every row ignored, "mean" is NaN (0 / 0) as in torch, "sum" 0, "none" zeros; the gradient is zero."""
    logits = _logits((4, 37), torch.float32, target)
    labels = torch.full((4,), IGNORE, device=target)
    weight = _weight(37, target) if with_weight else None
    args = _args(logits, labels, weight, label_smoothing, reduction)
    loss = cross_entropy(*args)
    expected = F.cross_entropy(logits, labels, weight, label_smoothing=label_smoothing, reduction=reduction)
    assert_close(loss, expected)
    assert bool(loss.isnan().all()) if reduction == "mean" else bool((loss == 0).all())
    grad = torch.ones_like(loss)
    assert bool((cross_entropy_backward(grad, *args) == 0).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("label_smoothing", SMOOTHING)
@pytest.mark.parametrize("offset", [0.0, 1e4], ids=["spread", "offset"])
@pytest.mark.parametrize("n_classes", [257, 20011])
def test_extreme_logits(
    target: torch.device, dtype: torch.dtype, label_smoothing: float, offset: float, n_classes: int
) -> None:
    """Logits of +-1e4 (and 1e4 plus small noise) lose no precision to the rounding of the log-sum-exp: the loss
    per row matches torch's, and the gradient is no worse than torch's, in one block and looped."""
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(2, n_classes, generator=gen)
    raw = offset + base if offset else 1e4 * base.sign() * torch.rand(2, n_classes, generator=gen)
    logits = raw.to(device=target, dtype=dtype)
    labels = torch.tensor([5, n_classes - 2], device=target)
    args = _args(logits, labels, None, label_smoothing, "none")
    expected = _torch_loss(logits, labels, None, label_smoothing, "none")
    assert_close(cross_entropy(*args), expected, reduction_length=n_classes)
    grad = torch.ones(2, dtype=dtype, device=target)
    got = cross_entropy_backward(grad, *args)
    _assert_no_worse_than_torch(got, logits, labels, None, label_smoothing, "none", grad)


@pytest.mark.parametrize("exp2", [True, False], ids=["exp2", "exp"])
def test_both_forms_of_the_streamed_sums_keep_extreme_logits_exact(
    target: torch.device, exp2: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The streamed forward sums exp2(fma(x, log2(e), -b)) where an fma rounds once and exp(x - m) elsewhere
    (Triton 3.6's interpreter): each form, forced, gives torch's loss at logits of 1e4, its statistics give a
    gradient no worse than torch's, and so does the forward that writes the gradient. The exp2 form needs the
    single rounding, so it is skipped where the interpreter rounds twice."""
    if exp2 and target.type == "cpu" and not cross_entropy_module._interpreter_rounds_fma_once():
        pytest.skip("this Triton's interpreter rounds an fma twice; the launchers use the exp form with it")
    monkeypatch.setattr(cross_entropy_module, "_exp2_sums", lambda: exp2)
    n_classes = 20011  # longer than one block: the looped forward streams the row
    gen = torch.Generator().manual_seed(5)
    logits = (1e4 + torch.randn(3, n_classes, generator=gen)).to(target)
    labels = torch.tensor([0, 7, n_classes - 1], device=target)
    args = _args(logits, labels, None, 0.1, "none")
    expected = _torch_loss(logits, labels, None, 0.1, "none")
    assert_close(cross_entropy(*args), expected, reduction_length=n_classes)
    loss, stats = cross_entropy_with_stats(*args)
    assert_close(loss, expected, reduction_length=n_classes)
    grad = torch.ones(3, device=target)
    from_stats = cross_entropy_backward(grad, *args, stats)
    _assert_no_worse_than_torch(from_stats, logits, labels, None, 0.1, "none", grad)
    loss, dx = cross_entropy_with_grad(*args)
    assert_close(loss, expected, reduction_length=n_classes)
    _assert_no_worse_than_torch(dx, logits, labels, None, 0.1, "none", grad)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("with_weight", [False, True])
def test_ignore_index_inside_the_classes(target: torch.device, reduction: str, with_weight: bool) -> None:
    """ignore_index may be a class index (0 here): its rows add nothing to the loss, the mean's divisor or the
    gradient, as in torch."""
    logits = _logits((6, 50), torch.float32, target).requires_grad_()
    labels = torch.tensor([0, 3, 0, 49, 7, 0], device=target)
    weight = _weight(50, target) if with_weight else None
    loss = cross_entropy(logits, labels, weight, 0, 0.1, reduction)
    x = logits.detach().clone().requires_grad_()
    expected = F.cross_entropy(x, labels, weight, ignore_index=0, label_smoothing=0.1, reduction=reduction)
    assert_close(loss.detach(), expected.detach(), reduction_length=56)
    grad = torch.full(tuple(loss.shape), 0.3, device=target)
    (dx,) = torch.autograd.grad(loss, logits, grad)
    (torch_dx,) = torch.autograd.grad(expected, x, grad)
    assert_close(dx, torch_dx, reduction_length=56)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", SMOOTHING)
@pytest.mark.parametrize("weight_on_masked", [None, 1.0, 0.0], ids=["no-weight", "weighted", "zero-weight"])
def test_minus_inf_logits_match_torch(
    target: torch.device, reduction: str, label_smoothing: float, weight_on_masked: float | None
) -> None:
    """-inf logits (masked classes) give torch's loss exactly: finite without smoothing, inf with it (NaN where
    the masked class has weight 0); a -inf target logit gives inf (NaN with smoothing 1: 0 * inf, as torch)."""
    logits = _logits((5, 40), torch.float32, target)
    labels = _target(5, 40, target, ignored=(4,))
    logits[0, (labels[0] + 1) % 40] = float("-inf")  # masked, not the target
    logits[2, labels[2]] = float("-inf")  # the target itself
    logits[4, :3] = float("-inf")  # masked, in an ignored row
    weight = None
    if weight_on_masked is not None:
        weight = _weight(40, target)
        weight[(labels[0] + 1) % 40] = weight_on_masked
    args = _args(logits, labels, weight, label_smoothing, reduction)
    loss = cross_entropy(*args)
    assert_close(loss, _torch_loss(logits, labels, weight, label_smoothing, reduction), reduction_length=45)
    grad = _logits(tuple(loss.shape), torch.float32, target, seed=4) if reduction == "none" else torch.tensor(1.0)
    grad = grad.to(target)
    got = cross_entropy_backward(grad, *args)
    x = logits.clone().requires_grad_()
    torch_loss = F.cross_entropy(
        x, labels, weight, ignore_index=IGNORE, label_smoothing=label_smoothing, reduction=reduction
    )
    (expected,) = torch.autograd.grad(torch_loss, x, grad)
    assert_close(got, expected, reduction_length=45)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_nan_propagates_as_in_torch(target: torch.device, reduction: str, label_smoothing: float) -> None:
    """A NaN or +inf logit makes its row's loss and gradient NaN, as torch's; in an ignored row the loss stays 0
    while the gradient row is NaN (torch's too: 0 * NaN softmax); a NaN gradient of an ignored row is dropped."""
    logits = _logits((5, 30), torch.float32, target)
    labels = _target(5, 30, target, ignored=(1, 3))
    logits[0, 5] = float("nan")
    logits[1, 7] = float("nan")  # ignored row
    logits[2, 9] = float("inf")
    args = _args(logits, labels, None, label_smoothing, reduction)
    expected = F.cross_entropy(
        logits, labels, ignore_index=IGNORE, label_smoothing=label_smoothing, reduction=reduction
    )
    assert_close(cross_entropy(*args), expected, reduction_length=35)
    assert_close(cross_entropy.reference(*args), expected, reduction_length=35)
    grad = torch.ones(()) if reduction != "none" else torch.tensor([1.0, 1.0, 1.0, float("nan"), 1.0])
    grad = grad.to(target)
    x = logits.clone().requires_grad_()
    torch_loss = F.cross_entropy(x, labels, ignore_index=IGNORE, label_smoothing=label_smoothing, reduction=reduction)
    (torch_dx,) = torch.autograd.grad(torch_loss, x, grad)
    got = cross_entropy_backward(grad, *args)
    assert torch.equal(got.isnan(), torch_dx.isnan())
    assert_close(got, torch_dx, reduction_length=35)


@pytest.mark.parametrize(
    "make_view",
    [
        pytest.param(lambda base: base[:, :37], id="row-strided"),
        pytest.param(lambda base: base.t().contiguous().t()[:, :37], id="transposed-contiguous"),
    ],
)
def test_non_contiguous_inputs(target: torch.device, make_view: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Row-strided and transposed logits, a strided target and a strided weight give the contiguous result."""
    base = _logits((9, 48), torch.bfloat16, target)
    logits = make_view(base)
    labels_base = _target(18, 37, target)
    labels = labels_base[::2]
    weight = _weight(74, target)[::2]
    for reduction in REDUCTIONS:
        args = _args(logits, labels, weight, 0.1, reduction)
        contiguous = _args(logits.contiguous(), labels.contiguous(), weight.contiguous(), 0.1, reduction)
        assert_close(cross_entropy(*args), cross_entropy.reference(*contiguous), reduction_length=46)
        grad = torch.ones(9 if reduction == "none" else (), dtype=torch.bfloat16, device=target)
        assert_close(
            cross_entropy_backward(grad, *args),
            cross_entropy_backward.reference(grad, *contiguous),
            reduction_length=46,
        )


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_empty_batch(reduction: str) -> None:
    """N = 0 takes the reference (reason "empty-tensor") and gives torch's results: an empty loss for "none", 0 for
    "sum", NaN for "mean"; an empty gradient."""
    kernelgate.configure(tune=False, warn_fallback=True)
    logits = torch.randn(0, 11, requires_grad=True)
    labels = torch.zeros(0, dtype=torch.int64)
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="empty-tensor"):
        loss = cross_entropy(logits, labels, None, IGNORE, 0.1, reduction)
        (dx,) = torch.autograd.grad(loss.sum(), logits)
    assert_close(loss.detach(), F.cross_entropy(logits, labels, label_smoothing=0.1, reduction=reduction).detach())
    assert dx.shape == (0, 11)
    # Under autograd the forward of "none" runs as cross_entropy_with_stats (it keeps row statistics for the
    # backward), that of "mean" and "sum" as cross_entropy_with_grad (the backward scales its gradient).
    if reduction == "none":
        expected = {"cross_entropy_with_stats", "cross_entropy_backward"}
    else:
        expected = {"cross_entropy_with_grad", "cross_entropy_backward_into"}
    assert {r.op for r in kernelgate.fallbacks()} == expected


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_of_class_scores(target: torch.device, reduction: str, dtype: torch.dtype) -> None:
    """(C,) logits with a 0-dim target, as torch accepts, give its 0-dim loss and its gradient."""
    logits = _logits((50,), dtype, target)
    label = torch.tensor(17, device=target)
    args = _args(logits, label, None, 0.1, reduction)
    _assert_runs_triton(cross_entropy, *args)
    loss = cross_entropy(*args)
    assert loss.shape == ()
    assert_close(loss, _torch_loss(logits, label, None, 0.1, reduction), reduction_length=51)
    grad = torch.tensor(0.5, dtype=dtype, device=target)
    _assert_no_worse_than_torch(cross_entropy_backward(grad, *args), logits, label, None, 0.1, reduction, grad)


# --- targets outside the classes ---------------------------------------------------------------


def test_reference_raises_for_a_target_out_of_range_on_the_cpu() -> None:
    """On CPU tensors, where the check costs no synchronisation, a class index outside [0, C) raises and says how
    to fix it, from the forward and the backward reference."""
    logits = torch.randn(3, 5)
    with pytest.raises(InputValueError, match=r"holds 7 at position 2, .* \[0, 5\) nor ignore_index \(-100\)"):
        cross_entropy(logits, torch.tensor([1, 2, 7]))
    with pytest.raises(InputValueError, match="holds -1 at position 0"):
        cross_entropy_backward(torch.tensor(1.0), logits, torch.tensor([-1, 2, 3]), None, IGNORE, 0.0, "mean")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_kernels_write_nan_for_a_target_out_of_range(target: torch.device, reduction: str) -> None:
    """The kernels never read at a bad class index and never return a number for it: the row's loss and gradient
    are NaN ("mean" and "sum" NaN too), the other rows are exact. On the GPU the reference does the same."""
    logits = _logits((4, 21), torch.float32, target)
    labels = torch.tensor([3, 21, IGNORE, 5], device=target)
    good = torch.tensor([3, IGNORE, IGNORE, 5], device=target)
    args = _args(logits, labels, None, 0.1, reduction)
    loss = cross_entropy(*args)
    if reduction == "none":
        expected = F.cross_entropy(logits, good, label_smoothing=0.1, reduction="none")
        expected[1] = float("nan")
    else:
        expected = torch.tensor(float("nan"), device=target)
    assert_close(loss, expected, reduction_length=25)
    grad = torch.ones(tuple(loss.shape), device=target)
    dx = cross_entropy_backward(grad, *args)
    assert bool(dx[1].isnan().all()) and not bool(dx[[0, 2, 3]].isnan().any())
    if target.type == "cuda":
        assert_close(cross_entropy.reference(*args), loss, reduction_length=25)
        assert_close(cross_entropy_backward.reference(grad, *args), dx, reduction_length=25)


# --- the contract ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        pytest.param(
            lambda: cross_entropy(torch.randn(3, 5), torch.rand(3, 5)),
            InputTypeError,
            r"class probabilities\. .*torch\.nn\.functional\.cross_entropy\(logits, target\)",
            id="probability-target",
        ),
        pytest.param(
            lambda: cross_entropy(torch.randn(3, 5), torch.tensor([1.0, 2.0, 3.0])),
            InputTypeError,
            r"must hold class indices of dtype int64; got float32\. Convert it first, e\.g\. target\.long\(\)",
            id="float-target",
        ),
        pytest.param(
            lambda: cross_entropy(torch.randn(3, 5), torch.tensor([1, 2, 3], dtype=torch.int32)),
            InputTypeError,
            r"'target' must have dtype int64.*got int32\. Convert it first, e\.g\. target\.to\(torch\.int64\)",
            id="int32-target",
        ),
        pytest.param(
            lambda: cross_entropy(torch.randn(3, 5), torch.tensor([1, 2])),
            InputValueError,
            r"'target' must have shape \(3,\) .*got \(2,\)\. Pass one int64 class index per row",
            id="target-shape",
        ),
        pytest.param(
            lambda: cross_entropy(torch.randn(5), torch.tensor([1])),
            InputValueError,
            r"'target' must have shape \(\) .*got \(1,\)",
            id="target-shape-one-row",
        ),
        pytest.param(
            lambda: cross_entropy(torch.randn(3, 5), torch.tensor([1, 2, 3]), torch.rand(4)),
            InputValueError,
            r"'weight' must have size 5 in dimension 0 \(= logits\.shape\[-1\]\); got 4.*Make weight\.shape\[0\]",
            id="weight-size",
        ),
        pytest.param(
            lambda: cross_entropy(torch.randn(3, 5), torch.tensor([1, 2, 3]), torch.rand(1, 5)),
            InputValueError,
            r"'weight' must have 1 dimension\(s\); got 2.*Reshape it",
            id="weight-rank",
        ),
        pytest.param(
            lambda: cross_entropy(torch.randn(3, 5), torch.tensor([1, 2, 3]), reduction="avg"),
            InputValueError,
            r"'reduction' must be 'none', 'mean' or 'sum'; got str 'avg'\. Pass one of those strings",
            id="reduction",
        ),
        pytest.param(
            lambda: cross_entropy(torch.randn(3, 5), torch.tensor([1, 2, 3]), label_smoothing=1.5),
            InputValueError,
            r"'label_smoothing' must be in \[0\.0, 1\.0\]; got 1\.5\. Pass a value in that range",
            id="label-smoothing",
        ),
        pytest.param(
            lambda: cross_entropy(torch.randn(2, 5, 4), torch.zeros(2, 4, dtype=torch.int64)),
            InputValueError,
            r"shape \(N, C\) or \(C,\); got \(2, 5, 4\)\. .*logits\.movedim\(1, -1\)\.reshape\(-1, C\)",
            id="class-dim-1",
        ),
        pytest.param(
            lambda: cross_entropy_backward(
                torch.ones(3), torch.randn(3, 5), torch.tensor([1, 2, 3]), None, IGNORE, 0.0, "mean"
            ),
            InputValueError,
            r"'grad' must have the loss's shape \(\) for reduction='mean'; got \(3,\)",
            id="grad-shape",
        ),
    ],
)
@pytest.mark.parametrize("interpret", [False, True], ids=["reference", "interpreter"])
def test_contract_errors_name_the_remedy(
    call: Callable[[], object], error: type[Exception], message: str, interpret: bool
) -> None:
    """Inputs outside the op's contract raise a kernelgate error naming the argument and the remedy, on the
    reference path and on the Triton path alike."""
    kernelgate.configure(tune=False)
    with kernelgate.use_interpreter(interpret), pytest.raises(error, match=message):
        call()


def test_weight_requiring_grad_is_refused_as_by_torch() -> None:
    """A weight that requires grad is refused when autograd records the call, as torch refuses it."""
    logits = torch.randn(3, 5, requires_grad=True)
    with pytest.raises(InputValueError, match=r"'weight' requires grad.*Pass weight\.detach\(\)"):
        cross_entropy(logits, torch.tensor([1, 2, 3]), torch.rand(5, requires_grad=True))


# --- backward ----------------------------------------------------------------------------------


def _assert_no_worse_than_torch(
    got: torch.Tensor,
    logits: torch.Tensor,
    labels: torch.Tensor,
    weight: torch.Tensor | None,
    label_smoothing: float,
    reduction: str,
    grad: torch.Tensor,
) -> None:
    """The gradient is no further from torch's float64 gradient than twice torch's own in the logits' dtype."""
    results = []
    for dtype in (logits.dtype, torch.float64):
        x = logits.detach().to(dtype).requires_grad_()
        w = None if weight is None else weight.to(dtype)
        loss = F.cross_entropy(x, labels, w, ignore_index=IGNORE, label_smoothing=label_smoothing, reduction=reduction)
        results.append(torch.autograd.grad(loss, x, grad.to(dtype))[0])
    assert_no_worse(got, results[0], results[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", SMOOTHING)
@pytest.mark.parametrize("with_weight", [False, True])
def test_gradient_matches_torch_autograd(
    target: torch.device, dtype: torch.dtype, reduction: str, label_smoothing: float, with_weight: bool
) -> None:
    """Autograd through the op runs the backward kernel; its gradient is no worse than torch's against float64
    for every reduction, smoothing and weighting, with ignored rows."""
    logits = _logits((6, 129), dtype, target).requires_grad_()
    labels = _target(6, 129, target, ignored=(1, 4))
    weight = _weight(129, target, dtype) if with_weight else None
    loss = cross_entropy(logits, labels, weight, IGNORE, label_smoothing, reduction)
    grad = _logits(tuple(loss.shape), dtype, target, seed=5) if reduction == "none" else torch.tensor(0.7)
    grad = grad.to(device=target, dtype=dtype)
    _assert_runs_triton(
        cross_entropy_backward, grad, *_args(logits.detach(), labels, weight, label_smoothing, reduction)
    )
    (dx,) = torch.autograd.grad(loss, logits, grad)
    assert dx.dtype == dtype
    assert bool((dx[[1, 4]] == 0).all())
    _assert_no_worse_than_torch(dx, logits, labels, weight, label_smoothing, reduction, grad)


def test_backward_reads_an_expanded_gradient() -> None:
    """A gradient broadcast over the rows (stride 0, as loss.sum().backward() gives for "none") is read per row."""
    kernelgate.configure(tune=False)
    logits = _logits((5, 40), torch.float32, torch.device("cpu")).requires_grad_()
    labels = _target(5, 40, torch.device("cpu"))
    with kernelgate.use_interpreter(), kernelgate.use_mode("triton"):
        cross_entropy(logits, labels, None, IGNORE, 0.0, "none").sum().backward()
    assert logits.grad is not None
    expected = F.softmax(logits.detach(), -1) - F.one_hot(labels.clamp_min(0), 40)
    expected[1] = 0.0
    assert_close(logits.grad, expected, reduction_length=40)


def test_references_pass_float64_gradcheck() -> None:
    """The forward reference is differentiable, and the backward reference is its gradient (fp64 gradcheck),
    with weights, smoothing and an ignored row."""
    logits = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([1, IGNORE, 6, 0])
    weight = torch.rand(7, dtype=torch.float64) + 0.5
    for reduction in REDUCTIONS:
        assert torch.autograd.gradcheck(
            lambda x, r=reduction: cross_entropy.reference(x, labels, weight, IGNORE, 0.2, r), (logits,)
        )
        grad = torch.randn(4 if reduction == "none" else (), dtype=torch.float64)
        (autograd_dx,) = torch.autograd.grad(
            cross_entropy.reference(logits, labels, weight, IGNORE, 0.2, reduction), logits, grad
        )
        explicit = cross_entropy_backward.reference(grad, logits.detach(), labels, weight, IGNORE, 0.2, reduction)
        torch.testing.assert_close(explicit, autograd_dx)


def test_op_passes_float64_gradcheck_and_gradgradcheck() -> None:
    """Through its registered backward (reference path here), the op passes gradcheck and gradgradcheck."""
    logits = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([2, IGNORE, 5])
    assert torch.autograd.gradcheck(lambda x: cross_entropy(x, labels, None, IGNORE, 0.1, "mean"), (logits,))
    assert torch.autograd.gradgradcheck(lambda x: cross_entropy(x, labels, None, IGNORE, 0.1, "sum"), (logits,))


def _saved_by_autograd(*args: object) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """cross_entropy(*args) under autograd, and the tensors it saves through autograd's saved-tensor hooks."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = cross_entropy(*args)
    return loss, saved


def test_saved_tensors_are_the_inputs_and_the_row_stats_only() -> None:
    """The forward of "none" saves its inputs (logits, target, weight) and each row's (max, log-sum) in float32: no
    softmax, no float32 copy of the logits."""
    logits = torch.randn(4, 9, requires_grad=True)
    labels, weight = torch.tensor([1, 2, 3, 4]), torch.rand(9)
    _, saved = _saved_by_autograd(logits, labels, weight, IGNORE, 0.1, "none")
    inputs = sorted(t.data_ptr() for t in (logits, labels, weight))
    assert sorted(t.data_ptr() for t in saved[:3]) == inputs
    [stats] = saved[3:]
    assert (stats.shape, stats.dtype) == ((4, 2), torch.float32)
    assert_close(stats[:, 0] + stats[:, 1], torch.logsumexp(logits.detach(), dim=-1))


# --- torch.library and configurations ----------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: (torch.randn(4, 9, requires_grad=True), torch.tensor([1, 2, IGNORE, 8])), id="default"),
        pytest.param(
            lambda: (
                torch.randn(4, 9, requires_grad=True),
                torch.tensor([1, 2, IGNORE, 8]),
                torch.rand(9),
                IGNORE,
                0.1,
                "none",
            ),
            id="weight-smoothing-none",
        ),
        pytest.param(
            lambda: (torch.randn(4, 9, requires_grad=True), torch.tensor([1, 2, 0, 8]), None, 0, 1.0, "sum"),
            id="ignore-0-sum",
        ),
        pytest.param(lambda: (torch.randn(9, requires_grad=True), torch.tensor(3), None, IGNORE, 0.0, "none"), id="1d"),
    ],
)
@pytest.mark.parametrize("interpret", [False, True], ids=["reference", "interpreter"])
def test_opcheck(make: Callable[[], tuple[object, ...]], interpret: bool) -> None:
    """torch.library.opcheck passes for torch.ops.kernelgate.cross_entropy: schema, fake tensors, autograd, AOT."""
    kernelgate.configure(tune=False)
    args = make()
    full = (*args, None, IGNORE, 0.0, "mean")[:6] if len(args) == 2 else args
    with kernelgate.use_interpreter(interpret):
        torch.library.opcheck(torch.ops.kernelgate.cross_entropy.default, full)
        torch.library.opcheck(torch.ops.kernelgate.cross_entropy_with_stats.default, full)
        grad = torch.ones(tuple(cross_entropy(*full).shape))
        plain = (full[0].detach(), *full[1:])
        _, stats = cross_entropy_with_stats(*plain)
        backward = torch.ops.kernelgate.cross_entropy_backward.default
        torch.library.opcheck(backward, (grad, *plain, None))
        torch.library.opcheck(backward, (grad, *plain, stats))
        torch.library.opcheck(torch.ops.kernelgate.cross_entropy_with_grad.default, full)
        if full[5] != "none":
            _, dlogits = cross_entropy_with_grad(*plain)
            into = torch.ops.kernelgate.cross_entropy_backward_into.default
            torch.library.opcheck(into, (torch.tensor(0.5), *plain, dlogits))


CONFIG_CASES = [
    ((5, 100), None, 0.0, "mean"),
    ((5, 100), "weight", 0.1, "none"),
    ((2, 20000), None, 0.1, "sum"),
    ((2, 20000), "weight", 0.1, "mean"),
    ((3, 2048), None, 0.0, "none"),  # whole blocks only: the streamed loops' unmasked path with no partial block
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("shape", "weighted", "label_smoothing", "reduction"), CONFIG_CASES)
@pytest.mark.parametrize(
    "op_name",
    [
        "cross_entropy",
        "cross_entropy_with_stats",
        "cross_entropy_with_grad",
        "cross_entropy_backward",
        "backward_with_stats",
    ],
)
def test_every_config_matches_the_reference(
    target: torch.device,
    op_name: str,
    shape: tuple[int, int],
    weighted: str | None,
    label_smoothing: float,
    reduction: str,
    dtype: torch.dtype,
) -> None:
    """Each implementation that accepts the shape gives the reference's result under every configuration it keeps,
    into NaN-filled outputs (the backward also with the forward's row statistics)."""
    logits = _logits(shape, dtype, target)
    args: tuple[object, ...] = (
        logits, _target(*shape, target), _weight(shape[1], target) if weighted else None, IGNORE, label_smoothing,
        reduction,
    )  # fmt: skip
    if op_name in ("cross_entropy", "cross_entropy_with_stats", "cross_entropy_with_grad"):
        op = {"cross_entropy": cross_entropy, "cross_entropy_with_stats": cross_entropy_with_stats}.get(
            op_name, cross_entropy_with_grad
        )
        check_every_config(op, args, target.type == "cpu")
        return
    grad_shape = shape[:1] if reduction == "none" else ()
    stats = cross_entropy_with_stats.reference(*args)[1] if op_name == "backward_with_stats" else None
    check_every_config(
        cross_entropy_backward, (_logits(grad_shape, dtype, target, seed=6), *args, stats), target.type == "cpu"
    )


def test_backward_with_stats_reads_ignored_rows_itself() -> None:
    """With the forward's statistics, a valid row uses them, while an ignored row (which the forward did not read,
    its statistics -inf) is read again: its gradient is 0, or NaN where its logits hold NaN, as torch's."""
    kernelgate.configure(tune=False)
    logits = torch.randn(3, 20000)
    logits[1, 7] = float("nan")
    labels = torch.tensor([5, IGNORE, 19999])
    args = (logits, labels, None, IGNORE, 0.0, "sum")
    with kernelgate.use_interpreter(), kernelgate.use_mode("triton"):
        _, stats = cross_entropy_with_stats(*args)
        assert stats[1].isneginf().all(), "the forward skips an ignored row"
        assert cross_entropy_backward.plan(torch.tensor(1.0), *args, stats).name == "looped"
        dx = cross_entropy_backward(torch.tensor(1.0), *args, stats)
    xr = logits.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(F.cross_entropy(xr, labels, reduction="sum"), xr)
    assert dx[1].isnan().all() and expected[1].isnan().all(), "0 * a NaN softmax row is NaN, as in torch"
    assert_close(dx[[0, 2]], expected[[0, 2]], reduction_length=20000)


def test_eager_autograd_runs_the_forward_with_stats_and_the_backward_uses_them() -> None:
    """kernelgate.cross_entropy of "none" under eager autograd computes its loss with cross_entropy_with_stats, and
    the backward receives those statistics; the gradient is torch's."""
    kernelgate.configure(tune=False)
    seen: list[torch.Tensor | None] = []
    backward = cross_entropy_backward.reference

    def spy(*args: object) -> torch.Tensor:
        stats = args[7] if len(args) > 7 else None
        seen.append(stats if isinstance(stats, torch.Tensor) else None)
        return backward(*args)  # type: ignore[arg-type]

    logits = torch.randn(4, 50, requires_grad=True)
    labels = torch.tensor([1, IGNORE, 49, 0])
    with kernelgate.use_mode("reference"):
        original = cross_entropy_backward.reference
        object.__setattr__(cross_entropy_backward, "reference", spy)
        try:
            (dx,) = torch.autograd.grad(cross_entropy(logits, labels, reduction="none").sum(), logits)
        finally:
            object.__setattr__(cross_entropy_backward, "reference", original)
    [stats] = seen
    assert stats is not None and stats.shape == (4, 2)
    assert_close(stats[[0, 2, 3]].sum(-1), torch.logsumexp(logits.detach(), -1)[[0, 2, 3]])
    xr = logits.detach().clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(F.cross_entropy(xr, labels, reduction="none").sum(), xr)
    assert_close(dx, expected, reduction_length=54)


def test_stats_of_the_wrong_shape_are_rejected() -> None:
    """cross_entropy_backward names 'stats', the shape it needs, what came, and the remedy."""
    logits, labels = torch.randn(4, 9), torch.tensor([1, 2, 3, 4])
    with pytest.raises(InputValueError, match=r"'stats' must have shape \(4, 2\).*got \(4,\).*or None"):
        cross_entropy_backward(torch.tensor(1.0), logits, labels, None, IGNORE, 0.0, "mean", torch.zeros(4))


# --- the GPU: vocabularies of 32K to 256K ------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8192, 32000), (4096, 128256), (2048, 256000)])
def test_large_vocabularies_on_the_gpu(shape: tuple[int, int]) -> None:
    """bfloat16 logits of LLM vocabularies: forward and backward kernels match the references (float32 math)."""
    kernelgate.configure(tune=False)
    device = torch.device("cuda")
    logits = _logits(shape, torch.bfloat16, device)
    labels = _target(shape[0], shape[1], device, ignored=tuple(range(0, shape[0], 9)))
    with kernelgate.use_mode("triton"):
        args = _args(logits, labels, None, 0.0, "mean")
        assert cross_entropy.plan(*args).name == "looped"
        loss = cross_entropy(*args)
        grad = torch.tensor(1.0, dtype=torch.bfloat16, device=device)
        dx = cross_entropy_backward(grad, *args)
        loss_with_stats, stats = cross_entropy_with_stats(*args)
        dx_from_stats = cross_entropy_backward(grad, *args, stats)
        smoothed = cross_entropy(*_args(logits, labels, None, 0.1, "none"))
    assert_close(loss, cross_entropy.reference(*args), reduction_length=cross_entropy.reduction_length(*args))
    assert_close(dx, cross_entropy_backward.reference(grad, *args), reduction_length=shape[1] + shape[0])
    expected_loss, expected_stats = cross_entropy_with_stats.reference(*args)
    assert_close(loss_with_stats, expected_loss, reduction_length=cross_entropy.reduction_length(*args))
    assert_close(stats, expected_stats, reduction_length=shape[1])
    assert_close(dx_from_stats, cross_entropy_backward.reference(grad, *args), reduction_length=shape[1] + shape[0])
    assert_close(
        smoothed, cross_entropy.reference(*_args(logits, labels, None, 0.1, "none")), reduction_length=shape[1]
    )


@pytest.mark.gpu
def test_forward_allocates_no_float32_copy_of_the_logits() -> None:
    """The forward's peak extra memory is per-row scratch, far below a float32 copy of the logits (N * C * 4 bytes)."""
    kernelgate.configure(tune=False)
    n_rows, n_classes = 4096, 128256
    logits = _logits((n_rows, n_classes), torch.bfloat16, torch.device("cuda"))
    labels = _target(n_rows, n_classes, torch.device("cuda"))
    with kernelgate.use_mode("triton"):
        cross_entropy(logits, labels)  # compile first
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss = cross_entropy(logits, labels)
        torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra < n_rows * n_classes * 4 // 100, extra  # in fact 2 * N float32 and the result
    assert bool(loss.isfinite())


@pytest.mark.gpu
def test_out_of_range_target_on_the_gpu_gives_nan_without_a_device_assert() -> None:
    """On the GPU, kernel and reference agree: a bad class index makes its row NaN, nothing asserts or syncs."""
    device = torch.device("cuda")
    logits = _logits((4, 1000), torch.float32, device)
    labels = torch.tensor([3, 5000, -7, IGNORE], device=device)
    kernelgate.configure(tune=False)
    with kernelgate.use_mode("triton"):
        loss = cross_entropy(logits, labels, None, IGNORE, 0.0, "none")
    reference = cross_entropy.reference(logits, labels, None, IGNORE, 0.0, "none")
    torch.cuda.synchronize()
    assert_close(loss, reference, reduction_length=1000)
    assert loss[1:3].isnan().all() and loss[3] == 0


def test_a_forward_kernel_keeps_the_function_untimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where tuning plans cross_entropy's forward to a kernel, autograd calls keep the Function and the step is never
    timed against eager autograd, whose reference keeps float32 probabilities the size of the logits."""
    kernelgate.configure(warn_fallback=False)
    real = kernelgate.selection.time_us

    def kernel_wins(fn: Callable[[], object], device: torch.device, *, screen: bool = False) -> float:
        candidate = isinstance(fn, functools.partial) and fn.func is kernelgate.selection.run_candidate
        return 1.0 if candidate else real(fn, device, screen=screen)

    def never(*args: object) -> float:
        raise AssertionError("the step was timed")

    monkeypatch.setattr(kernelgate.selection, "time_us", kernel_wins)
    monkeypatch.setattr(kernelgate.op, "time_autograd_step", never)
    logits = torch.randn(4, 50, requires_grad=True)
    labels = torch.tensor([1, IGNORE, 49, 0])
    (expected,) = torch.autograd.grad(F.cross_entropy(logits, labels), logits)
    with kernelgate.use_interpreter():
        for _ in range(3):
            loss = cross_entropy(logits, labels)
            assert "KernelgateFunction" in type(loss.grad_fn).__name__
            assert_close(torch.autograd.grad(loss, logits)[0], expected, reduction_length=54)
        assert cross_entropy.plan(logits.detach(), labels).path == "interpreter"
        route = cross_entropy.step_route(logits, labels)
    assert route.path == "function" and "may_step_eagerly" in route.detail


def test_a_forward_and_backward_planned_to_the_reference_run_eager_autograd_after_the_first_step() -> None:
    """Where cross_entropy_with_stats (the Function's forward) is planned to the reference and the backward, run once
    through the Function, called no kernel either, later autograd calls of the signature run cross_entropy's
    reference under eager autograd: torch's gradient, no Function."""
    kernelgate.configure(warn_fallback=False)
    logits = torch.randn(4, 50, requires_grad=True)
    labels = torch.tensor([1, IGNORE, 49, 0])
    (expected,) = torch.autograd.grad(F.cross_entropy(logits, labels), logits)
    first = cross_entropy(logits, labels)
    assert "KernelgateFunction" in type(first.grad_fn).__name__
    assert_close(torch.autograd.grad(first, logits)[0], expected, reduction_length=54)
    second = cross_entropy(logits, labels)
    assert "KernelgateFunction" not in type(second.grad_fn).__name__
    (dx,) = torch.autograd.grad(second, logits)
    assert_close(dx, expected, reduction_length=54)


# --- the gradient computed in the forward ("mean" and "sum" under eager autograd) -----------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("shape", [(7, 33), (3, 20000)], ids=["single_block", "looped"])
def test_forward_with_grad_matches_the_reference(
    target: torch.device,
    shape: tuple[int, int],
    with_weight: bool,
    label_smoothing: float,
    reduction: str,
    dtype: torch.dtype,
) -> None:
    """cross_entropy_with_grad's kernels give the reference's loss and gradient (for an incoming gradient of 1), with
    ignored rows, weights and smoothing, for rows in one block and rows looped over."""
    logits = _logits(shape, dtype, target)
    labels = _target(*shape, target, ignored=(1, 4))
    weight = _weight(shape[1], target) if with_weight else None
    args = _args(logits, labels, weight, label_smoothing, reduction)
    plan = cross_entropy_with_grad.plan(*args)
    assert (plan.path, plan.name) == (
        "triton" if target.type == "cuda" else "interpreter",
        "looped" if shape[1] > 16384 else "single_block",
    )
    loss, dx = cross_entropy_with_grad(*args)
    expected_loss, expected_dx = cross_entropy_with_grad.reference(*args)
    length = cross_entropy.reduction_length(*args)
    assert (dx.dtype, dx.shape, dx.is_contiguous()) == (dtype, logits.shape, True)
    assert_close(loss, expected_loss, reduction_length=length)
    assert_close(dx, expected_dx, reduction_length=length)
    assert bool((dx[[1]] == 0).all()), "an ignored row's gradient is 0"


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("op_name", ["cross_entropy_with_grad", "cross_entropy_backward"])
def test_looped_gradient_of_bad_ignored_and_large_rows(
    target: torch.device, op_name: str, label_smoothing: float
) -> None:
    """The looped gradient passes fold a bad row's NaN into its scale: its whole gradient is NaN (a target out of
    range, where torch raises), an ignored row's is 0, and rows of logits near 1e4 (the exponent's base far from 0)
    keep a gradient no further from float64 than torch's own, over whole blocks and a masked tail. (The backward's
    NaN comes from the fold alone; the forward with the gradient reads nothing of a bad row, so its statistics are
    NaN too, and its case checks the ignored and 1e4 rows.)"""
    n = 2500
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, n, generator=gen) * 3
    logits[2] += 1e4
    logits = logits.to(target)
    labels = torch.tensor([5, IGNORE, 17, n + 3], device=target)
    args = _args(logits, labels, None, label_smoothing, "sum")
    op = cross_entropy_with_grad if op_name == "cross_entropy_with_grad" else cross_entropy_backward
    looped = next(impl for impl in op.implementations if impl.name == "looped")
    config = {"BLOCK_N": 1024, "num_warps": 4} | ({"NUM_STAGES": 3} if op is cross_entropy_with_grad else {})
    values = args if op is cross_entropy_with_grad else (torch.ones((), device=target), *args)
    dx = run_candidate(looped, config, values, interpret=target.type == "cpu", poison=True)
    if op is cross_entropy_with_grad:
        loss, dx = dx
        assert bool(loss.isnan()), "a target out of range makes the reduced loss NaN"
    assert bool(dx[3].isnan().all()), "a target out of range makes its row's gradient NaN"
    assert bool((dx[1] == 0).all()), "an ignored row's gradient is 0"
    good = torch.tensor([0, 1, 2], device=target)
    grads = []
    for dtype in (torch.float32, torch.float64):
        x = logits[good].to(dtype).requires_grad_()
        loss_ok = F.cross_entropy(
            x, labels[good], ignore_index=IGNORE, label_smoothing=label_smoothing, reduction="sum"
        )
        grads.append(torch.autograd.grad(loss_ok, x)[0])
    assert_no_worse(dx[good], grads[0], grads[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(("with_weight", "label_smoothing"), [(False, 0.0), (True, 0.1), (False, 0.2)])
@pytest.mark.parametrize("block", [2048, 8192])
def test_split_rows_reads_a_row_over_programs_and_matches_the_reference(
    target: torch.device, block: int, with_weight: bool, label_smoothing: float, reduction: str, dtype: torch.dtype
) -> None:
    """split_rows, each row split over programs of BLOCK_N columns (10 and 3 of them here, the last one partial),
    gives the reference's loss and gradient, with ignored rows (gradient 0) and a target out of range (NaN)."""
    config = {"BLOCK_N": block, "num_warps": 4}
    _check_split_implementation(target, "split_rows", config, 20000, with_weight, label_smoothing, reduction, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(("with_weight", "label_smoothing"), [(False, 0.0), (True, 0.1), (False, 0.2)])
def test_split_looped_streams_segments_of_a_row_and_matches_the_reference(
    target: torch.device, with_weight: bool, label_smoothing: float, reduction: str, dtype: torch.dtype
) -> None:
    """split_looped, each row split over programs of a 16384-column segment streamed 4096 at a time (two whole
    segments of four whole blocks, then 7232 columns: a whole block and a partial one), gives the reference's loss
    and gradient, with ignored rows (gradient 0) and a target out of range (NaN). The target of row 0 lies in its
    third segment."""
    config = {"BLOCK_N": 16384, "STREAM_N": 4096, "num_warps": 4, "NUM_STAGES": 3}
    _check_split_implementation(target, "split_looped", config, 40000, with_weight, label_smoothing, reduction, dtype)


def _check_split_implementation(
    target: torch.device,
    name: str,
    config: dict[str, int],
    n_cols: int,
    with_weight: bool,
    label_smoothing: float,
    reduction: str,
    dtype: torch.dtype,
) -> None:
    """cross_entropy_with_grad's implementation ``name`` at ``config`` on 5 rows of ``n_cols``: row 1 ignored, row 3's
    target out of range (NaN loss and gradient row, the other rows untouched), then the same rows with row 3 ignored
    against the reference."""
    shape = (5, n_cols)
    logits = _logits(shape, dtype, target)
    labels = _target(*shape, target, ignored=(1,))
    labels[0] = n_cols - 3
    labels[3] = shape[1] + 5  # neither a class nor ignore_index
    weight = _weight(shape[1], target) if with_weight else None
    args = _args(logits, labels, weight, label_smoothing, reduction)
    impl = next(impl for impl in cross_entropy_with_grad.implementations if impl.name == name)
    assert impl.supports is not None and impl.supports(*args) is None
    loss, dx = run_candidate(impl, config, args, interpret=target.type == "cpu", poison=True)
    # The reference with the bad row's target made ignored: that row's loss and gradient are NaN on the kernels.
    fine = labels.clone()
    fine[3] = IGNORE
    expected_loss, expected_dx = cross_entropy_with_grad.reference(
        *_args(logits, fine, weight, label_smoothing, reduction)
    )
    assert bool(torch.isnan(loss)), "a target out of range makes the reduced loss NaN"
    assert bool(torch.isnan(dx[3]).all()), "a target out of range makes its row's gradient NaN"
    keep = [0, 1, 2, 4]
    length = cross_entropy.reduction_length(*args)
    assert (dx.dtype, dx.shape, dx.is_contiguous()) == (dtype, logits.shape, True)
    assert_close(dx[keep], expected_dx[keep], reduction_length=length)  # the other rows' gradients are untouched
    assert bool((dx[[1]] == 0).all()), "an ignored row's gradient is 0"
    good = _args(logits, fine, weight, label_smoothing, reduction)
    loss, dx = run_candidate(impl, config, good, interpret=target.type == "cpu", poison=True)
    assert_close(loss, expected_loss, reduction_length=length)
    assert_close(dx, expected_dx, reduction_length=length)


def test_split_rows_leaves_rows_of_one_block_to_single_block() -> None:
    """split_rows declines rows that fit one block, naming why, and prunes blocks as long as the row."""
    split_rows = next(impl for impl in cross_entropy_with_grad.implementations if impl.name == "split_rows")
    assert split_rows.supports is not None and split_rows.prune is not None
    short = _args(torch.randn(4, 16384), torch.zeros(4, dtype=torch.int64), None, 0.0, "mean")
    assert "fit one block" in str(split_rows.supports(*short))
    long = _args(torch.randn(2, 20000), torch.zeros(2, dtype=torch.int64), None, 0.0, "mean")
    kept = [dict(c) for c in split_rows.configs if split_rows.prune(c, *long)]
    assert {"BLOCK_N": 16384, "num_warps": 16} in kept and {"BLOCK_N": 16384, "num_warps": 4} not in kept
    assert all(c["BLOCK_N"] < 20000 for c in kept)


def test_split_looped_takes_two_byte_logits_of_rows_longer_than_a_segment() -> None:
    """split_looped declines rows that fit one block and float32 logits (split_rows was faster there on the GPU),
    naming why; it takes bf16 logits with a float32 weight, and keeps segments shorter than the row, read a quarter
    at a time."""
    split_looped = next(impl for impl in cross_entropy_with_grad.implementations if impl.name == "split_looped")
    assert split_looped.supports is not None and split_looped.prune is not None
    labels = torch.zeros(2, dtype=torch.int64)
    short = _args(torch.randn(2, 16384, dtype=torch.bfloat16), labels, None, 0.0, "mean")
    assert "rows of 16384: up to 16384 the looped and single-block kernels" in str(split_looped.supports(*short))
    wide = _args(torch.randn(2, 20000), labels, None, 0.0, "mean")
    assert "torch.float32 logits: split_rows" in str(split_looped.supports(*wide))
    long = _args(torch.randn(2, 20000, dtype=torch.bfloat16), labels, torch.rand(20000) + 0.5, 0.0, "mean")
    assert split_looped.supports(*long) is None
    tensors = [v for v in long if isinstance(v, torch.Tensor)]
    assert cross_entropy_with_grad._refusal(split_looped, long, tensors) is None, "the float32 weight is no refusal"
    kept = [dict(c) for c in split_looped.configs if split_looped.prune(c, *long)]
    assert kept and all(c["STREAM_N"] * 4 == c["BLOCK_N"] < 20000 for c in kept)
    assert {c["BLOCK_N"] for c in kept} == {8192, 16384} and split_looped.default_config in kept


def test_forward_with_grad_matches_torch_autograd_in_float64() -> None:
    """The reference's gradient is torch autograd's of the reference loss, for every reduction (float64)."""
    logits = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([1, IGNORE, 6, 0])
    weight = torch.rand(7, dtype=torch.float64) + 0.5
    for reduction in REDUCTIONS:
        loss, dx = cross_entropy_with_grad.reference(logits.detach(), labels, weight, IGNORE, 0.2, reduction)
        expected = cross_entropy.reference(logits, labels, weight, IGNORE, 0.2, reduction)
        (autograd_dx,) = torch.autograd.grad(expected.sum(), logits)
        torch.testing.assert_close(loss, expected.detach())
        torch.testing.assert_close(dx, autograd_dx)


def _eager_rows(log: Path) -> list[tuple[str, str]]:
    return [(r["op"], r["path"]) for r in csv.DictReader(log.open()) if r["path"] != "tune"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("shape", [(6, 129), (3, 20000)], ids=["single_block", "looped"])
@pytest.mark.parametrize("scale", [1.0, 3.0, 0.7])
def test_eager_autograd_of_a_reduced_loss_computes_float32_gradients_in_the_forward(
    target: torch.device,
    tmp_path: Path,
    shape: tuple[int, int],
    with_weight: bool,
    reduction: str,
    dtype: torch.dtype,
    scale: float,
) -> None:
    """Under eager autograd a reduced loss runs cross_entropy_with_grad, and the backward cross_entropy_backward_into,
    in every dtype (2-byte logits too: FUSED_GRAD_MIN_BYTES). The gradient of loss * scale is no worse than torch's
    against float64 (label smoothing included)."""
    kernelgate.configure(log_path=tmp_path / "log.csv")
    logits = _logits(shape, dtype, target).requires_grad_()
    labels = _target(*shape, target, ignored=(1,))
    weight = _weight(shape[1], target, dtype) if with_weight else None
    loss = cross_entropy(logits, labels, weight, IGNORE, 0.1, reduction)
    (loss * scale if scale != 1.0 else loss).backward()
    assert logits.grad is not None and logits.grad.dtype == dtype
    assert bool((logits.grad[1] == 0).all())
    grad = torch.tensor(scale, dtype=dtype, device=target)
    _assert_no_worse_than_torch(logits.grad, logits, labels, weight, 0.1, reduction, grad)
    assert {op for op, _ in _eager_rows(tmp_path / "log.csv")} == {
        "cross_entropy_with_grad",
        "cross_entropy_backward_into",
    }


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_the_forward_follows_the_incoming_gradient_last_seen(
    target: torch.device, tmp_path: Path, reduction: str
) -> None:
    """After a backward whose incoming gradient was not 1 (a loss divided for gradient accumulation), the next forward
    keeps row statistics instead of computing the gradient, which that backward would compute again; after one of 1
    it computes the gradient again. The gradients are torch's throughout."""
    log = tmp_path / "log.csv"
    kernelgate.configure(log_path=log)
    logits = _logits((6, 129), torch.float32, target).requires_grad_()
    labels = _target(6, 129, target, ignored=(1,))
    runs = []
    for scale in (0.25, 0.25, 1.0, 1.0):
        seen = len(_eager_rows(log)) if log.exists() else 0
        loss = cross_entropy(logits, labels, None, IGNORE, 0.1, reduction)
        (dx,) = torch.autograd.grad(loss * scale if scale != 1.0 else loss, logits)
        expected = torch.autograd.grad(
            F.cross_entropy(logits, labels, ignore_index=IGNORE, label_smoothing=0.1, reduction=reduction) * scale,
            logits,
        )[0]
        assert_close(
            dx, expected, reduction_length=cross_entropy.reduction_length(logits, labels, None, IGNORE, 0.1, reduction)
        )
        if target.type == "cuda":
            torch.cuda.synchronize(target)  # the observation is read only once the device has copied it
        runs.append({op for op, _ in _eager_rows(log)[seen:]})
    fused = {"cross_entropy_with_grad", "cross_entropy_backward_into"}
    with_stats = {"cross_entropy_with_stats", "cross_entropy_backward"}
    assert runs == [fused, with_stats, with_stats, fused]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("n_classes", [129, 20000], ids=["single_block", "looped"])
def test_backward_into_writes_nothing_for_a_unit_gradient(target: torch.device, reduction: str, n_classes: int) -> None:
    """cross_entropy_backward_into leaves dlogits alone where the incoming gradient is 1 (it already is the gradient),
    and for another gradient overwrites every element with cross_entropy_backward's result."""
    args = _args(_logits((4, n_classes), torch.float32, target), _target(4, n_classes, target), None, 0.1, reduction)
    sentinel = torch.full((4, n_classes), 7.0, device=target)
    dlogits = sentinel.clone()
    cross_entropy_backward_into(torch.tensor(1.0, device=target), *args, dlogits)
    assert torch.equal(dlogits, sentinel)
    grad = torch.tensor(-2.5, device=target)
    dlogits = torch.full((4, n_classes), float("nan"), device=target)
    cross_entropy_backward_into(grad, *args, dlogits)
    expected = cross_entropy_backward.reference(grad, *args)
    assert_close(dlogits, expected, reduction_length=cross_entropy.reduction_length(*args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("shape", "weighted", "label_smoothing", "reduction"), [c for c in CONFIG_CASES if c[3] != "none"]
)
def test_every_config_of_backward_into_matches_the_reference(
    target: torch.device,
    shape: tuple[int, int],
    weighted: str | None,
    label_smoothing: float,
    reduction: str,
    dtype: torch.dtype,
) -> None:
    """Every configuration of cross_entropy_backward_into writes cross_entropy_backward's gradient into a NaN-filled
    dlogits for an incoming gradient other than 1."""
    logits = _logits(shape, dtype, target)
    args = (
        logits, _target(*shape, target), _weight(shape[1], target) if weighted else None, IGNORE, label_smoothing,
        reduction,
    )  # fmt: skip
    grad = _logits((), dtype, target, seed=6)
    expected = cross_entropy_backward.reference(grad, *args)
    ran = set()
    for impl in cross_entropy_backward_into.implementations:
        dlogits = torch.full_like(logits, float("nan"))
        values = (grad, *args, dlogits)
        if impl.supports is not None and impl.supports(*values) is not None:
            continue
        for config in distinct_configs(impl, values, target.type == "cpu"):
            dlogits.fill_(float("nan"))
            run_candidate(impl, config, values, target.type == "cpu", poison=True)
            assert compare(dlogits, expected, cross_entropy.reduction_length(*args)) is None, (impl.name, config)
            ran.add(impl.name)
    assert ran


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("n_classes", [129, 20000], ids=["single_block", "looped"])
def test_a_second_backward_of_the_graph_recomputes(target: torch.device, reduction: str, n_classes: int) -> None:
    """With retain_graph=True the first backward uses the forward's gradient and a second one, finding it taken,
    recomputes it from the logits: both are torch's."""
    logits = _logits((5, n_classes), torch.float32, target).requires_grad_()
    labels = _target(5, n_classes, target)
    loss = cross_entropy(logits, labels, None, IGNORE, 0.1, reduction)
    (first,) = torch.autograd.grad(loss * 3, logits, retain_graph=True)
    (second,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (third,) = torch.autograd.grad(loss * 0.5, logits)
    xr = logits.detach().clone().requires_grad_()
    (expected,) = torch.autograd.grad(F.cross_entropy(xr, labels, label_smoothing=0.1, reduction=reduction), xr)
    length = n_classes + 5
    assert_close(first, 3 * expected, reduction_length=length)
    assert_close(second, expected, reduction_length=length)
    assert_close(third, 0.5 * expected, reduction_length=length)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_create_graph_differentiates_the_gradient(target: torch.device, reduction: str) -> None:
    """With create_graph=True the backward recomputes the gradient from the logits, with a graph: the gradient and a
    second derivative through it are torch's."""
    logits = _logits((5, 40), torch.float32, target).requires_grad_()
    labels = _target(5, 40, target)
    direction = _logits((5, 40), torch.float32, target, seed=3)
    (dx,) = torch.autograd.grad(cross_entropy(logits, labels, None, IGNORE, 0.1, reduction), logits, create_graph=True)
    (second,) = torch.autograd.grad((dx * direction).sum(), logits)
    xr = logits.detach().clone().requires_grad_()
    loss = F.cross_entropy(xr, labels, label_smoothing=0.1, reduction=reduction)
    (expected,) = torch.autograd.grad(loss, xr, create_graph=True)
    (expected_second,) = torch.autograd.grad((expected * direction).sum(), xr)
    assert_close(dx, expected.detach(), reduction_length=45)
    assert_close(second, expected_second, reduction_length=45)


def test_the_forward_gradient_is_kept_outside_the_saved_tensors() -> None:
    """For a reduced loss the forward saves its inputs through autograd (version counters checked) and keeps its
    gradient beside them: saved-tensor hooks see the inputs only."""
    logits = torch.randn(4, 9, requires_grad=True)
    labels, weight = torch.tensor([1, 2, 3, 4]), torch.rand(9)
    loss, saved = _saved_by_autograd(logits, labels, weight, IGNORE, 0.1, "mean")
    assert sorted(t.data_ptr() for t in saved) == sorted(t.data_ptr() for t in (logits, labels, weight))
    loss.backward()
    xr = logits.detach().clone().requires_grad_()
    F.cross_entropy(xr, labels, weight, label_smoothing=0.1).backward()
    assert_close(logits.grad, xr.grad, reduction_length=13)


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("n_classes", [32000, 128256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fused", "with_stats"])
def test_eager_autograd_does_not_synchronise(reduction: str, n_classes: int, dtype: torch.dtype) -> None:
    """Forward and backward of a reduced loss, for an incoming gradient of 1 and of 3, never wait for the GPU: float32
    logits (the gradient computed in the forward) and bfloat16 (row statistics)."""
    kernelgate.configure(tune=False)
    device = torch.device("cuda")
    logits = _logits((64, n_classes), dtype, device).requires_grad_()
    labels = _target(64, n_classes, device, ignored=(1, 5))
    with kernelgate.use_mode("triton"):
        cross_entropy(logits, labels, None, IGNORE, 0.0, reduction).backward()  # compiles and plans first
        (cross_entropy(logits, labels, None, IGNORE, 0.0, reduction) * 3).backward()
        logits.grad = None
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            cross_entropy(logits, labels, None, IGNORE, 0.0, reduction).backward()
            (cross_entropy(logits, labels, None, IGNORE, 0.0, reduction) * 3).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # The gradient accumulates in the logits' dtype over the two backwards: measure it against torch doing the
    # same, with float64 as the truth, not against one float32 gradient under float32's tolerance.
    accumulated = {}
    for accumulate in (dtype, torch.float64):
        x = logits.detach().to(accumulate).requires_grad_()
        F.cross_entropy(x, labels, ignore_index=IGNORE, reduction=reduction).backward()
        (F.cross_entropy(x, labels, ignore_index=IGNORE, reduction=reduction) * 3).backward()
        accumulated[accumulate] = x.grad
    assert logits.grad is not None
    assert_no_worse(logits.grad, accumulated[dtype], accumulated[torch.float64])


def test_the_interpreters_fma_probe_ignores_the_default_dtype() -> None:
    """The probe of the interpreter's fma rounding runs in float32 under torch.set_default_dtype(torch.float64) too:
    in float64 (1 + 2**-23) squared is exact, so the probe said "rounds twice" and the exp2 sums were turned off."""
    probe = cross_entropy_module._interpreter_rounds_fma_once.__wrapped__
    expected = probe()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert probe() == expected
    finally:
        torch.set_default_dtype(previous)
