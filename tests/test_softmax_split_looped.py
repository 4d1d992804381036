"""benchmarks/softmax_split_looped.py: softmax's forward with each row split over programs that stream a segment
twice."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

import kernelgate
from kernelgate.selection import run_candidate


@pytest.fixture
def split_looped_script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("triton")
    return benchmark_script("softmax_split_looped")


@pytest.mark.parametrize(
    ("length", "segments"),
    [(5000, [(2048, 1024), (2048, 2048)]), (4096, [(2048, 1024), (2048, 2048)])],
    ids=["partial-segment", "whole-segments"],
)
def test_every_variant_matches_the_reference_interpreted(
    split_looped_script: ModuleType, tmp_path: Path, length: int, segments: list[tuple[int, int]]
) -> None:
    """Interpreted, at 3 rows of 5000 (segments of 2048, the last 904 columns, masked) and of 4096 (two whole
    segments, no masks), the package's long-row forwards and the variant match the reference at every
    configuration that suits the row, in both dtypes."""
    out = tmp_path / "split-looped.json"
    args = ["--interpret", "--rows", "3", "--lengths", str(length), "--out", str(out)]
    assert split_looped_script.main(args) == 0
    result = json.loads(out.read_text())
    assert result["copy_gbps"] is None and "kernelgate_commit" in result
    assert [c["dtype"] for c in result["cases"]] == ["float32", "bfloat16"]
    for case in result["cases"]:
        assert case["shape"] == [3, length]
        variant = [r for r in case["results"] if r["variant"] == "split_looped"]
        assert all(r["matches_reference"] is True and "time_us" not in r for r in case["results"]), case
        assert sorted({(r["config"]["BLOCK_N"], r["config"]["STREAM_N"]) for r in variant}) == segments


def test_a_segment_of_minus_infinity_and_a_nan_row_match_torch(split_looped_script: ModuleType) -> None:
    """A segment whose logits are all -inf adds nothing to its row (exp of -inf is 0, its rescale not NaN), a row
    of -inf and one holding a NaN are NaN throughout, as torch's softmax is: every configuration, interpreted."""
    x = 3 * torch.randn(4, 5000, generator=torch.Generator().manual_seed(4))
    x[0, 2048:4096] = -float("inf")  # the second segment
    x[1] = -float("inf")
    x[2, 4500] = float("nan")  # in the last, partial segment
    variant = split_looped_script.variants()[-1]
    with kernelgate.use_interpreter():
        for config in variant.candidate_configs((x, -1)):
            y = run_candidate(variant, config, (x, -1), interpret=True, poison=True)
            torch.testing.assert_close(y[[0, 3]], torch.softmax(x[[0, 3]], -1))
            assert bool(y[0, 2048:4096].eq(0).all()), config
            assert bool(y[1].isnan().all() and y[2].isnan().all()), config


def test_a_wrong_variant_is_reported(
    split_looped_script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant whose result is off by 1 % fails the check: the script returns 1 and records the mismatch."""
    variant = split_looped_script.variants()[-1]

    def off(*args: object, config: object) -> object:
        return variant.launcher(*args, config=config) * 1.01

    monkeypatch.setattr(
        split_looped_script, "variants", lambda: [dataclasses.replace(variant, name="wrong", launcher=off)]
    )
    out = tmp_path / "split-looped.json"
    args = ["--interpret", "--rows", "2", "--lengths", "4100", "--dtype", "float32", "--out", str(out)]
    assert split_looped_script.main(args) == 1
    results = json.loads(out.read_text())["cases"][0]["results"]
    assert results and all(r["matches_reference"] is False and "mismatch" in r for r in results)
