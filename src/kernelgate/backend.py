"""Where Triton is imported (besides :mod:`kernelgate.compile_ahead`): target detection, launches.

Nothing here runs at ``import kernelgate``; the first call that needs Triton imports it and probes
the driver once per process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

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
        driver_error = f"{type(err).__name__}: {err}"
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


def launch_compiled(kernel: Any, grid: tuple[int, ...], args: Sequence[Any], meta: dict[str, Any]) -> None:
    """Launch a ``@triton.jit`` kernel compiled for the current device."""
    kernel[grid](*args, **meta)


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
    meta = {k: v for k, v in meta.items() if k not in ("num_warps", "num_stages", "num_ctas", "maxnreg")}
    import numpy as np

    # A GPU computes inf - inf = NaN silently; numpy would warn about it.
    with _interpreter_scope(), np.errstate(all="ignore"):
        _interpreted_function(fn)[grid](*args, **meta)
