"""What ``kernelgate bench`` needs to know about each op: inputs at a suite shape, bytes moved, peers.

One :class:`BenchSpec` per op, listed in :data:`SPECS`. A spec takes effect only when its op is
registered (:func:`kernelgate.registered_ops`), so specs of ops that are not part of this build
wait for them. The eager implementation is always the op's own reference; ``compile`` is
``torch.compile`` of that reference.

Byte counts are minimal: every input read once and every output written once (``e`` is the element
size of the dtype, shapes are named in ``dims``). A forward+backward count is the forward's plus a
backward that reads what it needs once and writes each gradient once.

>>> spec = spec_for("softmax")
>>> spec.forward_bytes.formula, spec.forward_bytes.count((4096, 4096), 2)
('2*M*N*e: read x, write y', 67108864)
>>> spec.rows_and_length((4096, 4096))
(4096, 4096)
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from typing import Any

import torch

from kernelgate.rowwise import MAX_SINGLE_BLOCK

__all__ = ["SPECS", "BenchSpec", "Bytes", "Rereads", "bench_specs", "spec_for"]


@dataclasses.dataclass(frozen=True)
class Bytes:
    """A minimal byte count: its formula as text, and as a function of (suite shape, element size)."""

    formula: str
    count: Callable[[tuple[int, ...], int], int]


@dataclasses.dataclass(frozen=True)
class Rereads:
    """The bytes a row-wise op's kernels move beyond the minimal count where they stream each row twice.

    ``forward``: a forward implementation whose name ends in ``looped`` (a first pass for the row's statistics,
    a second that writes); ``None`` where a looped forward reads each row once. ``backward``: an implementation of
    ``backward_op``, the op whose kernels form the gradient, other than one of ``single_pass`` (the looped and
    split backwards read each row for its sums, then again for the gradient; the single-block and split_rows ones
    hold a row's blocks in registers while they take its sums, and read it once); where a row does not say which
    ran, one at rows longer than ``one_block``, which no single-block kernel takes (``None``: no guess, where a
    single-pass kernel may take any length). ``gradient`` names
    ``backward_op``'s kernels in a row's note and the summary: ``"backward"``, or cross_entropy's ``"forward with
    the gradient"`` (under eager autograd its forward forms the gradient, reading a long row a second time in its
    looped kernel). The summary of ``kernelgate bench`` compares a miss with the bound these set at the copy rate,
    every pass from memory.
    """

    forward: Bytes | None
    backward: Bytes
    backward_op: str
    one_block: int | None = MAX_SINGLE_BLOCK
    single_pass: tuple[str, ...] = ("single_block", "split_rows")
    gradient: str = "backward"


def _rows_by_last(shape: tuple[int, ...]) -> tuple[int, int]:
    return math.prod(shape[:-1]), shape[-1]


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """How to benchmark one op.

    Attributes:
        op: the registered op's name.
        family: which group of the suite file gives its shapes when the file has no group named
            after the op (``rowwise``, ``cross_entropy``, ``rotary``).
        dims: names of the numbers of a suite shape, e.g. ``("M", "N")`` for rows x row length.
        make_args: ``make_args(shape, dtype, device) -> args``: random arguments in the op's order.
        grad_args: positions of the arguments whose gradients forward+backward computes.
        forward_bytes: minimal bytes of the forward pass.
        forward_backward_bytes: minimal bytes of forward plus backward.
        liger: ``liger(args) -> fn``: a function taking the op's arguments and calling Liger-Kernel's
            counterpart (prepared once per shape from ``args``); raises ``ImportError`` when the
            installed Liger-Kernel lacks it. ``None``: Liger-Kernel has no counterpart.
        layout: ``layout(shape) -> (rows, row_length)`` for the CSV and the plots.
        rereads: the bytes its kernels move beyond the minimal count where they stream rows twice
            (:class:`Rereads`); ``None`` where none do.
    """

    op: str
    family: str
    dims: tuple[str, ...]
    make_args: Callable[[tuple[int, ...], torch.dtype, torch.device], tuple[Any, ...]]
    grad_args: tuple[int, ...]
    forward_bytes: Bytes
    forward_backward_bytes: Bytes
    liger: Callable[[tuple[Any, ...]], Callable[..., Any]] | None = None
    layout: Callable[[tuple[int, ...]], tuple[int, int]] = _rows_by_last
    rereads: Rereads | None = None

    def rows_and_length(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """``(rows, row_length)`` of a suite shape."""
        return self.layout(shape)


def _liger(module: str, name: str) -> Any:
    """``liger_kernel.ops.<module>.<name>``; ``ImportError`` when this Liger-Kernel lacks it."""
    try:
        return getattr(importlib.import_module(f"liger_kernel.ops.{module}"), name)
    except AttributeError as err:
        raise ImportError(f"liger_kernel.ops.{module} has no {name}") from err


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=dtype)


# --- row-wise ops: shape (M, N) --------------------------------------------------------------------

ROWWISE = ("M", "N")

SOFTMAX_BYTES = (
    Bytes("2*M*N*e: read x, write y", lambda s, e: 2 * s[0] * s[1] * e),
    Bytes(
        "5*M*N*e: forward 2*M*N*e; backward reads y and dy, writes dx",
        lambda s, e: 5 * s[0] * s[1] * e,
    ),
)


def _mn(s: tuple[int, ...], e: int) -> int:
    return s[0] * s[1] * e


# softmax's looped forward reads x twice (an online max-and-sum pass, then a normalising one); its looped backward
# reads y and dy for sum(dy * y), then both again. log_softmax's backward first reads dy alone, for sum(dy).
SOFTMAX_REREADS = Rereads(
    Bytes("M*N*e: x read again", _mn),
    Bytes("2*M*N*e: y and dy read again", lambda s, e: 2 * _mn(s, e)),
    "softmax_backward",
)
LOG_SOFTMAX_REREADS = Rereads(
    Bytes("M*N*e: x read again", _mn), Bytes("M*N*e: dy read again", _mn), "log_softmax_backward"
)
# The norms' looped forwards take the row's statistics, then normalise it (add_rms_norm's reads back the sum s it
# stored); their looped and split backwards take each row's sums, then read x (s) and dy again for dx.
_NORM_FORWARD_REREADS = Bytes("M*N*e: x read again", _mn)
_NORM_BACKWARD_REREADS = Bytes("2*M*N*e: x and dy read again", lambda s, e: 2 * _mn(s, e))
RMS_NORM_REREADS = Rereads(_NORM_FORWARD_REREADS, _NORM_BACKWARD_REREADS, "rms_norm_backward")
LAYER_NORM_REREADS = Rereads(_NORM_FORWARD_REREADS, _NORM_BACKWARD_REREADS, "layer_norm_backward")
ADD_RMS_NORM_REREADS = Rereads(
    Bytes("M*N*e: the sum s read back", _mn),
    Bytes("2*M*N*e: s and dy read again", lambda s, e: 2 * _mn(s, e)),
    "add_rms_norm_backward",
)


def _softmax_args(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    return _randn(shape, dtype, device), -1


def _liger_softmax(args: tuple[Any, ...]) -> Callable[..., Any]:
    LigerSoftmaxFunction = _liger("softmax", "LigerSoftmaxFunction")

    return lambda x, dim: LigerSoftmaxFunction.apply(x)


def _rms_norm_args(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    return _randn(shape, dtype, device), _randn(shape[-1:], dtype, device), 1e-6


def _liger_rms_norm(args: tuple[Any, ...]) -> Callable[..., Any]:
    LigerRMSNormFunction = _liger("rms_norm", "LigerRMSNormFunction")

    # Offset 0, casting mode "llama", not in place (in place would overwrite the upstream gradient).
    return lambda x, weight, eps: LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", False)


def _layer_norm_args(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    n = shape[-1]
    return _randn(shape, dtype, device), (n,), _randn((n,), dtype, device), _randn((n,), dtype, device), 1e-5


def _liger_layer_norm(args: tuple[Any, ...]) -> Callable[..., Any]:
    LigerLayerNormFunction = _liger("layer_norm", "LigerLayerNormFunction")

    return lambda x, normalized_shape, weight, bias, eps: LigerLayerNormFunction.apply(x, weight, bias, eps)


def _add_rms_norm_args(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    return _randn(shape, dtype, device), _randn(shape, dtype, device), _randn(shape[-1:], dtype, device), 1e-6


def _liger_add_rms_norm(args: tuple[Any, ...]) -> Callable[..., Any]:
    LigerFusedAddRMSNormFunction = _liger("fused_add_rms_norm", "LigerFusedAddRMSNormFunction")

    return lambda x, residual, weight, eps: LigerFusedAddRMSNormFunction.apply(
        x, residual, weight, eps, 0.0, "llama", False
    )


def _gated_args(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    return _randn(shape, dtype, device), _randn(shape, dtype, device)


def _geglu_args(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    # The tanh approximation: the form models use (and the one Liger-Kernel implements).
    return (*_gated_args(shape, dtype, device), "tanh")


def _liger_swiglu(args: tuple[Any, ...]) -> Callable[..., Any]:
    LigerSiLUMulFunction = _liger("swiglu", "LigerSiLUMulFunction")

    return lambda gate, up: LigerSiLUMulFunction.apply(gate, up)


def _liger_geglu(args: tuple[Any, ...]) -> Callable[..., Any]:
    LigerGELUMulFunction = _liger("geglu", "LigerGELUMulFunction")

    return lambda gate, up, approximate: LigerGELUMulFunction.apply(gate, up)


GATED_BYTES = (
    Bytes("3*M*N*e: read gate and up, write y", lambda s, e: 3 * s[0] * s[1] * e),
    Bytes(
        "8*M*N*e: forward 3*M*N*e; backward reads gate, up and dy, writes dgate and dup",
        lambda s, e: 8 * s[0] * s[1] * e,
    ),
)

# --- cross entropy: shape (M, V), int64 targets -----------------------------------------------------

# cross_entropy's looped forward streams a row once (an online log-sum-exp). Under eager autograd of a reduced
# loss its forward forms the gradient (cross_entropy_with_grad): the looped kernel then reads the row again to
# write it, and split_looped each segment (mostly from L2), where split_rows holds the row in registers and
# single_block holds it whole.
CROSS_ENTROPY_REREADS = Rereads(
    None,
    Bytes("M*V*e: the logits read again for the gradient", lambda s, e: s[0] * s[1] * e),
    "cross_entropy_with_grad",
    one_block=None,  # split_rows reads a row of any length once
    gradient="forward with the gradient",
)


def _cross_entropy_args(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    rows, vocab = shape
    target = torch.randint(0, vocab, (rows,), device=device)
    return _randn(shape, dtype, device), target, None, -100, 0.0, "mean"


def _liger_cross_entropy(args: tuple[Any, ...]) -> Callable[..., Any]:
    LigerCrossEntropyFunction = _liger("cross_entropy", "LigerCrossEntropyFunction")

    def call(
        logits: torch.Tensor,
        target: torch.Tensor,
        weight: torch.Tensor | None,
        ignore_index: int,
        label_smoothing: float,
        reduction: str,
    ) -> Any:
        # Liger-Kernel computes the gradient during the forward pass and writes it into the
        # logits' storage; recent versions also return a z-loss beside the loss.
        out = LigerCrossEntropyFunction.apply(logits, target, weight, ignore_index, 0.0, label_smoothing, reduction)
        return out[0] if isinstance(out, tuple) else out

    return call


# --- rotary embedding: shape (B, S, Hq, Hk, D), q (B, S, Hq, D), k (B, S, Hk, D), cos/sin (S, D/2) --


def _rotary_args(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    batch, seq, q_heads, k_heads, head_dim = shape
    angle = torch.rand((seq, head_dim // 2), device=device) * 2 * math.pi
    q = _randn((batch, seq, q_heads, head_dim), dtype, device)
    k = _randn((batch, seq, k_heads, head_dim), dtype, device)
    return q, k, angle.cos().to(dtype), angle.sin().to(dtype), False


def _liger_rotary(args: tuple[Any, ...]) -> Callable[..., Any]:
    LigerRopeFunction = _liger("rope", "LigerRopeFunction")

    # Liger-Kernel takes (B, H, S, D) views and cos/sin of (1, S, D) with the halves repeated
    # (the rotate-half form, as interleaved=False here). Prepared once, outside the timing.
    cos, sin = args[2], args[3]
    cos_full = torch.cat([cos, cos], dim=-1).unsqueeze(0)
    sin_full = torch.cat([sin, sin], dim=-1).unsqueeze(0)

    def call(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> Any:
        return LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), cos_full, sin_full)

    return call


def _rotary_layout(shape: tuple[int, ...]) -> tuple[int, int]:
    batch, seq, q_heads, k_heads, head_dim = shape
    return batch * seq * (q_heads + k_heads), head_dim


def _rotary_tensors(s: tuple[int, ...]) -> int:
    return s[0] * s[1] * (s[2] + s[3]) * s[4]


SPECS: tuple[BenchSpec, ...] = (
    BenchSpec(
        "softmax",
        "rowwise",
        ROWWISE,
        _softmax_args,
        (0,),
        *SOFTMAX_BYTES,
        liger=_liger_softmax,
        rereads=SOFTMAX_REREADS,
    ),
    BenchSpec("log_softmax", "rowwise", ROWWISE, _softmax_args, (0,), *SOFTMAX_BYTES, rereads=LOG_SOFTMAX_REREADS),
    BenchSpec(
        "rms_norm",
        "rowwise",
        ROWWISE,
        _rms_norm_args,
        (0, 1),
        Bytes("(2*M*N + N)*e: read x and weight, write y", lambda s, e: (2 * s[0] * s[1] + s[1]) * e),
        Bytes(
            "(5*M*N + 3*N)*e: forward (2*M*N + N)*e; backward reads x, dy and weight, writes dx and dweight",
            lambda s, e: (5 * s[0] * s[1] + 3 * s[1]) * e,
        ),
        liger=_liger_rms_norm,
        rereads=RMS_NORM_REREADS,
    ),
    BenchSpec(
        "layer_norm",
        "rowwise",
        ROWWISE,
        _layer_norm_args,
        (0, 2, 3),
        Bytes("(2*M*N + 2*N)*e: read x, weight and bias, write y", lambda s, e: (2 * s[0] * s[1] + 2 * s[1]) * e),
        Bytes(
            "(5*M*N + 5*N)*e: forward (2*M*N + 2*N)*e; backward reads x, dy and weight, writes dx, dweight, dbias",
            lambda s, e: (5 * s[0] * s[1] + 5 * s[1]) * e,
        ),
        liger=_liger_layer_norm,
        rereads=LAYER_NORM_REREADS,
    ),
    BenchSpec(
        "add_rms_norm",
        "rowwise",
        ROWWISE,
        _add_rms_norm_args,
        (0, 1, 2),
        Bytes(
            "(4*M*N + N)*e: read x, residual and weight, write y and s = x + residual",
            lambda s, e: (4 * s[0] * s[1] + s[1]) * e,
        ),
        Bytes(
            "(8*M*N + 3*N)*e: forward (4*M*N + N)*e; backward reads s, dy, ds and weight, writes one M*N "
            "gradient (dx = dresidual) and dweight",
            lambda s, e: (8 * s[0] * s[1] + 3 * s[1]) * e,
        ),
        liger=_liger_add_rms_norm,
        rereads=ADD_RMS_NORM_REREADS,
    ),
    BenchSpec("swiglu", "rowwise", ROWWISE, _gated_args, (0, 1), *GATED_BYTES, liger=_liger_swiglu),
    BenchSpec("geglu", "rowwise", ROWWISE, _geglu_args, (0, 1), *GATED_BYTES, liger=_liger_geglu),
    BenchSpec(
        "cross_entropy",
        "cross_entropy",
        ("M", "V"),
        _cross_entropy_args,
        (0,),
        Bytes("M*V*e + 8*M: read logits and int64 targets, write a scalar", lambda s, e: s[0] * s[1] * e + 8 * s[0]),
        Bytes(
            "2*M*V*e + 8*M: read logits and targets once, write dlogits once (a fused kernel forms the "
            "gradient in the forward pass)",
            lambda s, e: 2 * s[0] * s[1] * e + 8 * s[0],
        ),
        liger=_liger_cross_entropy,
        rereads=CROSS_ENTROPY_REREADS,
    ),
    BenchSpec(
        "rotary_embedding",
        "rotary",
        ("B", "S", "Hq", "Hk", "D"),
        _rotary_args,
        (0, 1),
        Bytes(
            "2*B*S*(Hq+Hk)*D*e + S*D*e: read q, k, cos and sin (S*D/2 each), write rotated q and k",
            lambda s, e: 2 * _rotary_tensors(s) * e + s[1] * s[4] * e,
        ),
        Bytes(
            "4*B*S*(Hq+Hk)*D*e + 2*S*D*e: the backward is the same rotation by the opposite angle",
            lambda s, e: 4 * _rotary_tensors(s) * e + 2 * s[1] * s[4] * e,
        ),
        liger=_liger_rotary,
        layout=_rotary_layout,
    ),
)


def spec_for(op: str) -> BenchSpec:
    """The bench spec of ``op`` (registered or not); ``KeyError`` when there is none."""
    for spec in SPECS:
        if spec.op == op:
            return spec
    raise KeyError(op)


def bench_specs() -> list[BenchSpec]:
    """The specs whose op is registered in this process, in :data:`SPECS` order."""
    from kernelgate.op import registered_ops

    names = {op.name for op in registered_ops()}
    return [spec for spec in SPECS if spec.op in names]
