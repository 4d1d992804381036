"""benchmarks/kernel_resources.py: each candidate configuration's kernels compiled, not run, and their registers
and local memory read from the cubin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from kernelgate.config import config_label
from kernelgate.op import get_op

ROOT = Path(__file__).resolve().parents[1]


def test_every_candidate_configuration_is_compiled_and_its_resources_read(tmp_path: Path) -> None:
    """rms_norm's single-block forward at 4x1024 float32: one row per candidate configuration tuning would try,
    naming its kernel with the registers a thread (1 to 255), the local memory a thread and the warps it was
    compiled for; on a CPU through the compile-only driver, for sm_90."""
    out = tmp_path / "resources.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELGATE_")}
    args = ["--op", "rms_norm", "--shape", "4x1024", "--dtype", "float32", "--impl", "single_block", "--out", str(out)]
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "kernel_resources.py"), *args],
        capture_output=True,
        text=True,
        env={**env, "TRITON_CACHE_DIR": str(tmp_path / "triton"), "KERNELGATE_CACHE_DIR": str(tmp_path / "cache")},
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(out.read_text())
    op = get_op("rms_norm")
    [impl] = [i for i in op.implementations if i.name == "single_block"]
    assert op.make_inputs is not None
    values = op.make_inputs((4, 1024), torch.float32, torch.device("cpu"))
    expected = {config_label(c) for c in impl.candidate_configs(values) if c}
    rows = report["rows"]
    assert {row["config"] for row in rows} == expected and len(expected) > 1
    for row in rows:
        assert row["kernel"] == "_rms_norm_fwd_kernel" and row["function"] == "_rms_norm_fwd_kernel"
        assert 0 < row["registers"] <= 255 and row["stack_bytes"] >= 0 and row["shared_bytes"] >= 0
        assert f"num_warps={row['num_warps']}" in row["config"]
    assert report["target"] == ("this GPU" if torch.cuda.is_available() else "sm_90 (compile only)")
