"""A row's partial values exchanged through tagged slots, for the split_rows variants of the benchmark scripts
beside this module (NVIDIA GPUs: inline PTX).

The package's split_rows kernels exchange a row's partials through a float32 buffer and a per-row arrival count
(``kernelgate.ops.split_rows``): a program stores its partials, counts itself in with an acquire-release atomic,
polls the count, reads the partials and counts itself out. The release makes the atomic wait until the program's
earlier stores are acknowledged (in a kernel whose programs loop over rows, the previous row's output too), and the
count takes two atomics a row besides the polls. Here each partial value travels with a tag in the other half of a
64-bit slot, stored at once by a relaxed store: a reader loads a slot until its tag is the launch's, and has the
value from that same load, so nothing orders the store after others and nothing is reset. A launch's tag differs
from every earlier launch's in the process (:func:`tagged_slots`), so the slots need no clearing between launches.

Under Triton's interpreter, which runs programs one after another, the kernels store the slots in one launch and
read them in the next, plainly (:func:`slot_bits`, :func:`read_plainly`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelgate import rowwise


@triton.jit
def publish_tagged(slot, value, tag):
    """Thread 0 of the program stores ``value`` (a float32 scalar) at ``slot`` (an int64 slot) with ``tag`` in its
    high half, as one relaxed 64-bit store at device scope: value and tag become visible together, so nothing has to
    order the store after the program's earlier ones (no release, no count)."""
    packed = (tag.to(tl.int64) << 32) | slot_bits(value)
    return tl.inline_asm_elementwise(
        "{ .reg .pred %p; .reg .b32 %t; mov.u32 %t, %tid.x; setp.eq.u32 %p, %t, 0; "
        "@%p st.relaxed.gpu.global.b64 [$1], $2; mov.b32 $0, 0; }",
        "=r,l,l",
        [slot, packed],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def read_tagged(slot_row, slot, n_split, tag, other, SPLIT_BLOCK: tl.constexpr):
    """Partial value ``slot`` of each of a row's ``n_split`` programs (``other`` past them): each thread loads its slots
    (relaxed, device scope) until their high halves hold ``tag``, so a value is read in the load that shows it
    current. Nothing is reset afterwards, so no thread waits on another's reading."""
    parts = tl.arange(0, SPLIT_BLOCK)
    inside = parts < n_split
    addresses = slot_row + slot * SPLIT_BLOCK + tl.where(inside, parts, 0)
    packed = tl.inline_asm_elementwise(
        "{ .reg .pred %p; .reg .b32 %lo, %hi; poll${:uid}: ld.relaxed.gpu.global.b64 $0, [$1]; "
        "mov.b64 {%lo, %hi}, $0; setp.ne.u32 %p, %hi, $2; @%p bra poll${:uid}; }",
        "=l,l,r",
        [addresses, tag],
        dtype=tl.int64,
        is_pure=False,
        pack=1,
    )
    return tl.where(inside, tagged_value(packed), other)


@triton.jit
def slot_bits(value):
    """A float32 scalar's bits in the low half of an int64, the high half zero."""
    return value.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF


@triton.jit
def tagged_value(packed):
    """The float32 in the low half of a tagged slot."""
    return (packed & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def read_plainly(slot_row, slot, n_split, other, SPLIT_BLOCK: tl.constexpr):
    """:func:`read_tagged` without the wait, for the interpreter's second launch (every slot stored before it)."""
    parts = tl.arange(0, SPLIT_BLOCK)
    inside = parts < n_split
    return tl.where(inside, tagged_value(tl.load(slot_row + slot * SPLIT_BLOCK + parts, mask=inside, other=0)), other)


_SLOTS: dict[tuple[torch.device, int, int], torch.Tensor] = {}
# Tags are odd and from 3: Triton compiles an integer argument of 1, or one divisible by 16, into a kernel of its own,
# and a tag must not pick another kernel from one launch to the next.
_NEXT_TAG = [3]


def tagged_slots(device: torch.device, n_rows: int, width: int) -> tuple[torch.Tensor, int]:
    """Slots for a launch over ``n_rows`` rows of ``width`` slots each (int64, kept per device and size: a new
    buffer is zeros, below every tag) and the launch's tag."""
    key = (device, n_rows, width)
    if key not in _SLOTS:
        _SLOTS[key] = torch.zeros((n_rows, width), dtype=torch.int64, device=device)
    tag = _NEXT_TAG[0]
    _NEXT_TAG[0] += 2
    return _SLOTS[key], tag


def tagged_split(
    device: torch.device, n_rows: int, n_cols: int, block: int, values: int
) -> tuple[int, int, torch.Tensor, int]:
    """A tagged launch's programs a row (``rowwise.split_rows_count``), SPLIT_BLOCK (that count rounded up to a power
    of two), its slots (``values`` partials a program) and its tag."""
    n_split = rowwise.split_rows_count(device, n_cols, block)
    split_block = triton.next_power_of_2(n_split)
    slots, tag = tagged_slots(device, n_rows, values * split_block)
    return n_split, split_block, slots, tag
