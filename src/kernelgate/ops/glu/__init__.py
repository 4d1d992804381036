"""swiglu and geglu: declarations, launchers and the op objects ``kernelgate.swiglu`` and ``kernelgate.geglu``.

Both are elementwise over rows: the launchers see ``gate`` and ``up`` as rows with their own row
strides (the two halves of a packed ``[gate | up]`` tensor are two pointers into its rows), and
contiguous separate inputs as one long row, so no program idles at row ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from kernelgate.bucket import aligned16, pow2
from kernelgate.config import Config, ConfigSpace
from kernelgate.contract import ChoiceArg, TensorArg
from kernelgate.launch import LazyKernel, as_rows, cdiv, empty, launch, next_power_of_2
from kernelgate.library import Backward
from kernelgate.op import INT32_LIMIT, Op, TritonImpl
from kernelgate.ops.glu.reference import (
    check_glu_shapes,
    geglu_backward_reference,
    geglu_reference,
    output_shape,
    swiglu_backward_reference,
    swiglu_reference,
)

__all__ = ["geglu", "geglu_backward", "swiglu", "swiglu_backward"]

# The kernels are imported on first launch: `import kernelgate` works without Triton.
_KERNELS = "kernelgate.ops.glu.kernels"
# One kernel pair for both ops; the activation is a compile-time constant.
GLU_FWD = LazyKernel(_KERNELS, "_glu_fwd_kernel")
GLU_BWD = LazyKernel(_KERNELS, "_glu_bwd_kernel")

BLOCKS = (256, 512, 1024, 2048, 4096)
CONFIGS = ConfigSpace(BLOCK=BLOCKS, num_warps=(2, 4, 8))
# Elements each thread handles per tensor: at least 4 (a 16-byte float32 access), at most 16.
MIN_PER_THREAD, MAX_PER_THREAD = 4, 16
# Column offsets reach one block past the last element: keep them within 32 bits.
MAX_NUMEL = INT32_LIMIT - max(BLOCKS)


def _prune(config: Config, n_cols: int) -> bool:
    """Whether ``config`` suits rows of ``n_cols``: no block longer than the row (beyond the smallest)."""
    block, per_thread = config["BLOCK"], config["BLOCK"] // (32 * config["num_warps"])
    return block <= max(BLOCKS[0], next_power_of_2(n_cols)) and MIN_PER_THREAD <= per_thread <= MAX_PER_THREAD


def _default_config(n_cols: int) -> Config:
    """About 8 elements per thread in blocks of up to 1024."""
    block = min(1024, max(BLOCKS[0], next_power_of_2(n_cols)))
    return {"BLOCK": block, "num_warps": 2 if block == BLOCKS[0] else 4}


class _Operand(NamedTuple):
    """A tensor as rows: pass ``tensor`` as the pointer, rows ``stride`` elements apart."""

    tensor: torch.Tensor
    stride: int


class _Layout(NamedTuple):
    """How the launchers see the tensors of one call: operands as (pointer, row stride), and the row shape."""

    operands: tuple[_Operand, ...]
    n_rows: int
    n_cols: int


def _is_flat(gate: torch.Tensor, up: torch.Tensor | None, grad: torch.Tensor | None = None) -> bool:
    """Whether the launch sees one row of all elements: separate, contiguous tensors."""
    return up is not None and all(t is None or t.is_contiguous() for t in (grad, gate, up))


def _layout(gate: torch.Tensor, up: torch.Tensor | None, grad: torch.Tensor | None = None) -> _Layout:
    """``(grad,) gate, up`` as operands of ``n_rows`` rows of ``n_cols`` (the output's last dim).

    Separate contiguous tensors are one row of all elements; a packed ``gate`` gives two operands,
    its halves, with the row stride of ``gate``.
    """
    if _is_flat(gate, up, grad):
        return _Layout(tuple(_Operand(t, 0) for t in (grad, gate, up) if t is not None), 1, gate.numel())
    rows = as_rows(gate, "gate")
    operands = []
    for name, t in (("grad", grad), ("gate", gate), ("up", up)):
        if t is not None:
            r = rows if t is gate else as_rows(t, name)
            operands.append(_Operand(r.tensor, r.stride if r.n_rows > 1 else 0))
    n_cols = rows.n_cols
    if up is None:  # [gate | up]: the second half starts n_cols // 2 elements into each row
        n_cols //= 2
        packed = operands[-1]
        operands.append(_Operand(packed.tensor[..., n_cols:], packed.stride))
    return _Layout(tuple(operands), rows.n_rows, n_cols)


def _grid(layout: _Layout, block: int) -> tuple[tuple[int], int]:
    n_col_blocks = cdiv(layout.n_cols, block)
    return (layout.n_rows * n_col_blocks,), n_col_blocks


def _run_forward(
    op: str, kernel: LazyKernel, gate: torch.Tensor, up: torch.Tensor | None, config: Config, **meta: Any
) -> torch.Tensor:
    check_glu_shapes(op, gate, up)
    layout = _layout(gate, up)
    dtype = gate.dtype if up is None else torch.promote_types(gate.dtype, up.dtype)
    y = empty(output_shape(gate, up), dtype=dtype, device=gate.device)  # contiguous
    (g, stride_gm), (u, stride_um) = layout.operands
    grid, n_col_blocks = _grid(layout, config["BLOCK"])
    stride_ym = layout.n_cols if layout.n_rows > 1 else 0
    launch(
        kernel, grid, g, u, y, stride_gm, stride_um, stride_ym, layout.n_cols, n_col_blocks,
        BLOCK=config["BLOCK"], num_warps=config["num_warps"], **meta,
    )  # fmt: skip
    return y


def _run_backward(
    op: str,
    kernel: LazyKernel,
    grad: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor | None,
    config: Config,
    **meta: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_glu_shapes(op, gate, up, grad)
    layout = _layout(gate, up, grad)
    (dy, stride_dym), (g, stride_gm), (u, stride_um) = layout.operands
    if up is None:  # one gradient [dgate | dup], written by halves: no concatenation afterwards
        d = empty(gate.shape, dtype=gate.dtype, device=gate.device)
        dg, du, rest = d, d[..., layout.n_cols :], gate.new_empty(0)
        stride_dm = 2 * layout.n_cols if layout.n_rows > 1 else 0
    else:
        dg = empty(gate.shape, dtype=gate.dtype, device=gate.device)
        du = rest = empty(up.shape, dtype=up.dtype, device=up.device)
        stride_dm = layout.n_cols if layout.n_rows > 1 else 0
    grid, n_col_blocks = _grid(layout, config["BLOCK"])
    launch(
        kernel, grid, dy, g, u, dg, du, stride_dym, stride_gm, stride_um, stride_dm, stride_dm, layout.n_cols,
        n_col_blocks, BLOCK=config["BLOCK"], num_warps=config["num_warps"], **meta,
    )  # fmt: skip
    return dg, rest


def _n_cols(gate: torch.Tensor, up: torch.Tensor | None) -> int:
    """The output's last dimension (1 for a 0-dim output)."""
    if gate.dim() == 0:
        return 1
    return int(gate.shape[-1]) if up is not None else int(gate.shape[-1]) // 2


def _bucket(gate: torch.Tensor, up: torch.Tensor | None) -> tuple[int, int, bool, bool]:
    """Rows and output row length rounded up to powers of two, whether the length is a multiple of 16, packed."""
    n = _n_cols(gate, up)
    n_rows = gate.numel() // max(gate.shape[-1] if gate.dim() else 1, 1)
    return pow2(n_rows), pow2(n), aligned16(n), up is None


def _launch_cols(gate: torch.Tensor, up: torch.Tensor | None, grad: torch.Tensor | None = None) -> int:
    """The row length the kernel sees: every element for one flat row, else the output's last dimension."""
    return gate.numel() if _is_flat(gate, up, grad) else _n_cols(gate, up)


def _impl(launcher: Callable[..., Any], kernel: LazyKernel, tensors: Callable[..., tuple[Any, ...]]) -> TritonImpl:
    """The one implementation of a GLU op; ``tensors(*args)`` picks out ``(gate, up)`` or ``(gate, up, grad)``."""
    return TritonImpl(
        "elementwise",
        launcher,
        (kernel,),
        max_numel=MAX_NUMEL,
        configs=CONFIGS,
        default_config=lambda *args: _default_config(_launch_cols(*tensors(*args))),
        prune=lambda config, *args: _prune(config, _launch_cols(*tensors(*args))),
    )


# --- swiglu --------------------------------------------------------------------------------------


def _launch_swiglu(gate: torch.Tensor, up: torch.Tensor | None = None, *, config: Config) -> torch.Tensor:
    return _run_forward("swiglu", GLU_FWD, gate, up, config, ACTIVATION="silu")


def _launch_swiglu_backward(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor | None = None, *, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    return _run_backward("swiglu_backward", GLU_BWD, grad, gate, up, config, ACTIVATION="silu")


def _make_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(shape, device=device).to(dtype), torch.randn(shape, device=device).to(dtype)


def _make_backward_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.randn(shape, device=device).to(dtype), *_make_inputs(shape, dtype, device))


def _glu_grads(backward: Op, saved: tuple[Any, ...], grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """(dgate, dup, None for each option); a packed gate's gradient holds both halves."""
    gate, up, *options = saved
    dgate, dup = backward(grad, gate, up, *options)
    return (dgate, dup if up is not None else None, *(None for _ in options))


_GLU_ARGS = (TensorArg("gate"), TensorArg("up", optional=True, same_shape_as="gate"))
_GLU_BACKWARD_ARGS = (TensorArg("grad"), *_GLU_ARGS)

swiglu_backward = Op(
    "swiglu_backward",
    reference=swiglu_backward_reference,
    args=_GLU_BACKWARD_ARGS,
    implementations=(_impl(_launch_swiglu_backward, GLU_BWD, lambda grad, gate, up: (gate, up, grad)),),
    bucket=lambda grad, gate, up: _bucket(gate, up),
    returns="(Tensor, Tensor)",
    make_inputs=_make_backward_inputs,
)

swiglu = Op(
    "swiglu",
    reference=swiglu_reference,
    args=_GLU_ARGS,
    implementations=(_impl(_launch_swiglu, GLU_FWD, lambda gate, up: (gate, up)),),
    bucket=_bucket,
    # The gradient needs only the inputs (held by autograd anyway): silu is recomputed in the
    # backward kernel rather than kept, so the forward allocates nothing extra.
    backward=Backward(
        save=lambda inputs, y: tuple(inputs), grads=lambda saved, grad: _glu_grads(swiglu_backward, saved, grad)
    ),
    make_inputs=_make_inputs,
)


# --- geglu ---------------------------------------------------------------------------------------


def _gelu_activation(approximate: str) -> str:
    return "gelu_tanh" if approximate == "tanh" else "gelu"


def _launch_geglu(
    gate: torch.Tensor, up: torch.Tensor | None = None, approximate: str = "none", *, config: Config
) -> torch.Tensor:
    return _run_forward("geglu", GLU_FWD, gate, up, config, ACTIVATION=_gelu_activation(approximate))


def _launch_geglu_backward(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor | None = None, approximate: str = "none", *, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    return _run_backward("geglu_backward", GLU_BWD, grad, gate, up, config, ACTIVATION=_gelu_activation(approximate))


_APPROXIMATE = ChoiceArg("approximate", ("none", "tanh"))

geglu_backward = Op(
    "geglu_backward",
    reference=geglu_backward_reference,
    args=(*_GLU_BACKWARD_ARGS, _APPROXIMATE),
    implementations=(_impl(_launch_geglu_backward, GLU_BWD, lambda grad, gate, up, approximate: (gate, up, grad)),),
    bucket=lambda grad, gate, up, approximate: (*_bucket(gate, up), approximate),
    returns="(Tensor, Tensor)",
    make_inputs=lambda shape, dtype, device: (*_make_backward_inputs(shape, dtype, device), "none"),
)

geglu = Op(
    "geglu",
    reference=geglu_reference,
    args=(*_GLU_ARGS, _APPROXIMATE),
    implementations=(_impl(_launch_geglu, GLU_FWD, lambda gate, up, approximate: (gate, up)),),
    bucket=lambda gate, up, approximate: (*_bucket(gate, up), approximate),
    backward=Backward(
        save=lambda inputs, y: tuple(inputs), grads=lambda saved, grad: _glu_grads(geglu_backward, saved, grad)
    ),
    make_inputs=lambda shape, dtype, device: (*_make_inputs(shape, dtype, device), "none"),
)
