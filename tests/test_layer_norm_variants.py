"""benchmarks/layer_norm_variants.py: layer_norm's looped forward against the kernels it replaced."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

import kernelgate
from kernelgate.compile_ahead import compile_ahead
from kernelgate.selection import run_candidate
from kernelgate.tolerance import assert_close, assert_no_worse
from variant_scripts import check_a_wrong_variant_is_reported

SMALL_BLOCK = {"BLOCK_N": 1024, "num_warps": 4, "PREFETCH": 0}


@pytest.fixture
def variants_script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("triton")
    return benchmark_script("layer_norm_variants")


def test_every_variant_matches_the_reference_interpreted(variants_script: ModuleType, tmp_path: Path) -> None:
    """Interpreted, each variant at every configuration that suits a row of 1500 (two blocks of 1024, the last
    masked) matches the reference; the result has provenance and no timing. The Welford kernel runs at the package's
    configurations without PREFETCH, the others at all of them."""
    out = tmp_path / "variants.json"
    args = ["--interpret", "--rows", "3", "--lengths", "1500", "--dtype", "float32", "--out", str(out)]
    assert variants_script.main(args) == 0
    result = json.loads(out.read_text())
    [case] = result["cases"]
    assert case["shape"] == [3, 1500] and result["copy_gbps"] is None and "kernelgate_commit" in result
    by_variant: dict[str, list[dict[str, int]]] = {}
    for r in case["results"]:
        assert r["matches_reference"] is True and "time_us" not in r, r
        by_variant.setdefault(r["variant"], []).append(r["config"])
    assert set(by_variant) == {"looped", "welford", "chan", "shifted_sums_per_block"}
    without_prefetch = [c for c in by_variant["looped"] if not c["PREFETCH"]]
    assert without_prefetch != []
    assert by_variant["welford"] == without_prefetch
    for name in ("chan", "shifted_sums_per_block"):
        assert by_variant[name] == by_variant["looped"], name


def test_a_wrong_variant_is_reported(
    variants_script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant whose output is off by 1 % fails the check: the script returns 1 and records the mismatch."""
    args = ["--interpret", "--rows", "2", "--lengths", "1100", "--dtype", "float32"]
    check_a_wrong_variant_is_reported(
        variants_script, variants_script.variants()[0], lambda y: y * 1.01, args, tmp_path / "variants.json",
        monkeypatch,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "prefetch"),
    [
        ("looped", 0),
        ("looped", 1),
        ("welford", 0),
        ("chan", 0),
        ("chan", 1),
        ("shifted_sums_per_block", 0),
        ("shifted_sums_per_block", 1),
    ],
)
def test_variants_keep_precision_on_hard_rows(variants_script: ModuleType, name: str, prefetch: int) -> None:
    """Rows of 1e4 + noise are no further from float64 than torch's result; nor are rows whose first block lies
    far from the rest (the shift ``k``, the first block's mean, as far from the row's mean as it can be); constant
    rows give exactly the bias (the statistics are of x - k)."""
    impl = next(i for i in variants_script.variants() if i.name == name)
    config = {**SMALL_BLOCK, "PREFETCH": prefetch}
    n = 2500
    gen = torch.Generator().manual_seed(1)
    w, b = torch.rand(n, generator=gen) + 0.5, torch.randn(n, generator=gen)
    eps = 1e-5
    with kernelgate.use_interpreter():
        x = 1e4 + torch.randn(3, n, generator=gen) / 3
        y = run_candidate(impl, config, (x, (n,), w, b, eps), True, True)
        assert_no_worse(
            y, F.layer_norm(x, (n,), w, b, eps), F.layer_norm(x.double(), (n,), w.double(), b.double(), eps)
        )
        noise = torch.randn(3, n, generator=gen) / 3
        x = torch.cat([noise[:, :1024] - 1e3, noise[:, 1024:] + 1e4], dim=1)
        y = run_candidate(impl, config, (x, (n,), w, b, eps), True, True)
        assert_no_worse(
            y, F.layer_norm(x, (n,), w, b, eps), F.layer_norm(x.double(), (n,), w.double(), b.double(), eps)
        )
        constant = torch.tensor([3.7, 0.0, -1e4, 1e-3])[:, None].expand(4, n).contiguous()
        y = run_candidate(impl, config, (constant, (n,), w, b, eps), True, True)
        assert_close(y, b.expand(4, n))


def test_variants_compile_ahead_for_sm90(variants_script: ModuleType, triton_cache: Path) -> None:
    """The script's kernel goes through Triton's compiler for sm_90 (ptxas included) at bf16, as on the H200, in
    the compile workers: it is named by an importable module, so its configurations are built in parallel before
    they are timed rather than one by one. (The package's kernel with PREFETCH: test_compiles_for_hopper; a
    kernel this process compiled already is no job here.)"""
    if torch.cuda.is_available():
        pytest.skip("on a GPU the script itself compiles them")
    x = torch.empty(2, 16448, dtype=torch.bfloat16)
    w = torch.empty(16448, dtype=torch.bfloat16)
    values = (x, (16448,), w, w, 1e-5)
    welford = variants_script.variants()[1]
    launches = [
        lambda config=config: run_candidate(welford, config, values, False, False)
        for config in ({"BLOCK_N": 4096, "num_warps": warps, "PREFETCH": 0} for warps in (8, 16))
    ]
    outcome = compile_ahead(launches, workers=2)
    assert (outcome.jobs, outcome.compiled) == (2, 2), outcome
    assert len(list(triton_cache.rglob("_welford_kernel.cubin"))) == 2
