"""The kernelgate command: doctor and demo output, exit codes."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelgate import backend
from kernelgate import log as launch_log
from kernelgate.cli import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, main


def _gpu_here() -> bool:
    import torch

    return torch.cuda.is_available() and backend.status().gpu


def _run(*args: str, cwd: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "COLUMNS": "200", "KERNELGATE_CACHE_DIR": str(cwd / "cache"), **extra_env}
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
    assert "matches" in out
    if _gpu_here():  # which kernel wins each bucket is measured, so only the Triton path is certain
        assert "triton" in out and ("single_block" in out or "looped" in out)
    else:  # the interpreter rows use default configurations, one row past the single-block limit
        assert "single_block" in out and "looped" in out
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


def _statuses(table: str) -> list[str]:
    """The status column of each row of a `kernelgate tune` table."""
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in table.splitlines() if line.startswith("│ ")]
    return [row[3] for row in cells if row and row[0] in ("softmax", "rms_norm")]


def test_tune_then_cache_show_export_clear_import(tmp_path: Path) -> None:
    """tune decides buckets (tuned, then cached on a second run); cache show lists them; export, clear and
    import round-trip them."""
    first = _run("tune", "softmax", "rms_norm", "--shape", "4x100", "--interpret", cwd=tmp_path)
    assert first.returncode == EXIT_OK, first.stderr
    assert _statuses(first.stdout) == ["tuned", "tuned"]
    second = _run("tune", "softmax", "rms_norm", "--shape", "4x100", "--interpret", cwd=tmp_path)
    assert _statuses(second.stdout) == ["cached", "cached"]
    shown = _run("cache", "show", cwd=tmp_path)
    assert shown.returncode == EXIT_OK and "2 decision(s)" in shown.stdout and "softmax" in shown.stdout
    exported = tmp_path / "decisions.json"
    assert "wrote 2 decision(s)" in _run("cache", "export", str(exported), cwd=tmp_path).stdout
    assert "removed 2 decision(s)" in _run("cache", "clear", cwd=tmp_path).stdout
    assert "0 decision(s)" in _run("cache", "show", cwd=tmp_path).stdout
    assert "imported 2 decision(s)" in _run("cache", "import", str(exported), cwd=tmp_path).stdout
    again = _run("tune", "softmax", "--shape", "4x100", "--interpret", cwd=tmp_path)
    assert _statuses(again.stdout) == ["cached"]


def test_retune_decides_cached_buckets_again_and_keeps_the_others(tmp_path: Path) -> None:
    """tune --retune tunes a bucket decided before again (its candidates gated and timed anew, logged) and replaces
    its decision; other buckets' decisions stay as they were."""
    log = tmp_path / "log.csv"

    def tuned_rows(op: str) -> int:
        return sum(r["path"] == "tune" and r["op"] == op for r in csv.DictReader(log.open()))

    def decisions() -> dict[str, dict[str, object]]:
        entries = json.loads((tmp_path / "cache" / "decisions-v1.json").read_text())["entries"]
        return {json.loads(key)[0]: entry for key, entry in entries.items()}

    first = _run(
        "tune", "softmax", "rms_norm", "--shape", "4x100", "--interpret", cwd=tmp_path, KERNELGATE_LOG=str(log)
    )
    assert _statuses(first.stdout) == ["tuned", "tuned"], first.stderr
    softmax_rows, rms_norm_rows, before = tuned_rows("softmax"), tuned_rows("rms_norm"), decisions()
    assert softmax_rows >= 2 and rms_norm_rows >= 2
    again = _run(
        "tune", "softmax", "--shape", "4x100", "--interpret", "--retune", cwd=tmp_path, KERNELGATE_LOG=str(log)
    )
    assert again.returncode == EXIT_OK, again.stderr
    assert _statuses(again.stdout) == ["retuned"]
    assert tuned_rows("softmax") == 2 * softmax_rows, "every candidate was gated and timed again"
    assert tuned_rows("rms_norm") == rms_norm_rows
    after = decisions()
    assert set(after) == {"softmax", "rms_norm"} and after["rms_norm"] == before["rms_norm"]
    assert after["softmax"]["candidates"].keys() == before["softmax"]["candidates"].keys()
    unknown = _run("tune", "softmax", "--shape", "4x100", "--dtype", "float16", "--interpret", "--retune", cwd=tmp_path)
    assert _statuses(unknown.stdout) == ["tuned"], "a bucket never decided is simply tuned"


def test_tune_from_a_file_and_within_a_budget(tmp_path: Path) -> None:
    """tune reads specs from a JSON file, and specs not started within --budget-s are skipped, not run."""
    specs = tmp_path / "specs.json"
    entries = [
        {"op": "softmax", "shape": [3, 50], "dtype": "float16"},
        {"op": "rms_norm", "shape": [3, 50], "dtype": "float32"},
    ]
    specs.write_text(json.dumps(entries))
    done = _run("tune", "--file", str(specs), "--interpret", cwd=tmp_path)
    assert done.returncode == EXIT_OK and _statuses(done.stdout) == ["tuned", "tuned"]
    skipped = _run(
        "tune", "softmax", "--shape", "5x60", "--shape", "6x70", "--budget-s", "0", "--interpret", cwd=tmp_path
    )
    assert skipped.returncode == EXIT_OK and _statuses(skipped.stdout) == ["skipped", "skipped"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tune", "softmax", "--shape", "4by100"], "shape must look like 4096x4096"),
        (["tune", "softmax", "--shape", "4x100", "--dtype", "fp8"], "dtype must be one of float32"),
        (["tune", "softmx", "--shape", "4x100"], "no op named 'softmx'"),
        (["tune"], "nothing to tune"),
        (["cache", "export"], "give the file path"),
    ],
)
def test_tune_and_cache_usage_errors(argv: list[str], message: str, tmp_path: Path) -> None:
    """Bad tune specs and missing paths exit 2 with a message saying what was expected."""
    result = _run(*argv, cwd=tmp_path)
    assert result.returncode == EXIT_USAGE
    assert message in " ".join(result.stdout.split())


def test_cache_import_of_a_foreign_file_is_a_usage_error(tmp_path: Path) -> None:
    """Importing a file that is not a decision file exits 2 and leaves the cache as it was."""
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"hello": 1}')
    result = _run("cache", "import", str(foreign), cwd=tmp_path)
    assert result.returncode == EXIT_USAGE and "not a kernelgate decision file" in result.stdout


def test_replay_of_a_saved_case(tmp_path: Path) -> None:
    """replay re-runs a saved case: exit 0 when the implementation now matches, 1 while it still differs."""
    import torch

    import kernelgate
    from kernelgate.check import save_case
    from kernelgate.dispatch import Plan

    x = torch.randn(3, 40)
    impl = kernelgate.softmax.implementations[0]
    good = save_case(
        kernelgate.softmax, Plan(impl, "cached", config={"ROWS": 2, "num_warps": 4}, interpret=True), (x, -1), tmp_path
    )
    assert main(["replay", str(good)]) == EXIT_OK

    def wrong(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    op = kernelgate.Op(
        "kgcli_replay_wrong",
        reference=lambda x: x * 2,
        args=(kernelgate.TensorArg("x"),),
        implementations=(kernelgate.TritonImpl("wrong", wrong),),
        replace=True,
    )
    bad = save_case(op, Plan(op.implementations[0], "cached", interpret=True), (x,), tmp_path)
    assert main(["replay", str(bad)]) == EXIT_PROBLEM
    assert main(["replay", str(tmp_path / "missing.pt")]) == EXIT_USAGE
