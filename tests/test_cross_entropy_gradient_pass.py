"""benchmarks/cross_entropy_gradient_pass.py: cross_entropy_with_grad's looped kernel with a staged gradient pass."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

import kernelgate
from kernelgate.selection import run_candidate
from kernelgate.tolerance import assert_no_worse

CONFIG = {"BLOCK_N": 1024, "num_warps": 4, "NUM_STAGES": 1}


@pytest.fixture
def gradient_pass_script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("triton")
    return benchmark_script("cross_entropy_gradient_pass")


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_every_variant_matches_the_reference_interpreted(
    gradient_pass_script: ModuleType, tmp_path: Path, smoothing: float
) -> None:
    """Interpreted, at 5 rows of 2500 classes (whole blocks, then a masked tail), the package's looped implementation
    and the staged variant match the reference at the same configurations, with and without label smoothing."""
    out = tmp_path / "gradient-pass.json"
    args = ["--interpret", "--shapes", "5x2500", "--dtype", "float32", "--smoothing", str(smoothing), "--out", str(out)]
    assert gradient_pass_script.main(args) == 0
    result = json.loads(out.read_text())
    [case] = result["cases"]
    assert case["shape"] == [5, 2500] and result["copy_gbps"] is None and result["smoothing"] == smoothing
    by_variant: dict[str, list[dict[str, int]]] = {}
    for r in case["results"]:
        assert r["matches_reference"] is True and "time_us" not in r, r
        by_variant.setdefault(r["variant"], []).append(r["config"])
    assert set(by_variant) == {"looped", "staged_gradient_pass"}
    assert by_variant["staged_gradient_pass"] == by_variant["looped"] != []


def test_a_wrong_variant_is_reported(
    gradient_pass_script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant whose gradient is off by 1 % fails the check: the script returns 1 and records the mismatch."""
    variant = gradient_pass_script.variants()[-1]

    def off(*args: object, config: object) -> object:
        loss, dx = variant.launcher(*args, config=config)
        return loss, dx * 1.01

    wrong = dataclasses.replace(variant, name="wrong", launcher=off)
    monkeypatch.setattr(gradient_pass_script, "variants", lambda: [wrong])
    out = tmp_path / "gradient-pass.json"
    args = ["--interpret", "--shapes", "3x2100", "--dtype", "float32", "--out", str(out)]
    assert gradient_pass_script.main(args) == 1
    results = json.loads(out.read_text())["cases"][0]["results"]
    assert results and all(r["matches_reference"] is False and "mismatch" in r for r in results)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_bad_ignored_and_large_rows(gradient_pass_script: ModuleType, smoothing: float) -> None:
    """The NaN folded into a bad row's scale makes its whole gradient NaN (target out of range, as torch's error
    would be), an ignored row's gradient is 0, and rows of logits near 1e4 (the exponent's base far from 0) keep a
    gradient no further from float64 than torch's own."""
    variant = gradient_pass_script.variants()[-1]
    gen = torch.Generator().manual_seed(3)
    n = 2500
    logits = torch.randn(4, n, generator=gen) * 3
    logits[2] += 1e4
    target = torch.tensor([5, -100, 17, n + 3])
    with kernelgate.use_interpreter():
        loss, dx = run_candidate(variant, CONFIG, (logits, target, None, -100, smoothing, "sum"), True, True)
    assert bool(dx[3].isnan().all()) and bool(loss.isnan())
    assert bool((dx[1] == 0).all())
    good = torch.tensor([0, 1, 2])
    grads = []
    for dtype in (torch.float32, torch.float64):
        x = logits[good].to(dtype).requires_grad_()
        loss_ok = F.cross_entropy(x, target[good], ignore_index=-100, label_smoothing=smoothing, reduction="sum")
        grads.append(torch.autograd.grad(loss_ok, x)[0])
    assert_no_worse(dx[good], grads[0], grads[1])


def test_the_staged_kernel_compiles_for_sm90_without_local_memory(
    gradient_pass_script: ModuleType, triton_cache: Path
) -> None:
    """The staged kernel goes through Triton's compiler for sm_90 (ptxas included) at bf16 and float32, 8192-wide
    blocks and 3 stages in both passes, in the compile workers (it is named by an importable module), and keeps
    everything in registers: no local memory a thread (cuobjdump's STACK), as the package's looped kernel."""
    from kernelgate.bench.resources import cubin_resources
    from kernelgate.compile_ahead import compile_ahead

    if torch.cuda.is_available():
        pytest.skip("on a GPU the script itself compiles them")
    variant = gradient_pass_script.variants()[-1]
    launches = []
    for dtype in (torch.bfloat16, torch.float32):
        values = (torch.empty(2, 32000, dtype=dtype), torch.zeros(2, dtype=torch.int64), None, -100, 0.0, "mean")
        config = {"BLOCK_N": 8192, "num_warps": 8, "NUM_STAGES": 3}
        launches.append(lambda values=values, config=config: run_candidate(variant, config, values, False, False))
    outcome = compile_ahead(launches, workers=2)
    assert outcome.compiled == outcome.jobs >= 2, outcome  # the staged kernel, and the implementation's other two
    cubins = sorted(triton_cache.rglob("_fwd_grad_staged_kernel.cubin"))
    assert len(cubins) == 2
    for cubin in cubins:
        (kernel,) = cubin_resources(cubin.read_bytes(), num_warps=8)
        assert kernel.local_bytes == 0 and kernel.registers <= 255, kernel
