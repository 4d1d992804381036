"""benchmarks/split_rows_variants.py: softmax's and rms_norm's long-row forwards against variants of their kernels."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def variants_script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    pytest.importorskip("triton")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the script imports variant_timing.py beside it
    import split_rows_variants

    return split_rows_variants


def test_every_variant_matches_the_reference_interpreted(variants_script: ModuleType, tmp_path: Path) -> None:
    """Interpreted (where a kernel's programs do not wait for each other: the partials, then the rest), each
    variant of each op at every configuration that suits a row of 20000 matches the reference; the result has
    provenance and no timing. Every variant suits a row of 20000 (one block holds up to 32768)."""
    out = tmp_path / "variants.json"
    args = ["--interpret", "--rows", "2", "--lengths", "20000", "--dtype", "float32", "--out", str(out)]
    assert variants_script.main(args) == 0
    result = json.loads(out.read_text())
    assert result["copy_gbps"] is None and "kernelgate_commit" in result
    assert [(c["op"], c["shape"]) for c in result["cases"]] == [("softmax", [2, 20000]), ("rms_norm", [2, 20000])]
    softmax, rms_norm = ({r["variant"] for r in c["results"]} for c in result["cases"])
    assert softmax == {
        "split_rows", "split_one_exp", "split_one_exp_last", "split_one_exp_volatile", "split_exp2", "looped",
        "looped_exp2", "single_block", "single_block_reciprocal", "persistent", "persistent_reciprocal",
    }  # fmt: skip
    assert rms_norm == {"split_rows", "split_last", "split_volatile"}
    for case in result["cases"]:
        for r in case["results"]:
            assert r["matches_reference"] is True and "time_us" not in r, r


def test_the_exp2_variants_give_zero_for_minus_inf_and_nan_for_a_row_of_them(variants_script: ModuleType) -> None:
    """split_exp2 and looped_exp2 take no select an element: a max of -inf is taken as 0, so -inf terms are
    exp2(-inf) = 0. Interpreted, over 10 blocks a row: -inf terms give 0, a row with blocks of only -inf matches
    torch, a row of only -inf and a row holding a NaN give NaN rows, as in torch."""
    import torch

    from kernelgate.selection import run_candidate

    x = torch.randn(4, 20000) * 3
    x[0, :4096] = -float("inf")  # two whole blocks of 2048
    x[0, 5000] = -float("inf")
    x[2] = -float("inf")
    x[3, 7] = float("nan")
    expected = torch.softmax(x, -1)
    for name in ("split_exp2", "looped_exp2"):
        impl = next(i for i in variants_script.variants("softmax") if i.name == name)
        y = run_candidate(impl, {"BLOCK_N": 2048, "num_warps": 4}, (x, -1), True, True)
        torch.testing.assert_close(y[:2], expected[:2])
        assert bool((y[0, :4096] == 0).all()) and float(y[0, 5000]) == 0.0, name
        assert bool(torch.isnan(y[2]).all()) and bool(torch.isnan(y[3]).all()), name
