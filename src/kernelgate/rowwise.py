"""Shared pieces of row-wise ops (a reduction over the last dimension, one or more rows per program).

Two implementation shapes cover any row length: a single-block kernel that holds whole rows in
registers, and a looped kernel that streams long rows in blocks. This module holds their config
spaces, pruning rules and bucketing, so each row-wise op declares only its kernels and launchers.

A single-block kernel may take ``ROWS`` rows per program (a ``(ROWS, BLOCK_N)`` tile). Short rows
need it: with one row of 128 elements per program, a program does too little to hide memory
latency, and the launch of many tiny programs dominates.

>>> per_thread_ok(4096, 8), per_thread_ok(65536, 4), per_thread_ok(16, 2)
(True, False, False)
>>> row_block_default(128, 100000), row_block_default(8192, 100000), row_block_default(128, 3)
({'ROWS': 16, 'num_warps': 8}, {'ROWS': 1, 'num_warps': 16}, {'ROWS': 4, 'num_warps': 2})
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelgate import backend
from kernelgate.bucket import aligned16, pow2
from kernelgate.config import LAUNCH_OPTIONS, Config, ConfigSpace
from kernelgate.launch import (
    LazyKernel,
    Rows,
    Unsupported,
    as_rows,
    call_state,
    cdiv,
    empty,
    launch,
    next_power_of_2,
    num_warps_for,
)
from kernelgate.op import HALF_AND_FLOAT, TritonImpl

__all__ = [
    "INTERPRETED_L2_BYTES",
    "LOOPED_CONFIGS",
    "LOOPED_CONFIGS_32_WARPS",
    "LOOPED_DEFAULT",
    "MAX_SINGLE_BLOCK",
    "MAX_SINGLE_BLOCK_ALONG_BACKWARD",
    "MAX_SINGLE_BLOCK_FORWARD",
    "MAX_SPLIT_PROGRAMS",
    "PARTIAL_SUMS",
    "PERSISTENT_CONFIGS",
    "PERSISTENT_LOOPED_CONFIGS",
    "PERSISTENT_LOOPED_DEFAULT",
    "PERSISTENT_STAGE_BYTES",
    "PIPELINED_SHARED_BYTES",
    "ROW_BLOCK_BACKWARD_CONFIGS",
    "ROW_BLOCK_CONFIGS",
    "SINGLE_BLOCK_CONFIGS",
    "SPLIT_CONFIGS",
    "SPLIT_DEFAULT",
    "SPLIT_MIN_COLS",
    "SPLIT_PER_THREAD",
    "SPLIT_ROWS_BACKWARD_CONFIGS",
    "SPLIT_ROWS_BACKWARD_DEFAULT",
    "SPLIT_ROWS_BACKWARD_PER_THREAD",
    "SPLIT_ROWS_CONFIGS",
    "SPLIT_ROWS_DEFAULT",
    "SPLIT_ROWS_PER_THREAD",
    "along_dim_backward_impls",
    "along_dim_bucket",
    "along_dim_impls",
    "along_dim_length",
    "along_dim_rows",
    "column_row_groups",
    "fits_one_block",
    "launch_rows",
    "launch_split_rows",
    "looped_impl",
    "per_thread_ok",
    "persistent_impl",
    "persistent_looped_impl",
    "persistent_looped_programs",
    "persistent_programs",
    "prune_looped",
    "prune_persistent",
    "prune_row_block",
    "prune_single_block",
    "row_block_default",
    "row_bucket",
    "row_groups",
    "single_block",
    "single_block_default",
    "single_block_impl",
    "split_impl",
    "split_rows_backward_impl",
    "split_rows_buffers",
    "split_rows_count",
    "split_rows_counts",
    "split_rows_groups",
    "split_rows_impl",
    "split_rows_phases",
    "sum_partials",
]

# Rows up to this length are held in registers by one program; longer rows loop.
MAX_SINGLE_BLOCK = 16384
# A forward holds less per element than a backward (no gradient, no weight-gradient accumulator),
# so its single-block kernel also competes, in tuning, with the looped one up to this length: a
# row read once instead of twice (spilled registers make a candidate slower, never wrong).
MAX_SINGLE_BLOCK_FORWARD = 65536
# softmax's and log_softmax's backwards hold two rows (y and the gradient), and their single-block kernels also
# compete with the looped ones, which read both rows twice, up to this length. Compiled for sm_90 by Triton 3.6.0,
# softmax's keeps 32 to 56 bytes a thread in local memory at rows of 32768, and 472 to 560 at 65536
# (benchmarks/results/cpu/kernel-resources-along-backward/).
MAX_SINGLE_BLOCK_ALONG_BACKWARD = 32768
# Elements each thread holds per block: more spills registers.
MAX_PER_THREAD = 64

# Elements of a (ROWS, BLOCK_N) tile beyond which more rows per program stop helping.
MAX_ROW_TILE = 8192
# Smallest tile, and elements per thread, worth tuning with more than one row per program.
MIN_ROW_TILE = 1024
MIN_ROW_TILE_PER_THREAD = 8
# Elements a program is given by default when rows are short.
DEFAULT_ROW_TILE = 2048

SINGLE_BLOCK_CONFIGS = ConfigSpace(num_warps=(1, 2, 4, 8, 16, 32))
ROW_BLOCK_CONFIGS = ConfigSpace(ROWS=(1, 2, 4, 8, 16, 32, 64), num_warps=(1, 2, 4, 8, 16, 32))
# The norm backwards' single-block kernels take two switches besides (see prune_backward_switches):
# - PREFETCH: the next tile loaded before this tile's reductions. It holds two tiles live, so it is tried only where a
#   thread holds at most PREFETCH_MAX_PER_THREAD elements of a tile.
# - WEIGHT_PER_TILE: the weight loaded with each tile rather than once a program, so that it is not live across the
#   row loop. Compiled for sm_90 by Triton 3.6.0, every configuration of rms_norm's, add_rms_norm's and layer_norm's
#   at rows of 16384 keeps 112 to 2552 bytes a thread in local memory (benchmarks/results/cpu/
#   kernel-resources-1eb9bc2/), and with the switch on rms_norm's and add_rms_norm's keep 72 to 224, layer_norm's
#   184 to 280 (kernel-resources-weight-per-tile/). It is tried only from blocks of WEIGHT_PER_TILE_MIN_BLOCK,
#   where every configuration spills; at 8192 those tuned on the H200 keep none or 8 bytes.
ROW_BLOCK_BACKWARD_CONFIGS = ConfigSpace(
    ROWS=(1, 2, 4, 8, 16, 32, 64), num_warps=(1, 2, 4, 8, 16, 32), PREFETCH=(0, 1), WEIGHT_PER_TILE=(0, 1)
)
PREFETCH_MAX_PER_THREAD = 16
WEIGHT_PER_TILE_MIN_BLOCK = 16384
LOOPED_CONFIGS = ConfigSpace(BLOCK_N=(1024, 2048, 4096, 8192), num_warps=(4, 8, 16))
# With 32 warps too, for a looped forward light enough per element to keep 1024 threads busy: on the H200,
# rms_norm's at bf16 rows of 32768 ran at 0.83 of copy with 16 warps and 0.93 with 32; softmax's at float32
# rows of 65536 in 99.0 us as tuned (16 warps at best) and 87.5 us with 32
# (benchmarks/results/h200/long-rows-c8ca3e4.txt).
LOOPED_CONFIGS_32_WARPS = ConfigSpace(BLOCK_N=(1024, 2048, 4096, 8192), num_warps=(4, 8, 16, 32))
LOOPED_DEFAULT: Config = {"BLOCK_N": 4096, "num_warps": 8}
# The split backward (split_impl): for rows of at least SPLIT_MIN_COLS, where the looped backward's weight-gradient
# partial sums, a row per program, come close to an input's size when the rows are few.
SPLIT_CONFIGS = ConfigSpace(BLOCK_N=(1024, 2048, 4096), num_warps=(4, 8, 16))
# Tuning tries those holding 4 to 8 elements of a block a thread (5 of the 9): on the H200 every one of the 23
# buckets where tuning chose split, of rms_norm's, add_rms_norm's and layer_norm's backwards at rows of 16384 to
# 131072, chose one of them (benchmarks/results/h200/split-backward-2c2c022/ and layer-norm-split-67ba0db-6bb833f/).
SPLIT_PER_THREAD = (4, 8)
SPLIT_DEFAULT: Config = {"BLOCK_N": 2048, "num_warps": 8}
SPLIT_MIN_COLS = 8192
# The backwards' weight-gradient partial sums, summed over their rows (sum_partials): columns a program, and
# elements of a tile of rows a program (a tile of 4096 float32 at 4 warps: 32 a thread).
PARTIAL_SUMS = LazyKernel("kernelgate.ops.partial_sums", "_partial_sums_kernel")
PARTIAL_SUMS_BLOCK_C = 64
PARTIAL_SUMS_TILE = 4096


def per_thread_ok(block: int, num_warps: int) -> bool:
    """No more elements per thread than registers hold, and no warp without an element (beyond one)."""
    return block // (32 * num_warps) <= MAX_PER_THREAD and (num_warps == 1 or block >= 32 * num_warps)


def single_block(n_cols: int) -> int:
    """The block of a single-block kernel: the row length rounded up to a power of two (at least 16)."""
    return next_power_of_2(max(n_cols, 16))


def fits_one_block(n_cols: int, limit: int = MAX_SINGLE_BLOCK) -> str | None:
    """``None`` when a row of ``n_cols`` fits one block of at most ``limit``, else why not (``TritonImpl.supports``)."""
    return None if n_cols <= limit else f"rows of {n_cols} exceed one block of {limit}"


def _warps_that_fit(block: int) -> int:
    """About 8 elements per thread, with more warps where a long block would hold too many per thread."""
    warps = num_warps_for(block)
    while not per_thread_ok(block, warps) and warps < 32:
        warps *= 2
    return warps


def single_block_default(n_cols: int) -> Config:
    """The untuned configuration of a single-block kernel: about 8 elements per thread."""
    return {"num_warps": _warps_that_fit(single_block(n_cols))}


def prune_single_block(config: Config, n_cols: int) -> bool:
    """Whether a single-block configuration suits rows of ``n_cols``."""
    return per_thread_ok(single_block(n_cols), config["num_warps"])


def row_block_default(n_cols: int, n_rows: int) -> Config:
    """The untuned configuration of a multi-row single-block kernel: a tile of about 2048 elements."""
    block = single_block(n_cols)
    rows = max(1, min(DEFAULT_ROW_TILE // block, next_power_of_2(max(n_rows, 1))))
    return {"ROWS": rows, "num_warps": _warps_that_fit(rows * block)}


def prune_row_block(config: Config, n_cols: int, n_rows: int) -> bool:
    """Whether a ``(ROWS, BLOCK_N)`` configuration suits ``n_rows`` rows of ``n_cols``.

    More than one row per program only while the tile stays small and every row has data, and only
    for tiles that give each thread some work: at least MIN_ROW_TILE elements (or all the rows
    there are) and MIN_ROW_TILE_PER_THREAD per thread (or one warp). Every winner measured on the
    H200 at rows of 128 to 4096 met these (benchmarks/results/h200/short-rows-70095f7); the
    rest only lengthened tuning.
    """
    rows, block, warps = config["ROWS"], single_block(n_cols), config["num_warps"]
    tile = rows * block
    if rows > 1:
        everything = next_power_of_2(max(n_rows, 1)) * block
        if tile > MAX_ROW_TILE or tile > everything or tile < min(MIN_ROW_TILE, everything):
            return False
        if warps > 1 and tile // (32 * warps) < MIN_ROW_TILE_PER_THREAD:
            return False
    return per_thread_ok(tile, warps)


def prune_looped(config: Config, n_cols: int) -> bool:
    """Whether a looped configuration suits rows of ``n_cols`` (no block longer than the row)."""
    block = config["BLOCK_N"]
    return block <= next_power_of_2(n_cols) and per_thread_ok(block, config["num_warps"])


def prune_backward_switches(config: Config, n_cols: int) -> bool:
    """Whether a norm backward's PREFETCH and WEIGHT_PER_TILE suit rows of ``n_cols`` (see ROW_BLOCK_BACKWARD_CONFIGS):
    PREFETCH on only where a thread holds at most PREFETCH_MAX_PER_THREAD elements of a tile, WEIGHT_PER_TILE on only
    from blocks of WEIGHT_PER_TILE_MIN_BLOCK.

    >>> prune_backward_switches({"ROWS": 1, "num_warps": 32, "PREFETCH": 0, "WEIGHT_PER_TILE": 1}, 16384)
    True
    >>> prune_backward_switches({"ROWS": 1, "num_warps": 32, "PREFETCH": 0, "WEIGHT_PER_TILE": 1}, 8192)
    False
    """
    block = single_block(n_cols)
    if config["PREFETCH"] and config["ROWS"] * block // (32 * config["num_warps"]) > PREFETCH_MAX_PER_THREAD:
        return False
    return not config.get("WEIGHT_PER_TILE") or block >= WEIGHT_PER_TILE_MIN_BLOCK


def row_bucket(n_rows: int, n_cols: int) -> tuple[int, int, bool]:
    """Rows and row length rounded up to powers of two, and whether the row length is a multiple of 16."""
    return pow2(n_rows), pow2(n_cols), aligned16(n_cols)


def sum_partials(partial: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each parameter's gradient from its float32 partial sums: ``partial`` is ``(len(params), rows, n_cols)``,
    contiguous, ``partial[k]`` the partial sums of ``params[k]``'s gradient (one or two parameters, of ``n_cols``
    elements each). Returns the sums over the rows, each in its parameter's dtype and shape and memory of its own,
    from one launch of the partial-sums kernel (``kernelgate.ops.partial_sums``), which casts as it stores.
    """
    outputs, n_rows, n_cols = partial.shape
    if not 1 <= len(params) == outputs <= 2:
        raise ValueError(f"sum_partials: {outputs} rows of partial sums for {len(params)} parameters (one or two)")
    sums = [torch.empty(p.shape, dtype=p.dtype, device=partial.device) for p in params]
    block_c = min(PARTIAL_SUMS_BLOCK_C, next_power_of_2(max(n_cols, 1)))
    block_r = min(next_power_of_2(max(n_rows, 1)), PARTIAL_SUMS_TILE // block_c)
    launch(
        PARTIAL_SUMS, (cdiv(n_cols, block_c), outputs), partial, sums[0], sums[-1], n_rows, n_cols,
        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4,
    )  # fmt: skip
    return sums


def single_block_backward_programs_per_sm(block: int) -> int:
    """Programs per multiprocessor for a single-block backward over rows of up to ``block`` columns: 4 up to rows of
    2048, 2 at 4096 and 1 from 8192, each with more rows.

    Each program writes a float32 row of weight-gradient partial sums, which :func:`sum_partials` then sums over the
    programs; fewer programs hide less memory latency where rows are short. On the H200, with the partial sums
    summed by that kernel, the launchers were fastest at 4 programs a multiprocessor in 3 of 5 cases up to rows of
    2048 (at 2 in the others, by 4 and 5 %) and at 2 at rows of 4096 (``benchmarks/results/h200/
    backward-programs-281e662/``); at rows of 8192, with the configuration tuned for 4, 1 was 3 to 5 % faster than 2
    in 3 of 4 cases. With every configuration timed at each count (``backward-programs-16384-d156be4/``), 1 was 3.3
    to 5.4 % faster than 2 at each of 6 cases at rows of 16384. At the default suite's shapes, the norms'
    forward+backward with 1 from rows of 8192 took 2.4 to 4.4 % less time at rows of 8192 and 0.3 to 3.0 % less at
    16384 than with 2 (``mid-rows-d23dae9-rule1/`` against ``default-d156be4/``).

    >>> [single_block_backward_programs_per_sm(b) for b in (128, 2048, 4096, 8192, 16384)]
    [4, 4, 2, 1, 1]
    """
    return 4 if block <= 2048 else 2 if block <= 4096 else 1


def row_groups(device: torch.device, n_rows: int, per_sm: int, config: Config) -> tuple[int, int, dict[str, int]]:
    """How a backward kernel that sums over rows splits them: ``(rows_per_program, programs, meta)``.

    About ``per_sm`` programs per multiprocessor (two under the interpreter, which exercises the
    row loop), each over consecutive rows; with ``ROWS`` in ``config`` (a single-block kernel) a
    program's rows are a multiple of ``ROWS``, and ``meta`` passes ``ROWS`` to the kernel. Fewer
    programs keep the per-program partial sums small; enough of them fill the GPU.

    >>> row_groups(torch.device("cpu"), 10, 4, {"ROWS": 4, "num_warps": 1})
    (4, 3, {'ROWS': 4})
    """
    sms = backend.multiprocessors(device) if device.type == "cuda" else 2
    wanted = max(1, min(n_rows, per_sm * sms))
    step = config.get("ROWS", 1)
    rows_per_program = max(step, cdiv(cdiv(n_rows, wanted), step) * step)
    meta = {"ROWS": step} if "ROWS" in config else {}
    return rows_per_program, cdiv(n_rows, rows_per_program), meta


def column_row_groups(device: torch.device, n_rows: int, n_cols: int, block: int, per_sm: int) -> tuple[int, int, int]:
    """How a backward kernel over (column blocks, row groups) splits its work: ``(blocks, rows_per_group, groups)``.

    The row groups are as few as fill about ``per_sm`` programs per multiprocessor (two under the interpreter)
    together with the column blocks: each group keeps a row of partial sums of ``n_cols``.

    >>> column_row_groups(torch.device("cpu"), 256, 8192, 2048, 4)
    (4, 128, 2)
    """
    sms = backend.multiprocessors(device) if device.type == "cuda" else 2
    blocks = cdiv(n_cols, block)
    wanted = max(1, min(n_rows, cdiv(per_sm * sms, blocks)))
    rows_per_group = cdiv(n_rows, wanted)
    return blocks, rows_per_group, cdiv(n_rows, rows_per_group)


def single_block_impl(
    launcher: Callable[..., Any],
    kernel: LazyKernel,
    n_cols: Callable[..., int],
    n_rows: Callable[..., int] | None = None,
    *,
    max_block: int = MAX_SINGLE_BLOCK,
    norm_backward: bool = False,
    helpers: tuple[LazyKernel, ...] = (),
) -> TritonImpl:
    """The ``single_block`` implementation of a row-wise op; ``n_cols(*args)`` gives its row length. ``helpers``: the
    other kernels its launcher launches (a backward's :data:`PARTIAL_SUMS`), hashed into the tuning cache's key too.

    With ``n_rows`` (the row count of the same arguments), the kernel takes ``ROWS`` rows per
    program and the configurations range over :data:`ROW_BLOCK_CONFIGS` (with ``norm_backward``,
    :data:`ROW_BLOCK_BACKWARD_CONFIGS`: the kernel takes PREFETCH and WEIGHT_PER_TILE). Rows longer than
    ``max_block`` are not supported (forwards pass :data:`MAX_SINGLE_BLOCK_FORWARD`).
    """
    default: Callable[..., Config]
    prune: Callable[..., bool]
    if n_rows is None:
        configs = SINGLE_BLOCK_CONFIGS
        default = lambda *args: single_block_default(n_cols(*args))
        prune = lambda config, *args: prune_single_block(config, n_cols(*args))
    elif norm_backward:
        count = n_rows
        configs = ROW_BLOCK_BACKWARD_CONFIGS
        default = lambda *args: {**row_block_default(n_cols(*args), count(*args)), "PREFETCH": 0, "WEIGHT_PER_TILE": 0}
        prune = lambda config, *args: (
            prune_row_block(config, n_cols(*args), count(*args)) and prune_backward_switches(config, n_cols(*args))
        )
    else:
        count = n_rows
        configs = ROW_BLOCK_CONFIGS
        default = lambda *args: row_block_default(n_cols(*args), count(*args))
        prune = lambda config, *args: prune_row_block(config, n_cols(*args), count(*args))
    return TritonImpl(
        "single_block",
        launcher,
        (kernel, *helpers),
        supports=lambda *args: fits_one_block(n_cols(*args), max_block),
        configs=configs,
        default_config=default,
        prune=prune,
    )


def looped_impl(
    launcher: Callable[..., Any],
    kernel: LazyKernel,
    n_cols: Callable[..., int],
    *,
    configs: ConfigSpace = LOOPED_CONFIGS,
    helpers: tuple[LazyKernel, ...] = (),
) -> TritonImpl:
    """The ``looped`` implementation of a row-wise op, for rows of any length, tuned over ``configs``; ``helpers`` as
    for :func:`single_block_impl`."""
    return TritonImpl(
        "looped",
        launcher,
        (kernel, *helpers),
        configs=configs,
        default_config=LOOPED_DEFAULT,
        prune=lambda config, *args: prune_looped(config, n_cols(*args)),
    )


def split_impl(launcher: Callable[..., Any], kernels: tuple[LazyKernel, ...], n_cols: Callable[..., int]) -> TritonImpl:
    """The ``split`` implementation of a row-wise backward with a weight gradient, for rows of at least
    :data:`SPLIT_MIN_COLS`: one kernel takes each row's statistics, a second a column block of a group of rows
    (:func:`column_row_groups`), so that the weight gradient's partial sums are a few rows, not a row a program.
    Tuning tries the configurations whose threads hold :data:`SPLIT_PER_THREAD` elements of a block."""

    def supports(*args: Any) -> str | None:
        n = n_cols(*args)
        return (
            None
            if n >= SPLIT_MIN_COLS
            else f"rows of {n} are shorter than {SPLIT_MIN_COLS} (the split backward's least)"
        )

    return TritonImpl(
        "split",
        launcher,
        kernels,
        supports=supports,
        configs=SPLIT_CONFIGS,
        default_config=SPLIT_DEFAULT,
        prune=lambda config, *args: (
            prune_looped(config, n_cols(*args))
            and SPLIT_PER_THREAD[0] <= config["BLOCK_N"] // (32 * config["num_warps"]) <= SPLIT_PER_THREAD[1]
        ),
    )


# --- ops along one dimension: (x, dim) forward, (grad, y, dim) backward --------------------------
# softmax and log_softmax. Single-block kernels take (x_ptr, y_ptr, stride_xm, stride_ym, n_rows,
# n_cols, ROWS, BLOCK_N) and (dy_ptr, y_ptr, dx_ptr, stride_dym, stride_ym, stride_dxm, n_rows,
# n_cols, ROWS, BLOCK_N); looped kernels the same without n_rows and ROWS (one program per row).


def along_dim_length(x: torch.Tensor, dim: int) -> int:
    """The length of the rows of ``x`` along ``dim`` (1 for a 0-dim tensor)."""
    return x.shape[dim] if x.dim() else 1


def along_dim_rows(x: torch.Tensor, dim: int) -> int:
    """The number of rows of ``x`` along ``dim``."""
    return x.numel() // max(along_dim_length(x, dim), 1)


def along_dim_bucket(x: torch.Tensor, dim: int) -> tuple[int, int, bool]:
    """:func:`row_bucket` of ``x`` taken as rows along ``dim``."""
    return row_bucket(along_dim_rows(x, dim), along_dim_length(x, dim))


def _is_last(x: torch.Tensor, dim: int) -> bool:
    return x.dim() == 0 or dim in (-1, x.dim() - 1)


# The launch options besides num_warps (which every config of a row-wise kernel names).
_OTHER_LAUNCH_OPTIONS = frozenset(LAUNCH_OPTIONS) - {"num_warps"}


def with_launch_options(meta: dict[str, Any], config: Config) -> dict[str, Any]:
    """``meta`` with the launch options ``config`` names besides num_warps (num_stages, num_ctas, maxnreg: a config
    space may name them), which Triton takes from the launch call."""
    if _OTHER_LAUNCH_OPTIONS.isdisjoint(config):  # the common config pays one set test
        return meta
    with_options = None
    for name in _OTHER_LAUNCH_OPTIONS.intersection(config):
        # A maxnreg of 0 is split_rows' "no cap" (SPLIT_ROWS_CONFIGS): Triton's is its absence.
        if config[name] != 0:
            if with_options is None:
                with_options = dict(meta)
            with_options[name] = config[name]
    return meta if with_options is None else with_options


def launch_rows(
    kernel: LazyKernel,
    n_rows: int,
    operands: tuple[Any, ...],
    scalars: tuple[Any, ...],
    *,
    config: Config,
    block: int,
    **meta: Any,
) -> None:
    """Launch a row-wise forward kernel as ``kernel(*operands, [n_rows,] *scalars, BLOCK_N=block, ...)``.

    A config with ``ROWS`` (a single-block kernel) gets one program per ``ROWS`` rows, and the
    kernel takes ``n_rows`` before the scalars to mask the last program's rows; otherwise (a looped
    kernel) one program per row. Every launch option the config holds (:data:`~kernelgate.config.LAUNCH_OPTIONS`:
    num_warps, and num_stages, num_ctas or maxnreg where a config space names them) goes to the launch.
    """
    rows_per_program = config.get("ROWS")
    warps = config["num_warps"]
    meta = with_launch_options(meta, config)
    if rows_per_program is None:
        launch(kernel, (n_rows,), *operands, *scalars, BLOCK_N=block, num_warps=warps, **meta)
    else:
        grid = (cdiv(n_rows, rows_per_program),)
        launch(kernel, grid, *operands, n_rows, *scalars, ROWS=rows_per_program, BLOCK_N=block, num_warps=warps, **meta)


# --- split rows: each row over consecutive programs that wait for each other (kernelgate.ops.split_rows) ----------
# A block of a row is held in each program's registers (SPLIT_ROWS_PER_THREAD elements a thread), so a row of any
# length is read once where a looped kernel reads it twice; worth it only for rows longer than one block.

# maxnreg is a register cap (0: none), tuned only where a thread holds 32 elements: uncapped, softmax's bf16 kernel at
# 8192 / 8 warps keeps 63 registers a thread (its 32 exponentials issued at once) and 4 programs a multiprocessor;
# capped at 48, 5 programs while a row's programs wait, and no local memory
# (benchmarks/results/cpu/kernel-resources-split-rows-maxnreg/). On an H100 the cap of 48 won softmax bf16 and
# log_softmax float32 at rows of 65536 and 131072, 2 to 5 % faster, and tuning kept no cap in the norms
# (benchmarks/results/h100/ab-split-rows-register-cap-5ef5e01-a88bc97/).
SPLIT_ROWS_CONFIGS = ConfigSpace(BLOCK_N=(2048, 4096, 8192, 16384), num_warps=(4, 8, 16, 32), maxnreg=(0, 40, 48))
# Without tuning: in the default suite on the H200, split_rows was the fastest Triton implementation in 16 buckets,
# 13 of them at BLOCK_N 8192 and 8 warps, 3 at 4096 and 4 (benchmarks/results/h200/default-72566ba/decisions.json.gz);
# rms_norm's forward chose 8192 and 8 too (rms-norm-split-rows-6fc0de7-a60c3ab/).
SPLIT_ROWS_DEFAULT: Config = {"BLOCK_N": 8192, "num_warps": 8, "maxnreg": 0}
SPLIT_ROWS_PER_THREAD = (4, 32)
# The most programs a row may take (kernelgate.ops.split_rows.leave_row's encoding of the counts).
MAX_SPLIT_PROGRAMS = 2047
# split_rows_counts' buffers, by (device index, stream).
_SPLIT_ROWS_COUNTS: dict[tuple[int, int], torch.Tensor] = {}


def split_rows_count(device: torch.device, n_cols: int, block: int) -> int:
    """The programs a row of ``n_cols`` takes in blocks of ``block``; raises :class:`Unsupported` where that is more
    than the device's multiprocessors, which must hold a row's programs at once for their waiting to end. Only a
    GPU's count is checked: compile-only collection and the interpreter take CPU tensors."""
    n_split = cdiv(n_cols, block)
    multiprocessors = backend.multiprocessors(device) if device.type == "cuda" else n_split
    if n_split > MAX_SPLIT_PROGRAMS:  # the counts' encoding (kernelgate.ops.split_rows.leave_row) holds fewer
        raise Unsupported(
            "shape-unsupported",
            f"rows of {n_cols} need {n_split} programs of {block} columns each, more than split_rows' "
            f"{MAX_SPLIT_PROGRAMS}",
        )
    if n_split > multiprocessors:
        raise Unsupported(
            "shape-unsupported",
            f"rows of {n_cols} need {n_split} programs of {block} columns each, more than the device's "
            f"{multiprocessors} multiprocessors run together",
        )
    return n_split


def split_rows_counts(device: torch.device, n_rows: int) -> torch.Tensor:
    """Zeros for the arrival counts of a split-rows launch of ``n_rows`` rows (int32).

    On a GPU, the first ``n_rows`` of a buffer kept per device and stream: every split-rows kernel of the package
    leaves its counts zero (``kernelgate.ops.split_rows.leave_row``) and a stream runs its kernels one after
    another, so the next launch there finds zeros without a fill kernel before it. A new buffer is made where the
    kept one is too short, and for every launch while the stream is captured into a CUDA graph (its replays would
    share the buffer with launches outside the graph). On the CPU (the interpreter, which does not count) fresh
    zeros.
    """
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.zeros(n_rows, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch.cuda.current_stream(index).cuda_stream)
    counts = _SPLIT_ROWS_COUNTS.get(key)
    if counts is None or counts.numel() < n_rows:
        counts = torch.zeros(max(n_rows, 2 * (0 if counts is None else counts.numel())), dtype=torch.int32,
                             device=device)  # fmt: skip
        _SPLIT_ROWS_COUNTS[key] = counts
    return counts[:n_rows]


def split_rows_buffers(
    device: torch.device, n_rows: int, n_split: int, values: int, *, fresh_counts: bool = False
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A split-rows launch's float32 partials (``values`` a program, ``(n_rows, values * SPLIT_BLOCK)``), its
    per-row arrival counts (int32 zeros: :func:`split_rows_counts`, or new ones with ``fresh_counts``, for a kernel
    that does not set them back to zero) and SPLIT_BLOCK (``n_split`` rounded up to a power of two)."""
    split_block = next_power_of_2(n_split)
    partials = torch.empty((n_rows, values * split_block), dtype=torch.float32, device=device)
    if fresh_counts:
        counts = torch.zeros(n_rows, dtype=torch.int32, device=device)
    else:
        counts = split_rows_counts(device, n_rows)
    return partials, counts, split_block


def split_rows_phases() -> tuple[int, ...]:
    """The PHASE of each launch of a split-rows kernel: one launch on a GPU; under the interpreter, which runs one
    program at a time so that none could wait for another, the partials' launch and then the rest's."""
    return (1, 2) if call_state.interpret else (0,)


def split_rows_impl(
    launcher: Callable[..., Any],
    kernels: tuple[LazyKernel, ...],
    n_cols: Callable[..., int],
    *,
    configs: ConfigSpace = SPLIT_ROWS_CONFIGS,
    default_config: Config = SPLIT_ROWS_DEFAULT,
    dtypes: tuple[torch.dtype, ...] = HALF_AND_FLOAT,
) -> TritonImpl:
    """The ``split_rows`` implementation of a row-wise op, for rows longer than :data:`MAX_SINGLE_BLOCK`; tuning
    tries the configurations whose threads hold :data:`SPLIT_ROWS_PER_THREAD` elements of a block shorter than
    the row."""

    def supports(*args: Any) -> str | None:
        n = n_cols(*args)
        if n <= MAX_SINGLE_BLOCK:
            return f"rows of {n} fit one block (at most {MAX_SINGLE_BLOCK}): single_block reads them once"
        return None

    def prune(config: Config, *args: Any) -> bool:
        per_thread = config["BLOCK_N"] // (32 * config["num_warps"])
        low, high = SPLIT_ROWS_PER_THREAD
        capped = config.get("maxnreg", 0) != 0
        return low <= per_thread <= high and config["BLOCK_N"] < n_cols(*args) and (not capped or per_thread == high)

    return TritonImpl(
        "split_rows", launcher, kernels, dtypes=dtypes, supports=supports, configs=configs,
        default_config=default_config, prune=prune,
    )  # fmt: skip


# --- split looped: each row over programs that stream a segment of it twice ------------------------------------------
# As split_rows, a row's programs exchange its sums and wait for each other, but each streams its segment of BLOCK_N
# columns STREAM_N at a time, once for its partial sums and again, after the wait, for its result: only a segment a
# program is in flight between its two reads, which L2 holds. Measured on an H100 in bf16 only
# (benchmarks/results/h100/split-looped-forwards-f2df623): at rows of 131072, layer_norm 12 %, log_softmax 7 % and
# softmax 2 % faster than the package's best; at 32768 slower than looped in every op; in float32 untimed, where
# split_rows holds twice the bytes of a row a program. Offered for 2-byte inputs and rows longer than
# SPLIT_LOOPED_ABOVE; the fastest configurations read a quarter of the segment at a time.

SPLIT_LOOPED_CONFIGS = ConfigSpace(BLOCK_N=(8192, 16384), STREAM_N=(2048, 4096), num_warps=(4, 8, 16))
SPLIT_LOOPED_DEFAULT: Config = {"BLOCK_N": 16384, "STREAM_N": 4096, "num_warps": 16}
SPLIT_LOOPED_ABOVE = 32768


def split_looped_impl(
    launcher: Callable[..., Any],
    kernels: tuple[LazyKernel, ...],
    n_cols: Callable[..., int],
    *,
    above: int = SPLIT_LOOPED_ABOVE,
    configs: ConfigSpace = SPLIT_LOOPED_CONFIGS,
    default_config: Config = SPLIT_LOOPED_DEFAULT,
    dtypes: tuple[torch.dtype, ...] = HALF_AND_FLOAT,
    x_name: str = "x",
) -> TritonImpl:
    """The ``split_looped`` implementation of a row-wise op whose first argument, named ``x_name`` in its refusals, is
    the rows (a forward's input, cross_entropy's logits): for 2-byte rows (their dtype, not a weight's) longer than
    ``above``; tuning tries segments shorter than the row, read a quarter at a time."""

    def supports(x: torch.Tensor, *args: Any) -> str | None:
        n = n_cols(x, *args)
        if n <= above:
            return f"rows of {n}: up to {above} the looped and single-block kernels were faster"
        if x.dtype.itemsize != 2:
            return f"{x.dtype} {x_name}: split_rows, holding more bytes of a row a program, suits it"
        return None

    def prune(config: Config, *args: Any) -> bool:
        return config["STREAM_N"] * 4 == config["BLOCK_N"] < n_cols(*args)

    return TritonImpl(
        "split_looped", launcher, kernels, dtypes=dtypes, supports=supports, configs=configs,
        default_config=default_config, prune=prune,
    )  # fmt: skip


def _run_along(x: torch.Tensor, dim: int, kernel: LazyKernel, block: int, config: Config) -> torch.Tensor:
    last = _is_last(x, dim)
    moved = x if last else x.movedim(dim, -1)
    rows = as_rows(moved, "x")
    y = empty(moved.shape, dtype=x.dtype, device=x.device)  # contiguous: rows n_cols apart
    launch_rows(
        kernel, rows.n_rows, (rows.tensor, y, rows.stride, rows.n_cols), (rows.n_cols,), config=config, block=block,
        EVEN_N=rows.n_cols % block == 0 and config.get("ROWS", 1) == 1,  # a partial last tile of rows needs masks
    )  # fmt: skip
    # Contiguous, as torch's result and the fake tensor torch.compile plans with.
    return y if last else y.movedim(-1, dim).contiguous()


def launch_split_rows(
    kernel: LazyKernel,
    rows: Rows,
    pointers: tuple[Any, ...],
    strides: tuple[int, ...],
    scalars: tuple[Any, ...],
    values: int,
    *,
    config: Config,
    fresh_counts: bool = False,
    groups: int | None = None,
    **meta: Any,
) -> None:
    """Launch a split-rows kernel over ``rows`` as ``kernel(*pointers, partials, arrived, *strides, n_cols, n_split,
    *scalars, PHASE=..., SPLIT_BLOCK=..., BLOCK_N=..., **meta)``, ``values`` partials a program, once on a GPU and
    twice under the interpreter (:func:`split_rows_phases`); raises :class:`Unsupported` where a row's programs
    outnumber the multiprocessors (:func:`split_rows_count`). ``fresh_counts``: for a kernel that does not leave its
    arrival counts zero (:func:`split_rows_buffers`). ``groups``: for a kernel whose programs loop over rows, that
    many groups of ``n_split`` programs (:func:`split_rows_groups`) instead of a group a row. The launch options the
    config names besides num_warps go to the launch too (:func:`with_launch_options`)."""
    block = config["BLOCK_N"]
    n_split = split_rows_count(rows.tensor.device, rows.n_cols, block)
    partials, arrived, split_block = split_rows_buffers(
        rows.tensor.device, rows.n_rows, n_split, values, fresh_counts=fresh_counts
    )
    grid = ((rows.n_rows if groups is None else groups) * n_split,)
    meta = with_launch_options(meta, config)
    for phase in split_rows_phases():
        launch(
            kernel, grid, *pointers, partials, arrived, *strides, rows.n_cols, n_split, *scalars, PHASE=phase,
            SPLIT_BLOCK=split_block, BLOCK_N=block, num_warps=config["num_warps"], **meta,
        )  # fmt: skip


# --- split-rows backwards with a weight gradient: groups of a row's programs, each looping over rows ----------------
# A row's programs exchange its sums as in the forwards, but a group of them takes every ``groups``-th row, so that
# each program sums its block's weight gradient over its rows in registers: a row of partial sums a group, where a
# program a row would keep as many as an input. PER_SM: the groups' programs per multiprocessor, all of them
# resident together where the registers allow (more wait for a place, in order, as the forwards' rows do).

SPLIT_ROWS_BACKWARD_CONFIGS = ConfigSpace(
    BLOCK_N=(2048, 4096, 8192, 16384), num_warps=(4, 8, 16, 32), PER_SM=(2, 4), PREFETCH=(0, 1)
)
SPLIT_ROWS_BACKWARD_DEFAULT: Config = {"BLOCK_N": 4096, "num_warps": 8, "PER_SM": 2, "PREFETCH": 1}
# Elements of a block a thread: two blocks (x and dy) and the weight gradient's sums are held through the loop.
SPLIT_ROWS_BACKWARD_PER_THREAD = (4, 16)
# The shared memory a pipelined split_rows backward may take for its copies ahead: an A100's most a program (163 KB
# on sm_80; an H100's is 227). At BLOCK_N 16384 in bfloat16 rms_norm's took 262 KB on an H100 and could not launch.
PIPELINED_SHARED_BYTES = 160 * 1024


def split_rows_groups(device: torch.device, n_rows: int, n_cols: int, block: int, per_sm: int) -> int:
    """The row groups of a split-rows backward: about ``per_sm`` programs per multiprocessor (two multiprocessors
    under the interpreter) over the ``n_split`` programs of a row, at least one group and at most a row each.

    >>> cpu = torch.device("cpu")
    >>> split_rows_groups(cpu, 7, 3000, 1024, 2), split_rows_groups(cpu, 1, 3000, 1024, 4)
    (1, 1)
    >>> split_rows_groups(cpu, 7, 3000, 1024, 4)
    2
    """
    sms = backend.multiprocessors(device) if device.type == "cuda" else 2
    return max(1, min(n_rows, sms * per_sm // split_rows_count(device, n_cols, block)))


def split_rows_backward_impl(
    launcher: Callable[..., Any],
    kernels: tuple[LazyKernel, ...],
    n_cols: Callable[..., int],
    *,
    pipelined_blocks: int = 0,
) -> TritonImpl:
    """The ``split_rows`` implementation of a row-wise backward with a weight gradient (groups of a row's programs,
    :func:`split_rows_groups`), for rows of at least :data:`SPLIT_MIN_COLS`; tuning tries the configurations whose
    threads hold :data:`SPLIT_ROWS_BACKWARD_PER_THREAD` elements of a block shorter than the row, four programs a
    multiprocessor at blocks of 2048 and two at longer ones.

    ``pipelined_blocks``: for a kernel whose row loop Triton pipelines with PREFETCH (three stages, its exchange in
    NVIDIA's PTX), ``split_rows_pipelined`` instead, for 2-byte rows on NVIDIA GPUs (and the interpreter), tried
    with PREFETCH only, at the most elements a thread, and where two rows' copies in flight, of that many blocks a
    row, fit :data:`PIPELINED_SHARED_BYTES`."""

    def supports(*args: Any) -> str | None:
        n = n_cols(*args)
        if n < SPLIT_MIN_COLS:
            return f"rows of {n} are shorter than {SPLIT_MIN_COLS} (split_rows' least)"
        if not pipelined_blocks:
            return None
        x = next(a for a in args if isinstance(a, torch.Tensor))
        if x.device.type != "cpu" and (x.device.type != "cuda" or torch.version.hip is not None):
            return "its exchange is NVIDIA PTX (inline assembly); split_rows serves other GPUs"
        if x.element_size() != 2:
            return (
                f"{x.dtype} rows: made for 2-byte rows (wider ones double its copies ahead) and timed in bfloat16 "
                "only; split_rows serves these"
            )
        return None

    def prune(config: Config, *args: Any) -> bool:
        per_thread = config["BLOCK_N"] // (32 * config["num_warps"])
        low, high = SPLIT_ROWS_BACKWARD_PER_THREAD
        # Four programs a multiprocessor only for blocks of 2048: on the H100 the fastest configurations of blocks of
        # 2048 all took four, those of larger blocks all two (benchmarks/results/h100/norm-backward-split-rows-80f70db).
        per_sm = config["PER_SM"] == (4 if config["BLOCK_N"] == 2048 else 2)
        fits = low <= per_thread <= high and config["BLOCK_N"] < n_cols(*args) and per_sm
        if pipelined_blocks:
            # Threads that hold the most elements only: on an H100 in bfloat16 4096 / 8 warps was the fastest
            # configuration at every shape, 2048 / 4 and 8192 / 16 within 1 to 41 %, those with more warps 7 % to 2.7
            # times slower (benchmarks/results/h100/norm-backward-split-rows-staged-1d9eadd).
            itemsize = max(a.element_size() for a in args if isinstance(a, torch.Tensor))
            copies = 2 * pipelined_blocks * config["BLOCK_N"] * itemsize
            return fits and per_thread == high and bool(config["PREFETCH"]) and copies <= PIPELINED_SHARED_BYTES
        return fits

    return TritonImpl(
        "split_rows_pipelined" if pipelined_blocks else "split_rows", launcher, kernels, supports=supports,
        configs=SPLIT_ROWS_BACKWARD_CONFIGS, default_config=SPLIT_ROWS_BACKWARD_DEFAULT, prune=prune,
    )  # fmt: skip


def _run_along_split(x: torch.Tensor, dim: int, kernel: LazyKernel, config: Config, **meta: Any) -> torch.Tensor:
    last = _is_last(x, dim)
    moved = x if last else x.movedim(dim, -1)
    rows = as_rows(moved, "x")
    y = empty(moved.shape, dtype=x.dtype, device=x.device)
    even = rows.n_cols % config["BLOCK_N"] == 0
    launch_split_rows(
        kernel, rows, (rows.tensor, y), (rows.stride, rows.n_cols), (), 2, config=config, EVEN_N=even, **meta
    )
    return y if last else y.movedim(-1, dim).contiguous()


def _run_backward_along_split(
    grad: torch.Tensor, y: torch.Tensor, dim: int, kernel: LazyKernel, config: Config
) -> torch.Tensor:
    last = _is_last(y, dim)
    moved_g, moved_y = (grad, y) if last else (grad.movedim(dim, -1), y.movedim(dim, -1))
    g_rows, y_rows = as_rows(moved_g, "grad"), as_rows(moved_y, "y")
    dx = empty(moved_y.shape, dtype=grad.dtype, device=grad.device)
    launch_split_rows(
        kernel, y_rows, (g_rows.tensor, y_rows.tensor, dx), (g_rows.stride, y_rows.stride, y_rows.n_cols), (), 1,
        config=config, EVEN_N=y_rows.n_cols % config["BLOCK_N"] == 0,
    )  # fmt: skip
    return dx if last else dx.movedim(-1, dim).contiguous()


def _run_backward_along(
    grad: torch.Tensor, y: torch.Tensor, dim: int, kernel: LazyKernel, block: int, config: Config
) -> torch.Tensor:
    last = _is_last(y, dim)
    moved_g, moved_y = (grad, y) if last else (grad.movedim(dim, -1), y.movedim(dim, -1))
    g_rows, y_rows = as_rows(moved_g, "grad"), as_rows(moved_y, "y")
    dx = empty(moved_y.shape, dtype=grad.dtype, device=grad.device)
    operands = (g_rows.tensor, y_rows.tensor, dx, g_rows.stride, y_rows.stride, y_rows.n_cols)
    launch_rows(kernel, y_rows.n_rows, operands, (y_rows.n_cols,), config=config, block=block)
    return dx if last else dx.movedim(-1, dim).contiguous()


def _n_cols_along(*args: Any) -> int:
    return along_dim_length(args[-2], args[-1])


def _n_rows_along(*args: Any) -> int:
    return along_dim_rows(args[-2], args[-1])


def along_dim_impls(
    single: LazyKernel,
    looped: LazyKernel,
    persistent: LazyKernel | None = None,
    persistent_looped: LazyKernel | None = None,
    *,
    split: LazyKernel | None = None,
    split_looped: LazyKernel | None = None,
) -> tuple[TritonImpl, ...]:
    """``single_block`` and ``looped`` implementations of an op ``(x, dim) -> y`` from its two kernels, with
    ``persistent`` a ``persistent`` one (see :func:`persistent_impl`), with ``persistent_looped`` (and
    ``persistent``) a ``persistent_looped`` one (see :func:`persistent_looped_impl`), with ``split`` a
    ``split_rows`` one (:func:`split_rows_impl`), and with ``split_looped`` a ``split_looped`` one
    (:func:`split_looped_impl`)."""

    def launch_single(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
        return _run_along(x, dim, single, single_block(along_dim_length(x, dim)), config)

    def launch_looped(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
        return _run_along(x, dim, looped, config["BLOCK_N"], config)

    impls: tuple[TritonImpl, ...] = (
        single_block_impl(launch_single, single, _n_cols_along, _n_rows_along, max_block=MAX_SINGLE_BLOCK_FORWARD),
        looped_impl(launch_looped, looped, _n_cols_along, configs=LOOPED_CONFIGS_32_WARPS),
    )
    if split is not None:
        split_kernel = split

        def launch_split(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
            return _run_along_split(x, dim, split_kernel, config)

        impls = (*impls, split_rows_impl(launch_split, (split,), _n_cols_along))
    if split_looped is not None:
        split_looped_kernel = split_looped

        def launch_split_looped(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
            return _run_along_split(x, dim, split_looped_kernel, config, STREAM_N=config["STREAM_N"])

        impls = (*impls, split_looped_impl(launch_split_looped, (split_looped,), _n_cols_along))
    if persistent is None:
        return impls

    def launch_persistent(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
        last = _is_last(x, dim)
        moved = x if last else x.movedim(dim, -1)
        rows = as_rows(moved, "x")
        y = empty(moved.shape, dtype=x.dtype, device=x.device)
        grid = (persistent_programs(x.device, rows.n_rows, config),)
        launch(
            persistent, grid, rows.tensor, y, rows.stride, rows.n_cols, rows.n_rows, rows.n_cols,
            BLOCK_N=single_block(rows.n_cols), NUM_STAGES=config["NUM_STAGES"], num_warps=config["num_warps"],
            EVEN_N=rows.n_cols == single_block(rows.n_cols), **with_launch_options({}, config),
        )  # fmt: skip
        return y if last else y.movedim(-1, dim).contiguous()

    impls = (*impls, persistent_impl(launch_persistent, persistent, _n_cols_along, lambda *args: args[-2]))
    if persistent_looped is None:
        return impls

    def launch_persistent_looped(x: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
        last = _is_last(x, dim)
        moved = x if last else x.movedim(dim, -1)
        rows = as_rows(moved, "x")
        y = empty(moved.shape, dtype=x.dtype, device=x.device)
        block = config["BLOCK_N"]
        grid = (persistent_looped_programs(x.device, rows.n_rows, rows.n_cols * x.element_size(), config),)
        launch(
            persistent_looped, grid, rows.tensor, y, rows.stride, rows.n_cols, rows.n_rows, rows.n_cols,
            BLOCK_N=block, num_warps=config["num_warps"], EVEN_N=rows.n_cols % block == 0,
            **with_launch_options({}, config),
        )  # fmt: skip
        return y if last else y.movedim(-1, dim).contiguous()

    return (*impls, persistent_looped_impl(launch_persistent_looped, persistent_looped, _n_cols_along))


# --- persistent programs: a fixed number of programs, each looping over rows --------------------------
# For rows that fit one block. Each program takes rows pid, pid + programs, ... in a software-pipelined
# loop: loads of the next NUM_STAGES - 1 rows are in flight (in shared memory) while a row is reduced
# and stored. PER_SM programs per multiprocessor (two multiprocessors under the interpreter). Compiled
# for sm_90 with the launch's specialisation (16-byte aligned pointers and strides), NUM_STAGES of 2 or 3
# gives asynchronous copies (cp.async) and 1 none; a plain range loop gets none either, and on the H200
# that took bf16 softmax at rows of 4096 from 0.72 to 0.53 of copy (whole-tiles-bb55272).

PERSISTENT_CONFIGS = ConfigSpace(num_warps=(1, 2, 4, 8, 16, 32), NUM_STAGES=(1, 2, 3), PER_SM=(1, 2))
# Shared memory the staged rows of one program may take (an SM of the H100/H200 has 228 KB).
PERSISTENT_STAGE_BYTES = 160 * 1024


def persistent_programs(device: torch.device, n_rows: int, config: Config) -> int:
    """How many programs a persistent kernel launches: PER_SM per multiprocessor, at most one per row."""
    sms = backend.multiprocessors(device) if device.type == "cuda" else 2
    return max(1, min(n_rows, config["PER_SM"] * sms))


def prune_persistent(config: Config, n_cols: int, element_size: int) -> bool:
    """Whether a persistent configuration suits rows of ``n_cols`` elements of ``element_size`` bytes: no more
    elements per thread than registers hold, and the rows staged ahead (all but the one being reduced) within
    :data:`PERSISTENT_STAGE_BYTES`."""
    block = single_block(n_cols)
    staged = (config["NUM_STAGES"] - 1) * block * element_size
    return per_thread_ok(block, config["num_warps"]) and staged <= PERSISTENT_STAGE_BYTES


def persistent_impl(
    launcher: Callable[..., Any], kernel: LazyKernel, n_cols: Callable[..., int], x: Callable[..., torch.Tensor]
) -> TritonImpl:
    """The ``persistent`` implementation of a row-wise forward; ``x(*args)`` is its input (for the element size)."""

    def default(*args: Any) -> Config:
        cols = n_cols(*args)
        config = {"num_warps": _warps_that_fit(single_block(cols)), "NUM_STAGES": 2, "PER_SM": 2}
        return config if prune_persistent(config, cols, x(*args).element_size()) else {**config, "NUM_STAGES": 1}

    return TritonImpl(
        "persistent",
        launcher,
        (kernel,),
        supports=lambda *args: fits_one_block(n_cols(*args), MAX_SINGLE_BLOCK_FORWARD),
        configs=PERSISTENT_CONFIGS,
        default_config=default,
        prune=lambda config, *args: prune_persistent(config, n_cols(*args), x(*args).element_size()),
    )


# --- persistent looped forwards: rows longer than one block, a fixed number of programs ------------------
# A looped forward reads each row twice; the second read comes from L2 only while the rows in flight fit there.
# On the H200 (132 multiprocessors, 50 MB of L2), softmax float32 at rows of 65536 (256 KiB), BLOCK_N 8192 and
# 32 warps, took 97 us with a program per row: at 32 registers a thread two programs share a multiprocessor,
# 264 rows (66 MiB) in flight. The same algorithm compiled to 42 registers, one program per multiprocessor,
# took 84 us (benchmarks/results/h200/looped-gap-ffb60c5.txt). A persistent grid sets the rows in flight
# directly: PER_SM programs per multiprocessor, and no more than the L2 holds rows.

PERSISTENT_LOOPED_CONFIGS = ConfigSpace(BLOCK_N=(4096, 8192), num_warps=(16, 32), PER_SM=(1, 2))
PERSISTENT_LOOPED_DEFAULT: Config = {"BLOCK_N": 8192, "num_warps": 32, "PER_SM": 1}
# Under the interpreter (CPU tensors): a stand-in L2 small enough that it caps the grid at test shapes.
INTERPRETED_L2_BYTES = 64 * 1024


def persistent_looped_programs(device: torch.device, n_rows: int, row_bytes: int, config: Config) -> int:
    """How many programs a persistent looped kernel launches: PER_SM per multiprocessor, at most one per row, and
    no more than the L2 cache holds rows of ``row_bytes`` (at least one)."""
    l2 = backend.l2_cache_bytes(device) if device.type == "cuda" else INTERPRETED_L2_BYTES
    return max(1, min(persistent_programs(device, n_rows, config), l2 // max(row_bytes, 1)))


def persistent_looped_impl(launcher: Callable[..., Any], kernel: LazyKernel, n_cols: Callable[..., int]) -> TritonImpl:
    """The ``persistent_looped`` implementation of a row-wise forward, for rows longer than one block."""

    def supports(*args: Any) -> str | None:
        cols = n_cols(*args)
        return None if cols > MAX_SINGLE_BLOCK else f"rows of {cols} fit one block of {MAX_SINGLE_BLOCK}"

    return TritonImpl(
        "persistent_looped",
        launcher,
        (kernel,),
        supports=supports,
        configs=PERSISTENT_LOOPED_CONFIGS,
        default_config=PERSISTENT_LOOPED_DEFAULT,
        prune=lambda config, *args: prune_looped(config, n_cols(*args)),
    )


def along_dim_backward_impls(
    single: LazyKernel, looped: LazyKernel, *, split: LazyKernel | None = None
) -> tuple[TritonImpl, ...]:
    """``single_block`` and ``looped`` implementations of a gradient ``(grad, y, dim) -> dx``, and with ``split`` a
    ``split_rows`` one (:func:`split_rows_impl`)."""

    def launch_single(grad: torch.Tensor, y: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
        return _run_backward_along(grad, y, dim, single, single_block(along_dim_length(y, dim)), config)

    def launch_looped(grad: torch.Tensor, y: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
        return _run_backward_along(grad, y, dim, looped, config["BLOCK_N"], config)

    impls: tuple[TritonImpl, ...] = (
        single_block_impl(
            launch_single, single, _n_cols_along, _n_rows_along, max_block=MAX_SINGLE_BLOCK_ALONG_BACKWARD
        ),
        looped_impl(launch_looped, looped, _n_cols_along),
    )
    if split is None:
        return impls
    split_kernel = split

    def launch_split(grad: torch.Tensor, y: torch.Tensor, dim: int = -1, *, config: Config) -> torch.Tensor:
        return _run_backward_along_split(grad, y, dim, split_kernel, config)

    return (*impls, split_rows_impl(launch_split, (split,), _n_cols_along))
