"""benchmarks/layer_norm_variants.py: layer_norm's looped forward against variants of its statistics pass."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

import kernelgate
from kernelgate.compile_ahead import compile_ahead
from kernelgate.selection import run_candidate
from kernelgate.tolerance import assert_close, assert_no_worse

ROOT = Path(__file__).resolve().parents[1]
SMALL_BLOCK = {"BLOCK_N": 1024, "num_warps": 4}


@pytest.fixture
def variants_script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    pytest.importorskip("triton")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the script imports provenance.py beside it
    import layer_norm_variants

    return layer_norm_variants


def test_every_variant_matches_the_reference_interpreted(variants_script: ModuleType, tmp_path: Path) -> None:
    """Interpreted, each variant at every configuration that suits a row of 1500 (two blocks of 1024, the last
    masked) matches the reference; the result has provenance and no timing."""
    out = tmp_path / "variants.json"
    args = ["--interpret", "--rows", "3", "--lengths", "1500", "--dtype", "float32", "--out", str(out)]
    assert variants_script.main(args) == 0
    result = json.loads(out.read_text())
    [case] = result["cases"]
    assert case["shape"] == [3, 1500] and result["copy_gbps"] is None and "kernelgate_commit" in result
    by_variant: dict[str, int] = {}
    for r in case["results"]:
        assert r["matches_reference"] is True and "time_us" not in r, r
        by_variant[r["variant"]] = by_variant.get(r["variant"], 0) + 1
    assert set(by_variant) == {"looped", "block_stats", "block_stats_prefetch"}
    assert len(set(by_variant.values())) == 1, "each variant ran the same configurations"


def test_a_wrong_variant_is_reported(
    variants_script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant whose output is off by 1 % fails the check: the script returns 1 and records the mismatch."""
    looped = variants_script.variants()[0]
    wrong = dataclasses.replace(
        looped, name="wrong", launcher=lambda *a, config: looped.launcher(*a, config=config) * 1.01
    )
    monkeypatch.setattr(variants_script, "variants", lambda: [wrong])
    out = tmp_path / "variants.json"
    args = ["--interpret", "--rows", "2", "--lengths", "1100", "--dtype", "float32", "--out", str(out)]
    assert variants_script.main(args) == 1
    results = json.loads(out.read_text())["cases"][0]["results"]
    assert results and all(r["matches_reference"] is False and "mismatch" in r for r in results)


@pytest.mark.parametrize("name", ["block_stats", "block_stats_prefetch"])
def test_variants_keep_precision_on_hard_rows(variants_script: ModuleType, name: str) -> None:
    """Rows of 1e4 + noise are no further from float64 than torch's result; constant rows give exactly the bias,
    as the package's looped kernel does (the statistics are of x - k, k the first block's mean)."""
    impl = next(i for i in variants_script.variants() if i.name == name)
    n = 2500
    gen = torch.Generator().manual_seed(1)
    w, b = torch.rand(n, generator=gen) + 0.5, torch.randn(n, generator=gen)
    eps = 1e-5
    with kernelgate.use_interpreter():
        x = 1e4 + torch.randn(3, n, generator=gen) / 3
        y = run_candidate(impl, SMALL_BLOCK, (x, (n,), w, b, eps), True, True)
        assert_no_worse(
            y, F.layer_norm(x, (n,), w, b, eps), F.layer_norm(x.double(), (n,), w.double(), b.double(), eps)
        )
        constant = torch.tensor([3.7, 0.0, -1e4, 1e-3])[:, None].expand(4, n).contiguous()
        y = run_candidate(impl, SMALL_BLOCK, (constant, (n,), w, b, eps), True, True)
        assert_close(y, b.expand(4, n))


def test_variants_compile_ahead_for_sm90(variants_script: ModuleType, triton_cache: Path) -> None:
    """Both variant kernels go through Triton's compiler for sm_90 (ptxas included) at bf16, as on the H200, in the
    compile workers: the kernels are named by an importable module, so the script's configurations are built in
    parallel before they are timed rather than one by one."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU the script itself compiles them")
    x = torch.empty(2, 16448, dtype=torch.bfloat16)
    w = torch.empty(16448, dtype=torch.bfloat16)
    values = (x, (16448,), w, w, 1e-5)
    launches = [
        lambda impl=impl, warps=warps: run_candidate(impl, {"BLOCK_N": 4096, "num_warps": warps}, values, False, False)
        for impl in variants_script.variants()[1:]
        for warps in (8, 16)
    ]
    outcome = compile_ahead(launches, workers=2)
    assert (outcome.jobs, outcome.compiled) == (4, 4), outcome
    assert len(list(triton_cache.rglob("*.cubin"))) == 4
