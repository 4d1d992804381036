"""``@triton.jit`` helpers of the ``split_rows`` kernels, which split each row over consecutive programs that hold a
block of it in registers each, so that a row of any length is read once.

Program ``p`` of such a kernel holds block ``k = p % n_split`` of row ``p // n_split``. It reduces its block to
partial values, stores them in the row's slots of a float32 ``partial`` buffer (``(n_rows, parts * SPLIT_BLOCK)``,
``SPLIT_BLOCK >= n_split`` a power of two: value ``j`` of block ``k`` at ``j * SPLIT_BLOCK + k``), adds one to
the row's count in ``arrived`` (``(n_rows,)`` int32, zero at launch) and waits until the row's ``n_split``
programs have. Then every program combines the row's partials, counts itself out (:func:`leave_row`: once the
row's programs all have, its count is zero again) and writes its block of the result. A launch leaves the counts
as it found them, so one buffer of zeros serves every launch on a stream (``rowwise.split_rows_counts``) with no
fill kernel before each. The norms' backwards launch fewer programs than that: groups of a row's ``n_split``
programs, each group looping over every ``groups``-th row (the helpers at the end of this module), so that a
program can sum its block's weight gradient over its rows in registers.

Waiting is safe because a GPU starts programs in the order of their ids, and a row's programs are consecutive
and no more than can run at once (the launchers keep ``n_split`` at most the multiprocessors' count,
``rowwise.split_rows_count``): the first row not yet done has all its programs running, so some row always
completes. Groups that loop over rows keep this: a group's programs are consecutive, every group started whole
finishes all its rows and leaves, and so the one started in part gets its other programs. It assumes the kernel has
the device to itself as a launch normally does; a GPU partitioned into fewer multiprocessors than ``n_split`` (MPS
limits, green contexts) could leave a row's last programs waiting for a place that never frees.

Triton's interpreter runs programs one after another, so a program there cannot wait for another: the kernels
take ``PHASE``, 0 on a GPU (everything in one launch), and under the interpreter 1 (partials only) then 2 (the
rest, the block read again) as two launches.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelgate.ops.tiles import exp_below_max, load_tile


@triton.jit
def split_row_block(n_split, n_cols, BLOCK_N: tl.constexpr):
    """This program's row, the index of its block in the row, the block's columns and which of them are in it."""
    pid = tl.program_id(0)
    part = pid % n_split
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    return pid // n_split, part, cols, cols < n_cols


@triton.jit
def split_row_segment(n_split, n_cols, BLOCK_N: tl.constexpr):
    """This program's row, the index of its segment in the row, the segment's first column and its length (BLOCK_N,
    or less for a row's last): the split_looped kernels', whose programs stream a segment rather than hold a block."""
    pid = tl.program_id(0)
    part = pid % n_split
    start = part * BLOCK_N
    return pid // n_split, part, start, tl.minimum(n_cols - start, BLOCK_N)


@triton.jit
def wait_for_row(arrived_ptr, row, n_split):
    """Count this program's partials as stored for ``row`` and wait until the row's ``n_split`` programs have.

    The count's add returns the count before it, so the program that completes it goes on without polling: a row's
    programs all wait for its last, and that one's poll was a round trip to L2 on every row's path. On the H200,
    rms_norm float32 256x131072 went from 83.2 to 78.4 us, softmax's split forward (one exponential an element)
    from 80.4 to 77.4 (benchmarks/results/h200/split-rows-variants-3296d94). Polling with a volatile load and one
    acquire at its end gave wrong results there: the program's other threads read the partials unordered after it.
    """
    wait_until_arrived(arrived_ptr, row, n_split, arrive_at_row(arrived_ptr, row))


@triton.jit
def arrive_at_row(arrived_ptr, row):
    """The first half of :func:`wait_for_row`: count this program's partials as stored for ``row``; returns the
    count with this program's arrival in it. Loads issued between this and :func:`wait_until_arrived` are in flight
    while the program waits; issued before it, the count's release would wait for them."""
    tl.debug_barrier()  # every thread's partials are stored before the count says so
    return tl.atomic_add(arrived_ptr + row, 1, sem="acq_rel") + 1


@triton.jit
def wait_until_arrived(arrived_ptr, row, n_split, seen):
    """The second half of :func:`wait_for_row`: poll ``row``'s count until its ``n_split`` programs have arrived
    (``seen``: the count :func:`arrive_at_row` returned)."""
    # Negative: programs of the row are leaving (leave_row), so all have arrived.
    while (seen < n_split) & (seen >= 0):
        seen = tl.atomic_add(arrived_ptr + row, 0, sem="acquire")


@triton.jit
def leave_row(arrived_ptr, row, part, n_split):
    """Count this program out of ``row`` once it has read the row's partials, so that when the row's ``n_split``
    programs all have, the count is back to zero, without a program waiting for an answer.

    Block 0 subtracts ``n_split + (n_split - 1) * 2**20`` and every other block adds ``2**20``: after the arrivals
    (``n_split``), the count stays at ``n_split`` or more while block 0 is still in, is negative once it is out
    with others still in, and is zero once all are out. Waiting programs take either as all arrived
    (:func:`wait_for_row`); a count of 0 to ``n_split - 1`` only ever means arrivals still to come. Needs
    ``n_split * 2**20 < 2**31``: ``rowwise.split_rows_count`` keeps ``n_split`` under 2048.
    """
    step = tl.where(part == 0, -n_split - (n_split - 1) * 1048576, 1048576)
    tl.atomic_add(arrived_ptr + row, step, sem="relaxed")


@triton.jit
def widen_after_wait(narrow):
    """``narrow``, a block as loaded, in float32 for the work after the wait, by a route the compiler does not merge
    with the ``.to(tl.float32)`` taken of it before: so only the loaded block, not a float32 copy, stays live across
    the wait, and more programs fit a multiprocessor's registers.

    Converted the usual way twice, the two conversions merge into one and the float32 copy is kept: compiled for
    sm_90, rms_norm's bfloat16 split forward took 54 registers a thread at BLOCK_N 8192 and 8 warps, 62 at 16384
    and 16, and 46 and 40 this way (``benchmarks/kernel_resources.py``). A bfloat16 is the high half of the float32
    of the same value, so its bits shifted up 16 are that float32 (infinities and NaN included). Other dtypes are
    converted the usual way (a float16 has no such shortcut; float32 needs none).
    """
    if narrow.dtype == tl.bfloat16:
        wide = (narrow.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        wide = narrow.to(tl.float32)
    return wide


@triton.jit
def load_row_partials(partial_row, slot, n_split, other, SPLIT_BLOCK: tl.constexpr):
    """Partial value ``slot`` of each of a row's ``n_split`` programs (``other`` past them), read past L1: other
    programs of this launch wrote them."""
    parts = tl.arange(0, SPLIT_BLOCK)
    return tl.load(partial_row + slot * SPLIT_BLOCK + parts, mask=parts < n_split, other=other, cache_modifier=".cg")


@triton.jit
def split_row_exp_and_sum(
    x, partial_row, arrived_ptr, row, part, n_split, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
    EXP2: tl.constexpr,
):  # fmt: skip
    """For this program's block ``x`` (float32, -inf where masked) of a row split over programs: ``e``, the block's
    ``exp(x - m_block)`` (0 where x is -inf), ``m_block``, the block's max, and the row's max ``m`` and sum ``s`` of
    ``exp(x - m)``. partial_row: the row's ``2 * SPLIT_BLOCK`` partial slots. Under PHASE 1 it only stores the
    block's partials (``m`` and ``s`` are zeros); under PHASE 2 ``m_block`` is read back from them.

    Softmax's block is then ``e * (exp(m_block - m) / s)``: one exponential an element, where ``exp(x - m) / s``
    after the wait took a second and a division (float32 256x131072 on the H200: 85.2 -> 80.4 us,
    benchmarks/results/h200/split-rows-variants-3296d94). A block of nothing but -inf has a sum of 0 (its terms, and
    its rescale, would be NaN); a NaN in a block makes its sum, and so the row's, NaN, as in torch.

    EXP2 takes ``e`` from :func:`~kernelgate.ops.tiles.exp_below_max` (callers set it for 16-bit inputs): at
    bfloat16 1024x65536 softmax went from 99.3 to 95.2 us on the H200, but at float32 it raised the kernel's
    registers (256x131072 at 8192 columns and 8 warps: 48 to 54, a program fewer a multiprocessor) and went from
    75.9 to 78.4 us (benchmarks/results/h200/split-rows-exp2-0e3534d).
    """
    m_block = tl.max(x, axis=0) if PHASE != 2 else tl.load(partial_row + part)
    e = exp_below_max(x, m_block) if EXP2 else tl.where(x == -float("inf"), 0.0, tl.exp(x - m_block))
    if PHASE != 2:
        tl.store(partial_row + part, m_block)
        tl.store(partial_row + SPLIT_BLOCK + part, tl.sum(e, axis=0))
    if PHASE == 0:
        wait_for_row(arrived_ptr, row, n_split)
    m = tl.zeros([], tl.float32)
    s = tl.zeros([], tl.float32)
    if PHASE != 1:
        m_parts = load_row_partials(partial_row, 0, n_split, -float("inf"), SPLIT_BLOCK)
        s_parts = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
        if PHASE == 0:
            leave_row(arrived_ptr, row, part, n_split)
        m, s = merge_max_and_sum(m_parts, s_parts)
    return e, m_block, m, s


@triton.jit
def merge_max_and_sum(m_parts, s_parts):
    """A row's max ``m`` and sum of ``exp(x - m)`` from its programs' maxima ``m_parts`` and sums ``s_parts`` of
    ``exp(x - m_part)`` (-inf and 0 past the programs). A part of nothing but -inf has a sum of 0 (its rescale would
    be NaN); a NaN part's sum stays NaN. A row of only -inf gets m = -inf and a sum of 0."""
    m = tl.max(m_parts, axis=0)
    scale = tl.where(m_parts == -float("inf"), 0.0, tl.exp(m_parts - tl.where(m == -float("inf"), 0.0, m)))
    return m, tl.sum(s_parts * scale, axis=0)


@triton.jit
def split_row_sum(
    v, partial_row, arrived_ptr, row, part, n_split, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr
):  # fmt: skip
    """The sum over a row split over programs, from this program's block ``v`` (float32, 0 where masked).
    partial_row: the row's ``SPLIT_BLOCK`` partial slots. Under PHASE 1 it only stores the block's sum and
    returns 0."""
    if PHASE != 2:
        tl.store(partial_row + part, tl.sum(v, axis=0))
    if PHASE == 0:
        wait_for_row(arrived_ptr, row, n_split)
    total = tl.zeros([], tl.float32)
    if PHASE != 1:
        total = tl.sum(load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK), axis=0)
        if PHASE == 0:
            leave_row(arrived_ptr, row, part, n_split)
    return total


@triton.jit
def split_row_pair(
    a, b, partial_row, arrived_ptr, row, part, n_split, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr
):  # fmt: skip
    """Two partial values of each of a row's programs: this program's ``a`` and ``b`` (float32 scalars) stored, and
    once the row's programs have all stored theirs, every program's, as two vectors of SPLIT_BLOCK (0 past
    ``n_split``). partial_row: the row's ``2 * SPLIT_BLOCK`` partial slots. Under PHASE 1 it only stores (and
    returns zeros)."""
    if PHASE != 2:
        tl.store(partial_row + part, a)
        tl.store(partial_row + SPLIT_BLOCK + part, b)
    if PHASE == 0:
        wait_for_row(arrived_ptr, row, n_split)
    a_parts = tl.zeros([SPLIT_BLOCK], tl.float32)
    b_parts = tl.zeros([SPLIT_BLOCK], tl.float32)
    if PHASE != 1:
        a_parts = load_row_partials(partial_row, 0, n_split, 0.0, SPLIT_BLOCK)
        b_parts = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
        if PHASE == 0:
            leave_row(arrived_ptr, row, part, n_split)
    return a_parts, b_parts


# --- groups of a row's programs that loop over rows (the norms' split_rows backwards) -------------------------------
# Program p holds block ``p % n_split`` of rows ``group, group + groups, ...`` (``group = p // n_split``), so that it
# can sum a weight's gradient over its rows in registers (``rowwise.split_rows_groups``).


@triton.jit
def row_group_block(n_split, n_cols, BLOCK_N: tl.constexpr):
    """This program's block index in a row, its group, the groups' count, the block's columns and which of them
    are in the row."""
    pid = tl.program_id(0)
    part = pid % n_split
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    return part, pid // n_split, tl.num_programs(0) // n_split, cols, cols < n_cols


@triton.jit
def load_block_pair(x_ptr, dy_ptr, row, stride_xm, stride_dym, cols, mask, UNMASKED: tl.constexpr):
    """``row``'s blocks of x and dy at ``cols``, as loaded (0 outside ``mask`` unless UNMASKED)."""
    x = load_tile(x_ptr + row * stride_xm + cols, mask, 0.0, UNMASKED, "")
    dy = load_tile(dy_ptr + row * stride_dym + cols, mask, 0.0, UNMASKED, "")
    return x, dy


@triton.jit
def exchange_then_prefetch(
    arrived_ptr, row, n_split, x_ptr, dy_ptr, following, stride_xm, stride_dym, cols, mask, x_next, dy_next,
    PHASE: tl.constexpr, PREFETCH: tl.constexpr, UNMASKED: tl.constexpr,
):  # fmt: skip
    """Once this program's partials of ``row`` are stored: count them in, and wait for the row's other programs'
    (on a GPU: PHASE 0). With PREFETCH the blocks of row ``following`` are loaded between the two, so they are in
    flight during the wait (issued before the arrival, its release would wait for them), and returned; without it,
    ``x_next`` and ``dy_next`` as given."""
    seen = 0
    if PHASE == 0:
        seen = arrive_at_row(arrived_ptr, row)
    if PREFETCH:
        x_next, dy_next = load_block_pair(x_ptr, dy_ptr, following, stride_xm, stride_dym, cols, mask, UNMASKED)
    if PHASE == 0:
        wait_until_arrived(arrived_ptr, row, n_split, seen)
    return x_next, dy_next


# --- the exchange in inline assembly, for a row loop that Triton's pipeliner is to take (NVIDIA GPUs) ------------
# Triton's pipeliner (3.6 and 3.9) leaves alone a loop that holds a while loop or a tl.debug_barrier
# (benchmarks/results/compile-sm90/pipeliner-blockers.txt), which arrive_at_row and wait_until_arrived are, and in a
# loop it does take it copies every tl.load an iteration or more ahead, the partials read after the wait included.
# These three do the same work in PTX, which it neither sees as a loop nor moves.


@triton.jit
def arrive_at_row_in_asm(arrived_ptr, row):
    """:func:`arrive_at_row` with its barrier in inline assembly; the count's add takes the barrier's output (0),
    so it follows it."""
    after = tl.inline_asm_elementwise(
        "bar.sync 0; mov.b32 $0, 0;", "=r,r", [row], dtype=tl.int32, is_pure=False, pack=1
    )
    return tl.atomic_add(arrived_ptr + row, 1 + after, sem="acq_rel") + 1


@triton.jit
def wait_until_arrived_in_asm(arrived_ptr, row, n_split, seen):
    """:func:`wait_until_arrived` as one inline-assembly loop: each thread loads the row's count (acquire, device
    scope) until it is ``n_split`` or more, or negative (programs leaving), read as unsigned so that both end the
    wait; ``seen`` first. A barrier ends it: each thread polls for itself, so without one a program's first thread
    could count the program out of the row (:func:`leave_row`) while another of its threads still polled, and once
    the row's other programs had left too that thread would find the count back at zero and poll for ever (on an
    H100 such a kernel hung at BLOCK_N 8192 / 16 warps:
    benchmarks/results/h100/norm-backward-split-rows-staged-1d9eadd)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred %p; .reg .b32 %v; mov.b32 %v, $2; "
        "poll${:uid}: setp.lt.u32 %p, %v, $3; @!%p bra done${:uid}; "
        "ld.acquire.gpu.global.b32 %v, [$1]; bra poll${:uid}; done${:uid}: bar.sync 0; mov.b32 $0, %v; }",
        "=r,l,r,r",
        [arrived_ptr + row, seen, n_split],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def load_row_partials_in_asm(partial_row, slot, n_split, other, SPLIT_BLOCK: tl.constexpr):
    """:func:`load_row_partials` in inline assembly, after :func:`wait_until_arrived_in_asm`: as a
    ``tl.load`` in a pipelined loop it became a copy issued an iteration early, before the row's programs had stored
    their partials (an H100 returned NaN)."""
    parts = tl.arange(0, SPLIT_BLOCK)
    inside = parts < n_split
    addresses = partial_row + slot * SPLIT_BLOCK + tl.where(inside, parts, 0)
    bits = tl.inline_asm_elementwise(
        "ld.global.cg.b32 $0, [$1];", "=r,l", [addresses], dtype=tl.int32, is_pure=False, pack=1
    )
    return tl.where(inside, bits.to(tl.float32, bitcast=True), other)
