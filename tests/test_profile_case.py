"""benchmarks/profile_case.py: one bench case under the profiler, kernelgate against its ops (and Liger-Kernel)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_liger_is_profiled_where_installed_and_named_where_not(tmp_path: Path) -> None:
    """With --liger, Liger-Kernel's op is a third profiled row where Liger-Kernel is installed; without it the run
    says so and profiles kernelgate and its ops alone, rather than failing."""
    out = tmp_path / "profile.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELGATE_")}
    args = ["--liger", "--op", "rms_norm", "--shape", "8x64", "--dtype", "float32", "--direction", "forward+backward"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_case.py"), *args, "--steps", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        env={**env, "KERNELGATE_CACHE_DIR": str(tmp_path / "cache")},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = {row["case"] for row in json.loads(out.read_text())["rows"]}
    if importlib.util.find_spec("liger_kernel") is not None:
        assert rows == {"kernelgate", "ops", "liger"}
    else:
        assert rows == {"kernelgate", "ops"}
        assert "no Liger-Kernel counterpart here" in result.stdout
