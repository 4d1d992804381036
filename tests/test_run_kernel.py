"""benchmarks/run_kernel.py: one implementation at one configuration, launched for a profiler to read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run_kernel.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_configuration_of_an_implementation_is_launched_the_calls_asked() -> None:
    """The split_rows forward of rms_norm at one configuration runs (off a GPU through the interpreter)."""
    result = _run("--op", "rms_norm", "--shape", "4x9000", "--dtype", "float32", "--impl", "split_rows",
                  "--config", "BLOCK_N=2048,maxnreg=0,num_warps=4", "--calls", "2")  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rms_norm 4x9000 float32 split_rows[BLOCK_N=2048,maxnreg=0,num_warps=4]: 2 call(s) on " in result.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--impl", "nosuch"], "--impl must be one of "),
        (["--impl", "split_rows", "--config", "BLOCK_N=3,num_warps=4"], "is not in split_rows's space"),
        (["--impl", "split_rows", "--config", "BLOCK_N"], "--config must look like BLOCK_N=8192,num_warps=8"),
    ],
)
def test_an_unknown_implementation_or_configuration_is_refused_with_what_is_accepted(
    args: list[str], expected: str
) -> None:
    result = _run("--op", "softmax", "--shape", "4x9000", *args)
    assert result.returncode != 0 and expected in result.stderr, result.stderr[-2000:]
