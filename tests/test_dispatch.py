"""Dispatch: which path a call takes in each mode, and the visible record of every fallback."""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

import kernelgate
from kernelgate import (
    FallbackRecord,
    FallbackWarning,
    Op,
    Plan,
    Reason,
    ScalarArg,
    SettingsError,
    TensorArg,
    TritonImpl,
    TritonUnavailableError,
    backend,
)
from kernelgate.tolerance import assert_close

# --- small ops whose paths record that they ran ------------------------------------------------


def fake_impl(calls: list[str], name: str = "fake", *, delay: float = 0.0, **options: Any) -> TritonImpl:
    """A TritonImpl whose plain-torch launcher computes x * scale and appends ``name`` to ``calls``.

    With ``delay`` (seconds) the launcher sleeps first, so measurement never prefers it to the reference.
    """

    def launcher(x: torch.Tensor, scale: float) -> torch.Tensor:
        calls.append(name)
        if delay:
            time.sleep(delay)
        return x * scale

    return TritonImpl(name, launcher, **options)


def make_op(calls: list[str], *impls: TritonImpl, name: str = "kgtest_scale") -> Op:
    """An unregistered op ``x * scale`` whose reference appends "reference" to ``calls``."""

    def reference(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        calls.append("reference")
        return x * scale

    return Op(
        name, reference=reference, args=(TensorArg("x"), ScalarArg("scale")), implementations=impls, register=False
    )


def cpu_reason() -> str:
    """The reason a CPU call without the interpreter takes the reference on this machine."""
    return str(Reason.CPU_TENSORS if backend.status().gpu else Reason.NO_GPU_DRIVER)


def reload_env(env: dict[str, str]) -> kernelgate.Settings:
    """reload_settings(env), keeping this test's decision-cache directory (never the user's cache)."""
    return kernelgate.reload_settings({"KERNELGATE_CACHE_DIR": str(kernelgate.settings().cache_dir), **env})


def fallback_warnings(record: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, FallbackWarning)]


def test_cpu_tensors_without_interpreter_fall_back() -> None:
    """On CPU tensors without the interpreter, auto mode runs the reference with the machine's reason."""
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls))
    plan = op.plan(torch.ones(3), 2.0)
    assert (plan.implementation, str(plan.reason), plan.path) == (None, cpu_reason(), "reference")
    assert "KERNELGATE_INTERPRET=1" in plan.detail
    with pytest.warns(FallbackWarning):
        assert torch.equal(op(torch.ones(3), 2.0), torch.full((3,), 2.0))
    assert calls == ["reference"]


def test_fallback_warns_once_per_op_and_reason_and_counts_every_call() -> None:
    """A fallback warns on its first call only, points at the caller, and fallbacks() counts both calls."""
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        op(torch.ones(3), 2.0)
        op(torch.ones(3), 2.0)
    [warning] = fallback_warnings(record)
    assert f"kgtest_scale ran the reference implementation ({cpu_reason()})" in str(warning.message)
    assert "KERNELGATE_WARN=0 silences it" in str(warning.message)
    assert warning.filename == __file__, "the warning should point at the user's call"
    detail = op.plan(torch.ones(3), 2.0).detail
    assert kernelgate.fallbacks() == [FallbackRecord("kgtest_scale", cpu_reason(), 2, detail)]
    assert calls == ["reference", "reference"]


def test_fallback_warns_again_for_a_new_reason_a_new_op_or_after_reset() -> None:
    """The once-only warning is keyed by (op, reason): another reason, another op or reset_fallbacks warns again."""
    calls: list[str] = []
    first, second = make_op(calls, fake_impl(calls)), make_op(calls, fake_impl(calls), name="kgtest_other")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first(torch.ones(3), 2.0)
        first(torch.ones(3), 2.0)
        second(torch.ones(3), 2.0)
        with kernelgate.use_interpreter():
            first(torch.ones(3, dtype=torch.float64), 2.0)
            first(torch.ones(3, dtype=torch.float64), 2.0)
        kernelgate.reset_fallbacks()
        first(torch.ones(3), 2.0)
    messages = [str(w.message) for w in fallback_warnings(record)]
    assert len(messages) == 4
    assert [m.split(" ran ")[0] for m in messages] == [
        "kernelgate: kgtest_scale",
        "kernelgate: kgtest_other",
        "kernelgate: kgtest_scale",
        "kernelgate: kgtest_scale",
    ]
    assert "(dtype-unsupported)" in messages[2]
    assert [(r.op, r.reason, r.count) for r in kernelgate.fallbacks()] == [("kgtest_scale", cpu_reason(), 1)]


@pytest.mark.parametrize(
    "silence",
    [lambda: kernelgate.configure(warn_fallback=False), lambda: reload_env({"KERNELGATE_WARN": "0"})],
    ids=["configure", "env"],
)
def test_warn_off_still_counts(silence: Callable[[], object]) -> None:
    """With warnings off (configure or KERNELGATE_WARN=0) a fallback emits no warning but is still counted."""
    silence()
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        op(torch.ones(3), 2.0)
        op(torch.ones(3), 2.0)
    assert fallback_warnings(record) == []
    assert [(r.op, r.reason, r.count) for r in kernelgate.fallbacks()] == [("kgtest_scale", cpu_reason(), 2)]


# --- modes -------------------------------------------------------------------------------------


def test_mode_reference_runs_reference_without_recording_a_fallback() -> None:
    """Mode "reference" runs the reference even where Triton could run, and records no fallback and no warning."""
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls))
    with kernelgate.use_interpreter(), kernelgate.use_mode("reference"), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert op.plan(torch.ones(3), 2.0).reason is Reason.MODE_REFERENCE
        assert torch.equal(op(torch.ones(3), 3.0), torch.full((3,), 3.0))
    assert calls == ["reference"]
    assert kernelgate.fallbacks() == []
    assert fallback_warnings(record) == []


def test_mode_triton_runs_the_implementation() -> None:
    """Mode "triton" tunes an eligible implementation (reason "tuned"), then runs it from the stored decision."""
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls))
    with kernelgate.use_interpreter(), kernelgate.use_mode("triton"):
        plan = op.plan(torch.ones(3), 2.0)
        assert (plan.name, plan.path, plan.reason) == ("fake", "interpreter", Reason.TUNED)
        assert "fake" in calls, "tuning gated and timed the implementation"
        calls.clear()
        assert torch.equal(op(torch.ones(3), 2.0), torch.full((3,), 2.0))
        assert op.plan(torch.ones(3), 2.0).reason is Reason.CACHED
    assert calls == ["fake"]


@pytest.mark.parametrize(
    ("interpret", "x", "with_impl", "reason"),
    [
        (False, torch.ones(3), True, None),
        (True, torch.ones(3, dtype=torch.float64), True, "dtype-unsupported"),
        (True, torch.ones(0), True, "empty-tensor"),
        (True, torch.ones(3), False, "no-implementation"),
    ],
    ids=["cpu", "dtype", "empty", "no-implementation"],
)
def test_mode_triton_without_eligible_implementation_raises(
    interpret: bool, x: torch.Tensor, with_impl: bool, reason: str | None
) -> None:
    """Mode "triton" raises TritonUnavailableError (a RuntimeError) naming the reason, and runs nothing."""
    reason = reason or cpu_reason()
    calls: list[str] = []
    op = make_op(calls, *([fake_impl(calls)] if with_impl else []))
    message = (
        rf"^kgtest_scale\(\): mode 'triton' was requested, but no Triton implementation can run these "
        rf"inputs: {reason}: .*\. Use mode 'auto' to fall back to the reference, or change the inputs\.$"
    )
    with (
        kernelgate.use_interpreter(interpret),
        kernelgate.use_mode("triton"),
        pytest.raises(TritonUnavailableError, match=message) as info,
    ):
        op(x, 2.0)
    assert isinstance(info.value, RuntimeError)
    assert calls == []
    assert kernelgate.fallbacks() == []


def _plan_reason(op: Op) -> Reason | str:
    return op.plan(torch.ones(3), 2.0).reason


def test_mode_from_environment() -> None:
    """KERNELGATE_MODE=reference (read by reload_settings) sends calls to the reference."""
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls))
    reload_env({"KERNELGATE_MODE": "reference"})
    assert kernelgate.settings().mode == "reference"
    with kernelgate.use_interpreter():
        assert _plan_reason(op) is Reason.MODE_REFERENCE
        op(torch.ones(3), 2.0)
    assert calls == ["reference"]


def test_mode_precedence() -> None:
    """Precedence, most specific first: use_mode(op=...), the op's own mode, use_mode() for all ops, KERNELGATE_MODE."""
    calls: list[str] = []
    # The implementation is far slower than the reference, so the three modes plan three different
    # reasons: "triton" runs it (tuned, then cached), "auto" measures the reference faster.
    op = make_op(calls, fake_impl(calls, delay=0.005))
    reload_env({"KERNELGATE_MODE": "reference"})
    with kernelgate.use_interpreter():
        assert _plan_reason(op) is Reason.MODE_REFERENCE
        with kernelgate.use_mode("triton"):
            assert _plan_reason(op) is Reason.TUNED, "use_mode() beats KERNELGATE_MODE"
            op.set_mode("reference")
            assert op.mode == "reference"
            assert _plan_reason(op) is Reason.MODE_REFERENCE, "the op's mode beats use_mode()"
            with kernelgate.use_mode("auto", op=op):
                assert _plan_reason(op) is Reason.REFERENCE_FASTER, "use_mode(op=...) beats the op's mode"
                with kernelgate.use_mode("reference"):
                    assert _plan_reason(op) is Reason.REFERENCE_FASTER, "an inner use_mode() does not beat op=..."
            assert _plan_reason(op) is Reason.MODE_REFERENCE, "leaving use_mode(op=...) restores the op's mode"
            op.set_mode(None)
            assert op.mode is None
            assert _plan_reason(op) is Reason.CACHED, "set_mode(None) follows the global mode again"
        assert _plan_reason(op) is Reason.MODE_REFERENCE, "leaving use_mode() restores KERNELGATE_MODE"


def test_the_first_use_mode_reaches_a_call_memoised_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Until use_mode or use_interpreter is first entered, a call reads no context variable; a signature memoised
    before then still takes the mode of the first use_mode entered."""
    monkeypatch.setattr(kernelgate.dispatch, "overridden", False)
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls))
    op(torch.ones(3), 2.0)
    assert calls == ["reference"] and not kernelgate.dispatch.overridden
    with kernelgate.use_mode("triton"), pytest.raises(TritonUnavailableError, match=cpu_reason()):
        op(torch.ones(3), 2.0)
    assert kernelgate.dispatch.overridden


def test_the_first_use_interpreter_reaches_a_call_memoised_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signature memoised before any use_interpreter (here: refused in the op's mode triton, on CPU tensors) runs
    its implementation through the interpreter inside the first use_interpreter entered."""
    monkeypatch.setattr(kernelgate.dispatch, "overridden", False)
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls))
    op.set_mode("triton")
    with pytest.raises(TritonUnavailableError, match=cpu_reason()):
        op(torch.ones(3), 2.0)
    with kernelgate.use_interpreter():
        assert torch.equal(op(torch.ones(3), 2.0), torch.full((3,), 2.0))
    assert calls[-1] == "fake"
    assert kernelgate.dispatch.overridden


def test_use_mode_for_one_op_leaves_other_ops_alone() -> None:
    """use_mode(mode, op=name) changes only the op called name."""
    calls: list[str] = []
    mine, other = make_op(calls, fake_impl(calls)), make_op(calls, fake_impl(calls), name="kgtest_other")
    kernelgate.configure(tune=False)  # the untouched op runs its implementation, untimed
    with kernelgate.use_interpreter(), kernelgate.use_mode("reference", op=other):
        assert _plan_reason(mine) is Reason.DEFAULT_CONFIG
        assert _plan_reason(other) is Reason.MODE_REFERENCE
        mine(torch.ones(3), 2.0)
        other(torch.ones(3), 2.0)
    assert calls == ["fake", "reference"]


def test_op_mode_attribute_can_be_assigned() -> None:
    """Assigning op.mode directly pins the op's mode, like set_mode."""
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls))
    op.mode = "reference"
    with kernelgate.use_interpreter():
        op(torch.ones(3), 2.0)
    assert calls == ["reference"]
    assert kernelgate.fallbacks() == []


def test_modes_are_case_and_space_insensitive() -> None:
    """Mode strings are read after stripping spaces and lower-casing."""
    assert kernelgate.reload_settings({"KERNELGATE_MODE": " Reference "}).mode == "reference"
    assert kernelgate.configure(mode="TRITON").mode == "triton"


@pytest.mark.parametrize(
    ("set_mode", "source"),
    [
        (lambda: kernelgate.reload_settings({"KERNELGATE_MODE": "fast"}), "KERNELGATE_MODE"),
        (lambda: kernelgate.configure(mode="fast"), "mode"),
        (lambda: kernelgate.use_mode("fast").__enter__(), r"use_mode\(mode\)"),
        (lambda: kernelgate.softmax.set_mode("fast"), r"softmax\.set_mode\(mode\)"),
    ],
    ids=["env", "configure", "use_mode", "set_mode"],
)
def test_invalid_mode(set_mode: Callable[[], object], source: str) -> None:
    """An unknown mode is a SettingsError (a ValueError) naming its source, the modes and the value received."""
    with pytest.raises(
        SettingsError, match=rf"^{source} must be one of auto, reference, triton, check; got 'fast'\. Use 'auto' to let"
    ) as info:
        set_mode()
    assert isinstance(info.value, ValueError)
    assert kernelgate.settings().mode == "auto"
    assert kernelgate.softmax.mode is None


# --- fallback reasons --------------------------------------------------------------------------


def _requires_grad() -> torch.Tensor:
    return torch.ones(3).requires_grad_()


@pytest.mark.parametrize(
    ("make_x", "options", "reason", "detail"),
    [
        (lambda: torch.ones(3, dtype=torch.float64), {}, "dtype-unsupported", r"fake handles .*, not torch\.float64"),
        (lambda: torch.ones(3, 0), {}, "empty-tensor", r"an input is empty \(shape \(3, 0\)\)"),
        (lambda: torch.ones(9), {"max_numel": 8}, "too-many-elements", r"at most 8 elements; an input has 9"),
        (
            lambda: torch.ones(4, 10)[:, :2],
            {"max_numel": 8},
            "too-many-elements",
            r"an input has 8 \(index extent 32\)",
        ),
        (
            lambda: torch.ones(3),
            {"supports": lambda x, scale: "rows are too long"},
            "shape-unsupported",
            r"^fake: rows are too long$",
        ),
        (_requires_grad, {}, "requires-grad", r"requires grad"),
    ],
    ids=["dtype", "empty", "numel", "index-extent", "supports", "requires-grad"],
)
def test_fallback_reasons(
    make_x: Callable[[], torch.Tensor], options: dict[str, Any], reason: str, detail: str
) -> None:
    """Inputs the only implementation cannot run take the reference with the matching reason, counted once."""
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls, **options))
    x = make_x()
    with kernelgate.use_interpreter(), pytest.warns(FallbackWarning, match=rf"\({reason}\)"):
        plan = op.plan(x, 2.0)
        result = op(x, 2.0)
    assert (plan.implementation, str(plan.reason)) == (None, reason)
    assert plan.path == "reference"
    assert re.search(detail, plan.detail), plan.detail
    assert calls == ["reference"]
    assert_close(result.detach(), x.detach() * 2.0)
    assert [(r.op, r.reason, r.count) for r in kernelgate.fallbacks()] == [("kgtest_scale", reason, 1)]


def test_limits_admit_inputs_within_them() -> None:
    """Inputs at max_numel, in float16, strided within the limit, or requiring grad under no_grad run the impl."""
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls, max_numel=8))
    kernelgate.configure(tune=False)  # each call runs the implementation once, untimed
    with kernelgate.use_interpreter(), kernelgate.use_mode("triton"):
        op(torch.ones(8), 2.0)
        op(torch.ones(2, 4, dtype=torch.float16), 2.0)
        op(torch.ones(2, 4)[:, :2], 2.0)
        with torch.no_grad():
            op(torch.ones(3).requires_grad_(), 2.0)
    assert calls == ["fake"] * 4


def test_no_tensor_argument_falls_back() -> None:
    """A call whose only tensor argument is None takes the reference with reason "no-tensors"."""
    calls: list[str] = []

    def reference(x: torch.Tensor | None) -> int:
        calls.append("reference")
        return 0

    op = Op(
        "kgtest_optional",
        reference=reference,
        args=(TensorArg("x", optional=True),),
        implementations=(TritonImpl("fake", lambda x: calls.append("fake")),),
        register=False,
    )
    with kernelgate.use_interpreter(), pytest.warns(FallbackWarning, match=r"\(no-tensors\)"):
        assert op.plan(None).reason is Reason.NO_TENSORS
        assert op(None) == 0
    assert calls == ["reference"]


@pytest.mark.parametrize(
    ("op", "args"),
    [(kernelgate.softmax, (-1,)), (kernelgate.softmax, (0,)), (kernelgate.rms_norm, (None, 1e-6))],
    ids=["softmax", "softmax-dim0", "rms_norm"],
)
def test_real_op_refuses_2_31_elements_without_allocating(op: Op, args: tuple[Any, ...]) -> None:
    """A built-in op plans "too-many-elements" for an expanded tensor of 2**31 elements, which is never materialised."""
    x = torch.zeros(1, dtype=torch.float16).expand(2**16, 2**15)
    assert x.numel() == 2**31
    with kernelgate.use_interpreter():
        plan = op.plan(x, *args)
    assert str(plan.reason) == "too-many-elements"
    assert "an input has 2147483648" in plan.detail
    assert x.untyped_storage().nbytes() == 2


def test_supports_refusal_tries_the_next_implementation() -> None:
    """When the first implementation's supports predicate refuses, the next one runs, and no fallback is recorded."""
    calls: list[str] = []
    seen: list[tuple[Any, ...]] = []

    def refuse(x: torch.Tensor, scale: float) -> str:
        seen.append((x.shape, scale))
        return "too wide"

    first = fake_impl(calls, "first", supports=refuse)
    second = fake_impl(calls, "second")
    op = make_op(calls, first, second)
    kernelgate.configure(tune=False)
    with kernelgate.use_interpreter():
        plan = op.plan(torch.ones(3), 5.0)
        assert (plan.implementation, plan.reason) == (second, Reason.DEFAULT_CONFIG)
        op(torch.ones(3), 5.0)
    assert calls == ["second"]
    assert seen == [(torch.Size([3]), 5.0)] * 2, "supports receives the op's arguments"
    assert kernelgate.fallbacks() == []


def test_first_eligible_implementation_in_order() -> None:
    """With tuning off, the first eligible implementation in declaration order runs; a later one when earlier refuse."""
    calls: list[str] = []
    op = make_op(
        calls,
        fake_impl(calls, "half_only", dtypes=(torch.float16,)),
        fake_impl(calls, "any_float"),
        fake_impl(calls, "last"),
    )
    kernelgate.configure(tune=False)
    with kernelgate.use_interpreter():
        assert op.plan(torch.ones(3), 2.0).reason is Reason.DEFAULT_CONFIG
        op(torch.ones(3, dtype=torch.float16), 2.0)
        op(torch.ones(3), 2.0)
        assert op.plan(torch.ones(3, dtype=torch.float64), 2.0).detail.startswith("half_only handles")
    assert calls == ["half_only", "any_float"]


def test_plan_runs_nothing() -> None:
    """plan() with tuning off, or for a decided bucket, returns the Plan without running the launcher or reference."""
    calls: list[str] = []
    impl = fake_impl(calls)
    op = make_op(calls, impl)
    kernelgate.configure(tune=False)
    with kernelgate.use_interpreter():
        plan = op.plan(torch.ones(3), 2.0)
    assert isinstance(plan, Plan)
    assert (plan.implementation, plan.reason, plan.interpret, plan.config) == (impl, Reason.DEFAULT_CONFIG, True, None)
    assert (plan.path, plan.name, plan.device) == ("interpreter", "fake", torch.device("cpu"))
    assert repr(plan) == (
        "Plan(path='interpreter', implementation='fake', reason='default-config', "
        "detail='tuning is off (KERNELGATE_TUNE=off)')"
    )
    fallback = op.plan(torch.ones(3), 2.0)
    assert (fallback.path, fallback.name) == ("reference", "reference")
    assert calls == []
    kernelgate.configure(tune=True)
    with kernelgate.use_interpreter(), kernelgate.use_mode("triton"):
        op(torch.ones(3), 2.0)  # tunes the bucket and stores the decision
        calls.clear()
        decided = op.plan(torch.ones(3), 2.0)
    assert (decided.name, decided.reason, decided.key) == ("fake", Reason.CACHED, plan.key)
    assert calls == []
    assert kernelgate.fallbacks() == []


# --- a real Triton kernel through the interpreter ----------------------------------------------

BLOCK = 16


@triton.jit
def _add_one_fwd_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y[i] = x[i] + 1. Grid: (cdiv(n, BLOCK), k); programs along axis 1 repeat the same writes."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def add_one_op(calls: list[str], outputs: list[torch.Tensor], grid_y: int = 1) -> Op:
    """An op x + 1 whose launcher runs _add_one_fwd_kernel on a grid with grid_y programs along axis 1."""

    def reference(x: torch.Tensor) -> torch.Tensor:
        calls.append("reference")
        return x + 1

    def launcher(x: torch.Tensor) -> torch.Tensor:
        calls.append("launcher")
        flat = x.contiguous().view(-1)
        y = torch.full_like(flat, float("nan"))
        outputs.append(y)
        grid = (kernelgate.cdiv(flat.numel(), BLOCK), grid_y)
        kernelgate.launch(_add_one_fwd_kernel, grid, flat, y, flat.numel(), BLOCK=BLOCK, num_warps=1)
        return y.view(x.shape)

    impl = TritonImpl("add_one", launcher, (_add_one_fwd_kernel,))
    return Op("kgtest_add_one", reference=reference, args=(TensorArg("x"),), implementations=(impl,), register=False)


@pytest.mark.parametrize("shape", [(1,), (37,), (3, 5)])
def test_real_triton_kernel_runs_on_cpu_through_the_interpreter(shape: tuple[int, ...]) -> None:
    """A @triton.jit kernel launched with kernelgate.launch computes its result on CPU tensors under use_interpreter."""
    calls: list[str] = []
    outputs: list[torch.Tensor] = []
    op = add_one_op(calls, outputs, grid_y=2)
    x = torch.randn(shape)
    with kernelgate.use_interpreter(), kernelgate.use_mode("triton"):
        plan = op.plan(x)  # tunes: the kernel runs through the interpreter to be gated and timed
        assert (plan.path, plan.reason) == ("interpreter", Reason.TUNED)
        calls.clear()
        outputs.clear()
        y = op(x)
    assert calls == ["launcher"]
    assert y.data_ptr() == outputs[0].data_ptr(), "the result is the kernel's output buffer"
    assert_close(y, x + 1)


def test_grid_over_the_hardware_limit_falls_back_without_launching() -> None:
    """A launch on a grid of 70000 programs along axis 1 falls back with "grid-too-large"; the kernel never runs."""
    calls: list[str] = []
    outputs: list[torch.Tensor] = []
    op = add_one_op(calls, outputs, grid_y=70000)
    x = torch.randn(5)
    with kernelgate.use_interpreter(), pytest.warns(FallbackWarning, match=r"\(grid-too-large\)"):
        y = op(x)
    # The gate's reference result, the launcher refusing during the gate, the call's reference run.
    assert calls == ["reference", "launcher", "reference"]
    assert outputs[0].isnan().all(), "the kernel must not have written its output"
    assert_close(y, x + 1)
    [entry] = kernelgate.fallbacks()
    assert (entry.reason, entry.count) == ("grid-too-large", 1)
    assert entry.detail == "grid axis 1 needs 70000 programs; the hardware allows 65535"


def test_grid_over_the_hardware_limit_in_mode_triton_raises() -> None:
    """In mode "triton" a grid over the hardware limit is a TritonUnavailableError naming "grid-too-large"."""
    calls: list[str] = []
    op = add_one_op(calls, [], grid_y=70000)
    with (
        kernelgate.use_interpreter(),
        kernelgate.use_mode("triton"),
        pytest.raises(TritonUnavailableError, match=r"grid-too-large: grid axis 1 needs 70000 programs"),
    ):
        op(torch.randn(5))
    assert calls == ["reference", "launcher"], "the gate's reference result, then the launcher refusing"


# --- settings ----------------------------------------------------------------------------------


def test_bad_interpret_value() -> None:
    """A KERNELGATE_INTERPRET value that is not a boolean word is a SettingsError listing the accepted words."""
    with pytest.raises(
        SettingsError,
        match=r"^KERNELGATE_INTERPRET must be one of 1, 0, true, false, yes, no, on, off; got 'maybe'\.$",
    ):
        kernelgate.reload_settings({"KERNELGATE_INTERPRET": "maybe"})


def test_interpret_from_environment_and_override() -> None:
    """KERNELGATE_INTERPRET=1 interprets the Triton implementations, and use_interpreter(False) overrides it."""
    calls: list[str] = []
    op = make_op(calls, fake_impl(calls))
    reload_env({"KERNELGATE_INTERPRET": "yes", "KERNELGATE_TUNE": "off"})
    assert op.plan(torch.ones(3), 2.0).path == "interpreter"
    with kernelgate.use_interpreter(False):
        assert str(op.plan(torch.ones(3), 2.0).reason) == cpu_reason()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"unknown": 1},
            r"^configure\(\) got unknown setting\(s\) unknown; known: cache_dir, check_action, check_every, ",
        ),
        ({"interpret": "yes"}, r"^interpret must be a bool; got 'yes'\.$"),
        ({"warn_fallback": 1}, r"^warn_fallback must be a bool; got 1\.$"),
    ],
    ids=["unknown", "interpret-str", "warn-int"],
)
def test_configure_rejects_bad_settings(changes: dict[str, Any], message: str) -> None:
    """configure() rejects unknown names and badly typed values with a SettingsError, and keeps the old settings."""
    before = kernelgate.settings()
    with pytest.raises(SettingsError, match=message):
        kernelgate.configure(**changes)
    assert kernelgate.settings() == before


def test_use_mode_rejects_an_unknown_op_name() -> None:
    """use_mode(op="name") with a name no registered op has raises SettingsError instead of doing nothing."""
    unknown = pytest.raises(kernelgate.SettingsError, match=r"use_mode\(op='softmx'\): no op named 'softmx'")
    with unknown, kernelgate.use_mode("reference", op="softmx"):
        pass


def test_use_mode_by_registered_name() -> None:
    """use_mode(op="softmax") pins the registered op named softmax."""
    kernelgate.configure(tune=False)
    with kernelgate.use_interpreter(), kernelgate.use_mode("reference", op="softmax"):
        assert kernelgate.softmax.plan(torch.ones(3)).reason is Reason.MODE_REFERENCE
        assert kernelgate.rms_norm.plan(torch.ones(3), None).reason is Reason.DEFAULT_CONFIG
