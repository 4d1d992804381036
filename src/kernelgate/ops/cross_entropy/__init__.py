"""cross_entropy: declarations, launchers and the ops ``kernelgate.cross_entropy``, ``cross_entropy_with_grad`` (the
loss and its gradient for an incoming gradient of 1: the forward of "mean" and "sum" under autograd) with its
backward ``cross_entropy_backward_into``, ``cross_entropy_with_stats`` (the loss and each row's statistics: the
forward of "none" under autograd) and ``cross_entropy_backward``.

``cross_entropy(logits, target, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean")``
is :func:`torch.nn.functional.cross_entropy` for ``(N, C)`` (or ``(C,)``) logits and int64 class
indices, for vocabularies up to 256K: float16 and bfloat16 logits are accumulated in float32 as they
are read, never copied to float32.

Memory traffic, for ``N x C`` logits of ``b`` bytes each:

- forward: reads the logits once (``N*C*b``; rows whose target is ignored are not read) and writes
  ``N`` losses; with smoothing and ``weight`` it also reads the weights per row, from L2. ``"mean"``
  and ``"sum"`` add one program summing ``N`` float32 losses (and target weights).
- forward+backward of ``"mean"`` and ``"sum"`` under eager autograd (see ``FUSED_GRAD_MIN_BYTES``): the
  forward runs as ``cross_entropy_with_grad``, whose program
  per row reads the row (ignored rows too, whose gradient is 0, or NaN where torch's is) and writes its
  loss and its gradient for an incoming gradient of 1: ``2*N*C*b`` in all for rows of up to 16384
  classes, held in registers. A longer row is read twice, once for its loss, maximum and log-sum and
  once to write the gradient: about ``3*N*C*b``. On the H200 the second read costs about as much as the
  first even at 32000 classes (bf16 8192x32000: 424 us against 157 for the loss alone and 248 for a
  copy), and holding such a row in one block instead was slower still (483 us). The ``split_rows``
  implementation reads such a row once: it splits the row over programs that each hold a block of it in
  registers and wait for the row's others' partial sums (float32 at 128K-256K classes on the H200: 0.78 of
  copy against looped's 0.66; in bf16 it is slower than looped, and tuning leaves it). The ``split_looped``
  implementation, for 2-byte logits, splits a row the same way into segments of 8K or 16K classes that each
  program streams twice: about ``3*N*C*b`` again, but between a segment's two reads only a segment a program is
  in flight, so the second read comes from L2 (bf16 at 128K-256K classes on an H100: 830 us against
  looped's 983-1041). ``"mean"`` first runs one program summing the ``N`` target weights, the gradient's
  divisor. The backward
  (``cross_entropy_backward_into``) is one launch (two for ``"mean"``) whose programs read the incoming
  gradient and return at once where it is 1, as for ``loss.backward()``: no pass over memory. For
  another incoming gradient it computes the gradient again from the logits into the same buffer, as the
  backward below does: that reads as much as scaling the saved gradient would. A second backward of the
  same graph (``retain_graph=True``), a differentiated one (``create_graph=True``) and a traced call run
  the backward below.
- backward (of ``"none"`` and the cases just named): writes
  ``N*C*b``. A row of up to 16384 classes is read once (held in registers). A longer row is read once
  too when the backward gets the forward's row statistics (``stats``: each row's maximum and log-sum,
  8 bytes a row), as under eager autograd of ``"none"``, where the forward runs
  as ``cross_entropy_with_stats``; without them (a
  traced call, or a direct call without ``stats``) it is read twice, once for its log-sum-exp and
  once to write the gradient, so that backward moves about ``3*N*C*b`` instead of ``2*N*C*b`` for
  rows of 128K-256K classes. Ignored rows, which the forward does not read, are always read twice.

Extra memory: ``N`` float32 per-row losses for ``"sum"``, and ``N`` more target weights for ``"mean"``;
under eager autograd of ``"mean"`` and ``"sum"`` the gradient (``N*C*b``) is allocated in the
forward and held until the backward hands it to autograd (the peak of a forward+backward step is the
same, but the gradient lives from the forward on instead of from the backward on); under eager
autograd of ``"none"``, ``2*N`` float32 statistics; one float32 in the backward
of ``"mean"``; no float32 copy of the logits, no softmax buffer. The loss and the gradient of
``"mean"`` divide by a sum the device computes, and the backward reads the incoming gradient on
the device: nothing synchronises.

A target outside ``[0, C)`` that is not ``ignore_index`` gives a NaN loss row and gradient row on the
Triton path (no kernel reads out of bounds, no device assert), and on the reference path for GPU
tensors; the reference raises :class:`~kernelgate.errors.InputValueError` for CPU tensors, where
checking costs no synchronisation.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from kernelgate import backend, rowwise
from kernelgate.config import Config, ConfigSpace
from kernelgate.contract import FLOAT_DTYPES, ChoiceArg, ScalarArg, TensorArg
from kernelgate.errors import InputValueError
from kernelgate.launch import LazyKernel, Rows, as_rows, call_state, empty, launch
from kernelgate.library import Backward
from kernelgate.op import HALF_AND_FLOAT, Op, TritonImpl
from kernelgate.ops.cross_entropy.reference import (
    check_cross_entropy_inputs,
    cross_entropy_backward_into_reference,
    cross_entropy_backward_reference,
    cross_entropy_reference,
    cross_entropy_with_grad_reference,
    cross_entropy_with_stats_reference,
)

__all__ = [
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_backward_into",
    "cross_entropy_with_grad",
    "cross_entropy_with_stats",
]

_KERNELS = "kernelgate.ops.cross_entropy.kernels"
# The kernels are imported on first launch: `import kernelgate` works without Triton.
CROSS_ENTROPY_FWD = LazyKernel(_KERNELS, "_cross_entropy_fwd_kernel")
CROSS_ENTROPY_REDUCE = LazyKernel(_KERNELS, "_cross_entropy_reduce_kernel")
CROSS_ENTROPY_BWD = LazyKernel(_KERNELS, "_cross_entropy_bwd_kernel")
CROSS_ENTROPY_BWD_LOOPED = LazyKernel(_KERNELS, "_cross_entropy_bwd_looped_kernel")
CROSS_ENTROPY_BWD_SCALE = LazyKernel(_KERNELS, "_cross_entropy_bwd_scale_kernel")
CROSS_ENTROPY_FWD_GRAD = LazyKernel(_KERNELS, "_cross_entropy_fwd_grad_kernel")
CROSS_ENTROPY_FWD_GRAD_SPLIT = LazyKernel(_KERNELS, "_cross_entropy_fwd_grad_split_kernel")
CROSS_ENTROPY_FWD_GRAD_SPLIT_LOOPED = LazyKernel(_KERNELS, "_cross_entropy_fwd_grad_split_looped_kernel")
FMA_PROBE = LazyKernel(_KERNELS, "_cross_entropy_fma_probe_kernel")
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


@functools.cache
def _interpreter_rounds_fma_once() -> bool:
    """Whether Triton's interpreter computes ``tl.fma`` with one rounding, as a GPU does (Triton 3.6's multiplies
    and then adds, rounding twice): the residual of (1 + 2**-23) squared is 2**-46 with one rounding, 0 with two."""
    x = torch.full((2,), 1.0 + 2.0**-23, dtype=torch.float32)  # float32 whatever the default dtype
    out = torch.zeros(1, dtype=torch.float32)
    backend.launch_interpreted(FMA_PROBE.resolve(), (1,), (x, out), {})
    return bool(out.item() != 0.0)


def _exp2_sums() -> bool:
    """The streamed forwards' EXP2 (the kernels' module docstring): wherever an fma rounds once, that is compiled,
    or in an interpreter that rounds it once; elsewhere the sums keep ``exp``, as exact as before."""
    return not call_state.interpret or _interpreter_rounds_fma_once()


def _forward(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
    block: int,
    num_warps: int,
    stages: int,
    with_stats: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The loss, and with ``with_stats`` each row's ``(m, log(s))`` (see cross_entropy_with_stats)."""
    check_cross_entropy_inputs("cross_entropy", logits, target, reduction)
    rows = as_rows(logits, "logits")
    t, stride_t = _flat_target(target)
    loss, target_weight = _loss_rows(rows.n_rows, logits, target, reduction)
    stats = empty((*target.shape, 2), dtype=torch.float32, device=logits.device) if with_stats else loss
    launch(
        CROSS_ENTROPY_FWD, (rows.n_rows,), rows.tensor, t, _weight(weight, rows.tensor), loss, target_weight, stats,
        rows.stride, stride_t, rows.n_cols, ignore_index, float(label_smoothing),
        HAS_WEIGHT=weight is not None, HAS_SMOOTHING=label_smoothing > 0, WRITE_TARGET_WEIGHT=reduction == "mean",
        WRITE_STATS=with_stats, BLOCK_N=block, NUM_STAGES=stages, EXP2=_exp2_sums(), num_warps=num_warps,
    )  # fmt: skip
    return _reduce(loss, target_weight, logits, reduction), stats if with_stats else None


def _loss_rows(
    n_rows: int, logits: torch.Tensor, target: torch.Tensor, reduction: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the forward kernel writes each row's loss and (for "mean") target weight."""
    device = logits.device
    if reduction == "none":
        loss = empty(target.shape, dtype=logits.dtype, device=device)
        return loss, loss  # no target weight is written
    # Scratch the kernel fills entirely: float32 per row, summed by _reduce in a fixed order.
    loss = torch.empty(n_rows, dtype=torch.float32, device=device)
    return loss, torch.empty(n_rows, dtype=torch.float32, device=device) if reduction == "mean" else loss


def _reduce(loss: torch.Tensor, target_weight: torch.Tensor, logits: torch.Tensor, reduction: str) -> torch.Tensor:
    """The loss of ``reduction`` from the rows' losses (and target weights) that _loss_rows allocated."""
    if reduction == "none":
        return loss
    out = empty((), dtype=logits.dtype, device=logits.device)
    launch(
        CROSS_ENTROPY_REDUCE, (1,), loss, target_weight, out, loss.shape[0],
        MEAN=reduction == "mean", BLOCK_M=REDUCE_BLOCK, num_warps=4,
    )  # fmt: skip
    return out


def _mean_share(
    grad: torch.Tensor | None, t: torch.Tensor, stride_t: int, w: torch.Tensor, has_weight: bool, n_rows: int,
    n_cols: int, ignore_index: int, skip_unit: bool = False,
) -> torch.Tensor:  # fmt: skip
    """A valid row's share of the gradient of a "mean" loss, ``grad`` (1 when None) over the sum of the target
    weights: float32 (1,), computed on the device by one program over the targets (with ``skip_unit``, left
    unwritten where ``grad`` is 1)."""
    share = torch.empty(1, dtype=torch.float32, device=t.device)
    launch(
        CROSS_ENTROPY_BWD_SCALE, (1,), share if grad is None else grad, t, w, share, stride_t, n_rows, n_cols,
        ignore_index, HAS_GRAD=grad is not None, SKIP_UNIT=skip_unit, HAS_WEIGHT=has_weight, BLOCK_M=REDUCE_BLOCK,
        num_warps=4,
    )  # fmt: skip
    return share


def _with_grad_buffers(
    rows: Rows, logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, ignore_index: int,
    reduction: str,
) -> tuple[torch.Tensor, int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """What cross_entropy_with_grad's kernels take besides the logits: the target and its row stride, the weight
    pointer, the rows' losses and target weights (_loss_rows), a valid row's share of the gradient (for "mean",
    computed first on the device by _mean_share; the losses, unread, otherwise) and the gradient, contiguous."""
    t, stride_t = _flat_target(target)
    w = _weight(weight, rows.tensor)
    loss, target_weight = _loss_rows(rows.n_rows, logits, target, reduction)
    share = loss
    if reduction == "mean":
        share = _mean_share(None, t, stride_t, w, weight is not None, rows.n_rows, rows.n_cols, ignore_index)
    dx = empty(logits.shape, dtype=logits.dtype, device=logits.device)  # rows n_cols apart
    return t, stride_t, w, loss, target_weight, share, dx


def _forward_with_grad(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
    looped: bool,
    block: int,
    num_warps: int,
    stages: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and its gradient for an incoming gradient of 1 (see cross_entropy_with_grad)."""
    check_cross_entropy_inputs("cross_entropy", logits, target, reduction)
    rows = as_rows(logits, "logits")
    t, stride_t, w, loss, target_weight, share, dx = _with_grad_buffers(
        rows, logits, target, weight, ignore_index, reduction
    )
    mean = reduction == "mean"
    launch(
        CROSS_ENTROPY_FWD_GRAD, (rows.n_rows,), rows.tensor, t, w, share, loss, target_weight, dx, rows.stride,
        stride_t, rows.n_cols, ignore_index, float(label_smoothing),
        HAS_WEIGHT=weight is not None, HAS_SMOOTHING=label_smoothing > 0, MEAN=mean, WRITE_TARGET_WEIGHT=mean,
        LOOPED=looped, BLOCK_N=block, NUM_STAGES=stages, EXP2=_exp2_sums(), num_warps=num_warps,
    )  # fmt: skip
    return _reduce(loss, target_weight, logits, reduction), dx


def _forward_with_grad_over_programs(
    kernel: LazyKernel,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
    config: Config,
    **meta: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and its gradient from ``kernel``, a fused forward that splits each row over programs which wait for
    each other (``rowwise.launch_split_rows``), with ``meta`` its compile-time values beyond the common ones."""
    check_cross_entropy_inputs("cross_entropy", logits, target, reduction)
    rows = as_rows(logits, "logits")
    rowwise.split_rows_count(logits.device, rows.n_cols, config["BLOCK_N"])  # checked before anything allocates
    t, stride_t, w, loss, target_weight, share, dx = _with_grad_buffers(
        rows, logits, target, weight, ignore_index, reduction
    )
    mean = reduction == "mean"
    pointers = (rows.tensor, t, w, share, loss, target_weight, dx)
    rowwise.launch_split_rows(
        kernel, rows, pointers, (rows.stride, stride_t), (ignore_index, float(label_smoothing)), 4, config=config,
        HAS_WEIGHT=weight is not None, HAS_SMOOTHING=label_smoothing > 0, MEAN=mean, WRITE_TARGET_WEIGHT=mean, **meta,
    )  # fmt: skip
    return _reduce(loss, target_weight, logits, reduction), dx


def _forward_with_grad_split(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cross_entropy_with_grad's ``split_rows`` launcher: each row split over programs of BLOCK_N columns that
    wait for each other (_cross_entropy_fwd_grad_split_kernel), so a row of any length is read once."""
    return _forward_with_grad_over_programs(
        CROSS_ENTROPY_FWD_GRAD_SPLIT, logits, target, weight, ignore_index, label_smoothing, reduction, config
    )


# split_rows (rowwise.split_rows_impl) holds a block of a row in each program's registers and is worth it only where
# the looped kernel reads a row twice: rows longer than one block. Tuned on the H200 without 32 warps, its
# gradient being heavier per element than softmax's (benchmarks/results/h200/cross-entropy-split-rows-36439d6/).
SPLIT_ROWS_CONFIGS = ConfigSpace(BLOCK_N=(2048, 4096, 8192, 16384), num_warps=(4, 8, 16))
SPLIT_ROWS_DEFAULT: Config = {"BLOCK_N": 8192, "num_warps": 8}


def _split_rows_impl() -> TritonImpl:
    return rowwise.split_rows_impl(
        _forward_with_grad_split,
        (CROSS_ENTROPY_BWD_SCALE, CROSS_ENTROPY_FWD_GRAD_SPLIT, CROSS_ENTROPY_REDUCE),
        lambda logits, *args: _n_cols(logits),
        configs=SPLIT_ROWS_CONFIGS,
        default_config=SPLIT_ROWS_DEFAULT,
        dtypes=DTYPES,
    )


def _forward_with_grad_split_looped(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    *,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cross_entropy_with_grad's ``split_looped`` launcher: each row split over programs of a BLOCK_N-column segment
    that stream it twice and wait for each other between (_cross_entropy_fwd_grad_split_looped_kernel)."""
    return _forward_with_grad_over_programs(
        CROSS_ENTROPY_FWD_GRAD_SPLIT_LOOPED, logits, target, weight, ignore_index, label_smoothing, reduction, config,
        STREAM_N=config["STREAM_N"], NUM_STAGES=config["NUM_STAGES"], EXP2=_exp2_sums(),
    )  # fmt: skip


# split_looped (rowwise.split_looped_impl): a program a segment of BLOCK_N columns, read STREAM_N at a time. Timed on
# an H100 at every configuration of a wider space (benchmarks/results/h100/ce-split-looped-wide-96385aa/, bf16): the
# fastest at 128K and 256K classes read a quarter segment at a time with 4 warps and one stage in flight, segments
# of 16384 (830 us at both) or 8192 (835-841), 6 and 3 % faster than the earlier best (16384, 8 warps, 3 stages: 884
# and 858, also kept); 16 warps were 11 to 25 % slower, segments of 32768 6 %. 2-byte logits only: in float32 it was
# 36 % slower than split_rows at 4096x128256 (benchmarks/results/h100/ce-split-looped-cc1334d). Offered for rows
# longer than one block, where the looped kernel reads a row twice from memory.
SPLIT_LOOPED_CONFIGS = ConfigSpace(BLOCK_N=(8192, 16384), STREAM_N=(2048, 4096), num_warps=(4, 8), NUM_STAGES=(1, 3))
SPLIT_LOOPED_DEFAULT: Config = {"BLOCK_N": 16384, "STREAM_N": 4096, "num_warps": 4, "NUM_STAGES": 1}


def _split_looped_impl() -> TritonImpl:
    return rowwise.split_looped_impl(
        _forward_with_grad_split_looped,
        (CROSS_ENTROPY_BWD_SCALE, CROSS_ENTROPY_FWD_GRAD_SPLIT_LOOPED, CROSS_ENTROPY_REDUCE),
        lambda logits, *args: _n_cols(logits),
        above=rowwise.MAX_SINGLE_BLOCK,
        configs=SPLIT_LOOPED_CONFIGS,
        default_config=SPLIT_LOOPED_DEFAULT,
        dtypes=DTYPES,
        x_name="logits",
    )


def _forward_launchers(returns: str) -> tuple[Any, Any]:
    """The single-block and looped launchers of cross_entropy (``returns="loss"``), cross_entropy_with_stats
    (``"stats"``) or cross_entropy_with_grad (``"grad"``)."""

    def run(args: tuple[Any, Any, Any, Any, Any, Any], looped: bool, block: int, num_warps: int, stages: int) -> Any:
        if returns == "grad":
            return _forward_with_grad(*args, looped, block, num_warps, stages)
        loss, stats = _forward(*args, block, num_warps, stages, returns == "stats")
        return (loss, stats) if returns == "stats" else loss

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
        args = (logits, target, weight, ignore_index, label_smoothing, reduction)
        return run(args, False, rowwise.single_block(_n_cols(logits)), config["num_warps"], 1)

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
        args = (logits, target, weight, ignore_index, label_smoothing, reduction)
        return run(args, True, config["BLOCK_N"], config["num_warps"], config["NUM_STAGES"])

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
    into: torch.Tensor | None,
    looped: bool,
    block: int,
    num_warps: int,
) -> torch.Tensor:
    """The gradient (see cross_entropy_backward), or with ``into`` written there (see cross_entropy_backward_into)."""
    check_cross_entropy_inputs("cross_entropy_backward", logits, target, reduction, grad, stats)
    rows = as_rows(logits, "logits")
    t, stride_t = _flat_target(target)
    w = _weight(weight, rows.tensor)
    skip_unit = into is not None
    if reduction == "mean":
        share = _mean_share(grad, t, stride_t, w, weight is not None, rows.n_rows, rows.n_cols, ignore_index, skip_unit)
        stride_g = 0
    else:
        share = grad
        stride_g = grad.stride(0) if grad.dim() else 0  # 0 also for a gradient expanded over the rows
    # Contiguous: rows n_cols apart (cross_entropy_backward_into accepts only such an ``into``).
    dx = empty(logits.shape, dtype=logits.dtype, device=logits.device) if into is None else into
    pointers: tuple[torch.Tensor, ...] = (share, grad, rows.tensor, t, w, dx)
    meta: dict[str, Any] = {}
    if looped:  # a row held in one block gets its max and sum for free: only the looped kernel reads stats
        pointers = (share, grad, rows.tensor, t, w, rows.tensor if stats is None else stats, dx)
        meta["HAS_STATS"] = stats is not None
    launch(
        CROSS_ENTROPY_BWD_LOOPED if looped else CROSS_ENTROPY_BWD, (rows.n_rows,), *pointers, stride_g, rows.stride,
        stride_t, rows.n_cols, rows.n_cols, ignore_index, float(label_smoothing),
        HAS_WEIGHT=weight is not None, HAS_SMOOTHING=label_smoothing > 0, SKIP_UNIT=skip_unit, BLOCK_N=block,
        num_warps=num_warps, **meta,
    )  # fmt: skip
    return dx


def _backward_launchers(into: bool) -> tuple[Any, Any]:
    """The single-block and looped launchers of cross_entropy_backward (whose last argument is ``stats``), or with
    ``into`` of cross_entropy_backward_into (whose last argument is ``dlogits``)."""

    def run(
        args: tuple[Any, Any, Any, Any, Any, Any, Any], last: torch.Tensor | None, looped: bool, block: int,
        num_warps: int,
    ) -> torch.Tensor:  # fmt: skip
        stats, dlogits = (None, last) if into else (last, None)
        return _backward(*args, stats, dlogits, looped, block, num_warps)

    def single_block(
        grad: torch.Tensor,
        logits: torch.Tensor,
        target: torch.Tensor,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        last: torch.Tensor | None = None,
        *,
        config: Config,
    ) -> torch.Tensor:
        args = (grad, logits, target, weight, ignore_index, label_smoothing, reduction)
        return run(args, last, False, rowwise.single_block(_n_cols(logits)), config["num_warps"])

    def looped(
        grad: torch.Tensor,
        logits: torch.Tensor,
        target: torch.Tensor,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        last: torch.Tensor | None = None,
        *,
        config: Config,
    ) -> torch.Tensor:
        args = (grad, logits, target, weight, ignore_index, label_smoothing, reduction)
        return run(args, last, True, config["BLOCK_N"], config["num_warps"])

    return single_block, looped


# The forwards' looped implementation also tunes how many blocks of the row are in flight (the streaming
# loop's tl.range stages: asynchronous copies on sm_90 from 2 on, none in a plain loop). On the H200 tuning chose
# 3 stages in every forward case of the bench's suite (benchmarks/results/h200/cross-entropy-5d2bdda); 1 stays for
# rows where staging does not pay, and 2 is left out to keep the tuning short.
LOOPED_FORWARD_CONFIGS = ConfigSpace(BLOCK_N=(1024, 2048, 4096, 8192), num_warps=(4, 8, 16), NUM_STAGES=(1, 3))
LOOPED_FORWARD_DEFAULT: Config = {**rowwise.LOOPED_DEFAULT, "NUM_STAGES": 1}


def _prune_looped_forward(config: Config, logits: torch.Tensor) -> bool:
    """A looped forward configuration that suits the row, with the blocks staged ahead (all but the one being
    reduced) within :data:`rowwise.PERSISTENT_STAGE_BYTES` of shared memory."""
    staged = (config["NUM_STAGES"] - 1) * config["BLOCK_N"] * logits.element_size()
    return rowwise.prune_looped(config, _n_cols(logits)) and staged <= rowwise.PERSISTENT_STAGE_BYTES


def _impls(
    single_block: Any,
    looped: Any,
    kernels: tuple[tuple[LazyKernel, ...], tuple[LazyKernel, ...]],
    skip: int,
    *,
    staged: bool = False,
) -> tuple[TritonImpl, TritonImpl]:
    """A single-block and a looped implementation; ``skip`` arguments precede the logits. ``staged``: the
    looped launcher takes NUM_STAGES too (the forwards)."""

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
            configs=LOOPED_FORWARD_CONFIGS if staged else rowwise.LOOPED_CONFIGS,
            default_config=LOOPED_FORWARD_DEFAULT if staged else rowwise.LOOPED_DEFAULT,
            prune=(
                (lambda config, *args: _prune_looped_forward(config, args[skip]))
                if staged
                else (lambda config, *args: rowwise.prune_looped(config, n_cols(*args)))
            ),
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


_BACKWARD_KERNELS = (
    (CROSS_ENTROPY_BWD, CROSS_ENTROPY_BWD_SCALE),
    (CROSS_ENTROPY_BWD_LOOPED, CROSS_ENTROPY_BWD_SCALE),
)
# The row statistics the forward hands to the backward: (n_rows, 2) float32, or (2,) for (C,) logits.
_STATS = TensorArg("stats", dtypes=(torch.float32,), min_rank=1, optional=True)

cross_entropy_backward = Op(
    "cross_entropy_backward",
    reference=cross_entropy_backward_reference,
    args=(*_contract(TensorArg("grad")), _STATS),
    implementations=_impls(*_backward_launchers(into=False), _BACKWARD_KERNELS, skip=1),
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
        *_forward_launchers("stats"),
        ((CROSS_ENTROPY_FWD, CROSS_ENTROPY_REDUCE), (CROSS_ENTROPY_FWD, CROSS_ENTROPY_REDUCE)),
        skip=0,
        staged=True,
    ),
    bucket=_bucket,
    reduction_length=_reduction_length,
    make_inputs=_make_inputs,
    returns="(Tensor, Tensor)",
)

cross_entropy_with_grad = Op(
    "cross_entropy_with_grad",
    reference=cross_entropy_with_grad_reference,
    args=_contract(),
    implementations=(
        *_impls(
            *_forward_launchers("grad"),
            ((CROSS_ENTROPY_FWD_GRAD, CROSS_ENTROPY_BWD_SCALE, CROSS_ENTROPY_REDUCE),) * 2,
            skip=0,
            staged=True,
        ),
        _split_rows_impl(),
        _split_looped_impl(),
    ),
    bucket=_bucket,
    reduction_length=_reduction_length,
    make_inputs=_make_inputs,
    returns="(Tensor, Tensor)",
)


def _make_backward_into_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    args = _make_inputs(shape, dtype, device)
    grad = torch.tensor(0.5, device=device, dtype=dtype)  # not 1: the kernels compute
    return (grad, *args, cross_entropy_with_grad.reference(*args)[1])


def _unit_gradient_only(*args: Any) -> str | None:
    """Refuse what the kernels' test of the incoming gradient cannot read: a gradient per row, a strided ``dlogits``."""
    if args[6] == "none":
        return "reduction 'none' has a gradient per row; cross_entropy_with_grad's backward takes a scalar loss"
    return None if args[7].is_contiguous() else "dlogits is not contiguous"


def _backward_into_impls() -> tuple[TritonImpl, ...]:
    """cross_entropy_backward's implementations, writing into ``dlogits``, for scalar losses only."""

    def supports(fits: Any) -> Any:
        return lambda *args: _unit_gradient_only(*args) or (fits(*args) if fits is not None else None)

    impls = _impls(*_backward_launchers(into=True), _BACKWARD_KERNELS, skip=1)
    return tuple(dataclasses.replace(impl, supports=supports(impl.supports)) for impl in impls)


cross_entropy_backward_into = Op(
    "cross_entropy_backward_into",
    reference=cross_entropy_backward_into_reference,
    args=(*_contract(TensorArg("grad", rank=0)), TensorArg("dlogits", same_shape_as="logits")),
    implementations=_backward_into_impls(),
    # Written in place: tuning and check mode work on copies, and the operator's schema says so.
    mutates=("dlogits",),
    returns="()",
    bucket=lambda grad, *args: _bucket(*args[:6]),
    reduction_length=lambda grad, *args: _reduction_length(*args[:6]),
    make_inputs=_make_backward_into_inputs,
)


class _IncomingGradient:
    """Whether the latest backward of a reduced cross_entropy got an incoming gradient of exactly 1,
    as ``loss.backward()`` gives, observed without waiting for the device.

    The backward copies the incoming gradient to pinned host memory behind an event; a later forward
    reads it once the event has passed, never blocking (until then it keeps the earlier answer). A
    gradient of 1 makes computing the gradient in the forward pay: one read of the logits and one
    write of the gradient in all. Another (a loss divided for gradient accumulation, a scaled loss)
    would have the backward compute it again, so the forward then keeps row statistics instead. The
    answer steers speed only: both forwards give the same numbers.
    """

    def __init__(self) -> None:
        self.unit = True  # before any backward: the common case
        self._pending: tuple[Any, torch.Tensor] | None = None  # (event or None, the value on the host)
        # Per device and dtype, the pinned scalar and the event each observation reuses: allocating pinned
        # memory and creating an event took part of every backward's host time (both are read back only
        # once the event has passed, so a copy never overwrites a value not yet read).
        self._slots: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, Any]] = {}

    def expected(self) -> bool:
        pending = self._pending
        if pending is not None and (pending[0] is None or pending[0].query()):
            self.unit = bool(pending[1].item() == 1)  # a host tensor: no synchronisation
            self._pending = None
        return self.unit

    def observe(self, grad: torch.Tensor) -> None:
        if self._pending is not None:  # one copy in flight at a time, so a buffer is never overwritten
            return
        if grad.device.type != "cuda":
            self._pending = (None, grad.detach().to("cpu", copy=True))
            return
        slot = self._slots.get((grad.device, grad.dtype))
        if slot is None:
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            slot = self._slots[grad.device, grad.dtype] = (torch.empty((), dtype=grad.dtype, pin_memory=True), event)
        host, event = slot
        host.copy_(grad.detach(), non_blocking=True)  # on the current stream of grad's device
        event.record(torch.cuda.current_stream(grad.device))
        self._pending = (event, host)


_incoming_gradient = _IncomingGradient()


def reset_incoming_gradient() -> None:
    """Forget the observed incoming gradients (a fresh process's state): for tests."""
    global _incoming_gradient
    _incoming_gradient = _IncomingGradient()


# Bytes per logit from which the forward of a reduced loss computes its gradient: every dtype. On the H200
# at 8192x32000 (benchmarks/results/h200: profile-2e948f3, verify-7a78c96, cross-entropy-d5b23b2), in
# float32 the fused kernel took 574 to 595 us against 826 for the statistics path's kernels called
# directly. bfloat16 kept the statistics path (4 here) while its fused kernel saved no device time (405
# to 424 us against 426); since its streamed first pass reads whole blocks unmasked, staged, in the exp2
# form, it does: on an H100 (benchmarks/results/h100/ce-fused-bf16-45176a5) kernelgate's step took 474
# against 555 us at 8192x32000 (0.62 -> 0.73 of copy), 1038 against 1084 at 4096x128256 and 1072 against
# 1090 at 2048x256000. Back to back the step is bound by that host (about 700 us a step on either path, rounds
# spreading 30 to 50 %: benchmarks/results/h100/ce-back-to-back-b88d083), so the device time decides.
FUSED_GRAD_MIN_BYTES = 2


def _forward_op(inputs: tuple[Any, ...]) -> Op:
    """The forward eager autograd runs: for a reduced (scalar) loss whose backward is expected to get 1 (of
    logits of at least FUSED_GRAD_MIN_BYTES), with the gradient; else with the row statistics.

    Under eager autograd the logits are the only input that can require grad (a weight that does is
    refused by _save), so the reduction, the logits' dtype and the incoming gradient decide.
    """
    if inputs[5] != "none" and inputs[0].element_size() >= FUSED_GRAD_MIN_BYTES and _incoming_gradient.expected():
        return cross_entropy_with_grad
    return cross_entropy_with_stats


class _SavedGradient:
    """cross_entropy_with_grad's gradient, handed to the first backward that asks, and then dropped.

    Kept on the autograd context as a plain value rather than through ``save_for_backward``: the
    backward scales the tensor in place, which would bump its version counter and make a second
    backward of the graph (``retain_graph=True``) fail autograd's check on unpacking it, though that
    backward recomputes instead. Dropping it once taken also lets autograd accumulate the tensor
    into ``logits.grad`` without a copy. ``saved_tensors_hooks`` (such as ``save_on_cpu``) do not
    see it.
    """

    __slots__ = ("dlogits",)

    def __init__(self, dlogits: torch.Tensor) -> None:
        self.dlogits: torch.Tensor | None = dlogits

    def take(self) -> torch.Tensor | None:
        dlogits, self.dlogits = self.dlogits, None
        return dlogits


def _keep(inputs: tuple[Any, ...], extras: tuple[Any, ...], forward: Op) -> tuple[Any, ...]:
    return (_SavedGradient(extras[0]),) if forward is cross_entropy_with_grad else extras


def _save(inputs: tuple[Any, ...], loss: torch.Tensor) -> tuple[Any, ...]:
    weight = inputs[2]
    if isinstance(weight, torch.Tensor) and weight.requires_grad:
        raise InputValueError(
            "cross_entropy(): argument 'weight' requires grad, but the loss has no gradient with respect to the "
            "class weights (neither has torch.nn.functional.cross_entropy's). Pass weight.detach()."
        )
    return tuple(inputs)


def _grads(saved: tuple[Any, ...], grad: torch.Tensor) -> tuple[Any, ...]:
    # The six inputs, then what the eager autograd path's forward kept: the gradient for an incoming
    # gradient of 1 ("mean", "sum") or the row statistics ("none"). Neither carries autograd history,
    # so a backward that is itself differentiated (create_graph, where grad mode is on) recomputes
    # from the logits; so does any backward after the first, which finds the gradient taken.
    extra = saved[6] if len(saved) > 6 else None
    differentiated = torch.is_grad_enabled()
    if saved[5] != "none" and not differentiated:
        _incoming_gradient.observe(grad)
    if isinstance(extra, _SavedGradient):
        dlogits = extra.take()
        if dlogits is not None and not differentiated:
            # In place; where grad is 1 (loss.backward()) this moves no memory. Another grad is not
            # applied by scaling the saved gradient: rounded twice, a float16 or bfloat16 gradient
            # would be up to twice as far from the exact one as torch's. It is computed again from
            # the logits, which reads as much as scaling would.
            cross_entropy_backward_into(grad, *saved[:6], dlogits)
            return (dlogits, None, None, None, None, None)
        extra = None
    stats = None if differentiated else extra
    return (cross_entropy_backward(grad, *saved[:6], stats), None, None, None, None, None)


cross_entropy = Op(
    "cross_entropy",
    reference=cross_entropy_reference,
    args=_contract(),
    implementations=_impls(
        *_forward_launchers("loss"),
        ((CROSS_ENTROPY_FWD, CROSS_ENTROPY_REDUCE), (CROSS_ENTROPY_FWD, CROSS_ENTROPY_REDUCE)),
        skip=0,
        staged=True,
    ),
    bucket=_bucket,
    reduction_length=_reduction_length,
    # Under eager autograd the forward of "mean" and "sum" is cross_entropy_with_grad: it writes the
    # gradient for an incoming gradient of 1 (one read of the logits, one write), which the backward
    # hands on. That of "none" is cross_entropy_with_stats: each row's maximum and
    # log-sum are kept (8 bytes a row), so the backward reads a long row once instead of twice. A traced
    # call (the PyTorch operator) keeps only the inputs, and the backward recomputes from them. Eager
    # autograd of the reference never replaces a kernel forward: it keeps float32 probabilities the size
    # of the logits, which the Function exists to avoid.
    backward=Backward(save=_save, grads=_grads, forward=_forward_op, keep=_keep, may_step_eagerly=False),
    make_inputs=_make_inputs,
)
