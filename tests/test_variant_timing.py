"""benchmarks/variant_timing.py: what the variant scripts share, here its watchdog for a configuration that hangs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(body: str) -> subprocess.CompletedProcess[str]:
    code = f"import sys, time; sys.path.insert(0, {str(BENCHMARKS)!r}); import variant_timing as vt\n{body}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_a_configuration_that_hangs_stops_the_run_and_names_itself() -> None:
    """A block that outlasts the watchdog ends the process with status HUNG, naming what hung and with the stacks,
    rather than running on to a device call's time limit with nothing printed."""
    ran = _run(
        "with vt.hang_watchdog('split_rows_pipelined {BLOCK_N: 8192}', 0.5):\n    time.sleep(30)\nprint('ran on')"
    )
    assert ran.returncode == 3, (ran.returncode, ran.stderr)
    assert "hung: split_rows_pipelined {BLOCK_N: 8192} did not finish in 0.5 s" in ran.stderr
    assert 'File "<string>", line 3 in <module>' in ran.stderr, ran.stderr  # the main thread, inside the block
    assert "ran on" not in ran.stdout


def test_a_configuration_that_finishes_disarms_the_watchdog() -> None:
    """A block left in time leaves the run going past the watchdog's time."""
    ran = _run("with vt.hang_watchdog('quick', 0.5):\n    pass\ntime.sleep(1.5)\nprint('ran on')")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "ran on"
