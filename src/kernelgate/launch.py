"""Launch helpers: what a launcher needs so that it reads like the math.

A launcher allocates outputs, views its inputs as rows, picks block sizes and calls :func:`launch`,
which runs the kernel compiled on the tensors' device or through Triton's interpreter, as the
dispatcher decided:

>>> cdiv(1000, 256), next_power_of_2(1000), block_size(5, lo=16, hi=4096)
(4, 1024, 16)
"""

from __future__ import annotations

import importlib
import threading
import types
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from kernelgate import backend

__all__ = [
    "LazyKernel",
    "Rows",
    "Unsupported",
    "as_contiguous",
    "as_rows",
    "block_size",
    "cdiv",
    "empty",
    "empty_like",
    "launch",
    "next_power_of_2",
    "num_warps_for",
]


class Unsupported(Exception):
    """Raised by a launcher, before it launches anything, when it cannot run these valid inputs.

    ``raise kernelgate.Unsupported("shape-unsupported", "rows wider than 65536")``.

    The dispatcher turns it into a reference-path call with the given reason (or, in mode
    ``triton``, into :class:`~kernelgate.errors.TritonUnavailableError`).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class LazyKernel:
    """A ``@triton.jit`` kernel imported on first launch, so ``import kernelgate`` needs no Triton.

    >>> k = LazyKernel("kernelgate.ops.softmax.kernels", "_softmax_fwd_kernel"); k.__name__
    '_softmax_fwd_kernel'
    """

    __slots__ = ("__name__", "_kernel", "module")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.__name__ = name
        self._kernel: Any = None

    def resolve(self) -> Any:
        """Import the kernel's module (once) and return the kernel."""
        if self._kernel is None:
            self._kernel = getattr(importlib.import_module(self.module), self.__name__)
        return self._kernel

    def __repr__(self) -> str:
        return f"LazyKernel({self.module}.{self.__name__})"


def kernel_source(kernel: Any) -> str | None:
    """What a ``@triton.jit`` function compiles from, the same text in every process: its source, then that of each
    ``@triton.jit`` function it reaches (by a global, a closure variable or a module's attribute), each once, and
    the ``tl.constexpr`` globals they read, in a fixed order. ``None`` for anything else.

    Triton's own ``cache_key`` is not that before Triton 3.9: a caller hashed before the functions it calls misses
    their constexpr globals, so the key of one kernel depended on which kernels the process had hashed first.
    """
    try:
        from triton.language.core import constexpr
        from triton.runtime import jit
    except ImportError:
        return None
    jit_callable = getattr(jit, "JITCallable", jit.JITFunction)
    if not isinstance(kernel, jit_callable):
        return None
    texts: dict[str, str] = {}
    pending = [kernel]
    while pending:
        fn = pending.pop()
        name = f"{fn.fn.__module__}.{fn.fn.__qualname__}"
        if name in texts:
            continue
        code = fn.fn.__code__
        scope = dict(fn.fn.__globals__)
        scope.update(zip(code.co_freevars, (cell.cell_contents for cell in fn.fn.__closure__ or ()), strict=False))
        attributes = sorted(set(code.co_names))
        constants = []
        # What each name refers to; through a module (tl.sum, helpers.inner.scale), each attribute name the code
        # uses, module by module.
        found = [(ref, scope.get(ref)) for ref in sorted(set(code.co_names) | set(code.co_freevars))]
        modules_seen: set[int] = set()
        while found:
            label, item = found.pop()
            if isinstance(item, types.ModuleType):
                if id(item) not in modules_seen:
                    modules_seen.add(id(item))
                    found += [(f"{label}.{attr}", getattr(item, attr, None)) for attr in attributes]
            elif isinstance(item, jit_callable):
                pending.append(item)
            elif isinstance(item, constexpr):
                constants.append(f"{label}={item!r}")
        constants.sort()
        texts[name] = f"{fn.src}\nnoinline={getattr(fn, 'noinline', False)} {' '.join(constants)}"
    return "\n".join(f"# {name}\n{texts[name]}" for name in sorted(texts))


class _CallState(threading.local):
    """Per-thread state of the call being dispatched: how to launch, and what to record."""

    interpret: bool = False
    poison: bool = False
    # While compile_ahead collects: launches only bind their arguments, and compile jobs land here.
    collect: list[Any] | None = None
    launches: list[tuple[str, tuple[int, ...], dict[str, Any]]] | None = None
    notes: list[str] | None = None
    # Calls that ran a Triton implementation, on this thread: a backward compares it before and after;
    # of them, those in mode "triton" (asked for, not chosen by tuning).
    triton_runs: int = 0
    forced_runs: int = 0


call_state = _CallState()


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of blocks of size ``b`` that cover ``a`` items."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two that is ``>= n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def block_size(n: int, *, lo: int = 16, hi: int = 65536) -> int:
    """A power-of-two block that covers ``n`` items, clamped to ``[lo, hi]``."""
    return max(lo, min(hi, next_power_of_2(n)))


def num_warps_for(block: int, *, elements_per_thread: int = 8, lo: int = 1, hi: int = 16) -> int:
    """Warps for a block of ``block`` elements, about ``elements_per_thread`` per thread, a power of two."""
    want = max(1, block // (32 * elements_per_thread))
    return max(lo, min(hi, next_power_of_2(want)))


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
    """Launch ``kernel`` on ``grid`` with ``args`` and compile-time ``meta`` (block sizes, num_warps).

    Runs compiled on the current device (the dispatcher makes it the tensors' device) or through
    Triton's interpreter. A grid over the hardware limit raises :class:`Unsupported`, so the call
    takes the reference path instead of failing inside the driver.
    """
    if grid[0] > backend.MAX_GRID[0] or len(grid) > 1:
        for axis, (size, limit) in enumerate(zip(grid, backend.MAX_GRID[: len(grid)], strict=True)):
            if size > limit:
                raise Unsupported(
                    "grid-too-large", f"grid axis {axis} needs {size} programs; the hardware allows {limit}"
                )
    if type(kernel) is LazyKernel:
        kernel = kernel._kernel or kernel.resolve()
    state = call_state
    if state.launches is not None:
        state.launches.append((getattr(kernel, "__name__", repr(kernel)), grid, meta))
    if state.interpret:
        backend.launch_interpreted(kernel, grid, args, meta)
    elif state.collect is not None:
        backend.warm_compiled(kernel, grid, args, meta)
    else:
        backend.launch_compiled(kernel, grid, args, meta)


class Rows(NamedTuple):
    """A tensor seen as a matrix of contiguous rows: pass ``tensor`` as the pointer, ``stride`` apart."""

    tensor: torch.Tensor
    n_rows: int
    n_cols: int
    stride: int


def as_rows(t: torch.Tensor, name: str) -> Rows:
    """``t`` seen as ``(rows, t.shape[-1])`` with contiguous rows ``stride`` elements apart.

    No view is made when none is needed (a contiguous tensor, or a 2-D one with unit last stride:
    any row stride is kept). Only a tensor whose last dimension is strided, or whose leading
    dimensions cannot be merged, is copied, and the copy is recorded. A 0-dim tensor is one row.

    >>> r = as_rows(torch.zeros(4, 10)[:, :3], "x"); (r.n_rows, r.n_cols, r.stride)
    (4, 3, 10)
    """
    n = t.shape[-1] if t.dim() else 1
    if t.dim() and t.stride(-1) != 1 and n > 1:
        _note(f"copied {name}: last dimension has stride {t.stride(-1)}")
        t = t.contiguous()
    if t.dim() == 2:
        return Rows(t, t.shape[0], n, t.stride(0) if t.shape[0] > 1 else n)
    if t.is_contiguous():
        return Rows(t, t.numel() // n if n else 0, n, n)
    try:
        view = t.view(-1, n)
    except RuntimeError:
        _note(f"copied {name}: leading dimensions of strides {t.stride()[:-1]} cannot be merged")
        view = t.contiguous().view(-1, n)
    return Rows(view, view.shape[0], n, view.stride(0) if view.shape[0] > 1 else n)


def empty(shape: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output tensor: uninitialised, or NaN-filled while the correctness gate runs a candidate.

    Launchers allocate their outputs with this (or :func:`empty_like`), so the gate catches any
    element a kernel fails to write.
    """
    if call_state.poison:
        return torch.full(tuple(shape), _poison_value(dtype), dtype=dtype, device=device)
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """A contiguous output shaped like ``t`` (see :func:`empty`)."""
    return empty(t.shape, dtype=t.dtype, device=t.device)


def _poison_value(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return int(torch.iinfo(dtype).max)


def as_contiguous(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t`` itself when contiguous, else a contiguous copy (recorded in the launch log).

    For kernels that index a tensor as one flat array.
    """
    if t.is_contiguous():
        return t
    _note(f"copied {name}: not contiguous (strides {t.stride()})")
    return t.contiguous()


def _note(text: str) -> None:
    if call_state.notes is not None:
        call_state.notes.append(text)
