"""The backend probe, the lazy Triton import, a Triton-free kernelgate, and the launch helpers."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
import torch

import kernelgate
from kernelgate import backend
from kernelgate.launch import Unsupported, as_rows, block_size, call_state, cdiv, next_power_of_2, num_warps_for


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter without KERNELGATE_* variables; return its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELGATE_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


# --- backend.status ----------------------------------------------------------------------------


def test_status_on_this_machine() -> None:
    """Triton imports, its interpreter is available, and the GPU fields agree with each other and with torch."""
    import triton

    status = backend.status()
    assert status.triton_version == triton.__version__
    assert status.triton_error is None
    assert status.interpreter is True
    assert (status.driver_error is None) is status.gpu, "a driver error is given exactly when there is no GPU"
    if not torch.cuda.is_available():
        assert status.gpu is False
        assert status.target is None
        assert status.driver_error


def test_no_driver_says_what_to_check_before_tritons_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a driver, the reason names what to check (a torch built without GPU support, or a torch that sees no
    GPU), then keeps Triton's own message; with a GPU that torch sees, Triton's message alone."""
    triton_error = "RuntimeError: 0 active drivers ([]). There should only be one."
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    assert backend._why_no_driver(triton_error) == (
        f"this torch ({torch.__version__}) is built without CUDA or ROCm; on a GPU machine install a CUDA or ROCm "
        f"build of torch (Triton: {triton_error})"
    )
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert backend._why_no_driver(triton_error).startswith(
        "torch sees no GPU (torch.cuda.is_available() is False): check the driver (nvidia-smi or rocm-smi) and "
        "CUDA_VISIBLE_DEVICES (Triton: RuntimeError: 0 active drivers"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert backend._why_no_driver(triton_error) == triton_error


@pytest.mark.gpu
def test_status_with_a_gpu() -> None:
    """With a GPU the probe finds an active Triton target and no driver error."""
    status = backend.status()
    assert status.target in ("cuda", "hip", "xpu")
    assert status.driver_error is None


def test_status_is_probed_once() -> None:
    """status() probes Triton once per process and returns the same object afterwards."""
    assert backend.status() is backend.status()


def test_triton_version_reads_metadata() -> None:
    """triton_version() gives the installed Triton's version from its package metadata."""
    import importlib.metadata

    assert backend.triton_version() == importlib.metadata.version("triton")


def test_cpu_device_description() -> None:
    """The CPU's device name is "cpu" and it has no compute capability."""
    assert backend.device_name(torch.device("cpu")) == "cpu"
    assert backend.capability(torch.device("cpu")) == ""


# --- importing without Triton --------------------------------------------------------------------


def test_import_kernelgate_does_not_import_triton() -> None:
    """`import kernelgate` and a reference-mode call leave Triton unimported."""
    out = run_python(
        "import sys, torch, kernelgate\n"
        "assert 'triton' not in sys.modules, 'import kernelgate imported triton'\n"
        "with kernelgate.use_mode('reference'):\n"
        "    kernelgate.softmax(torch.zeros(2)); kernelgate.rms_norm(torch.ones(2), None)\n"
        "print('triton' in sys.modules)\n"
    )
    assert out == "False\n"


def test_auto_call_imports_triton_lazily() -> None:
    """The first auto-mode call imports Triton to probe the backend (so the lazy import is real, not absent)."""
    out = run_python(
        "import sys, warnings, torch, kernelgate\n"
        "warnings.simplefilter('ignore')\n"
        "before = 'triton' in sys.modules\n"
        "kernelgate.softmax(torch.zeros(2))\n"
        "print(before, 'triton' in sys.modules)\n"
    )
    assert out == "False True\n"


_WITHOUT_TRITON = """
import json, sys, warnings
sys.modules["triton"] = None  # `import triton` now raises ImportError, as if it were not installed
import torch, kernelgate
from kernelgate import backend

warnings.simplefilter("ignore")
x = torch.randn(3, 5)
w = torch.randn(5)
y_auto = kernelgate.softmax(x)
with kernelgate.use_interpreter():
    y_interp = kernelgate.rms_norm(x, w)
try:
    with kernelgate.use_mode("triton"):
        kernelgate.softmax(x)
    raised = None
except kernelgate.TritonUnavailableError as err:
    raised = str(err)
status = backend.status()
print(json.dumps({
    "softmax_ok": torch.allclose(y_auto, torch.softmax(x, -1)),
    "rms_norm_ok": torch.allclose(y_interp, torch.nn.functional.rms_norm(x, (5,), w, 1e-6)),
    "fallbacks": [[r.op, r.reason, r.count] for r in kernelgate.fallbacks()],
    "raised": raised,
    "status": [status.triton_version, status.triton_error, status.target, status.interpreter],
}))
"""


def test_kernelgate_works_without_triton() -> None:
    """Without Triton every call runs its reference with reason "triton-missing", and mode "triton" raises saying so."""
    result: dict[str, Any] = json.loads(run_python(_WITHOUT_TRITON))
    assert result["softmax_ok"] is True
    assert result["rms_norm_ok"] is True
    assert result["fallbacks"] == [["rms_norm", "triton-missing", 1], ["softmax", "triton-missing", 1]]
    assert result["raised"] is not None
    assert re.search(r"triton-missing: triton cannot be imported \((ModuleNotFound|Import)Error: ", result["raised"])
    assert "pip install triton" in result["raised"]
    version, error, target, interpreter = result["status"]
    assert (version, target, interpreter) == (None, None, False)
    assert re.match(r"(ModuleNotFound|Import)Error: import of triton halted", error)


# --- launch helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b", "expected"), [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (1000, 256, 4)])
def test_cdiv(a: int, b: int, expected: int) -> None:
    """cdiv(a, b) is the number of blocks of b that cover a items."""
    assert cdiv(a, b) == expected


@pytest.mark.parametrize(("n", "expected"), [(0, 1), (1, 1), (2, 2), (3, 4), (17, 32), (1024, 1024), (1025, 2048)])
def test_next_power_of_2(n: int, expected: int) -> None:
    """next_power_of_2(n) is the least power of two >= n, and 1 for n <= 1."""
    assert next_power_of_2(n) == expected


@pytest.mark.parametrize(
    ("n", "kwargs", "expected"),
    [(1, {}, 16), (17, {}, 32), (1000, {}, 1024), (10**6, {}, 65536), (5, {"lo": 1}, 8), (300, {"hi": 128}, 128)],
)
def test_block_size(n: int, kwargs: dict[str, int], expected: int) -> None:
    """block_size covers n with a power of two clamped to [lo, hi]."""
    assert block_size(n, **kwargs) == expected


@pytest.mark.parametrize(
    ("block", "kwargs", "expected"),
    [(16, {}, 1), (256, {}, 1), (512, {}, 2), (1024, {}, 4), (2**16, {}, 16), (1024, {"elements_per_thread": 1}, 16)],
)
def test_num_warps_for(block: int, kwargs: dict[str, int], expected: int) -> None:
    """num_warps_for gives about elements_per_thread elements per thread, a power of two within [lo, hi]."""
    assert num_warps_for(block, **kwargs) == expected


def test_launch_refuses_a_grid_over_the_hardware_limit() -> None:
    """launch() raises Unsupported("grid-too-large") before touching the kernel when a grid axis is too large."""
    touched: list[str] = []

    class Kernel:
        def __getitem__(self, grid: object) -> None:
            touched.append("launched")

    with pytest.raises(Unsupported, match=r"^grid-too-large: grid axis 2 needs 65536 programs") as info:
        kernelgate.launch(Kernel(), (1, 1, 65536))
    assert (info.value.reason, touched) == ("grid-too-large", [])
    built = kernelgate.Unsupported("shape-unsupported", "too wide")
    assert (built.reason, built.detail, str(built)) == ("shape-unsupported", "too wide", "shape-unsupported: too wide")


@pytest.fixture
def notes() -> Any:
    """Collect as_rows' notes, as the dispatcher does while logging."""
    collected: list[str] = []
    saved = call_state.notes
    call_state.notes = collected
    yield collected
    call_state.notes = saved


def _matrix(rows: Any) -> torch.Tensor:
    """The rows as a (n_rows, n_cols) tensor read through the pointer and stride a kernel would use."""
    return rows.tensor.as_strided((rows.n_rows, rows.n_cols), (rows.stride, 1))


def test_as_rows_keeps_a_contiguous_tensor(notes: list[str]) -> None:
    """A contiguous (2, 3, 4) tensor is used as is: 6 rows of 4, 4 apart, same memory, no note."""
    t = torch.arange(24.0).view(2, 3, 4)
    rows = as_rows(t, "x")
    assert (rows.n_rows, rows.n_cols, rows.stride) == (6, 4, 4)
    assert rows.tensor.data_ptr() == t.data_ptr()
    assert torch.equal(_matrix(rows), t.reshape(6, 4))
    assert notes == []


def test_as_rows_keeps_the_row_stride(notes: list[str]) -> None:
    """Rows sliced out of a wider tensor keep their stride, not copied."""
    base = torch.arange(24.0).view(3, 8)
    t = base[:, :5]
    rows = as_rows(t, "x")
    assert (rows.n_rows, rows.n_cols, rows.stride) == (3, 5, 8)
    assert rows.tensor.data_ptr() == base.data_ptr()
    assert torch.equal(_matrix(rows), t)
    assert notes == []


def test_as_rows_copies_a_transposed_tensor_and_notes_it(notes: list[str]) -> None:
    """A transposed tensor, whose last dimension is strided, is copied contiguous and the copy is noted."""
    t = torch.arange(15.0).view(5, 3).t()
    rows = as_rows(t, "x")
    assert rows.tensor.is_contiguous() and rows.tensor.data_ptr() != t.data_ptr()
    assert torch.equal(_matrix(rows), t)
    assert notes == ["copied x: last dimension has stride 3"]


def test_as_rows_copies_unmergeable_leading_dimensions_and_notes_it(notes: list[str]) -> None:
    """Leading dimensions that cannot be merged into one row index force a noted copy."""
    t = torch.arange(24.0).view(2, 3, 4)[:, :2, :]
    rows = as_rows(t, "w")
    assert (rows.n_rows, rows.n_cols) == (4, 4) and rows.tensor.is_contiguous()
    assert torch.equal(_matrix(rows), t.reshape(4, 4))
    assert notes == ["copied w: leading dimensions of strides (12, 4) cannot be merged"]


def test_as_rows_of_a_zero_dim_tensor(notes: list[str]) -> None:
    """A 0-dim tensor is one row of one element."""
    rows = as_rows(torch.tensor(2.5), "x")
    assert (rows.n_rows, rows.n_cols, rows.stride) == (1, 1, 1)
    assert notes == []


def test_as_rows_without_a_note_list() -> None:
    """Outside a logged call (notes is None) as_rows still copies, recording nothing."""
    assert call_state.notes is None
    t = torch.arange(6.0).view(2, 3).t()
    assert torch.equal(_matrix(as_rows(t, "x")), t)
    assert call_state.notes is None


# --- compiled launches: the fast path -------------------------------------------------------------

_SPECIALISED = [
    *(0, 1, 2, 15, 16, 17, 32, 48, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, -(2**31), -(2**31) - 16),
    *(2**63 - 16, 2**63 - 1, -(2**63), 2**63, 2**63 + 16, 2**64 - 16),
    True,
    False,
    0.0,
    1.0,
    2.5,
    None,
]


def _tensors() -> list[torch.Tensor]:
    base = {dtype: torch.zeros(64, dtype=dtype) for dtype in (torch.float32, torch.bfloat16, torch.int64)}
    return [t[offset:] for t in base.values() for offset in (0, 1, 2, 4, 8, 16)]


def test_fast_launch_keys_are_at_least_as_fine_as_tritons_specialisation() -> None:
    """Arguments with the same fast-launch key get the same specialisation from Triton itself (its native
    specialiser, the one JITFunction.run uses), so a kernel found by the key is the one Triton would choose."""
    pytest.importorskip("triton")
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    by_key: dict[Any, set[Any]] = {}
    for value in [*_SPECIALISED, *_tensors()]:
        key = backend._argument_key(value)
        assert key is not None, value
        spec = native_specialize_impl(BaseBackend, value, False, True, True)
        by_key.setdefault((type(value) is bool, key), set()).add(spec)
    assert all(len(specs) == 1 for specs in by_key.values()), {k: v for k, v in by_key.items() if len(v) > 1}
    assert len(by_key) >= 12, "the corpus covers several distinct specialisations"
    assert backend._argument_key((1, 2)) is None and backend._argument_key("s") is None


class _Compiled:
    def __init__(self, launches: list[tuple[Any, ...]]) -> None:
        self.function, self.packed_metadata = "function", "metadata"
        self.run = lambda *a: launches.append(a)


class _Kernel:
    """A stand-in for a JITFunction: ``kernel[grid](*args, **meta)`` records Triton's path and returns a compiled
    kernel whose launcher records direct launches."""

    def __init__(self) -> None:
        self.through_triton: list[tuple[Any, ...]] = []
        self.direct: list[tuple[Any, ...]] = []

        def fn(x_ptr: Any, n: int, BLOCK: int, FLAG: bool = False) -> None:
            pass

        self.fn = fn

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, **meta: Any) -> _Compiled:
            self.through_triton.append((grid, args, meta))
            return _Compiled(self.direct)

        return launch


@pytest.fixture
def as_if_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """launch_compiled as on a CUDA device (device 0, stream 1234), with no launch cached yet, taking the stand-in
    kernel below for a plain JITFunction."""
    pytest.importorskip("triton")
    status = dataclasses.replace(backend.status(), target="cuda")
    monkeypatch.setattr(backend, "status", lambda: status)
    monkeypatch.setattr(backend, "_current_device", lambda: 0)
    monkeypatch.setattr(backend, "_current_stream", lambda device: 1234)
    monkeypatch.setattr(backend, "_fast_launches", {})
    monkeypatch.setattr(backend, "_launches_directly", lambda kernel: True)


@pytest.mark.usefixtures("as_if_cuda")
def test_a_launch_seen_before_calls_the_compiled_launcher_directly() -> None:
    """The first launch of a specialisation goes through Triton; the next ones call its launcher with the grid, the
    stream and every argument in order (positional ones, then compile-time values and defaults). A new
    specialisation (here an unaligned pointer) or an active launch hook goes through Triton again."""
    kernel = _Kernel()
    x = torch.zeros(64)
    for _ in range(3):
        backend.launch_compiled(kernel, (7,), (x, 64), {"BLOCK": 128, "num_warps": 4})
    assert len(kernel.through_triton) == 1 and len(kernel.direct) == 2
    assert kernel.direct[0] == (7, 1, 1, 1234, "function", "metadata", None, None, None, x, 64, 128, False)
    backend.launch_compiled(kernel, (7, 2), (x[1:], 64), {"BLOCK": 128, "num_warps": 4})
    assert len(kernel.through_triton) == 2, "an unaligned pointer is another specialisation"
    backend.launch_compiled(kernel, (7,), (x, 64), {"BLOCK": 256, "num_warps": 4})
    assert len(kernel.through_triton) == 3, "another compile-time value"

    from triton import knobs

    def profiler_hook(*args: Any) -> None:
        pass

    knobs.runtime.launch_enter_hook.add(profiler_hook)
    try:
        backend.launch_compiled(kernel, (7,), (x, 64), {"BLOCK": 128, "num_warps": 4})
    finally:
        knobs.runtime.launch_enter_hook.remove(profiler_hook)
    assert len(kernel.through_triton) == 4 and len(kernel.direct) == 2, "a launch hook sees every launch"
    backend.launch_compiled(kernel, (7,), (x, 64), {"BLOCK": 128, "num_warps": 4})
    assert len(kernel.direct) == 3, "with the hook gone, direct again"
    kernelgate.configure(fast_launch=False)
    backend.launch_compiled(kernel, (7,), (x, 64), {"BLOCK": 128, "num_warps": 4})
    assert len(kernel.through_triton) == 5 and len(kernel.direct) == 3, "fast_launch off: Triton's path always"


@pytest.mark.usefixtures("as_if_cuda")
def test_a_compile_time_parameter_passed_by_position_is_keyed_by_its_value() -> None:
    """Triton compiles for each value of a constexpr, so a launch passing one by position (BLOCK here) is keyed by
    its exact value: 4096 after 8192 (the same divisibility) goes through Triton again, not to the 8192 kernel."""
    kernel = _Kernel()
    kernel.constexprs = [2]  # type: ignore[attr-defined]  # BLOCK, as Triton lists a JITFunction's
    x = torch.zeros(64)
    for block in (8192, 8192, 4096, 4096):
        backend.launch_compiled(kernel, (1,), (x, 64, block), {"num_warps": 4})
    assert len(kernel.through_triton) == 2 and len(kernel.direct) == 2
    assert kernel.direct[1][-2:] == (4096, False)
    backend.launch_compiled(kernel, (1,), (x, 64, 4096), {"num_warps": 4, "FLAG": [1]})  # unhashable: Triton's path
    assert len(kernel.through_triton) == 3


def test_only_a_plain_jit_function_launches_directly() -> None:
    """An autotuned (or heuristic) kernel chooses a configuration per call and may reset outputs in hooks, so it
    always takes Triton's launch path; a plain @triton.jit function may skip it."""
    triton = pytest.importorskip("triton")

    def body(x_ptr: Any, BLOCK: Any) -> None:  # never compiled: only the wrappers' types matter
        pass

    plain = triton.jit(body)
    autotuned = triton.autotune(configs=[triton.Config({"BLOCK": 16})], key=[])(triton.jit(body))
    assert backend._launches_directly(plain) and not backend._launches_directly(autotuned)


def test_fast_launch_setting_reads_the_environment() -> None:
    """KERNELGATE_FAST_LAUNCH: on unless set to a false value; anything else is a clear error."""
    assert kernelgate.Settings.from_env({}).fast_launch is True
    assert kernelgate.Settings.from_env({"KERNELGATE_FAST_LAUNCH": "0"}).fast_launch is False
    with pytest.raises(kernelgate.SettingsError, match="KERNELGATE_FAST_LAUNCH"):
        kernelgate.Settings.from_env({"KERNELGATE_FAST_LAUNCH": "sometimes"})
