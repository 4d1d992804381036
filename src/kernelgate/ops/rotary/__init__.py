"""rotary_embedding: declaration, launcher and the op object ``kernelgate.rotary_embedding``.

The layout and conventions are those of :mod:`kernelgate.ops.rotary.reference`: ``q`` and ``k`` of
shape ``(batch, seq, heads, head_dim)`` (different head counts allowed), ``cos``/``sin`` of shape
``(seq, head_dim // 2)`` or ``(batch or 1, seq, head_dim // 2)``, ``interleaved`` choosing GPT-J's
pairs over rotate-half.

Gradients: the rotation's transpose is the rotation by the opposite angle, so ``dq`` and ``dk``
are this same op applied to the output gradients with ``-sin`` (negating the small angle table is
the only extra work): one pass over the gradients, nothing saved but ``cos`` and ``sin``. ``cos``
and ``sin`` are treated as constants unless one of them requires grad; then every gradient comes
from autograd of the reference (saving ``q`` and ``k`` for it).
"""

from __future__ import annotations

from typing import Any

import torch

from kernelgate.bucket import pow2
from kernelgate.config import Config, ConfigSpace
from kernelgate.contract import ScalarArg, TensorArg
from kernelgate.errors import InputValueError
from kernelgate.launch import LazyKernel, as_contiguous, cdiv, empty, launch, next_power_of_2, num_warps_for
from kernelgate.library import Backward
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.rotary.reference import check_rotary_shapes, rotary_embedding_reference
from kernelgate.rowwise import per_thread_ok

__all__ = ["rotary_embedding"]

# The kernels are imported on first launch: `import kernelgate` works without Triton. The helper
# is listed with the kernel so that its source is hashed into tuning decisions too.
ROTARY_FWD = LazyKernel("kernelgate.ops.rotary.kernels", "_rotary_embedding_fwd_kernel")
ROTARY_HEADS = LazyKernel("kernelgate.ops.rotary.kernels", "_rotary_embedding_heads")

# One program holds BLOCK_H heads of one position in registers; head_dim beyond this takes the reference.
MAX_HEAD_DIM = 16384
# Elements (both halves of BLOCK_H heads) per program when untuned: enough to keep loads wide.
DEFAULT_TILE = 2048
CONFIGS = ConfigSpace(BLOCK_H=(1, 2, 4, 8, 16, 32), num_warps=(1, 2, 4, 8))


def _block_half(head_dim: int) -> int:
    return next_power_of_2(head_dim // 2)


def _tile(config: Config, head_dim: int) -> int:
    return int(config["BLOCK_H"]) * 2 * _block_half(head_dim)


def _unit_last_stride(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t``, or a contiguous copy (recorded) when its last dimension is strided: the kernel reads features in runs."""
    return as_contiguous(t, name) if t.shape[-1] > 1 and t.stride(-1) != 1 else t


def _angle_strides(t: torch.Tensor) -> tuple[int, int]:
    """(batch stride, seq stride) of ``cos``/``sin``; the batch stride is 0 when the angles are shared."""
    if t.dim() == 2:
        return 0, t.stride(0)
    return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1)


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = _unit_last_stride(q, "q"), _unit_last_stride(k, "k")
    cos, sin = _unit_last_stride(cos, "cos"), _unit_last_stride(sin, "sin")
    batch, seq, n_q_heads, head_dim = q.shape
    n_k_heads = k.shape[2]
    q_out = empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous: heads head_dim apart
    k_out = empty(k.shape, dtype=k.dtype, device=k.device)
    block_h = config["BLOCK_H"]
    n_q_blocks = cdiv(n_q_heads, block_h)
    n_blocks = n_q_blocks + cdiv(n_k_heads, block_h)
    launch(
        ROTARY_FWD, (batch * seq * n_blocks,),
        q, k, cos, sin, q_out, k_out, seq, n_q_heads, n_k_heads, head_dim // 2, n_q_blocks, n_blocks,
        *q.stride()[:3], *k.stride()[:3], *_angle_strides(cos), *_angle_strides(sin),
        INTERLEAVED=interleaved, BLOCK_H=block_h, BLOCK_HALF=_block_half(head_dim),
        num_warps=config["num_warps"],
        enable_fp_fusion=False,  # products rounded one by one, as the reference does: equal in float32
    )  # fmt: skip
    return q_out, k_out


def _supports(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> str | None:
    # The shape rules the contract cannot state raise here as in the reference: this runs once per
    # input signature before the launcher, which therefore never sees such inputs.
    check_rotary_shapes(q, k, cos, sin)
    if q.shape[-1] > MAX_HEAD_DIM:
        return f"head_dim {q.shape[-1]} exceeds the {MAX_HEAD_DIM} one program holds"
    return None


def _prune(config: Config, q: torch.Tensor, k: torch.Tensor, *_: Any) -> bool:
    """No block of heads beyond the head counts, and a tile the warps share without spilling."""
    heads = max(q.shape[2], k.shape[2])
    return config["BLOCK_H"] <= next_power_of_2(heads) and per_thread_ok(
        _tile(config, q.shape[-1]), config["num_warps"]
    )


def _default_config(q: torch.Tensor, k: torch.Tensor, *_: Any) -> Config:
    """About DEFAULT_TILE elements per program, 16 per thread (two 16-byte loads of 16-bit data)."""
    head_dim = q.shape[-1]
    per_head = 2 * _block_half(head_dim)
    block_h = min(next_power_of_2(max(q.shape[2], k.shape[2])), max(1, DEFAULT_TILE // per_head), 32)
    return {"BLOCK_H": block_h, "num_warps": num_warps_for(block_h * per_head, elements_per_thread=16, hi=8)}


def _bucket(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
) -> tuple[int, int, int, int, bool]:
    """Positions rounded up to a power of two; head counts and head_dim exact (fixed by a model)."""
    return pow2(q.shape[0] * q.shape[1]), q.shape[2], k.shape[2], q.shape[3], interleaved


def _make_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """q of ``shape`` padded to ``(batch, seq, heads, head_dim)`` with leading 1s, k with a quarter of
    q's heads (or ``shape = (batch, seq, q_heads, k_heads, head_dim)``, the benchmark's form); an odd
    head_dim is rounded up; float32 angles ``s / 10000 ** (2i / head_dim)``."""
    if len(shape) > 5:
        raise InputValueError(
            f"rotary_embedding: a shape for make_inputs has at most 5 sizes (batch, seq, q_heads, k_heads, "
            f"head_dim); got {tuple(shape)}. Pass e.g. 4x4096x32x8x128, or 4x4096x32x128 for k with 8 heads."
        )
    if len(shape) == 5:
        batch, seq, n_heads, n_k_heads, head_dim = shape
    else:
        batch, seq, n_heads, head_dim = (1,) * (4 - len(shape)) + tuple(shape)
        n_k_heads = max(1, n_heads // 4)
    head_dim += head_dim % 2
    q = torch.randn(batch, seq, n_heads, head_dim, device=device).to(dtype)
    k = torch.randn(batch, seq, n_k_heads, head_dim, device=device).to(dtype)
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.arange(seq, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return q, k, angles.cos(), angles.sin(), False


def _save(inputs: tuple[Any, ...], outputs: Any) -> tuple[Any, ...]:
    q, k, cos, sin, interleaved = inputs
    if cos.requires_grad or sin.requires_grad:
        return q, k, cos, sin, interleaved
    return cos, sin, interleaved


def _reference_grads(saved: tuple[Any, ...], grad_q: torch.Tensor, grad_k: torch.Tensor) -> tuple[Any, ...]:
    """Every gradient, cos's and sin's included, by autograd of the reference."""
    q, k, cos, sin, interleaved = saved
    with torch.enable_grad():
        leaves = tuple(t.detach().requires_grad_(True) for t in (q, k, cos, sin))
        outputs = rotary_embedding_reference(leaves[0], leaves[1], leaves[2], leaves[3], interleaved)
        grads = torch.autograd.grad(outputs, leaves, (grad_q, grad_k))
    return (*grads, None)


def _grads(saved: tuple[Any, ...], grad: tuple[torch.Tensor, torch.Tensor]) -> tuple[Any, ...]:
    grad_q, grad_k = grad
    if len(saved) == 5:
        return _reference_grads(saved, grad_q, grad_k)
    cos, sin, interleaved = saved
    # The transpose of a rotation by +angle is the rotation by -angle: the same cos, sin negated.
    dq, dk = rotary_embedding(grad_q, grad_k, cos, -sin, interleaved)
    return dq, dk, None, None, None


rotary_embedding = Op(
    "rotary_embedding",
    reference=rotary_embedding_reference,
    args=(
        TensorArg("q", rank=4),
        TensorArg("k", rank=4, sizes={0: ("q", 0), 1: ("q", 1), 3: ("q", 3)}),
        TensorArg("cos", min_rank=2, sizes={-2: ("q", 1)}),
        TensorArg("sin", same_shape_as="cos"),
        ScalarArg("interleaved", kind=bool),
    ),
    implementations=(
        TritonImpl(
            "per_position",
            _launch,
            (ROTARY_FWD, ROTARY_HEADS),
            supports=_supports,
            configs=CONFIGS,
            default_config=_default_config,
            prune=_prune,
        ),
    ),
    bucket=_bucket,
    # Each output is a sum of two products.
    reduction_length=lambda *args: 2,
    backward=Backward(save=_save, grads=_grads),
    returns="(Tensor, Tensor)",
    make_inputs=_make_inputs,
)
