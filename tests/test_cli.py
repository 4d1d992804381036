"""The kernelgate command: doctor and demo output, exit codes."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from kernelgate import backend
from kernelgate import log as launch_log
from kernelgate.cli import EXIT_OK, EXIT_USAGE, main


def _gpu_here() -> bool:
    import torch

    return torch.cuda.is_available() and backend.status().gpu


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "COLUMNS": "200", "KERNELGATE_CACHE_DIR": str(cwd / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "kernelgate", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def test_doctor_reports_versions_and_each_op_path(tmp_path: Path) -> None:
    """doctor prints torch and triton versions, the interpreter, and for each op the path it takes here and why."""
    result = _run("doctor", cwd=tmp_path)
    assert result.returncode == EXIT_OK, result.stderr
    out = result.stdout
    import torch
    import triton

    assert torch.__version__ in out and triton.__version__ in out
    assert "interpreter" in out and "available" in out
    for op in ("softmax", "rms_norm"):
        line = next(line for line in out.splitlines() if f" {op} " in line)
        if _gpu_here():  # a fresh cache: the bucket is not tuned yet, and doctor does not tune
            assert "triton" in line and "single_block" in line and "default-config" in line
        else:
            assert "reference" in line and "no-gpu-driver" in line


def test_demo_checks_times_and_logs(tmp_path: Path) -> None:
    """demo runs each op, shows path, implementation, reason and times, checks results and writes the log."""
    log = tmp_path / "demo.csv"
    result = _run("demo", "--log", str(log), "--repeats", "1", cwd=tmp_path)
    assert result.returncode == EXIT_OK, result.stderr
    out = result.stdout
    assert "single_block" in out and "looped" in out and "matches" in out
    assert "NO" not in out
    rows = list(csv.DictReader(log.open()))
    assert list(rows[0]) == list(launch_log.COLUMNS)
    assert {r["op"] for r in rows} == {"softmax", "rms_norm"}
    paths = {r["path"] for r in rows}
    if _gpu_here():  # a fresh cache: each bucket is tuned (logged), then runs what won
        assert {"tune", "tune-winner"} <= paths <= {"tune", "tune-winner", "triton", "reference"}
    else:
        assert paths == {"reference", "interpreter"}


def test_demo_default_log_is_in_the_working_directory(tmp_path: Path) -> None:
    """Without --log, demo writes kernelgate-demo.csv in the current directory."""
    assert _run("demo", "--repeats", "1", cwd=tmp_path).returncode == EXIT_OK
    assert (tmp_path / "kernelgate-demo.csv").stat().st_size > 0


@pytest.mark.parametrize("argv", [["bogus"], [], ["demo", "--repeats", "0"], ["demo", "--nope"]])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    """Unknown commands and bad options exit with code 2."""
    assert main(argv) == EXIT_USAGE


def test_console_script_is_installed() -> None:
    """The kernelgate console script exists beside the interpreter and answers --help."""
    script = Path(sys.executable).with_name("kernelgate")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "doctor" in result.stdout and "Exit codes" in result.stdout
