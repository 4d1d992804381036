"""benchmarks/split_looped_forwards.py: softmax's, log_softmax's, rms_norm's and layer_norm's forwards with each row
split over programs that stream a segment twice."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

import kernelgate
from kernelgate.selection import run_candidate
from variant_scripts import check_a_wrong_variant_is_reported


@pytest.fixture
def forwards_script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("triton")
    return benchmark_script("split_looped_forwards")


def test_every_variant_matches_the_reference_interpreted(forwards_script: ModuleType, tmp_path: Path) -> None:
    """Interpreted, for softmax, log_softmax and rms_norm at 3 rows of 5000 (segments of 2048, the last 904
    columns, masked) and of 4096 (two whole segments, no masks), the package's long-row forwards and the variant
    match the reference at every configuration that suits the row, in both dtypes."""
    out = tmp_path / "split-looped.json"
    ops = ["--op", "softmax", "--op", "log_softmax", "--op", "rms_norm"]
    args = [*ops, "--interpret", "--rows", "3", "--lengths", "5000", "4096", "--out", str(out)]
    assert forwards_script.main(args) == 0
    result = json.loads(out.read_text())
    assert result["copy_gbps"] is None and "kernelgate_commit" in result
    cases = [(c["op"], c["dtype"], c["shape"][1]) for c in result["cases"]]
    assert cases == [
        (op, dtype, n) for op in ("softmax", "log_softmax", "rms_norm") for dtype in ("float32", "bfloat16")
        for n in (5000, 4096)
    ]  # fmt: skip
    for case in result["cases"]:
        assert all(r["matches_reference"] is True and "time_us" not in r for r in case["results"]), case
        variant = [r["config"] for r in case["results"] if r["variant"] == "split_looped"]
        assert sorted({(c["BLOCK_N"], c["STREAM_N"]) for c in variant}) == [(2048, 1024), (2048, 2048)], case


@pytest.mark.parametrize("op_name", ["softmax", "log_softmax"])
def test_a_segment_of_minus_infinity_and_a_nan_row_match_torch(forwards_script: ModuleType, op_name: str) -> None:
    """A segment whose inputs are all -inf adds nothing to its row (exp of -inf is 0, its rescale not NaN); a row of
    -inf and one holding a NaN are NaN throughout, as torch's are: every configuration, interpreted."""
    x = 3 * torch.randn(4, 5000, generator=torch.Generator().manual_seed(4))
    x[0, 2048:4096] = -float("inf")  # the second segment
    x[1] = -float("inf")
    x[2, 4500] = float("nan")  # in the last, partial segment
    expected = getattr(torch, op_name)(x, -1)
    variant = forwards_script.variants(op_name)[-1]
    with kernelgate.use_interpreter():
        for config in variant.candidate_configs((x, -1)):
            y = run_candidate(variant, config, (x, -1), interpret=True, poison=True)
            torch.testing.assert_close(y[[0, 3]], expected[[0, 3]])
            assert bool(y[1].isnan().all() and y[2].isnan().all()), config


def test_rms_norm_without_a_weight_matches_the_reference(forwards_script: ModuleType) -> None:
    """rms_norm's variant without a weight (HAS_WEIGHT off) gives the reference's result at every configuration,
    interpreted."""
    x = 2 * torch.randn(3, 5000, generator=torch.Generator().manual_seed(5))
    values = (x, None, 1e-6)
    variant = forwards_script.variants("rms_norm")[-1]
    with kernelgate.use_interpreter():
        for config in variant.candidate_configs(values):
            y = run_candidate(variant, config, values, interpret=True, poison=True)
            torch.testing.assert_close(y, kernelgate.rms_norm.reference(*values))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_matches_the_reference_with_segments_far_from_the_first_element(
    forwards_script: ModuleType, dtype: torch.dtype
) -> None:
    """layer_norm's variant, rows of 5000 in segments of 2048: a row near 0 but for a second segment near 1e4 (its
    mean far from the row's first element, the reference of the stored means) and a row of 1e4 plus unit noise,
    with weight and bias, match the reference at every configuration, interpreted."""
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(3, 5000, generator=generator)
    x[0, 2048:4096] += 1e4
    x[1] += 1e4
    w = torch.rand(5000, generator=generator) + 0.5
    b = torch.randn(5000, generator=generator)
    values = (x.to(dtype), (5000,), w.to(dtype), b.to(dtype), 1e-5)
    variant = forwards_script.variants("layer_norm")[-1]
    with kernelgate.use_interpreter():
        results = forwards_script.check_and_time(kernelgate.layer_norm, [variant], values, 5000, 0, True)
    assert results and all(r["matches_reference"] is True for r in results), results


def test_a_wrong_variant_is_reported(
    forwards_script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant whose result is off by 1 % fails the check: the script returns 1 and records the mismatch."""
    args = ["--op", "softmax", "--interpret", "--rows", "2", "--lengths", "4100", "--dtype", "float32"]
    check_a_wrong_variant_is_reported(
        forwards_script, forwards_script.variants("softmax")[-1], lambda y: y * 1.01, args,
        tmp_path / "split-looped.json", monkeypatch,
    )  # fmt: skip
