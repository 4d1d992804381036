"""cross_entropy: declarations, launchers and the ops ``kernelgate.cross_entropy``, ``cross_entropy_with_stats``
(the loss and each row's statistics, the forward under autograd) and ``cross_entropy_backward``.

``cross_entropy(logits, target, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean")``
is :func:`torch.nn.functional.cross_entropy` for ``(N, C)`` (or ``(C,)``) logits and int64 class
indices, for vocabularies up to 256K: float16 and bfloat16 logits are accumulated in float32 as they
are read, never copied to float32.

Memory traffic, for ``N x C`` logits of ``b`` bytes each:

- forward: reads the logits once (``N*C*b``; rows whose target is ignored are not read) and writes
  ``N`` losses; with smoothing and ``weight`` it also reads the weights per row, from L2. ``"mean"``
  and ``"sum"`` add one program summing ``N`` float32 losses (and target weights).
- backward: writes ``N*C*b``. A row of up to 16384 classes is read once (held in registers). A
  longer row is read once too when the backward gets the forward's row statistics (``stats``: each
  row's maximum and log-sum, 8 bytes a row), as under eager autograd, where the forward runs as
  ``cross_entropy_with_stats``; without them (a traced call, or a direct call without ``stats``) it
  is read twice, once for its log-sum-exp and once to write the gradient. The second read of a row
  of 32000 bf16 (64 KB) mostly hits L2; rows of 128K-256K classes mostly do not, so that backward
  moves about ``3*N*C*b`` instead of ``2*N*C*b``. Ignored rows, which the forward does not read, are
  always read twice.

Extra memory: ``N`` float32 per-row losses for ``"sum"``, and ``N`` more target weights for ``"mean"``;
``2*N`` float32 statistics kept for the backward under autograd; one float32 in the backward of
``"mean"``; no float32 copy of the logits, no softmax buffer. The loss
and the gradient of ``"mean"`` divide by a sum the device computes, and the backward reads the
incoming gradient on the device: nothing synchronises.

A target outside ``[0, C)`` that is not ``ignore_index`` gives a NaN loss row and gradient row on the
Triton path (no kernel reads out of bounds, no device assert), and on the reference path for GPU
tensors; the reference raises :class:`~kernelgate.errors.InputValueError` for CPU tensors, where
checking costs no synchronisation.
"""

from __future__ import annotations

from typing import Any

import torch

from kernelgate import rowwise
from kernelgate.config import Config
from kernelgate.contract import FLOAT_DTYPES, ChoiceArg, ScalarArg, TensorArg
from kernelgate.errors import InputValueError
from kernelgate.launch import LazyKernel, as_rows, empty, launch
from kernelgate.library import Backward
from kernelgate.op import HALF_AND_FLOAT, Op, TritonImpl
from kernelgate.ops.cross_entropy.reference import (
    check_cross_entropy_inputs,
    cross_entropy_backward_reference,
    cross_entropy_reference,
    cross_entropy_with_stats_reference,
)

__all__ = ["cross_entropy", "cross_entropy_backward", "cross_entropy_with_stats"]

_KERNELS = "kernelgate.ops.cross_entropy.kernels"
# The kernels are imported on first launch: `import kernelgate` works without Triton.
CROSS_ENTROPY_FWD = LazyKernel(_KERNELS, "_cross_entropy_fwd_kernel")
CROSS_ENTROPY_REDUCE = LazyKernel(_KERNELS, "_cross_entropy_reduce_kernel")
CROSS_ENTROPY_BWD = LazyKernel(_KERNELS, "_cross_entropy_bwd_kernel")
CROSS_ENTROPY_BWD_LOOPED = LazyKernel(_KERNELS, "_cross_entropy_bwd_looped_kernel")
CROSS_ENTROPY_BWD_SCALE = LazyKernel(_KERNELS, "_cross_entropy_bwd_scale_kernel")
# Float logits (and weights) and the int64 targets.
DTYPES = (*HALF_AND_FLOAT, torch.int64)
# Rows per block of the one-program reductions over rows (of at most a few MB).
REDUCE_BLOCK = 1024
REDUCTIONS = ("none", "mean", "sum")


def _n_cols(logits: torch.Tensor, *_: Any) -> int:
    return int(logits.shape[-1])


def _flat_target(target: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The target as a pointer and its stride between rows (a 0-dim target is one row)."""
    return target, (target.stride(0) if target.dim() else 0)


def _weight(weight: torch.Tensor | None, fallback: torch.Tensor) -> torch.Tensor:
    """A unit-stride weight, or any tensor as the pointer of a kernel that reads no weight."""
    if weight is None:
        return fallback
    return weight if weight.stride(0) == 1 else weight.contiguous()


def _forward(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
    block: int,
    num_warps: int,
    with_stats: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The loss, and with ``with_stats`` each row's ``(m, log(s))`` (see cross_entropy_with_stats)."""
    check_cross_entropy_inputs("cross_entropy", logits, target, reduction)
    rows = as_rows(logits, "logits")
    t, stride_t = _flat_target(target)
    device = logits.device
    if reduction == "none":
        loss = empty(target.shape, dtype=logits.dtype, device=device)
        target_weight = loss  # not written
    else:
        # Scratch the kernel fills entirely: float32 per row, summed below in a fixed order.
        loss = torch.empty(rows.n_rows, dtype=torch.float32, device=device)
        target_weight = torch.empty(rows.n_rows, dtype=torch.float32, device=device) if reduction == "mean" else loss
    stats = empty((*target.shape, 2), dtype=torch.float32, device=device) if with_stats else loss
    launch(
        CROSS_ENTROPY_FWD, (rows.n_rows,), rows.tensor, t, _weight(weight, rows.tensor), loss, target_weight, stats,
        rows.stride, stride_t, rows.n_cols, ignore_index, float(label_smoothing),
        HAS_WEIGHT=weight is not None, HAS_SMOOTHING=label_smoothing > 0, WRITE_TARGET_WEIGHT=reduction == "mean",
        WRITE_STATS=with_stats, BLOCK_N=block, num_warps=num_warps,
    )  # fmt: skip
    if reduction == "none":
        return loss, stats if with_stats else None
    out = empty((), dtype=logits.dtype, device=device)
    launch(
        CROSS_ENTROPY_REDUCE, (1,), loss, target_weight, out, rows.n_rows,
        MEAN=reduction == "mean", BLOCK_M=REDUCE_BLOCK, num_warps=4,
    )  # fmt: skip
    return out, stats if with_stats else None


def _forward_launchers(with_stats: bool) -> tuple[Any, Any]:
    """The single-block and looped launchers of cross_entropy, or of cross_entropy_with_stats."""

    def result(loss: torch.Tensor, stats: torch.Tensor | None) -> Any:
        return (loss, stats) if with_stats else loss

    def single_block(
        logits: torch.Tensor,
        target: torch.Tensor,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        *,
        config: Config,
    ) -> Any:
        block = rowwise.single_block(_n_cols(logits))
        return result(
            *_forward(
                logits, target, weight, ignore_index, label_smoothing, reduction, block, config["num_warps"],
                with_stats,
            )
        )  # fmt: skip

    def looped(
        logits: torch.Tensor,
        target: torch.Tensor,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        *,
        config: Config,
    ) -> Any:
        return result(
            *_forward(
                logits, target, weight, ignore_index, label_smoothing, reduction, config["BLOCK_N"],
                config["num_warps"], with_stats,
            )
        )  # fmt: skip

    return single_block, looped


def _backward(
    grad: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
    stats: torch.Tensor | None,
    looped: bool,
    block: int,
    num_warps: int,
) -> torch.Tensor:
    check_cross_entropy_inputs("cross_entropy_backward", logits, target, reduction, grad, stats)
    rows = as_rows(logits, "logits")
    t, stride_t = _flat_target(target)
    w = _weight(weight, rows.tensor)
    if reduction == "mean":
        share = torch.empty(1, dtype=torch.float32, device=logits.device)
        launch(
            CROSS_ENTROPY_BWD_SCALE, (1,), grad, t, w, share, stride_t, rows.n_rows, rows.n_cols, ignore_index,
            HAS_WEIGHT=weight is not None, BLOCK_M=REDUCE_BLOCK, num_warps=4,
        )  # fmt: skip
        stride_g = 0
    else:
        share = grad
        stride_g = grad.stride(0) if grad.dim() else 0  # 0 also for a gradient expanded over the rows
    dx = empty(logits.shape, dtype=logits.dtype, device=logits.device)  # contiguous: rows n_cols apart
    pointers: tuple[torch.Tensor, ...] = (share, rows.tensor, t, w, dx)
    meta: dict[str, Any] = {}
    if looped:  # a row held in one block gets its max and sum for free: only the looped kernel reads stats
        pointers = (share, rows.tensor, t, w, rows.tensor if stats is None else stats, dx)
        meta["HAS_STATS"] = stats is not None
    launch(
        CROSS_ENTROPY_BWD_LOOPED if looped else CROSS_ENTROPY_BWD, (rows.n_rows,), *pointers, stride_g, rows.stride,
        stride_t, rows.n_cols, rows.n_cols, ignore_index, float(label_smoothing),
        HAS_WEIGHT=weight is not None, HAS_SMOOTHING=label_smoothing > 0, BLOCK_N=block, num_warps=num_warps, **meta,
    )  # fmt: skip
    return dx


def _launch_backward_single_block(
    grad: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    stats: torch.Tensor | None = None,
    *,
    config: Config,
) -> torch.Tensor:
    block = rowwise.single_block(_n_cols(logits))
    return _backward(
        grad, logits, target, weight, ignore_index, label_smoothing, reduction, stats, False, block,
        config["num_warps"],
    )  # fmt: skip


def _launch_backward_looped(
    grad: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    stats: torch.Tensor | None = None,
    *,
    config: Config,
) -> torch.Tensor:
    return _backward(
        grad, logits, target, weight, ignore_index, label_smoothing, reduction, stats, True, config["BLOCK_N"],
        config["num_warps"],
    )  # fmt: skip


def _impls(
    single_block: Any, looped: Any, kernels: tuple[tuple[LazyKernel, ...], tuple[LazyKernel, ...]], skip: int
) -> tuple[TritonImpl, TritonImpl]:
    """A single-block and a looped implementation; ``skip`` arguments precede the logits."""

    def n_cols(*args: Any) -> int:
        return _n_cols(args[skip])

    return (
        TritonImpl(
            "single_block",
            single_block,
            kernels[0],
            dtypes=DTYPES,
            supports=lambda *args: rowwise.fits_one_block(n_cols(*args)),
            configs=rowwise.SINGLE_BLOCK_CONFIGS,
            default_config=lambda *args: rowwise.single_block_default(n_cols(*args)),
            prune=lambda config, *args: rowwise.prune_single_block(config, n_cols(*args)),
        ),
        TritonImpl(
            "looped",
            looped,
            kernels[1],
            dtypes=DTYPES,
            configs=rowwise.LOOPED_CONFIGS,
            default_config=rowwise.LOOPED_DEFAULT,
            prune=lambda config, *args: rowwise.prune_looped(config, n_cols(*args)),
        ),
    )


def _bucket(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
) -> tuple[Any, ...]:
    n_cols = _n_cols(logits)
    n_rows = logits.numel() // max(n_cols, 1)
    return (*rowwise.row_bucket(n_rows, n_cols), weight is not None, label_smoothing > 0, reduction)


def _reduction_length(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
) -> int:
    """Each loss reduces over its row; "mean" and "sum" then over the rows too."""
    n_cols = _n_cols(logits)
    return n_cols + (logits.numel() // max(n_cols, 1) if reduction != "none" else 0)


def _make_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, None, int, float, str]:
    logits = (4 * torch.randn(shape, device=device)).to(dtype)
    target = torch.randint(0, shape[-1], shape[:-1], device=device)
    if target.dim():
        target[::7] = -100  # some ignored rows, as padding gives
    return logits, target, None, -100, 0.0, "mean"


def _make_backward_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, int, float, str]:
    logits, target, weight, ignore_index, label_smoothing, reduction = _make_inputs(shape, dtype, device)
    return torch.ones((), device=device, dtype=dtype), logits, target, weight, ignore_index, label_smoothing, reduction


def _contract(*leading: TensorArg) -> tuple[Any, ...]:
    return (
        *leading,
        TensorArg("logits", min_rank=1),
        # Float targets pass the contract so that the op's own check can name the remedy for class
        # probabilities (check_cross_entropy_inputs); the schema is the same.
        TensorArg("target", dtypes=(torch.int64, *FLOAT_DTYPES)),
        TensorArg("weight", rank=1, sizes={0: ("logits", -1)}, optional=True),
        ScalarArg("ignore_index", kind=int),
        ScalarArg("label_smoothing", kind=float, min=0.0, max=1.0),
        ChoiceArg("reduction", REDUCTIONS),
    )


# The row statistics the forward hands to the backward: (n_rows, 2) float32, or (2,) for (C,) logits.
_STATS = TensorArg("stats", dtypes=(torch.float32,), min_rank=1, optional=True)

cross_entropy_backward = Op(
    "cross_entropy_backward",
    reference=cross_entropy_backward_reference,
    args=(*_contract(TensorArg("grad")), _STATS),
    implementations=_impls(
        _launch_backward_single_block,
        _launch_backward_looped,
        ((CROSS_ENTROPY_BWD, CROSS_ENTROPY_BWD_SCALE), (CROSS_ENTROPY_BWD_LOOPED, CROSS_ENTROPY_BWD_SCALE)),
        skip=1,
    ),
    # With the forward's statistics the looped kernel reads a valid row once: its own bucket.
    bucket=lambda grad, *args: (*_bucket(*args[:6]), len(args) > 6 and args[6] is not None),
    reduction_length=lambda grad, *args: _reduction_length(*args[:6]),
    make_inputs=_make_backward_inputs,
)

cross_entropy_with_stats = Op(
    "cross_entropy_with_stats",
    reference=cross_entropy_with_stats_reference,
    args=_contract(),
    implementations=_impls(
        *_forward_launchers(with_stats=True),
        ((CROSS_ENTROPY_FWD, CROSS_ENTROPY_REDUCE), (CROSS_ENTROPY_FWD, CROSS_ENTROPY_REDUCE)),
        skip=0,
    ),
    bucket=_bucket,
    reduction_length=_reduction_length,
    make_inputs=_make_inputs,
    returns="(Tensor, Tensor)",
)


def _save(inputs: tuple[Any, ...], loss: torch.Tensor) -> tuple[Any, ...]:
    weight = inputs[2]
    if isinstance(weight, torch.Tensor) and weight.requires_grad:
        raise InputValueError(
            "cross_entropy(): argument 'weight' requires grad, but the loss has no gradient with respect to the "
            "class weights (neither has torch.nn.functional.cross_entropy's). Pass weight.detach()."
        )
    return tuple(inputs)


def _grads(saved: tuple[Any, ...], grad: torch.Tensor) -> tuple[Any, ...]:
    # The six inputs, then the forward's row statistics where the eager autograd path kept them. They
    # carry no autograd history, so a backward that is itself differentiated (create_graph, where
    # grad mode is on) recomputes them from the logits.
    stats = saved[6] if len(saved) > 6 and not torch.is_grad_enabled() else None
    return (cross_entropy_backward(grad, *saved[:6], stats), None, None, None, None, None)


cross_entropy = Op(
    "cross_entropy",
    reference=cross_entropy_reference,
    args=_contract(),
    implementations=_impls(
        *_forward_launchers(with_stats=False),
        ((CROSS_ENTROPY_FWD, CROSS_ENTROPY_REDUCE), (CROSS_ENTROPY_FWD, CROSS_ENTROPY_REDUCE)),
        skip=0,
    ),
    bucket=_bucket,
    reduction_length=_reduction_length,
    # Under eager autograd the forward is cross_entropy_with_stats: each row's maximum and log-sum
    # are kept (8 bytes a row), so the backward reads a long row once instead of twice. A traced
    # call (the PyTorch operator) keeps only the inputs, and the backward recomputes them.
    backward=Backward(save=_save, grads=_grads, forward=cross_entropy_with_stats),
    make_inputs=_make_inputs,
)
