"""benchmarks/norm_backward_split_rows.py: the norms' split and split_rows backwards at every configuration."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


def test_every_configuration_is_checked_interpreted(
    benchmark_script: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    """Interpreted, at 3 rows of 9000 (past SPLIT_MIN_COLS, a ragged last block), every configuration of split and
    split_rows of each norm backward runs and matches the reference; the JSON has provenance and no timing."""
    pytest.importorskip("triton")
    script = benchmark_script("norm_backward_split_rows")
    out = tmp_path / "split-rows.json"
    args = ["--interpret", "--rows", "3", "--lengths", "9000", "--dtype", "float32", "--out", str(out)]
    assert script.main(args) == 0
    result = json.loads(out.read_text())
    assert result["copy_gbps"] is None and "kernelgate_commit" in result
    assert [case["op"] for case in result["cases"]] == [
        "rms_norm_backward", "add_rms_norm_backward", "layer_norm_backward"
    ]  # fmt: skip
    for case in result["cases"]:
        assert case["shape"] == [3, 9000]
        variants = {r["variant"] for r in case["results"]}
        assert variants == {"split", "split_rows"}, case["op"]
        assert all(r["matches_reference"] and "time_us" not in r for r in case["results"]), case["op"]
