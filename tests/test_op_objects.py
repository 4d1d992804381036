"""An op as an object: copied and pickled as a function is, by its registered name."""

from __future__ import annotations

import copy
import functools
import io
import pickle
import subprocess
import sys

import pytest
import torch

import kernelgate
from kernelgate import Op, TensorArg


class _Holder(torch.nn.Module):
    """A module that keeps an op as an attribute, as a model may keep its activation or norm function."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = kernelgate.rms_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x), None, 1e-6)


def test_a_copy_of_an_op_is_the_op_and_what_holds_one_copies_and_saves() -> None:
    """copy and deepcopy return the op itself; a module holding one deep-copies (an EMA of a model) and saves whole
    with torch.save, the loaded module holding the same op. Both raised before (a lock, local launchers)."""
    assert copy.copy(kernelgate.softmax) is kernelgate.softmax
    assert copy.deepcopy(kernelgate.softmax) is kernelgate.softmax
    model = _Holder()
    x = torch.randn(2, 8)
    twin = copy.deepcopy(model)
    assert twin.norm is kernelgate.rms_norm and torch.equal(twin(x), model(x))
    saved = io.BytesIO()
    torch.save(model, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert loaded.norm is kernelgate.rms_norm and torch.equal(loaded(x), model(x))


def test_a_registered_op_pickles_by_name_into_a_fresh_process() -> None:
    """A functools.partial of an op (a process pool's task) pickles here and runs in a fresh process, where the
    name finds that process's op."""
    task = pickle.dumps(functools.partial(kernelgate.rms_norm, weight=None, eps=1e-6))
    assert pickle.loads(task).func is kernelgate.rms_norm
    script = (
        "import pickle, sys, torch, kernelgate\n"
        "task = pickle.loads(sys.stdin.buffer.read())\n"
        "x = torch.arange(8.0).view(2, 4)\n"
        "assert task.func is kernelgate.rms_norm\n"
        "assert torch.allclose(task(x), torch.nn.functional.rms_norm(x, (4,), None, 1e-6))\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], input=task, capture_output=True, timeout=300, check=False)
    assert result.returncode == 0 and result.stdout.strip() == b"ok", result.stderr.decode()[-2000:]


def test_an_op_that_cannot_be_found_by_name_says_so() -> None:
    """An unregistered op refuses to pickle, naming itself and the remedy; a pickled registered op unpickled where
    its declaring module was not imported says to import it."""
    private = Op("kgtest_unregistered", reference=lambda x: x, args=(TensorArg("x"),), register=False)
    with pytest.raises(pickle.PicklingError, match=r"'kgtest_unregistered' is not registered .* declare it registered"):
        pickle.dumps(private)
    shared = Op("kgtest_pickled_user_op", reference=lambda x: x, args=(TensorArg("x"),), replace=True)
    data = pickle.dumps(shared)
    assert pickle.loads(data) is shared
    script = "import pickle, sys, kernelgate\npickle.loads(sys.stdin.buffer.read())\n"
    result = subprocess.run([sys.executable, "-c", script], input=data, capture_output=True, timeout=300, check=False)
    message = result.stderr.decode()
    assert result.returncode != 0 and "UnpicklingError" in message, message[-2000:]
    assert "holds the kernelgate op 'kgtest_pickled_user_op', which this process has not registered" in message
    assert "Import the module that declares it" in message
