"""benchmarks/cross_entropy_split_looped.py: cross_entropy_with_grad's split_looped implementation at a wider space of
configurations."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

import kernelgate
from variant_scripts import check_a_wrong_variant_is_reported

IGNORE = -100


@pytest.fixture
def split_looped_script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("triton")
    return benchmark_script("cross_entropy_split_looped")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_variant_matches_the_reference_interpreted(
    split_looped_script: ModuleType, tmp_path: Path, dtype: str
) -> None:
    """Interpreted, at 5 rows of 2500 classes, the package's looped implementation and the wide variant match the
    reference at every configuration that suits the row: segments of 2048 columns split a row in two (the second
    452 columns, a masked block only), streamed 1024 at a time (the first, two whole blocks) or 2048 (one)."""
    out = tmp_path / "split-looped.json"
    args = ["--interpret", "--shapes", "5x2500", "--dtype", dtype, "--out", str(out)]
    assert split_looped_script.main(args) == 0
    result = json.loads(out.read_text())
    [case] = result["cases"]
    assert case["shape"] == [5, 2500] and result["copy_gbps"] is None and "kernelgate_commit" in result
    by_variant: dict[str, list[dict[str, int]]] = {}
    for r in case["results"]:
        assert r["matches_reference"] is True and "time_us" not in r, r
        by_variant.setdefault(r["variant"], []).append(r["config"])
    assert set(by_variant) == {"looped", "split_looped_wide"}
    assert {(c["BLOCK_N"], c["STREAM_N"]) for c in by_variant["split_looped_wide"]} == {(2048, 1024), (2048, 2048)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("weighted", "label_smoothing", "reduction"), [(True, 0.1, "mean"), (False, 0.0, "none")])
def test_the_variant_matches_the_reference_with_ignored_rows_weights_and_smoothing(
    split_looped_script: ModuleType, dtype: torch.dtype, weighted: bool, label_smoothing: float, reduction: str
) -> None:
    """Rows whose target is ignored (their gradient 0, their loss left out of the mean), a target in the row's
    last column and in its second segment, class weights and label smoothing: the wide variant's loss and
    gradient match the reference's at every configuration, interpreted."""
    generator = torch.Generator().manual_seed(3)
    logits = (4 * torch.randn(6, 2500, generator=generator)).to(dtype)
    target = torch.tensor([3, IGNORE, 2499, 0, IGNORE, 2100])
    weight = torch.rand(2500, generator=generator) + 0.5 if weighted else None
    values = (logits, target, weight, IGNORE, label_smoothing, reduction)
    op = kernelgate.cross_entropy_with_grad
    with kernelgate.use_interpreter():
        results = split_looped_script.check_and_time(
            op, [split_looped_script.variants()[-1]], values, 2500, 0, True, record_errors=True
        )
    assert results and all(r["matches_reference"] is True for r in results), results


def test_a_wrong_gradient_is_reported(
    split_looped_script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant whose gradient is off by 1 % fails the check: the script returns 1 and records the mismatch."""
    args = ["--interpret", "--shapes", "3x2100", "--dtype", "float32"]
    check_a_wrong_variant_is_reported(
        split_looped_script, split_looped_script.variants()[-1], lambda r: (r[0], r[1] * 1.01), args,
        tmp_path / "split-looped.json", monkeypatch,
    )  # fmt: skip
