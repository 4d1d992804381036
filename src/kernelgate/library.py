"""Every op as a PyTorch operator: ``torch.ops.kernelgate.<name>``, with fake tensors and autograd.

Registration derives the schema from the op's contract, the fake (meta) implementation from its
reference (plain PyTorch runs on fake tensors), and the backward from the op's :class:`Backward`,
or else from autograd of the reference. ``torch.compile`` then traces a call as one node, and the
op's own dispatch (validation, selection per shape bucket, the cache) runs inside that node at run
time, so a compiled graph does not freeze the first shape's decision.

A call from eager code without autograd skips the PyTorch dispatcher (about 6 µs): the op is
entered through ``torch.ops`` only when an input requires grad or ``torch.compile`` is tracing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from kernelgate.contract import ArgSpec, ChoiceArg, DimArg, ScalarArg, ShapeArg, TensorArg
from kernelgate.dispatch import current_overrides, restore_overrides
from kernelgate.errors import DeclarationError
from kernelgate.launch import call_state

if TYPE_CHECKING:
    from kernelgate.op import Op

__all__ = ["NAMESPACE", "Backward", "autograd_function", "register"]

NAMESPACE = "kernelgate"
_library = torch.library.Library(NAMESPACE, "FRAGMENT")  # type: ignore[no-untyped-call]
_defined: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Backward:
    """How an op's gradients are computed (without one, autograd differentiates the reference).

    Attributes:
        save: ``save(inputs, output) -> tuple``: what the backward needs, taken at forward time.
            Tensors in it are saved through autograd (version counters checked); other values are
            kept as they are. Save as little as the gradient needs.
        grads: ``grads(saved, grad_output) -> tuple``: one gradient per op argument, ``None`` for
            arguments that are not differentiable tensors. Typically calls other kernelgate ops
            (a backward op with its own reference, kernels, gate and tuning).
        forward: optionally, an op with the same arguments that returns this op's output followed
            by tensors the backward can reuse (statistics a kernel computes anyway, such as a row's
            log-sum-exp), or ``forward(inputs) -> Op | None`` choosing such an op per call (``None``:
            the op itself). Eager autograd then runs it instead of the op, and appends those tensors
            to what ``save`` returns. A traced call (the PyTorch operator) runs the op itself and
            appends nothing, so ``grads`` must also work without them.
        keep: optionally, ``keep(inputs, extras, forward) -> tuple``: what is appended in place of
            the extra tensors that the op ``forward`` returned. A value that is not a tensor is kept as it is, outside
            autograd's saved tensors (no version-counter check, no saved-tensor hooks): for a tensor
            the backward consumes or modifies in place.
        may_step_eagerly: whether eager autograd of the reference may replace the Function, where the
            step timed both ways is faster, for a forward planned to a kernel (mode ``auto``, see
            ``Op._steps_eagerly``). ``False`` where the Function is there for memory as well as time:
            cross_entropy's reference under autograd keeps float32 probabilities the size of the logits.
    """

    save: Callable[[tuple[Any, ...], Any], tuple[Any, ...]]
    grads: Callable[[tuple[Any, ...], Any], tuple[Any, ...]]
    forward: Op | Callable[[tuple[Any, ...]], Op | None] | None = None
    keep: Callable[[tuple[Any, ...], tuple[Any, ...], Op], tuple[Any, ...]] | None = None
    may_step_eagerly: bool = True

    def forward_op(self, inputs: tuple[Any, ...]) -> Op | None:
        """The op eager autograd runs as the forward of ``inputs`` (``None``: the op itself)."""
        from kernelgate.op import Op

        forward = self.forward
        return forward if forward is None or isinstance(forward, Op) else forward(inputs)

    def kept(self, inputs: tuple[Any, ...], extras: tuple[Any, ...], forward: Op) -> tuple[Any, ...]:
        """What the backward receives after the saved values, for the extra outputs ``extras`` of ``forward``."""
        return extras if self.keep is None else tuple(self.keep(inputs, extras, forward))


def schema(op_name: str, specs: Sequence[ArgSpec], returns: str, mutates: Sequence[str]) -> str:
    """The operator schema of an op, e.g. ``(Tensor x, int dim) -> Tensor``."""
    params = []
    for index, spec in enumerate(specs):
        if isinstance(spec, TensorArg):
            alias = f"(a{index}!)" if spec.name in mutates else ""
            params.append(f"Tensor{alias}{'?' if spec.optional else ''} {spec.name}")
        elif isinstance(spec, DimArg):
            params.append(f"int {spec.name}")
        elif isinstance(spec, ScalarArg):
            kind = {float: "float", int: "int", bool: "bool"}[spec.kind]
            params.append(f"{kind} {spec.name}")
        elif isinstance(spec, ChoiceArg):
            params.append(f"str {spec.name}")
        elif isinstance(spec, ShapeArg):
            params.append(f"SymInt[] {spec.name}")
        else:  # pragma: no cover - validate_specs rejects anything else
            raise DeclarationError(f"op {op_name!r}: cannot express {spec!r} in a schema.")
    return f"({', '.join(params)}) -> {returns}"


def register(op: Op, returns: str) -> Any:
    """Define ``kernelgate::<op.name>`` (once per process) and bind it to ``op``; return the overload.

    The implementation looks the op up by name at call time, so an op re-declared with
    ``replace=True`` takes over the same operator.
    """
    qualname = f"{NAMESPACE}::{op.name}"
    if op.name not in _defined:
        _library.define(op.name + schema(op.name, op.args, returns, op.mutates))  # type: ignore[no-untyped-call]
        _defined.add(op.name)
        # An op declared to return nothing (one that writes in place) may still return what it wrote,
        # so that the gate compares it; the operator returns nothing, as its schema says.
        returns_nothing = returns == "()"

        def run(*args: Any) -> Any:
            from kernelgate.op import inside_torch_op, lookup

            saved, inside_torch_op.active = inside_torch_op.active, True
            try:
                result = lookup(op.name)._call_untraced(args)
            finally:
                inside_torch_op.active = saved
            return None if returns_nothing else result

        def fake(*args: Any) -> Any:
            from kernelgate.op import lookup

            result = lookup(op.name).run_reference(*args)
            return None if returns_nothing else result

        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            from kernelgate.op import lookup

            _setup(lookup(op.name), ctx, inputs, output)

        def backward(ctx: Any, *grad_outputs: Any) -> Any:
            from kernelgate.op import lookup

            return _backward(lookup(op.name), ctx, grad_outputs, ctx.needs_input_grad)

        torch.library.impl(qualname, "CompositeExplicitAutograd", run, lib=_library)
        torch.library.register_fake(qualname, fake, lib=_library)
        if not op.mutates:  # torch registers autograd formulas for functional schemas only
            torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=_library)
    return getattr(torch.ops.kernelgate, op.name).default


def autograd_function(op: Op) -> Any:
    """A ``torch.autograd.Function`` running ``op`` with the operator's save and backward.

    Eager calls that need autograd use it instead of the operator: the same semantics (what is
    saved, version counters, the backward and its modes) without the dispatcher round trip.
    """

    def forward(ctx: Any, route: Any, *args: Any) -> Any:
        # ``route``: the memoised route of this forward (Op.forward_route), or None before the signature's
        # first call or outside modes auto and reference; with it, the forward runs without a new lookup.
        declared = op.backward
        with_extras = declared.forward_op(args) if declared is not None else None
        forward_op = op if with_extras is None else with_extras
        output = forward_op._call_untraced(args) if route is None else forward_op.run_memoised(route, args)
        if declared is None or with_extras is None:
            _setup(op, ctx, args, output)
        else:
            output, *extras = output
            _setup(op, ctx, args, output, declared.kept(args, tuple(extras), with_extras))
        # The signature's first step through the Function: its backward records whether it ran a kernel,
        # and from then on Op._steps_eagerly decides between eager autograd and this Function.
        if route is None:
            route = op.forward_route(args)
        if route is not None and route.backward_reference is None:
            ctx.kernelgate_route = route
        return output

    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        return (None, *_backward(op, ctx, grad_outputs, ctx.needs_input_grad[1:]))

    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    return type(f"KernelgateFunction_{op.name}", (torch.autograd.Function,), methods)


def _setup(op: Op, ctx: Any, inputs: tuple[Any, ...], output: Any, extras: tuple[Any, ...] = ()) -> None:
    saved = (*op.backward.save(inputs, output), *extras) if op.backward is not None else tuple(inputs)
    if all(isinstance(v, torch.Tensor) for v in saved):  # the common case: nothing to interleave
        ctx.save_for_backward(*saved)
        ctx.kernelgate_layout = None
    else:
        ctx.save_for_backward(*(v for v in saved if isinstance(v, torch.Tensor)))
        ctx.kernelgate_layout = [None if isinstance(v, torch.Tensor) else (v,) for v in saved]
    # The backward runs in the modes of the forward call, also on autograd's device threads.
    ctx.kernelgate_overrides = current_overrides()
    ctx.kernelgate_route = None


def _restore(ctx: Any) -> tuple[Any, ...]:
    if ctx.kernelgate_layout is None:
        return tuple(ctx.saved_tensors)
    tensors = iter(ctx.saved_tensors)
    return tuple(next(tensors) if slot is None else slot[0] for slot in ctx.kernelgate_layout)


def _backward(op: Op, ctx: Any, grad_outputs: tuple[Any, ...], needs: Sequence[bool]) -> tuple[Any, ...]:
    saved = _restore(ctx)
    grad = grad_outputs[0] if len(grad_outputs) == 1 else grad_outputs
    overrides = ctx.kernelgate_overrides
    triton_runs, forced_runs = call_state.triton_runs, call_state.forced_runs
    if overrides == current_overrides():  # the same modes here already (the usual case): no context switch
        grads = _grads(op, saved, grad, needs)
    else:
        with restore_overrides(overrides):
            grads = _grads(op, saved, grad, needs)
    route = ctx.kernelgate_route
    if route is not None:
        route.backward_reference = call_state.triton_runs == triton_runs
        route.backward_forced = call_state.forced_runs != forced_runs
    return tuple(g if need else None for g, need in zip(grads, needs, strict=True))


def _grads(op: Op, saved: tuple[Any, ...], grad: Any, needs: Sequence[bool]) -> tuple[Any, ...]:
    if op.backward is not None:
        return tuple(op.backward.grads(saved, grad))
    return _reference_grads(op, saved, grad, needs)


def _reference_grads(op: Op, inputs: tuple[Any, ...], grad: Any, needs: Sequence[bool]) -> tuple[Any, ...]:
    """Gradients by autograd of the reference, recomputed from the saved inputs."""
    with torch.enable_grad():
        leaves = [
            v.detach().requires_grad_(True) if isinstance(v, torch.Tensor) and need else v
            for v, need in zip(inputs, needs, strict=True)
        ]
        output = op.run_reference(*leaves)
        wanted = [leaf for leaf, need in zip(leaves, needs, strict=True) if need]
        outputs = [output] if isinstance(output, torch.Tensor) else list(output)
        grads_out = [grad] if isinstance(grad, torch.Tensor) else list(grad)
        # Only outputs that depend on a wanted input take part: an output without a graph (layer_norm_backward's
        # empty dbias where there is no bias) would make autograd refuse the whole call.
        pairs = [(o, g) for o, g in zip(outputs, grads_out, strict=True) if o.requires_grad]
        if not pairs:
            return tuple(None for _ in needs)
        computed = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True))
    return tuple(next(computed) if need else None for need in needs)
