"""benchmarks/model_step.py: a decoder's training step with torch's ops against kernelgate's."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

import kernelgate


@pytest.fixture
def model_step(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("model_step")


def test_the_decoder_runs_kernelgates_kernels_and_matches_torch(model_step: ModuleType, tmp_path: Path) -> None:
    """In mode triton (interpreted here) every kernelgate op of the tiny decoder runs its kernel, and the loss and
    gradient norm agree with the torch variant's; the result names both variants' times and its provenance."""
    out = tmp_path / "model-step.json"
    args = ["--device", "cpu", "--tiny", "--steps", "1", "--rounds", "1", "--warmup", "2", "--mode", "triton"]
    kernelgate.configure(tune=False)  # default configurations: tuning is tested elsewhere, and slow interpreted
    with kernelgate.use_interpreter():
        assert model_step.main([*args, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["checks_agree"] is True
    assert result["checks"]["kernelgate"]["loss"] == pytest.approx(result["checks"]["torch"]["loss"], rel=2e-2)
    assert set(result["variants"]) == {"torch", "kernelgate"}
    assert all(v["ms_per_step_median"] > 0 for v in result["variants"].values())
    assert result["kernelgate_mode"] == "triton" and "kernelgate_commit" in result
    # Each op's autograd calls, per input shape, and how they ran: in mode triton, through the Function.
    assert {key.split()[0] for key in result["step_routes"]} == {
        "rms_norm",
        "rotary_embedding",
        "swiglu",
        "cross_entropy",
    }
    assert all(route.startswith("function: mode triton") for route in result["step_routes"].values()), result


def test_a_kernelgate_variant_that_disagrees_with_torch_fails_the_run(
    model_step: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong op (here a SwiGLU without the SiLU) changes the loss: the run returns 1 and says so in its JSON."""
    wrong = dataclasses.replace(model_step.VARIANTS["kernelgate"], swiglu=lambda gate_up: gate_up.chunk(2, -1)[0] * 3.0)
    monkeypatch.setitem(model_step.VARIANTS, "kernelgate", wrong)
    out = tmp_path / "model-step.json"
    args = ["--device", "cpu", "--tiny", "--steps", "1", "--rounds", "1", "--warmup", "1", "--mode", "reference"]
    assert model_step.main([*args, "--out", str(out)]) == 1
    assert json.loads(out.read_text())["checks_agree"] is False


def test_the_decoder_with_layer_norms_runs_kernelgates_layer_norm(model_step: ModuleType, tmp_path: Path) -> None:
    """With --norm layer_norm the norms are LayerNorms with a bias, F.layer_norm against kg.layer_norm: in mode
    triton the kernelgate variant's layer_norm runs its kernels, and the two variants agree."""
    out = tmp_path / "model-step.json"
    args = ["--device", "cpu", "--tiny", "--steps", "1", "--rounds", "1", "--warmup", "2", "--mode", "triton"]
    kernelgate.configure(tune=False)
    with kernelgate.use_interpreter():
        assert model_step.main([*args, "--norm", "layer_norm", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["checks_agree"] is True and result["norm"] == "layer_norm"
    assert {key.split()[0] for key in result["step_routes"]} == {
        "layer_norm",
        "rotary_embedding",
        "swiglu",
        "cross_entropy",
    }
    assert all(route.startswith("function: mode triton") for route in result["step_routes"].values()), result
