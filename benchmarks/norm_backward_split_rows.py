"""The norms' backward implementations for long rows, side by side, at every configuration tuning would try.

The ``split`` backwards of rms_norm, add_rms_norm and layer_norm read x and dy twice (a kernel for each row's
statistics, then one over column blocks of row groups), which bounds the forward+backward at 0.71 of copy;
``split_rows`` reads them once (a row's programs exchange its statistics, in groups that loop over rows). For each
case this checks each configuration of each implementation against the op's reference (the package's tolerance,
the parameter gradients by the norm of their error) and times the ones that match (``do_bench``: L2 flushed,
median, compiled ahead in worker processes). Bytes a call: x and dy read, dx written (add_rms_norm: grad_s read
too), the weight read once (layer_norm's bias not counted); fractions are of a device-to-device copy measured in
the same run. Writes JSON with provenance.

Beside the package's three, each backward runs a variant, ``split_rows_tagged``: the package's split_rows_pipelined
kernel with a row's sums (layer_norm's four partials) exchanged through slots that carry the launch's tag beside
each value (one 64-bit store a value, read until every tag of the row is current) instead of partials and an
arrival count. The count costs a release a row, which waits until the program's earlier stores (the previous
row's dx) are acknowledged, then an atomic's round trip, then an atomic to leave. At rms_norm's bfloat16
4096x16384 its split_rows backward took 1.3 times the single-block kernel's time for the same bytes (216.0 against
161.3 us, both timed by tuning in the H100 suite at 1d9eadd: ``results/h100/default-1d9eadd/decisions.json.gz``),
and the exchange, paid every row, is what the variant cuts. (A variant that put
each row's wait off by a row, ``split_rows_lagged``, was 0.95 to 1.06 times the package kernel's time:
``results/h100/norm-backward-split-rows-lagged-8d8bed0``.)

The package's ``split_rows_pipelined`` runs beside them, its split_rows backward with the row loop pipelined by
Triton (2-byte rows, NVIDIA GPUs): it began here as the rms norms' variant ``split_rows_staged``, which was wrong
and could hang as first written and, fixed, was faster than split_rows at most bfloat16 shapes on an H100
(``results/h100/norm-backward-split-rows-staged-1d9eadd``); layer_norm's began here as ``layer_norm_pipelined``.

``--per-sm K`` adds the pipelined and tagged kernels at blocks of 2048 with K programs a multiprocessor (tuning
takes 4 there; compiled for sm_90 the rms norms' take 80 registers a thread, room for 6), named ``<name>_K``: more
programs in flight a multiprocessor hide more of the exchange's wait. ``--op`` keeps the backwards named.

    python benchmarks/norm_backward_split_rows.py --out split-rows.json
    python benchmarks/norm_backward_split_rows.py --interpret --rows 5 --lengths 9000 --out check.json
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from tagged_exchange import publish_tagged, read_plainly, read_tagged, slot_bits, tagged_split  # beside this script
from variant_timing import argument_parser, check_and_time, package_impl, run_cases

import kernelgate
from kernelgate import rowwise
from kernelgate.config import Config, ConfigSpace
from kernelgate.launch import LazyKernel, launch
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.layer_norm.kernels import _block_stats, layer_norm_write_dx
from kernelgate.ops.rms_norm.kernels import rms_norm_write_dx
from kernelgate.ops.split_rows import load_block_pair, row_group_block
from kernelgate.ops.tiles import load_tile, store_tile

rms_norm_module = importlib.import_module("kernelgate.ops.rms_norm")
layer_norm_module = importlib.import_module("kernelgate.ops.layer_norm")

DEFAULT_LENGTHS = (16384, 32768, 65536, 131072)
BACKWARDS = (kernelgate.rms_norm_backward, kernelgate.add_rms_norm_backward, kernelgate.layer_norm_backward)
IMPLEMENTATIONS = ("split", "split_rows", "split_rows_pipelined")


@triton.jit
def _rms_norm_bwd_tagged_kernel(
    dy_ptr, ds_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, slot_ptr, tag, stride_dym, stride_dsm, stride_xm, stride_dxm,
    n_cols, n_split, n_rows, eps, HAS_DS: tl.constexpr, HAS_WEIGHT: tl.constexpr, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """The package's ``_rms_norm_bwd_split_rows_pipelined_kernel`` (same grid and results) with the row's sums
    exchanged through tagged slots instead of partials and a count: each program stores its two sums with this
    launch's ``tag`` beside them (slot_ptr: (n_rows, 2 * SPLIT_BLOCK) int64, slot ``j * SPLIT_BLOCK + part``) and
    reads the row's until every tag is current. The count's exchange costs a release (the program's earlier stores,
    the previous row's dx among them, acknowledged first), an atomic's round trip and an atomic to leave; this costs
    a store and the reads. Under the interpreter (PHASE 1, then 2) the slots are stored and read plainly."""
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    dw = tl.zeros([BLOCK_N], tl.float32)
    for row in tl.range(group, n_rows, groups, num_stages=1 + 2 * PREFETCH):
        x_in, dy_in = load_block_pair(x_ptr, dy_ptr, row, stride_xm, stride_dym, cols, mask, EVEN_N)
        slot_row = slot_ptr + row * (2 * SPLIT_BLOCK)
        x = x_in.to(tl.float32)
        g = dy_in.to(tl.float32)
        if HAS_WEIGHT:
            g = g * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        if PHASE == 0:
            publish_tagged(slot_row + part, tl.sum(x * x, axis=0), tag)
            publish_tagged(slot_row + SPLIT_BLOCK + part, tl.sum(g * x, axis=0), tag)
            sum_xx = tl.sum(read_tagged(slot_row, 0, n_split, tag, 0.0, SPLIT_BLOCK), axis=0)
            sum_gx = tl.sum(read_tagged(slot_row, 1, n_split, tag, 0.0, SPLIT_BLOCK), axis=0)
        elif PHASE == 1:  # the interpreter's first launch: the slots only
            tl.store(slot_row + part, slot_bits(tl.sum(x * x, axis=0)))
            tl.store(slot_row + SPLIT_BLOCK + part, slot_bits(tl.sum(g * x, axis=0)))
        else:
            sum_xx = tl.sum(read_plainly(slot_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
            sum_gx = tl.sum(read_plainly(slot_row, 1, n_split, 0.0, SPLIT_BLOCK), axis=0)
        if PHASE != 1:
            dw = rms_norm_write_dx(
                x_in, dy_in, sum_xx, sum_gx, w_ptr, ds_ptr, dx_ptr, dw, row, stride_dsm, stride_dxm, cols, mask,
                n_cols, eps, HAS_DS, HAS_WEIGHT, EVEN_N,
            )  # fmt: skip
    if HAS_WEIGHT and PHASE != 1:
        store_tile(dw_ptr + group * n_cols + cols, dw, mask, EVEN_N, "")


@triton.jit
def _layer_norm_bwd_tagged_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, db_ptr, slot_ptr, tag, stride_dym, stride_xm, stride_dxm, n_cols, n_split,
    n_rows, eps, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, EVEN_N: tl.constexpr = False,
):  # fmt: skip
    """The package's ``_layer_norm_bwd_split_rows_pipelined_kernel`` (same grid and results) with the row's four
    partials a program exchanged through tagged slots (slot_ptr: (n_rows, 4 * SPLIT_BLOCK) int64), as the rms norms'
    tagged kernel exchanges its two."""
    part, group, groups, cols, mask = row_group_block(n_split, n_cols, BLOCK_N)
    count = tl.minimum(n_cols - part * BLOCK_N, BLOCK_N).to(tl.float32)
    parts = tl.arange(0, SPLIT_BLOCK)
    counts = tl.minimum(tl.maximum(n_cols - parts * BLOCK_N, 0), BLOCK_N).to(tl.float32)
    dw = tl.zeros([BLOCK_N], tl.float32)
    db = tl.zeros([BLOCK_N], tl.float32)
    for row in tl.range(group, n_rows, groups, num_stages=1 + 2 * PREFETCH):
        x_in, dy_in = load_block_pair(x_ptr, dy_ptr, row, stride_xm, stride_dym, cols, mask, EVEN_N)
        k = tl.load(x_ptr + row * stride_xm).to(tl.float32)
        slot_row = slot_ptr + row * (4 * SPLIT_BLOCK)
        g = dy_in.to(tl.float32)
        if HAS_WEIGHT:
            g = g * load_tile(w_ptr + cols, mask, 0.0, EVEN_N, "").to(tl.float32)
        if PHASE == 0:
            x = x_in.to(tl.float32)
            mean_part, m2_part = _block_stats(x, mask, k, count, EVEN_N)
            publish_tagged(slot_row + part, mean_part, tag)
            publish_tagged(slot_row + SPLIT_BLOCK + part, m2_part, tag)
            publish_tagged(slot_row + 2 * SPLIT_BLOCK + part, tl.sum(g, axis=0), tag)
            publish_tagged(slot_row + 3 * SPLIT_BLOCK + part, tl.sum(g * ((x - k) - mean_part), axis=0), tag)
            means = read_tagged(slot_row, 0, n_split, tag, 0.0, SPLIT_BLOCK)
            m2s = read_tagged(slot_row, 1, n_split, tag, 0.0, SPLIT_BLOCK)
            g_sums = read_tagged(slot_row, 2, n_split, tag, 0.0, SPLIT_BLOCK)
            g_devs = read_tagged(slot_row, 3, n_split, tag, 0.0, SPLIT_BLOCK)
        elif PHASE == 1:  # the interpreter's first launch: the slots only
            x = x_in.to(tl.float32)
            mean_part, m2_part = _block_stats(x, mask, k, count, EVEN_N)
            tl.store(slot_row + part, slot_bits(mean_part))
            tl.store(slot_row + SPLIT_BLOCK + part, slot_bits(m2_part))
            tl.store(slot_row + 2 * SPLIT_BLOCK + part, slot_bits(tl.sum(g, axis=0)))
            tl.store(slot_row + 3 * SPLIT_BLOCK + part, slot_bits(tl.sum(g * ((x - k) - mean_part), axis=0)))
        else:
            means = read_plainly(slot_row, 0, n_split, 0.0, SPLIT_BLOCK)
            m2s = read_plainly(slot_row, 1, n_split, 0.0, SPLIT_BLOCK)
            g_sums = read_plainly(slot_row, 2, n_split, 0.0, SPLIT_BLOCK)
            g_devs = read_plainly(slot_row, 3, n_split, 0.0, SPLIT_BLOCK)
        if PHASE != 1:
            dw, db = layer_norm_write_dx(
                x_in, dy_in, k, means, m2s, g_sums, g_devs, counts, w_ptr, dx_ptr, dw, db, row, stride_dxm, cols, mask,
                n_cols, eps, HAS_WEIGHT, HAS_BIAS, EVEN_N,
            )  # fmt: skip
    if PHASE != 1:
        if HAS_WEIGHT:
            store_tile(dw_ptr + group * n_cols + cols, dw, mask, EVEN_N, "")
        if HAS_BIAS:
            store_tile(db_ptr + group * n_cols + cols, db, mask, EVEN_N, "")


# By the module's importable name (not "__main__" when it runs as a script): the compile workers import it by name.
RMS_NORM_TAGGED = LazyKernel(Path(__file__).stem, "_rms_norm_bwd_tagged_kernel")
LAYER_NORM_TAGGED = LazyKernel(Path(__file__).stem, "_layer_norm_bwd_tagged_kernel")


def run_rms_norm_backward_tagged(
    grad: torch.Tensor,
    grad_s: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    config: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The package's ``run_backward_split_rows`` with the tagged kernel, its slots and tag in place of the partials
    and counts."""
    x_rows, g_rows, ds_rows, w = rms_norm_module._backward_operands(grad, grad_s, x, weight)
    n_rows, n_cols, block = x_rows.n_rows, x_rows.n_cols, config["BLOCK_N"]
    groups = rowwise.split_rows_groups(x.device, n_rows, n_cols, block, config["PER_SM"])
    n_split, split_block, slots, tag = tagged_split(x.device, n_rows, n_cols, block, 2)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    partial = torch.empty((groups, n_cols) if w is not None else (1,), dtype=torch.float32, device=x.device)
    for phase in rowwise.split_rows_phases():
        launch(
            RMS_NORM_TAGGED, (groups * n_split,), g_rows.tensor, ds_rows.tensor, x_rows.tensor,
            x_rows.tensor if w is None else w, dx, partial, slots, tag, g_rows.stride, ds_rows.stride, x_rows.stride,
            n_cols, n_cols, n_split, n_rows, eps, HAS_DS=grad_s is not None, HAS_WEIGHT=w is not None, PHASE=phase,
            SPLIT_BLOCK=split_block, BLOCK_N=block, PREFETCH=bool(config["PREFETCH"]), EVEN_N=n_cols % block == 0,
            num_warps=config["num_warps"],
        )  # fmt: skip
    if w is None:
        return dx, x.new_empty(0)
    return dx, rowwise.sum_partials(partial[None], [w])[0]


def run_layer_norm_backward_tagged(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    config: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The package's layer_norm ``run_backward_split_rows`` with the tagged kernel, its slots and tag in place of the
    partials and counts."""
    x_rows, g_rows, w = layer_norm_module._backward_operands(grad, x, normalized_shape, weight, bias)
    n_rows, n_cols, block = x_rows.n_rows, x_rows.n_cols, config["BLOCK_N"]
    groups = rowwise.split_rows_groups(x.device, n_rows, n_cols, block, config["PER_SM"])
    n_split, split_block, slots, tag = tagged_split(x.device, n_rows, n_cols, block, 4)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    sums = int(w is not None) + int(bias is not None)
    partial = torch.empty((sums, groups, n_cols) if sums else (1, 1, 1), dtype=torch.float32, device=x.device)
    for phase in rowwise.split_rows_phases():
        launch(
            LAYER_NORM_TAGGED, (groups * n_split,), g_rows.tensor, x_rows.tensor, x_rows.tensor if w is None else w,
            dx, partial[0], partial[sums - 1], slots, tag, g_rows.stride, x_rows.stride, n_cols, n_cols, n_split,
            n_rows, float(eps), HAS_WEIGHT=w is not None, HAS_BIAS=bias is not None, PHASE=phase,
            SPLIT_BLOCK=split_block, BLOCK_N=block, PREFETCH=bool(config["PREFETCH"]), EVEN_N=n_cols % block == 0,
            num_warps=config["num_warps"],
        )  # fmt: skip
    return (dx, *layer_norm_module._affine_grads(partial, sums, x, weight, bias))


def tagged_variant(op: Op) -> TritonImpl:
    """``op``'s split_rows_pipelined implementation (a norm's backward) with the tagged kernel in place of the
    package's, at the same configurations."""
    pipelined = package_impl(op, "split_rows_pipelined")

    def launch_tagged(*args: Any, config: Any) -> Any:
        if op.name == "layer_norm_backward":  # (grad, x, normalized_shape, weight, bias, eps)
            return run_layer_norm_backward_tagged(*args, config)
        if op.name == "add_rms_norm_backward":  # (grad, grad_s, s, weight, eps)
            return run_rms_norm_backward_tagged(*args, config)
        grad, x, weight, eps = args
        return run_rms_norm_backward_tagged(grad, None, x, weight, eps, config)

    kernel = LAYER_NORM_TAGGED if op.name == "layer_norm_backward" else RMS_NORM_TAGGED
    return dataclasses.replace(
        pipelined, name="split_rows_tagged", launcher=launch_tagged, kernels=(kernel, rowwise.PARTIAL_SUMS)
    )


def crowded_variant(impl: TritonImpl, per_sm: int) -> TritonImpl:
    """``impl`` (a pipelined split_rows backward) at blocks of 2048 only, with ``per_sm`` programs a multiprocessor
    where tuning takes 4: named ``<name>_<per_sm>``. Compiled for sm_90 the rms norms' pipelined kernels take 79 to
    80 registers a thread there, room for 6 programs of 4 warps a multiprocessor
    (``results/compile-sm90/tagged-exchange-registers.txt``); a row's exchange is paid every row, and more programs
    in flight a multiprocessor hide more of its wait."""

    def prune(config: Config, *args: Any) -> bool:
        return impl.prune(dict(config, PER_SM=4), *args)

    configs = ConfigSpace(**{**impl.configs.params, "BLOCK_N": (2048,), "PER_SM": (per_sm,)})
    default = {"BLOCK_N": 2048, "num_warps": 4, "PER_SM": per_sm, "PREFETCH": 1}
    return dataclasses.replace(impl, name=f"{impl.name}_{per_sm}", configs=configs, prune=prune, default_config=default)


def measure_case(
    op: Op, dtype: torch.dtype, rows: int, n: int, device: torch.device, interpret: bool, per_sm: Sequence[int] = ()
) -> list[dict[str, Any]]:
    """Check, then (on a GPU) time, every configuration of ``op``'s long-row backwards at a ``rows`` x ``n`` input
    (with ``per_sm``, the pipelined and tagged kernels at that many programs a multiprocessor too)."""
    assert op.make_inputs is not None
    torch.manual_seed(0)
    values = tuple(op.make_inputs((rows, n), dtype, device))
    tensors_read = 3 if op.name == "add_rms_norm_backward" else 2  # grad, (grad_s), x
    nbytes = ((tensors_read + 1) * rows * n + n) * dtype.itemsize
    impls = [*(impl for impl in op.implementations if impl.name in IMPLEMENTATIONS), tagged_variant(op)]
    impls += [crowded_variant(impl, k) for k in per_sm for impl in impls if impl.name.startswith("split_rows_")]
    return check_and_time(op, impls, values, op.reduction_length(*values), nbytes, interpret, record_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(__doc__, DEFAULT_LENGTHS)
    parser.add_argument("--op", action="append", choices=[op.name for op in BACKWARDS], help="default: all three")
    parser.add_argument(
        "--per-sm", type=int, action="append", default=[],
        help="also time the pipelined and tagged kernels at blocks of 2048 with this many programs a multiprocessor",
    )  # fmt: skip
    args = parser.parse_args(argv)
    ops = [op for op in BACKWARDS if not args.op or op.name in args.op]
    groups = [({"op": op.name}, functools.partial(measure_case, op, per_sm=args.per_sm)) for op in ops]
    return run_cases(args, Path(__file__).name, groups)


if __name__ == "__main__":
    sys.exit(main())
