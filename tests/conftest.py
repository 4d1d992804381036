"""Shared fixtures: a clean kernelgate state per test, the targets kernels run on, and Triton compiling for sm_90."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

import kernelgate
from kernelgate import backend
from kernelgate.op import clear_memos
from kernelgate.ops.cross_entropy import reset_incoming_gradient


def gpu_available() -> bool:
    """Whether compiled Triton kernels can run here (a GPU and an active Triton driver)."""
    return torch.cuda.is_available() and backend.status().gpu


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """A dtype parameter's id is its name (``float32``, not ``dtype0``), so ``-k "float32"`` selects its cases."""
    return str(val).removeprefix("torch.") if isinstance(val, torch.dtype) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU with an active Triton driver; none here (these run on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def clean_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each test starts from default settings (environment ignored), no recorded fallbacks, an empty cache."""
    cache = tmp_path_factory.mktemp("kernelgate-cache")
    kernelgate.reload_settings({"KERNELGATE_CACHE_DIR": str(cache)})
    kernelgate.reset_fallbacks()
    clear_memos()
    reset_incoming_gradient()
    yield
    kernelgate.reload_settings({"KERNELGATE_CACHE_DIR": str(cache)})
    kernelgate.reset_fallbacks()
    clear_memos()


@pytest.fixture(params=["interpreter", pytest.param("gpu", marks=pytest.mark.gpu)])
def target(request: pytest.FixtureRequest) -> Iterator[torch.device]:
    """The device Triton kernels run on: CPU tensors through the interpreter, or the GPU compiled.

    The mode is "triton", so a test fails rather than silently testing the reference. Tuning is
    off: each kernel runs its default configuration (tests/test_configs.py checks every other
    configuration, and the selection tests the tuning itself).
    """
    kernelgate.configure(tune=False)
    if request.param == "interpreter":
        with kernelgate.use_interpreter(), kernelgate.use_mode("triton"):
            yield torch.device("cpu")
    else:
        with kernelgate.use_mode("triton"):
            yield torch.device("cuda")


@pytest.fixture
def triton_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh Triton cache, and Triton compiling for sm_90 with no GPU when none is here: a compile-only driver
    names an H100-class target, so Triton's real compiler (ptxas included) runs without a GPU."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    from kernelgate import compile_ahead

    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    assert Path(triton.knobs.cache.dir) == cache
    saved = driver._active
    if not torch.cuda.is_available():
        driver.set_active(compile_ahead._CompileOnlyDriver(GPUTarget("cuda", 90, 32)))  # type: ignore[arg-type]
    try:
        yield cache
    finally:
        driver._active = saved
        compile_ahead.shutdown()


@pytest.fixture
def benchmark_script(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Imports ``benchmarks/<name>.py`` as its command line runs it: its sibling modules (provenance.py,
    variant_timing.py) importable beside it."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module
