"""torch.jit.trace of code that calls an op: the trace records the op, never a kernel's output as a constant."""

from __future__ import annotations

import pytest
import torch

import kernelgate
from kernelgate import Op, TensorArg
from kernelgate.tolerance import assert_close

# torch.jit.trace is deprecated in torch's favour of torch.compile and torch.export, and still in use.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")


class _Norm(torch.nn.Module):
    """A module with a weight, traced as a model's layer is."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(torch.randn(40, generator=generator).to(device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernelgate.softmax(kernelgate.rms_norm(x, self.weight, 1e-6), -1) * 2


def _reference(module: _Norm, x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.nn.functional.rms_norm(x, (40,), module.weight, 1e-6), -1) * 2


def test_a_traced_module_calls_the_ops_and_runs_their_kernels(target: torch.device) -> None:
    """The traced graph calls kernelgate::rms_norm and kernelgate::softmax, so a new input gets its own outputs and
    gradients (computed by the kernels: the target's mode is triton). Before, tracing raised AttributeError from
    the input checks, which read sizes that the trace records as tensors."""
    module = _Norm(target)
    generator = torch.Generator().manual_seed(0)
    traced = torch.jit.trace(module, (torch.randn(4, 40, generator=generator).to(target),))
    called = {node.kind() for node in traced.graph.nodes()}
    assert {"kernelgate::rms_norm", "kernelgate::softmax"} <= called, called
    x = torch.randn(4, 40, generator=generator).to(target).requires_grad_()
    got = traced(x)
    expected = _reference(module, x)
    assert_close(got, expected, reduction_length=40)
    incoming = torch.randn(got.shape, generator=generator).to(target)
    got_grads = torch.autograd.grad(got, (x, module.weight), incoming)
    expected_grads = torch.autograd.grad(expected, (x, module.weight), incoming)
    for ours, theirs in zip(got_grads, expected_grads, strict=True):
        assert_close(ours, theirs, reduction_length=40)


def test_bad_input_while_tracing_gets_the_ops_error() -> None:
    """The input checks run with the trace paused, so a bad argument gets the op's own error."""
    x = torch.randn(4, 40)
    with pytest.raises(kernelgate.InputValueError, match=r"argument 'dim' must be in \[-2, 1\]"):
        torch.jit.trace(lambda t: kernelgate.softmax(t, 5), (x,))


def test_an_unregistered_op_is_traced_through_its_reference() -> None:
    """An op without a torch operator (register=False) runs its reference while traced, whose torch ops the trace
    records: a counted fallback (jit-trace), refused in mode triton with an error that says why."""
    double = Op("kgtest_traced_double", reference=lambda x: x * 2 + 1, args=(TensorArg("x"),), register=False)
    kernelgate.configure(warn_fallback=False)
    traced = torch.jit.trace(double, (torch.zeros(3),))
    assert "aten::mul" in {node.kind() for node in traced.graph.nodes()}
    x = torch.arange(3.0)
    assert torch.equal(traced(x), x * 2 + 1)
    assert any(r.op == "kgtest_traced_double" and r.reason == "jit-trace" for r in kernelgate.fallbacks())
    with kernelgate.use_mode("triton"), pytest.raises(kernelgate.TritonUnavailableError, match="jit-trace"):
        torch.jit.trace(double, (torch.zeros(3),))
