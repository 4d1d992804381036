"""Where Triton is imported (besides :mod:`kernelgate.compile_ahead`): target detection, launches.

Nothing here runs at ``import kernelgate``; the first call that needs Triton imports it and probes
the driver once per process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from kernelgate.config import LAUNCH_OPTIONS

_settings = importlib.import_module("kernelgate.settings")  # the module: the package exports settings()

__all__ = [
    "BackendStatus",
    "capability",
    "device_name",
    "launch_compiled",
    "launch_interpreted",
    "status",
    "triton_version",
    "warm_compiled",
]

# Launch-grid limits of the GPU targets Triton supports (CUDA, ROCm and XPU agree on these).
MAX_GRID = (2**31 - 1, 65535, 65535)


@dataclasses.dataclass(frozen=True)
class BackendStatus:
    """What this process can do with Triton.

    Attributes:
        triton_version: the installed Triton's version, or ``None`` when it cannot be imported.
        triton_error: why Triton could not be imported, when it could not.
        target: ``"cuda"``, ``"hip"`` or ``"xpu"`` when a Triton GPU driver is active, else ``None``.
        driver_error: why no driver is active, when none is.
        interpreter: whether Triton's interpreter can run kernels on CPU tensors here.
    """

    triton_version: str | None
    triton_error: str | None
    target: str | None
    driver_error: str | None
    interpreter: bool

    @property
    def gpu(self) -> bool:
        """Whether compiled Triton kernels can run on a GPU here."""
        return self.target is not None


def _import_triton() -> tuple[Any, str | None]:
    try:
        import triton
    except Exception as err:  # ImportError, or a broken install raising anything at import
        return None, f"{type(err).__name__}: {err}"
    return triton, None


def _why_no_driver(triton_error: str) -> str:
    """Why Triton found no GPU driver, in the terms of what to check, then Triton's own message (``0 active
    drivers ([]). There should only be one.`` says neither)."""
    if torch.version.cuda is None and torch.version.hip is None:
        why = (
            f"this torch ({torch.__version__}) is built without CUDA or ROCm; on a GPU machine install a CUDA or "
            "ROCm build of torch"
        )
    elif not torch.cuda.is_available():
        why = (
            "torch sees no GPU (torch.cuda.is_available() is False): check the driver (nvidia-smi or rocm-smi) and "
            "CUDA_VISIBLE_DEVICES"
        )
    else:
        return triton_error
    return f"{why} (Triton: {triton_error})"


@functools.cache
def status() -> BackendStatus:
    """Import Triton and probe its driver, once per process.

    >>> isinstance(status().interpreter, bool)
    True
    """
    triton, error = _import_triton()
    if triton is None:
        return BackendStatus(None, error, None, "triton is not installed", False)
    target: str | None = None
    driver_error: str | None = None
    try:
        backend = triton.runtime.driver.active.get_current_target().backend
        target = str(backend)
    except Exception as err:  # Triton raises RuntimeError("0 active drivers") and others
        driver_error = _why_no_driver(f"{type(err).__name__}: {err}")
    try:
        from triton.runtime import interpreter as _interpreter  # noqa: F401

        interpreter = True
    except Exception:
        interpreter = False
    return BackendStatus(str(triton.__version__), None, target, driver_error, interpreter)


@functools.cache
def triton_version() -> str | None:
    """The installed Triton's version without importing it, or ``None``."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def device_name(device: torch.device) -> str:
    """A readable name of ``device`` (``"cpu"`` for the CPU)."""
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    if device.type == "xpu":
        return str(torch.xpu.get_device_name(device))
    return device.type


@functools.cache
def capability(device: torch.device) -> str:
    """Compute capability of a CUDA device as ``"9.0"``, the ROCm arch name, or ``""``."""
    if device.type == "cuda":
        if torch.version.hip is not None:
            return str(getattr(torch.cuda.get_device_properties(device), "gcnArchName", ""))
        major, minor = torch.cuda.get_device_capability(device)
        return f"{major}.{minor}"
    return ""


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """How many multiprocessors (SMs, or compute units) a CUDA or ROCm device has."""
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


@functools.cache
def l2_cache_bytes(device: torch.device) -> int:
    """The size of a CUDA or ROCm device's L2 cache, in bytes."""
    return int(torch.cuda.get_device_properties(device).L2_cache_size)


# ---------------------------------------------------------------------------------------------
# Compiled launches. ``kernel[grid](*args)`` runs Triton's launch path in Python on every call:
# binding the arguments, specialising each one, the cache key, hooks, the grid, the stream. Once a
# combination of kernel, device, compile-time values and argument specialisations has been launched
# that way, later launches of it call the compiled kernel's launcher directly. The combination is
# keyed at least as finely as Triton specialises (a tensor by dtype and 16-byte alignment, an int by
# being 1, divisibility by 16 and its integer type, a bool, float or None by kind), so the kernel
# found is the one Triton would have chosen. Anything else (other argument kinds, launch hooks such
# as a profiler's, pre-run hooks, a target other than CUDA) takes Triton's own path.
# ---------------------------------------------------------------------------------------------

_INT64 = (-(2**63), 2**63 - 1)
# Fast launches remembered; past this many the table starts over (each entry is small).
FAST_LAUNCH_LIMIT = 4096


class _FastLaunch:
    """What a direct launch of one compiled kernel needs, besides the grid, stream and arguments."""

    __slots__ = ("function", "kernel", "metadata", "run", "trailing")

    def __init__(self, kernel: Any, compiled: Any, trailing: tuple[Any, ...]) -> None:
        self.kernel = kernel  # the key holds its id: a hit must be this very kernel
        self.run = compiled.run  # Triton's generated launcher (its handles load on first access)
        self.function = compiled.function
        self.metadata = compiled.packed_metadata
        self.trailing = trailing  # values of the parameters after the positional ones, in order


_fast_launches: dict[tuple[Any, ...], _FastLaunch] = {}


def _argument_key(value: Any) -> Any:
    """How Triton specialises ``value``, or a finer distinction; ``None`` for kinds not handled here."""
    kind = type(value)
    if kind is int:
        width = 0 if -2147483648 <= value <= 2147483647 else 1 if _INT64[0] <= value <= _INT64[1] else 2
        return value == 1, value & 15 == 0, width
    if kind is torch.Tensor or isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() & 15 == 0
    if kind is bool:
        return "b"
    if kind is float:
        return "f"
    if value is None:
        return "n"
    return None


def launch_key(kernel: Any, device: int, args: Sequence[Any], meta: dict[str, Any]) -> tuple[Any, ...] | None:
    """The fast-launch table's key of a launch, or ``None`` when it must take Triton's path.

    Kept flat: it runs on every launch, and costs about as much as the Triton code it replaces.
    """
    # The kernel by id: hashing a JITFunction runs Python (its cache_key property) on every launch.
    key: list[Any] = [id(kernel), device, len(args)]
    append = key.append
    if getattr(kernel, "constexprs", None) and min(kernel.constexprs) < len(args):
        # A compile-time parameter passed by position: its exact value, as Triton compiles for it.
        return _key_with_constexprs(key, kernel.constexprs, args, meta)
    for value in args:
        kind = type(value)
        if kind is int:  # inline _argument_key's commonest cases
            append((value == 1, value & 15 == 0, 0 if -2147483648 <= value <= 2147483647 else _argument_key(value)[2]))
        elif kind is torch.Tensor:
            append((value.dtype, value.data_ptr() & 15 == 0))
        else:
            part = _argument_key(value)
            if part is None:
                return None
            append(part)
    # Compile-time values and launch options; their types too, as 1 and True hash alike.
    key.append(tuple(meta.items()))
    key.append(tuple(map(type, meta.values())))
    return tuple(key)


def _key_with_constexprs(
    key: list[Any], constexprs: Sequence[int], args: Sequence[Any], meta: dict[str, Any]
) -> tuple[Any, ...] | None:
    """launch_key's slower form, for a launch passing compile-time parameters by position."""
    for position, value in enumerate(args):
        part = ("constexpr", type(value), value) if position in constexprs else _argument_key(value)
        if part is None:
            return None
        key.append(part)
    key.append(tuple(meta.items()))
    key.append(tuple(map(type, meta.values())))
    return tuple(key)


def _trailing_values(kernel: Any, n_args: int, meta: dict[str, Any]) -> tuple[Any, ...] | None:
    """Values of the kernel's parameters after the first ``n_args``, from ``meta`` or their defaults, in order."""
    import inspect

    values = []
    for parameter in list(inspect.signature(kernel.fn).parameters.values())[n_args:]:
        if parameter.name in meta:
            values.append(meta[parameter.name])
        elif parameter.default is not inspect.Parameter.empty:
            values.append(parameter.default)
        else:
            return None
    return tuple(values)


@functools.cache
def _runtime_knobs() -> Any:
    from triton import knobs

    return knobs.runtime


@functools.cache
def _jit_function_class() -> Any:
    from triton.runtime.jit import JITFunction

    return JITFunction


def _launches_directly(kernel: Any) -> bool:
    """Whether ``kernel`` may skip Triton's launch path once seen: a plain ``@triton.jit`` function. An
    autotuned or heuristic kernel picks a configuration per call and may run hooks (resetting outputs)."""
    return type(kernel) is _jit_function_class()


def _hook_set(hook: Any) -> bool:
    # Triton keeps its launch hooks as chains, present even when empty; an older one as None or a callable.
    return hook is not None and bool(getattr(hook, "calls", True))


def _hooks_active(kernel: Any) -> bool:
    runtime = _runtime_knobs()
    return (
        _hook_set(runtime.launch_enter_hook)
        or _hook_set(runtime.launch_exit_hook)
        or getattr(runtime, "add_stages_inspection_hook", None) is not None
        or bool(getattr(kernel, "pre_run_hooks", None))
    )


def _current_device() -> int:
    return int(torch._C._cuda_getDevice())


def _current_stream(device: int) -> int:
    return int(torch._C._cuda_getCurrentRawStream(device))


def launch_compiled(kernel: Any, grid: tuple[int, ...], args: Sequence[Any], meta: dict[str, Any]) -> None:
    """Launch a ``@triton.jit`` kernel compiled for the current device (directly, once Triton's path
    has launched the same specialisation)."""
    if status().target != "cuda" or not (_settings._current or _settings.settings()).fast_launch:
        kernel[grid](*args, **meta)
        return
    device = _current_device()
    key = launch_key(kernel, device, args, meta)
    try:
        fast = _fast_launches.get(key) if key is not None else None
    except TypeError:  # an unhashable compile-time value: Triton's path every time
        key = fast = None
    if fast is not None and fast.kernel is kernel and not _hooks_active(kernel):
        fast.run(
            grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, _current_stream(device),
            fast.function, fast.metadata, None, None, None, *args, *fast.trailing,
        )  # fmt: skip
        return
    compiled = kernel[grid](*args, **meta)
    # Only a plain kernel enters the table, so a hit above needs no such check.
    if key is None or compiled is None or not _launches_directly(kernel) or _hooks_active(kernel):
        return
    if hasattr(compiled, "result"):  # a compile that ran asynchronously: its future
        compiled = compiled.result()
    trailing = _trailing_values(kernel, len(args), meta)
    if trailing is not None:
        if len(_fast_launches) >= FAST_LAUNCH_LIMIT:
            _fast_launches.clear()
        _fast_launches[key] = _FastLaunch(kernel, compiled, trailing)


def warm_compiled(kernel: Any, grid: tuple[int, ...], args: Sequence[Any], meta: dict[str, Any]) -> None:
    """Bind ``args`` as a launch would and compile if needed, without launching (Triton's ``warmup``)."""
    kernel.warmup(*args, grid=grid, **meta)


# ---------------------------------------------------------------------------------------------
# Interpreter. Triton only interprets a kernel when TRITON_INTERPRET=1 was set before the kernel
# was decorated. To interpret per call, each kernel is wrapped in an InterpretedFunction, and while
# it runs the @triton.jit helpers it calls (tl.sum, tl.max, user helpers) are routed through the
# interpreter too. The patch is process-wide, so interpreted launches are serialised by a lock.
# ---------------------------------------------------------------------------------------------

_interpret_lock = threading.RLock()
_interpreted: dict[Callable[..., Any], Any] = {}


def _interpreted_function(fn: Callable[..., Any]) -> Any:
    wrapped = _interpreted.get(fn)
    if wrapped is None:
        from triton.runtime.interpreter import InterpretedFunction

        wrapped = _interpreted[fn] = InterpretedFunction(fn)
    return wrapped


@contextlib.contextmanager
def _interpreter_scope() -> Iterator[None]:
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    with _interpret_lock:
        original_call = JITFunction.__call__
        original_patch = interpreter._patch_lang_tensor
        original_convert = interpreter._convert_float

        def call_interpreted(self: Any, *args: Any, **kwargs: Any) -> Any:
            # Triton's own device-call path patches triton.language and never undoes it, which
            # breaks later compiled launches in the same process; here each call undoes its patch.
            scope = interpreter._patch_lang(self.fn)
            try:
                return _interpreted_function(self.fn).rewrite()(*args, **kwargs)
            finally:
                scope.restore()

        def patch_tensor(tensor: Any, scope: Any) -> None:
            original_patch(tensor, scope)
            # Triton 3.6 converts a 1-element array with int(), which numpy >= 2.4 rejects.
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        def convert_float(data: Any, input_dtype: Any, output_dtype: Any, rounding_mode: Any) -> Any:
            # The interpreter narrows float32 to bfloat16 by truncation; GPUs round to nearest even.
            if str(input_dtype) == "fp32" and str(output_dtype) == "bf16" and rounding_mode is None:
                return _float32_to_bfloat16_bits(data)
            return original_convert(data, input_dtype, output_dtype, rounding_mode)

        JITFunction.__call__ = call_interpreted  # type: ignore[method-assign]
        interpreter._patch_lang_tensor = patch_tensor
        interpreter._convert_float = convert_float
        try:
            yield
        finally:
            JITFunction.__call__ = original_call  # type: ignore[method-assign]
            interpreter._patch_lang_tensor = original_patch
            interpreter._convert_float = original_convert


def _float32_to_bfloat16_bits(data: Any) -> Any:
    """bfloat16 bit patterns of float32 values, rounded to nearest even (NaN stays NaN)."""
    import numpy as np

    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(data, dtype=np.float32))
    return np.where(nan, ((bits >> 16) | 0x0040).astype(np.uint16), rounded)


def launch_interpreted(kernel: Any, grid: tuple[int, ...], args: Sequence[Any], meta: dict[str, Any]) -> None:
    """Run a ``@triton.jit`` kernel through Triton's interpreter (Python breakpoints work inside)."""
    fn = getattr(kernel, "fn", kernel)
    # Launch options only matter to the compiler.
    meta = {k: v for k, v in meta.items() if k not in LAUNCH_OPTIONS}
    import numpy as np

    # A GPU computes inf - inf = NaN silently; numpy would warn about it.
    with _interpreter_scope(), np.errstate(all="ignore"):
        _interpreted_function(fn)[grid](*args, **meta)
