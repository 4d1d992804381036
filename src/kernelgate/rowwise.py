"""Shared pieces of row-wise ops (one program per row, a reduction over the last dimension).

Two implementation shapes cover any row length: a single-block kernel that holds a whole row in
registers, and a looped kernel that streams long rows in blocks. This module holds their config
spaces, pruning rules and bucketing, so each row-wise op declares only its kernels and launchers.

>>> per_thread_ok(4096, 8), per_thread_ok(65536, 4), per_thread_ok(16, 2)
(True, False, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernelgate.bucket import aligned16, pow2
from kernelgate.config import Config, ConfigSpace
from kernelgate.launch import LazyKernel, next_power_of_2, num_warps_for
from kernelgate.op import TritonImpl

__all__ = [
    "LOOPED_CONFIGS",
    "LOOPED_DEFAULT",
    "MAX_SINGLE_BLOCK",
    "SINGLE_BLOCK_CONFIGS",
    "fits_one_block",
    "looped_impl",
    "per_thread_ok",
    "prune_looped",
    "prune_single_block",
    "row_bucket",
    "single_block",
    "single_block_default",
    "single_block_impl",
]

# Rows up to this length are held in registers by one program; longer rows loop.
MAX_SINGLE_BLOCK = 16384
# Elements each thread holds per block: more spills registers.
MAX_PER_THREAD = 64

SINGLE_BLOCK_CONFIGS = ConfigSpace(num_warps=(1, 2, 4, 8, 16, 32))
LOOPED_CONFIGS = ConfigSpace(BLOCK_N=(1024, 2048, 4096, 8192), num_warps=(4, 8, 16))
LOOPED_DEFAULT: Config = {"BLOCK_N": 4096, "num_warps": 8}


def per_thread_ok(block: int, num_warps: int) -> bool:
    """No more elements per thread than registers hold, and no warp without an element (beyond one)."""
    return block // (32 * num_warps) <= MAX_PER_THREAD and (num_warps == 1 or block >= 32 * num_warps)


def single_block(n_cols: int) -> int:
    """The block of a single-block kernel: the row length rounded up to a power of two (at least 16)."""
    return next_power_of_2(max(n_cols, 16))


def fits_one_block(n_cols: int) -> str | None:
    """``None`` when a row of ``n_cols`` fits one block, else why not (for ``TritonImpl.supports``)."""
    return None if n_cols <= MAX_SINGLE_BLOCK else f"rows of {n_cols} exceed one block of {MAX_SINGLE_BLOCK}"


def single_block_default(n_cols: int) -> Config:
    """The untuned configuration of a single-block kernel: about 8 elements per thread."""
    return {"num_warps": num_warps_for(single_block(n_cols))}


def prune_single_block(config: Config, n_cols: int) -> bool:
    """Whether a single-block configuration suits rows of ``n_cols``."""
    return per_thread_ok(single_block(n_cols), config["num_warps"])


def prune_looped(config: Config, n_cols: int) -> bool:
    """Whether a looped configuration suits rows of ``n_cols`` (no block longer than the row)."""
    block = config["BLOCK_N"]
    return block <= next_power_of_2(n_cols) and per_thread_ok(block, config["num_warps"])


def row_bucket(n_rows: int, n_cols: int) -> tuple[int, int, bool]:
    """Rows and row length rounded up to powers of two, and whether the row length is a multiple of 16."""
    return pow2(n_rows), pow2(n_cols), aligned16(n_cols)


def single_block_impl(launcher: Callable[..., Any], kernel: LazyKernel, n_cols: Callable[..., int]) -> TritonImpl:
    """The ``single_block`` implementation of a row-wise op; ``n_cols(*args)`` gives its row length."""
    return TritonImpl(
        "single_block",
        launcher,
        (kernel,),
        supports=lambda *args: fits_one_block(n_cols(*args)),
        configs=SINGLE_BLOCK_CONFIGS,
        default_config=lambda *args: single_block_default(n_cols(*args)),
        prune=lambda config, *args: prune_single_block(config, n_cols(*args)),
    )


def looped_impl(launcher: Callable[..., Any], kernel: LazyKernel, n_cols: Callable[..., int]) -> TritonImpl:
    """The ``looped`` implementation of a row-wise op, for rows of any length."""
    return TritonImpl(
        "looped",
        launcher,
        (kernel,),
        configs=LOOPED_CONFIGS,
        default_config=LOOPED_DEFAULT,
        prune=lambda config, *args: prune_looped(config, n_cols(*args)),
    )
