"""rotary_embedding: both conventions against independent formulas, layouts, gradients, configs and errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import kernelgate
from every_config import check_every_config, distinct_configs
from kernelgate.errors import InputValueError
from kernelgate.launch import next_power_of_2
from kernelgate.ops.rotary import rotary_embedding
from kernelgate.tolerance import assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (batch, seq, q heads, k heads, head_dim): GQA 4/2 and 4/1 (multi-query), more k heads than q, heads
# that no block divides, odd and prime seq lengths, head_dim 2 and halves that are not powers of two.
SHAPES = [
    (2, 5, 4, 2, 8),
    (1, 7, 4, 1, 16),
    (3, 3, 3, 5, 10),
    (2, 1, 2, 2, 64),
    (1, 3, 4, 2, 128),
    (1, 4, 1, 1, 2),
]


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def _angles(seq: int, head_dim: int, device: torch.device, batch: int | None = None) -> tuple[torch.Tensor, ...]:
    """cos, sin of the usual angles ``s * 10000 ** (-2i / head_dim)``, or per-sequence offsets with ``batch``."""
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    positions = torch.arange(seq, dtype=torch.float32)
    if batch is not None:
        positions = positions + 3.0 * torch.arange(batch, dtype=torch.float32)[:, None]
    angles = (positions[..., None] * inv_freq).to(device)
    return angles.cos(), angles.sin()


def _rotate_half_formula(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face transformers' apply_rotary_pos_emb (cos/sin with the half repeated), in float32."""
    cos_full = torch.cat((cos, cos), dim=-1).float().unsqueeze(-2)
    sin_full = torch.cat((sin, sin), dim=-1).float().unsqueeze(-2)
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos_full + torch.cat((-x2, x1), dim=-1) * sin_full).to(x.dtype)


def _interleaved_formula(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-J pairs as in Meta's Llama code: (x[2i] + i x[2i+1]) * exp(i angle), complex in float32."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
    rotation = torch.complex(cos.float(), sin.float()).unsqueeze(-2)
    return torch.view_as_real(pairs * rotation).flatten(-2).to(x.dtype)


def _formula(interleaved: bool) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    return _interleaved_formula if interleaved else _rotate_half_formula


def _assert_runs_triton(*args: object) -> None:
    plan = rotary_embedding.plan(*args)
    assert plan.path in ("triton", "interpreter"), plan


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_matches_independent_formulas(
    target: torch.device, dtype: torch.dtype, interleaved: bool, shape: tuple[int, ...]
) -> None:
    """The kernel gives the transformers (rotate-half) or complex-number (interleaved) result, and the reference's,
    for every dtype, GQA head counts and odd sizes; outputs are new tensors of q's and k's dtype."""
    batch, seq, n_q, n_k, head_dim = shape
    q = _randn((batch, seq, n_q, head_dim), dtype, target)
    k = _randn((batch, seq, n_k, head_dim), dtype, target, seed=1)
    cos, sin = _angles(seq, head_dim, target)
    _assert_runs_triton(q, k, cos, sin, interleaved)
    q_rot, k_rot = rotary_embedding(q, k, cos, sin, interleaved)
    assert q_rot.shape == q.shape and k_rot.shape == k.shape
    assert q_rot.dtype == k_rot.dtype == dtype
    assert q_rot.data_ptr() != q.data_ptr() and k_rot.data_ptr() != k.data_ptr()
    formula = _formula(interleaved)
    assert_close(q_rot, formula(q, cos, sin), reduction_length=2)
    assert_close(k_rot, formula(k, cos, sin), reduction_length=2)
    q_ref, k_ref = rotary_embedding.reference(q, k, cos, sin, interleaved)
    assert_close(q_rot, q_ref, reduction_length=2)
    assert_close(k_rot, k_ref, reduction_length=2)


def test_the_reference_matches_the_formulas_in_float64() -> None:
    """The reference itself is the transformers and the complex-number formula (float64, computed in float64)."""
    q = _randn((2, 5, 4, 12), torch.float64, torch.device("cpu"))
    k = _randn((2, 5, 2, 12), torch.float64, torch.device("cpu"), seed=1)
    cos, sin = (t.double() for t in _angles(5, 12, torch.device("cpu")))
    for interleaved in (False, True):
        q_ref, k_ref = rotary_embedding.reference(q, k, cos, sin, interleaved)
        assert q_ref.dtype == torch.float64
        # The formulas compute in float32: compare at float32's precision.
        assert_close(q_ref.float(), _formula(interleaved)(q, cos, sin).float(), reduction_length=2)
        assert_close(k_ref.float(), _formula(interleaved)(k, cos, sin).float(), reduction_length=2)


def test_rotation_preserves_norms_and_angle_zero_is_identity(target: torch.device) -> None:
    """Rotating keeps each pair's length (so each head's norm), and position 0 (angle 0) leaves q and k unchanged."""
    q = _randn((2, 6, 4, 16), torch.float32, target)
    k = _randn((2, 6, 2, 16), torch.float32, target, seed=1)
    cos, sin = _angles(6, 16, target)
    for interleaved in (False, True):
        q_rot, k_rot = rotary_embedding(q, k, cos, sin, interleaved)
        assert_close(q_rot.norm(dim=-1), q.norm(dim=-1), reduction_length=16)
        assert torch.equal(q_rot[:, 0], q[:, 0]) and torch.equal(k_rot[:, 0], k[:, 0])


@pytest.mark.parametrize(
    "make_qk",
    [
        pytest.param(lambda qkv: (qkv[:, :, :4], qkv[:, :, 4:6]), id="fused-qkv-slices"),
        pytest.param(lambda qkv: (qkv[1:, :, 2:6], qkv[1:, :, 6:]), id="batch-and-head-offsets"),
        pytest.param(lambda qkv: (qkv[:, :, :4, :8], qkv[:, :, 4:6, 8:]), id="head-dim-slices"),
        pytest.param(
            lambda qkv: (qkv[:1, :, :4].expand(2, -1, -1, -1), qkv[:1, :, 4:6].expand(2, -1, -1, -1)),
            id="batch-broadcast",
        ),
        pytest.param(lambda qkv: (qkv[:, :, :4, ::2], qkv[:, :, 4:6, ::2]), id="strided-features-copied"),
        pytest.param(lambda qkv: (qkv[:, ::2, :4], qkv[:, ::2, 4:6]), id="every-other-position"),
    ],
)
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_non_contiguous_q_and_k(
    target: torch.device, make_qk: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], interleaved: bool
) -> None:
    """Views of a fused (batch, seq, heads, head_dim) projection give the numbers of contiguous copies and stay
    unchanged."""
    qkv = _randn((2, 6, 8, 16), torch.bfloat16, target)
    before = qkv.clone()
    q, k = make_qk(qkv)
    cos, sin = _angles(q.shape[1], q.shape[-1], target)
    q_rot, k_rot = rotary_embedding(q, k, cos, sin, interleaved)
    q_ref, k_ref = rotary_embedding.reference(q.contiguous(), k.contiguous(), cos, sin, interleaved)
    assert_close(q_rot, q_ref, reduction_length=2)
    assert_close(k_rot, k_ref, reduction_length=2)
    assert torch.equal(qkv, before)


def test_heads_first_layout_through_a_transpose(target: torch.device, tmp_path: Path) -> None:
    """A (batch, heads, seq, head_dim) tensor passed as x.transpose(1, 2) is read without a copy and rotated as
    transformers rotates it in its own layout; a strided feature dimension is copied, and the log says so."""
    kernelgate.configure(log_path=tmp_path / "log.csv")
    q_bhsd = _randn((2, 4, 5, 16), torch.float16, target)
    k_bhsd = _randn((2, 2, 5, 16), torch.float16, target, seed=1)
    cos, sin = _angles(5, 16, target)
    q_rot, k_rot = rotary_embedding(q_bhsd.transpose(1, 2), k_bhsd.transpose(1, 2), cos, sin)
    # transformers: cos, sin of shape (seq, head_dim) broadcast over (batch, heads, seq, head_dim).
    cos_full, sin_full = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    x1, x2 = q_bhsd.float().chunk(2, -1)
    expected = (q_bhsd.float() * cos_full + torch.cat((-x2, x1), -1) * sin_full).half()
    assert_close(q_rot.transpose(1, 2), expected, reduction_length=2)
    assert_close(k_rot, _rotate_half_formula(k_bhsd.transpose(1, 2), cos, sin), reduction_length=2)
    assert "copied" not in (tmp_path / "log.csv").read_text()
    rotary_embedding(q_bhsd[..., ::2].transpose(1, 2), k_bhsd.transpose(1, 2)[..., :8], cos[:, :4], sin[:, :4])
    assert "copied q: not contiguous" in (tmp_path / "log.csv").read_text()


@pytest.mark.parametrize(
    "make_angles",
    [
        pytest.param(lambda b, s, d, dev: _angles(s, d, dev, batch=b), id="per-sequence"),
        pytest.param(lambda b, s, d, dev: tuple(t[None] for t in _angles(s, d, dev)), id="batch-1"),
        pytest.param(
            lambda b, s, d, dev: tuple(torch.cat((t, t), -1)[..., : d // 2] for t in _angles(s, d, dev)),
            id="half-of-a-repeated-table",
        ),
        pytest.param(lambda b, s, d, dev: tuple(t.t().contiguous().t() for t in _angles(s, d, dev)), id="transposed"),
        pytest.param(
            lambda b, s, d, dev: (_angles(s, d, dev)[0].half(), _angles(s, d, dev)[1].to(torch.bfloat16)),
            id="half-precision-angles",
        ),
    ],
)
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_angle_layouts(
    target: torch.device,
    make_angles: Callable[[int, int, int, torch.device], tuple[torch.Tensor, torch.Tensor]],
    interleaved: bool,
) -> None:
    """cos/sin per sequence (batch, seq, half), with a batch of 1, as views of a larger table, strided or in 16-bit
    dtypes, match the formula."""
    q = _randn((3, 5, 4, 12), torch.float32, target)
    k = _randn((3, 5, 2, 12), torch.float32, target, seed=1)
    cos, sin = make_angles(3, 5, 12, target)
    _assert_runs_triton(q, k, cos, sin, interleaved)
    q_rot, k_rot = rotary_embedding(q, k, cos, sin, interleaved)
    formula = _formula(interleaved)
    assert_close(q_rot, formula(q, cos, sin), reduction_length=2)
    assert_close(k_rot, formula(k, cos, sin), reduction_length=2)


def test_q_and_k_of_different_dtypes(target: torch.device) -> None:
    """q and k may differ in dtype (and from cos/sin): each output keeps its input's dtype and matches the formula."""
    q = _randn((2, 3, 4, 8), torch.bfloat16, target)
    k = _randn((2, 3, 2, 8), torch.float32, target, seed=1)
    cos, sin = (t.half() for t in _angles(3, 8, target))
    _assert_runs_triton(q, k, cos, sin, True)
    q_rot, k_rot = rotary_embedding(q, k, cos, sin, True)
    assert (q_rot.dtype, k_rot.dtype) == (torch.bfloat16, torch.float32)
    assert_close(q_rot, _interleaved_formula(q, cos, sin), reduction_length=2)
    assert_close(k_rot, _interleaved_formula(k, cos, sin), reduction_length=2)


def test_nan_propagates_to_the_pair(target: torch.device) -> None:
    """A NaN feature makes both members of its pair NaN, and nothing else, as in the reference."""
    q = _randn((1, 3, 2, 8), torch.float32, target)
    k = _randn((1, 3, 1, 8), torch.float32, target, seed=1)
    q[0, 1, 1, 2] = float("nan")
    cos, sin = _angles(3, 8, target)
    for interleaved in (False, True):
        q_rot, k_rot = rotary_embedding(q, k, cos, sin, interleaved)
        q_ref, _ = rotary_embedding.reference(q, k, cos, sin, interleaved)
        assert int(q_rot.isnan().sum()) == 2 and not bool(k_rot.isnan().any())
        assert_close(q_rot, q_ref, reduction_length=2)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_match_autograd_of_the_reference(target: torch.device, dtype: torch.dtype, interleaved: bool) -> None:
    """dq and dk (the same kernel with sin negated) equal autograd of the reference, also for a non-contiguous
    gradient."""
    q = _randn((2, 5, 4, 10), dtype, target).requires_grad_()
    k = _randn((2, 5, 2, 10), dtype, target, seed=1).requires_grad_()
    cos, sin = _angles(5, 10, target)
    grad_q = _randn((2, 5, 10, 4), dtype, target, seed=2).transpose(-1, -2)
    grad_k = _randn((2, 5, 2, 10), dtype, target, seed=3)
    dq, dk = torch.autograd.grad(rotary_embedding(q, k, cos, sin, interleaved), (q, k), (grad_q, grad_k))
    expected = torch.autograd.grad(rotary_embedding.reference(q, k, cos, sin, interleaved), (q, k), (grad_q, grad_k))
    assert_close(dq, expected[0], reduction_length=2)
    assert_close(dk, expected[1], reduction_length=2)


def test_gradient_of_one_output_only(target: torch.device) -> None:
    """Using only q_rot gives k a zero gradient (the unused output's gradient is zeros), and q the inverse rotation."""
    q = _randn((1, 3, 2, 8), torch.float32, target).requires_grad_()
    k = _randn((1, 3, 1, 8), torch.float32, target, seed=1).requires_grad_()
    cos, sin = _angles(3, 8, target)
    q_rot, _ = rotary_embedding(q, k, cos, sin, False)
    q_rot.sum().backward()
    assert k.grad is not None and torch.equal(k.grad, torch.zeros_like(k))
    ones = torch.ones_like(q)
    (expected,) = torch.autograd.grad(rotary_embedding.reference(q, k, cos, sin, False)[0], q, ones)
    assert q.grad is not None
    assert_close(q.grad, expected, reduction_length=2)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_gradients_of_cos_and_sin_when_they_require_grad(target: torch.device, interleaved: bool) -> None:
    """With learnable angles every gradient, cos's and sin's included, is autograd of the reference."""
    q = _randn((2, 5, 4, 8), torch.float32, target).requires_grad_()
    k = _randn((2, 5, 2, 8), torch.float32, target, seed=1).requires_grad_()
    cos, sin = (t.requires_grad_() for t in _angles(5, 8, target))
    grads = (_randn((2, 5, 4, 8), torch.float32, target, seed=2), _randn((2, 5, 2, 8), torch.float32, target, seed=3))
    inputs = (q, k, cos, sin)
    got = torch.autograd.grad(rotary_embedding(q, k, cos, sin, interleaved), inputs, grads)
    expected = torch.autograd.grad(rotary_embedding.reference(q, k, cos, sin, interleaved), inputs, grads)
    # dcos and dsin sum two products over the batch and all 6 heads.
    for g, e, n in zip(got, expected, (2, 2, 24, 24), strict=True):
        assert_close(g, e, reduction_length=n)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_float64_gradcheck_and_gradgradcheck(interleaved: bool) -> None:
    """Through its registered backward the op passes float64 gradcheck (cos and sin constant, or learnable) and
    gradgradcheck."""
    q = torch.randn(1, 3, 2, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 3, 1, 6, dtype=torch.float64, requires_grad=True)
    angles = torch.randn(3, 3, dtype=torch.float64)
    cos, sin = angles.cos(), angles.sin()
    assert torch.autograd.gradcheck(lambda q, k: rotary_embedding(q, k, cos, sin, interleaved), (q, k))
    assert torch.autograd.gradgradcheck(lambda q, k: rotary_embedding(q, k, cos, sin, interleaved), (q, k))
    learnable = (cos.clone().requires_grad_(), sin.clone().requires_grad_())
    assert torch.autograd.gradcheck(lambda q, k, c, s: rotary_embedding(q, k, c, s, interleaved), (q, k, *learnable))


def test_backward_saves_only_the_angles() -> None:
    """With constant angles the forward saves cos and sin only: no copy of q or k is kept for the backward."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    q = torch.randn(1, 3, 2, 8, requires_grad=True)
    k = torch.randn(1, 3, 1, 8, requires_grad=True)
    cos, sin = _angles(3, 8, torch.device("cpu"))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        rotary_embedding(q, k, cos, sin, False)
    assert sorted(t.data_ptr() for t in saved) == sorted((cos.data_ptr(), sin.data_ptr()))


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("interpret", [False, True], ids=["reference", "interpreter"])
def test_opcheck(interleaved: bool, interpret: bool) -> None:
    """torch.library.opcheck passes for torch.ops.kernelgate.rotary_embedding: schema, fake tensors, autograd,
    AOT dispatch."""
    kernelgate.configure(tune=False)
    q = torch.randn(2, 3, 4, 8, requires_grad=True)
    k = torch.randn(2, 3, 2, 8, requires_grad=True)
    cos, sin = _angles(3, 8, torch.device("cpu"))
    assert rotary_embedding.torch_op is torch.ops.kernelgate.rotary_embedding.default
    with kernelgate.use_interpreter(interpret):
        torch.library.opcheck(torch.ops.kernelgate.rotary_embedding.default, (q, k, cos, sin, interleaved))


# (q, k, cos, sin shapes, error message pattern, whether the reference itself checks the rule (the others
# are the contract's)): each case breaks one rule, the rest is valid.
BAD_INPUTS = [
    pytest.param((1, 3, 2, 7), (1, 3, 1, 7), (3, 3), (3, 3), "even head_dim", True, id="odd-head-dim"),
    pytest.param((1, 3, 2, 8), (1, 3, 1, 8), (3, 8), (3, 8), "looks like the Hugging Face", True, id="repeated-half"),
    pytest.param((1, 3, 2, 8), (1, 3, 1, 8), (3, 3), (3, 3), "head_dim // 2 = 4 entries", True, id="cos-last-dim"),
    pytest.param((2, 3, 2, 8), (2, 3, 1, 8), (3, 3, 4), (3, 3, 4), "size 1 or q's batch size 2", True, id="cos-batch"),
    pytest.param((1, 3, 2, 8), (1, 3, 1, 8), (1, 1, 3, 4), (1, 1, 3, 4), "cos.squeeze", True, id="cos-rank-4"),
    pytest.param((1, 3, 2, 8), (1, 3, 1, 8), (4, 4), (4, 4), r"size 3 in dimension -2 \(= q.shape", False, id="seq"),
    pytest.param((1, 3, 2, 8), (1, 3, 1, 8), (3, 4), (3, 2), "'sin' must have the shape of 'cos'", False, id="sin"),
    pytest.param((1, 3, 2, 8), (1, 3, 1, 8), (4,), (4,), "'cos' must have at least 2", False, id="cos-rank-1"),
    pytest.param((1, 3, 2, 8), (1, 3, 1, 6), (3, 4), (3, 4), "'k' must have size 8 in dimension 3", False, id="k-dim"),
    pytest.param(
        (1, 3, 2, 8), (2, 3, 1, 8), (3, 4), (3, 4), "'k' must have size 1 in dimension 0", False, id="k-batch"
    ),
    pytest.param((1, 3, 2, 8), (1, 4, 1, 8), (3, 4), (3, 4), "'k' must have size 3 in dimension 1", False, id="k-seq"),
    pytest.param((3, 2, 8), (1, 3, 1, 8), (3, 4), (3, 4), "'q' must have 4 dimension", False, id="q-rank-3"),
]


@pytest.mark.parametrize(("q_shape", "k_shape", "cos_shape", "sin_shape", "match", "in_reference"), BAD_INPUTS)
@pytest.mark.parametrize("mode", ["triton", "reference"])
def test_invalid_shapes_raise_errors_that_teach(
    mode: str,
    q_shape: tuple[int, ...],
    k_shape: tuple[int, ...],
    cos_shape: tuple[int, ...],
    sin_shape: tuple[int, ...],
    match: str,
    in_reference: bool,
) -> None:
    """Each broken shape rule raises InputValueError (a ValueError) naming the argument and the remedy, whether the
    call would run the kernel (mode triton, interpreter) or the reference; the rules beyond the contract are also
    raised by the reference itself (the fake implementation under torch.compile)."""
    kernelgate.configure(tune=False)
    args = (torch.randn(q_shape), torch.randn(k_shape), torch.randn(cos_shape), torch.randn(sin_shape), False)
    with kernelgate.use_interpreter(), kernelgate.use_mode(mode), pytest.raises(InputValueError, match=match):
        rotary_embedding(*args)
    if in_reference:
        with pytest.raises(InputValueError, match=match):
            rotary_embedding.reference(*args)


def test_interleaved_must_be_a_bool() -> None:
    """interleaved is a bool flag: an int is refused with the remedy."""
    q, k = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8)
    cos, sin = _angles(3, 8, torch.device("cpu"))
    with pytest.raises(kernelgate.InputTypeError, match="'interleaved' must be a Python bool"):
        rotary_embedding(q, k, cos, sin, 1)


@pytest.mark.parametrize(
    ("q_shape", "k_shape"),
    [((2, 0, 4, 8), (2, 0, 2, 8)), ((0, 3, 4, 8), (0, 3, 2, 8)), ((2, 3, 4, 8), (2, 3, 0, 8)), ((1, 3, 2, 0),) * 2],
    ids=["no-positions", "no-batch", "no-k-heads", "head-dim-0"],
)
def test_empty_inputs_take_the_reference(q_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> None:
    """Empty q or k are valid: they take the reference path with reason "empty-tensor" and keep their shapes."""
    kernelgate.configure(tune=False)
    q, k = torch.randn(q_shape), torch.randn(k_shape)
    cos, sin = torch.randn(q_shape[1], q_shape[-1] // 2), torch.randn(q_shape[1], q_shape[-1] // 2)
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="empty-tensor"):
        plan = rotary_embedding.plan(q, k, cos, sin, False)
        q_rot, k_rot = rotary_embedding(q, k, cos, sin, False)
    assert plan.path == "reference" and plan.reason == kernelgate.Reason.EMPTY_TENSOR
    assert q_rot.shape == q.shape and k_rot.shape == k.shape


def test_float64_takes_the_reference() -> None:
    """float64 is valid for the op but not for the kernel: reference path with reason "dtype-unsupported"."""
    q, k = torch.randn(1, 3, 2, 8, dtype=torch.float64), torch.randn(1, 3, 1, 8, dtype=torch.float64)
    cos, sin = _angles(3, 8, torch.device("cpu"))
    with kernelgate.use_interpreter(), pytest.warns(kernelgate.FallbackWarning, match="dtype-unsupported"):
        assert rotary_embedding.plan(q, k, cos, sin, False).reason == kernelgate.Reason.DTYPE
        q_rot, _ = rotary_embedding(q, k, cos, sin, False)
    assert q_rot.dtype == torch.float64


@pytest.mark.parametrize("shape", [(64, 1000), (7,), (2, 5, 3, 9), (1, 3, 8, 16), (2, 3, 4, 3, 8)])
def test_make_inputs_gives_valid_arguments(shape: tuple[int, ...]) -> None:
    """make_inputs (used by doctor, tune and bench) pads any shape to (batch, seq, heads, even head_dim), and reads
    five sizes as (batch, seq, q heads, k heads, head_dim)."""
    assert rotary_embedding.make_inputs is not None
    q, k, cos, sin, interleaved = rotary_embedding.make_inputs(shape, torch.float16, torch.device("cpu"))
    assert q.dim() == 4 and q.shape[-1] % 2 == 0 and q.dtype == torch.float16
    if len(shape) == 5:
        assert (*q.shape[:3], k.shape[2]) == shape[:4]
    else:
        assert q.shape[:3] == ((1,) * (4 - len(shape)) + shape)[:3]
    rotary_embedding.reference(q, k, cos, sin, interleaved)
    with kernelgate.use_interpreter():
        assert rotary_embedding.explain(q, k, cos, sin, interleaved).name == "per_position"


CONFIG_CASES = [(2, 3, 4, 2, 16, False), (1, 3, 5, 3, 10, True), (1, 2, 8, 1, 128, False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CONFIG_CASES, ids=["x".join(map(str, c)) for c in CONFIG_CASES])
def test_every_config_matches_the_reference(target: torch.device, dtype: torch.dtype, case: tuple[int, ...]) -> None:
    """Every configuration the implementation keeps gives the reference's result on NaN-filled outputs."""
    batch, seq, n_q, n_k, head_dim, interleaved = case
    values = (
        _randn((batch, seq, n_q, head_dim), dtype, target),
        _randn((batch, seq, n_k, head_dim), dtype, target, seed=1),
        *_angles(seq, head_dim, target),
        bool(interleaved),
    )
    (impl,) = rotary_embedding.implementations
    assert impl.default_for(values) in impl.candidate_configs(values)
    assert len(distinct_configs(impl, values, target.type == "cpu")) >= 2
    check_every_config(rotary_embedding, values, target.type == "cpu")


def test_default_config_and_pruning() -> None:
    """The untuned configuration is kept by the pruning for every head layout, and pruning drops blocks of heads
    larger than the head counts."""
    (impl,) = rotary_embedding.implementations
    for n_q, n_k, head_dim in [(32, 8, 128), (1, 1, 2), (3, 5, 10), (64, 64, 256), (2, 1, 16384)]:
        values = (torch.empty(1, 1, n_q, head_dim), torch.empty(1, 1, n_k, head_dim), *torch.empty(2, 1, head_dim // 2))
        kept = impl.candidate_configs((*values, False))
        assert impl.default_for((*values, False)) in kept
        assert all(c["BLOCK_H"] <= next_power_of_2(max(n_q, n_k)) for c in kept)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_llama_sized_gqa_in_bfloat16_on_the_gpu(interleaved: bool) -> None:
    """Batch 4, seq 4096, 32 q heads, 8 k heads, head_dim 128 in bfloat16: the compiled kernel (tuned) matches the
    formula, also for q and k sliced from a fused projection, and its gradients match the reference's."""
    device = torch.device("cuda")
    batch, seq, n_q, n_k, head_dim = 4, 4096, 32, 8, 128
    qkv = _randn((batch, seq, n_q + 2 * n_k, head_dim), torch.bfloat16, device)
    cos, sin = _angles(seq, head_dim, device)
    formula = _formula(interleaved)
    with kernelgate.use_mode("triton"):
        for q, k in ((qkv[:, :, :n_q].contiguous(), qkv[:, :, n_q : n_q + n_k].contiguous()),
                     (qkv[:, :, :n_q], qkv[:, :, n_q : n_q + n_k])):  # fmt: skip
            _assert_runs_triton(q, k, cos, sin, interleaved)
            q_rot, k_rot = rotary_embedding(q, k, cos, sin, interleaved)
            assert_close(q_rot, formula(q, cos, sin), reduction_length=2)
            assert_close(k_rot, formula(k, cos, sin), reduction_length=2)
        q = qkv[:, :, :n_q].detach().requires_grad_()
        k = qkv[:, :, n_q : n_q + n_k].detach().requires_grad_()
        grads = (_randn(q.shape, torch.bfloat16, device, seed=2), _randn(k.shape, torch.bfloat16, device, seed=3))
        got = torch.autograd.grad(rotary_embedding(q, k, cos, sin, interleaved), (q, k), grads)
    expected = torch.autograd.grad(rotary_embedding.reference(q, k, cos, sin, interleaved), (q, k), grads)
    assert_close(got[0], expected[0], reduction_length=2)
    assert_close(got[1], expected[1], reduction_length=2)
