"""Shared fixtures: a clean kernelgate state per test, and the targets kernels run on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import kernelgate
from kernelgate import backend
from kernelgate.op import clear_memos
from kernelgate.ops.cross_entropy import reset_incoming_gradient


def gpu_available() -> bool:
    """Whether compiled Triton kernels can run here (a GPU and an active Triton driver)."""
    return torch.cuda.is_available() and backend.status().gpu


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
