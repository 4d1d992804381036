"""Triton kernels of swiglu and geglu: elementwise over rows that are contiguous, ``stride_*m`` apart.

Every kernel runs on a 1-D grid of ``n_rows * n_col_blocks`` programs; program ``p`` covers
columns ``[(p % n_col_blocks) * BLOCK, ... + BLOCK)`` of row ``p // n_col_blocks``. Contiguous
inputs come as one row of every element (no lane wasted at row ends); the halves of a packed
``[gate | up]`` tensor come as two pointers into the same rows. Arithmetic in float32.

The activations are written as the torch kernels write them, so infinities and NaN come out where
torch's do: ``silu(x) = x / (1 + exp(-x))`` (``-inf`` gives NaN), ``gelu(x) = x / 2 * (1 + erf(x / sqrt(2)))``,
and the tanh form ``x / 2 * (1 + tanh(z)) = x / (1 + exp(-2 z))``, ``z = sqrt(2 / pi) * (x + 0.044715 x**3)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

SQRT_HALF = tl.constexpr(0.7071067811865476)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
GELU_TANH_BETA = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
GELU_TANH_KAPPA = tl.constexpr(0.044715)


@triton.jit
def _gelu(x, APPROXIMATE_TANH: tl.constexpr):
    """gelu(x) in float32 (erf form, or tanh form through the identity (1 + tanh(z)) / 2 = sigmoid(2 z))."""
    if APPROXIMATE_TANH:
        z = GELU_TANH_BETA * (x + GELU_TANH_KAPPA * x * x * x)
        y = x / (1.0 + tl.exp(-2.0 * z))
    else:
        y = x * 0.5 * (1.0 + tl.math.erf(x * SQRT_HALF))
    return y


@triton.jit
def _gelu_and_grad(x, APPROXIMATE_TANH: tl.constexpr):
    """(gelu(x), gelu'(x)) in float32; the tanh form's 1 - sigmoid(2 z) is sigmoid(-2 z), free of cancellation."""
    if APPROXIMATE_TANH:
        z = GELU_TANH_BETA * (x + GELU_TANH_KAPPA * x * x * x)
        s = 1.0 / (1.0 + tl.exp(-2.0 * z))
        s_neg = 1.0 / (1.0 + tl.exp(2.0 * z))
        act = x * s
        dact = s * (1.0 + 2.0 * x * s_neg * GELU_TANH_BETA * (1.0 + 3.0 * GELU_TANH_KAPPA * x * x))
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(x * SQRT_HALF))
        act = x * cdf
        dact = cdf + x * tl.exp(-0.5 * x * x) * INV_SQRT_2PI
    return act, dact


@triton.jit
def _silu_and_grad(x):
    """(silu(x), silu'(x)) in float32: x * s and s * (1 + x * (1 - s)), with 1 - s = sigmoid(-x)."""
    s = 1.0 / (1.0 + tl.exp(-x))
    s_neg = 1.0 / (1.0 + tl.exp(x))
    return x * s, s * (1.0 + x * s_neg)


@triton.jit
def _activation(x, ACTIVATION: tl.constexpr):
    """silu(x), gelu(x) or its tanh form (ACTIVATION "silu", "gelu" or "gelu_tanh"), in float32."""
    return x / (1.0 + tl.exp(-x)) if ACTIVATION == "silu" else _gelu(x, ACTIVATION == "gelu_tanh")


@triton.jit
def _activation_and_grad(x, ACTIVATION: tl.constexpr):
    """(act(x), act'(x)) in float32 for ACTIVATION "silu", "gelu" or "gelu_tanh"."""
    if ACTIVATION == "silu":
        act, dact = _silu_and_grad(x)
    else:
        act, dact = _gelu_and_grad(x, ACTIVATION == "gelu_tanh")
    return act, dact


@triton.jit
def _glu_fwd_kernel(
    g_ptr, u_ptr, y_ptr, stride_gm, stride_um, stride_ym, n_cols, n_col_blocks,
    ACTIVATION: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """y[m, n] = act(g[m, n]) * u[m, n]: swiglu (ACTIVATION "silu") or geglu ("gelu", "gelu_tanh").

    g_ptr, u_ptr, y_ptr: (n_rows, n_cols). Grid: (n_rows * n_col_blocks,), n_col_blocks = cdiv(n_cols, BLOCK).
    Reads g and u once, writes y once.
    """
    pid = tl.program_id(0)
    row = pid // n_col_blocks
    cols = (pid - row * n_col_blocks) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(g_ptr + row * stride_gm + cols, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + row * stride_um + cols, mask=mask).to(tl.float32)
    y = _activation(g, ACTIVATION) * u
    tl.store(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd_kernel(
    dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, stride_dym, stride_gm, stride_um, stride_dgm, stride_dum, n_cols,
    n_col_blocks, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """dg = dy * u * act'(g), du = dy * act(g), for ACTIVATION "silu", "gelu" or "gelu_tanh".

    dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr: (n_rows, n_cols). Grid: (n_rows * n_col_blocks,).
    Reads dy, g and u once, writes dg and du once (for a packed input, both halves of one tensor).
    """
    pid = tl.program_id(0)
    row = pid // n_col_blocks
    cols = (pid - row * n_col_blocks) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dy = tl.load(dy_ptr + row * stride_dym + cols, mask=mask).to(tl.float32)
    g = tl.load(g_ptr + row * stride_gm + cols, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + row * stride_um + cols, mask=mask).to(tl.float32)
    act, dact = _activation_and_grad(g, ACTIVATION)
    tl.store(dg_ptr + row * stride_dgm + cols, (dy * u * dact).to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + row * stride_dum + cols, (dy * act).to(du_ptr.dtype.element_ty), mask=mask)
