"""benchmarks/reference_route_overhead.py: kernelgate's calls planned to the reference against the reference."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

import kernelgate


@pytest.fixture
def script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("reference_route_overhead")


def test_each_shape_and_direction_is_timed_both_ways_and_the_modes_are_put_back(
    script: ModuleType, tmp_path: Path
) -> None:
    """For softmax, one row per latency shape and direction with both times and their paired difference; the
    forward+backward steps ran eager autograd of the reference (mode reference both ways), and afterwards the op
    and its backward follow the global mode again."""
    out = tmp_path / "result.json"
    assert script.main(["--op", "softmax", "--calls", "3", "--rounds", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["shape"], r["direction"]) for r in rows] == [
        (shape, direction)
        for shape in ("1x4096", "64x4096", "512x4096")
        for direction in ("forward", "forward+backward")
    ]
    for row in rows:
        assert row["reference_us"] > 0 and row["kernelgate_us"] > 0 and isinstance(row["median_extra_us"], float)
        assert row["step_route"] == ("eager" if row["direction"] == "forward+backward" else "")
    assert "kernelgate_commit" in result and result["calls"] == 3
    assert kernelgate.softmax.mode is None and kernelgate.softmax_backward.mode is None
