"""The CSV launch log: one exact row per call, safe across processes, and never a failure for the caller."""

from __future__ import annotations

import csv
import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
import torch

import kernelgate
from kernelgate import LogWriteWarning
from kernelgate.cache import FILE_NAME
from kernelgate.log import COLUMNS, SCHEMA_VERSION, LogRow, read
from kernelgate.tolerance import assert_close

HEADER = ",".join(COLUMNS)


def rows_of(path: Path) -> list[dict[str, str]]:
    """Parse the log, checking that its first line is the header and no row is short or long."""
    lines = path.read_text().splitlines()
    assert lines[0] == HEADER
    assert lines.count(HEADER) == 1, "the header is written once"
    records = list(csv.reader(lines))
    assert all(len(record) == len(COLUMNS) for record in records), "every row has every column"
    return [dict(zip(COLUMNS, record, strict=True)) for record in records[1:]]


def test_columns_match_the_row_fields() -> None:
    """COLUMNS names every LogRow field once, provenance first."""
    fields = [f.name for f in dataclasses.fields(LogRow)]
    assert sorted(COLUMNS) == sorted(fields)
    assert len(set(COLUMNS)) == len(COLUMNS)
    assert COLUMNS[:3] == ("schema_version", "timestamp", "pid")


def test_one_row_per_call_and_the_header_once(tmp_path: Path) -> None:
    """Three calls append three rows under one header whose columns are COLUMNS."""
    path = tmp_path / "log.csv"
    kernelgate.configure(log_path=path, mode="reference")
    for n in (1, 2, 3):
        kernelgate.softmax(torch.zeros(n, 3))
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == COLUMNS
        rows = list(reader)
    assert [row["shapes"] for row in rows] == ["[1, 3]", "[2, 3]", "[3, 3]"]
    assert rows_of(path) == rows
    assert read(path) == rows


def test_reference_call_row(tmp_path: Path) -> None:
    """A reference call's row records the op, "reference" as implementation and path, reason, inputs and versions."""
    path = tmp_path / "log.csv"
    kernelgate.configure(log_path=path)
    with kernelgate.use_mode("reference"):
        kernelgate.rms_norm(torch.ones(2, 3, dtype=torch.float16), torch.ones(3, dtype=torch.float16), 1e-5)
    [row] = rows_of(path)
    assert row == {
        **row,
        "schema_version": str(SCHEMA_VERSION),
        "pid": str(os.getpid()),
        "op": "rms_norm",
        "implementation": "reference",
        "config": "",
        "shapes": "[2, 3];[3]",
        "dtypes": "float16;float16",
        "device": "cpu",
        "device_name": "cpu",
        "capability": "",
        "torch_version": torch.__version__,
        "triton_version": importlib.metadata.version("triton"),
        "kernelgate_version": kernelgate.__version__,
        "mode": "reference",
        "path": "reference",
        "reason": "mode-reference: mode is 'reference'",
    }
    assert float(row["wall_us"]) >= 0
    assert datetime.fromisoformat(row["timestamp"]).utcoffset() is not None


def test_interpreted_triton_call_row(tmp_path: Path) -> None:
    """An interpreted Triton call's row names the implementation, path "interpreter", the kernel, grid and BLOCK_N."""
    path = tmp_path / "log.csv"
    kernelgate.configure(log_path=path, tune=False)  # no tuning rows: each call runs its default config
    x = torch.randn(3, 5)
    with kernelgate.use_interpreter():
        y = kernelgate.softmax(x)
        kernelgate.rms_norm(x.half(), None)
    assert_close(y, torch.softmax(x, -1), reduction_length=5)
    softmax_row, rms_norm_row = rows_of(path)
    assert {k: softmax_row[k] for k in ("op", "implementation", "path", "mode", "reason", "shapes", "dtypes")} == {
        "op": "softmax",
        "implementation": "single_block",
        "path": "interpreter",
        "mode": "auto",
        "reason": "default-config: tuning is off (KERNELGATE_TUNE=off)",
        "shapes": "[3, 5]",
        "dtypes": "float32",
    }
    assert (
        softmax_row["config"]
        == "_softmax_fwd_kernel[1][('BLOCK_N', 16), ('EVEN_N', False), ('ROWS', 4), ('num_warps', 1)]"
    )
    assert softmax_row["triton_version"] == importlib.metadata.version("triton")
    assert (rms_norm_row["implementation"], rms_norm_row["shapes"], rms_norm_row["dtypes"]) == (
        "single_block",
        "[3, 5]",
        "float16",
    )
    assert (
        rms_norm_row["config"]
        == "_rms_norm_fwd_kernel[1][('BLOCK_N', 16), ('EVEN_N', False), ('HAS_WEIGHT', False), ('ROWS', 4), "
        "('num_warps', 1)]"
    )


def test_mode_triton_and_auto_fallback_rows(tmp_path: Path) -> None:
    """Mode "triton" logs a "tune" row per candidate and a "tune-winner" row before its call row (reason "tuned").

    An auto fallback logs path "reference" with its reason and detail, and no tuning rows.
    """
    path = tmp_path / "log.csv"
    kernelgate.configure(log_path=path, warn_fallback=False)
    with kernelgate.use_interpreter():
        with kernelgate.use_mode("triton"):
            kernelgate.softmax(torch.randn(2, 3))
        kernelgate.softmax(torch.randn(2, 3, dtype=torch.float64))
    # Rows of 3 hold one block of 16, which only num_warps=1 fills: single_block with one or two (all)
    # rows per program, persistent with one to three stages and one or two programs per multiprocessor;
    # the looped kernel is pruned.
    *tune_rows, winner_row, triton_row, fallback_row = rows_of(path)
    persistent = [f"NUM_STAGES={s},PER_SM={p},num_warps=1" for s in (1, 2, 3) for p in (1, 2)]
    assert [(row["implementation"], row["config"]) for row in tune_rows] == [
        ("single_block", "ROWS=1,num_warps=1"),
        ("single_block", "ROWS=2,num_warps=1"),
        *(("persistent", config) for config in persistent),
    ]
    for tune_row in tune_rows:
        assert {k: tune_row[k] for k in ("op", "path", "reason", "mode")} == {
            "op": "softmax",
            "path": "tune",
            "reason": "pass",
            "mode": "triton",
        }
        assert float(tune_row["wall_us"]) > 0, "a passing candidate's row holds its measured time"
    # The winner row names the stored decision for mode "auto" (which of the reference and the
    # interpreted kernel measured faster is up to the machine); mode "triton" runs the kernel anyway.
    [decision] = json.loads((kernelgate.settings().cache_dir / FILE_NAME).read_text())["entries"].values()
    assert (winner_row["path"], winner_row["implementation"], winner_row["shapes"]) == (
        "tune-winner",
        decision["implementation"],
        "[2, 3]",
    )
    assert winner_row["reason"] == decision["reason"]
    assert float(winner_row["wall_us"]) == decision["reference_us"]
    assert (triton_row["mode"], triton_row["path"], triton_row["reason"]) == ("triton", "interpreter", "tuned")
    assert triton_row["implementation"] == decision["best_triton"]["implementation"]
    assert (fallback_row["mode"], fallback_row["path"], fallback_row["implementation"]) == (
        "auto",
        "reference",
        "reference",
    )
    assert fallback_row["reason"] == (
        "dtype-unsupported: single_block handles torch.float16, torch.bfloat16, torch.float32, not torch.float64"
    )
    assert fallback_row["config"] == ""


def test_copy_of_a_non_contiguous_input_is_noted(tmp_path: Path) -> None:
    """A transposed input copied by the launcher is noted in the reason column; a row-strided one is not copied."""
    path = tmp_path / "log.csv"
    kernelgate.configure(log_path=path, tune=False)  # the rows of the calls alone
    transposed = torch.randn(5, 3).t()
    sliced = torch.randn(3, 8)[:, :5]
    with kernelgate.use_interpreter():
        y_transposed = kernelgate.softmax(transposed)
        y_sliced = kernelgate.softmax(sliced)
    assert_close(y_transposed, torch.softmax(transposed, -1), reduction_length=5)
    assert_close(y_sliced, torch.softmax(sliced, -1), reduction_length=5)
    transposed_row, sliced_row = rows_of(path)
    tuning_off = "default-config: tuning is off (KERNELGATE_TUNE=off)"
    assert transposed_row["reason"] == f"{tuning_off}; copied x: last dimension has stride 3"
    assert sliced_row["reason"] == tuning_off


def test_switching_paths_keeps_one_header_per_file(tmp_path: Path) -> None:
    """Moving the log to another file and back appends to each file under its single header."""
    first, second = tmp_path / "a.csv", tmp_path / "sub" / "b.csv"
    with kernelgate.use_mode("reference"):
        for path in (first, second, first):
            kernelgate.configure(log_path=path)
            kernelgate.softmax(torch.zeros(2))
    assert len(rows_of(first)) == 2
    assert len(rows_of(second)) == 1


def test_log_path_from_environment(tmp_path: Path) -> None:
    """KERNELGATE_LOG names the log file; an empty value turns the log off."""
    path = tmp_path / "env.csv"
    kernelgate.reload_settings({"KERNELGATE_LOG": str(path), "KERNELGATE_MODE": "reference"})
    assert kernelgate.settings().log_path == path
    kernelgate.softmax(torch.zeros(2))
    assert len(rows_of(path)) == 1
    assert kernelgate.reload_settings({"KERNELGATE_LOG": "  "}).log_path is None


def test_logging_off_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no log path nothing is written anywhere, and turning the log off stops further rows."""
    monkeypatch.chdir(tmp_path)
    assert kernelgate.settings().log_path is None
    x = torch.randn(2, 3)
    with kernelgate.use_interpreter():
        kernelgate.softmax(x)
    with kernelgate.use_mode("reference"):
        kernelgate.softmax(x)
    assert list(tmp_path.iterdir()) == []
    path = tmp_path / "log.csv"
    kernelgate.configure(log_path=path, mode="reference")
    kernelgate.softmax(x)
    kernelgate.configure(log_path=None)
    kernelgate.softmax(x)
    assert len(rows_of(path)) == 1
    assert list(tmp_path.iterdir()) == [path]


def _directory(tmp_path: Path) -> Path:
    return tmp_path


def _under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "file").write_text("not a directory")
    return tmp_path / "file" / "log.csv"


@pytest.mark.parametrize("make_path", [_directory, _under_a_file], ids=["directory", "under-a-file"])
@pytest.mark.parametrize("interpret", [False, True], ids=["reference", "interpreter"])
def test_unwritable_log_warns_once_and_calls_still_work(
    tmp_path: Path, make_path: Callable[[Path], Path], interpret: bool
) -> None:
    """An unwritable log path gives exactly one LogWriteWarning naming it, and every call still returns its result."""
    path = make_path(tmp_path)
    kernelgate.configure(log_path=path, warn_fallback=False)
    x = torch.randn(2, 5)
    with kernelgate.use_interpreter(interpret), pytest.warns(LogWriteWarning) as record:
        results = [kernelgate.softmax(x) for _ in range(3)]
    log_warnings = [w for w in record if issubclass(w.category, LogWriteWarning)]
    assert len(log_warnings) == 1
    message = str(log_warnings[0].message)
    assert f"cannot write the launch log {str(path)!r}" in message
    assert "the log is off for the rest of this process" in message
    assert "Point KERNELGATE_LOG (or configure(log_path=...)) at a writable file" in message
    for y in results:
        assert_close(y, torch.softmax(x, -1), reduction_length=5)


def test_log_works_again_at_a_writable_path(tmp_path: Path) -> None:
    """After a failed path, pointing the log at a writable file logs again, without another warning."""
    kernelgate.configure(log_path=tmp_path, mode="reference")
    with pytest.warns(LogWriteWarning):
        kernelgate.softmax(torch.zeros(2))
    good = tmp_path / "good.csv"
    kernelgate.configure(log_path=good)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernelgate.softmax(torch.zeros(2))
    assert len(rows_of(good)) == 1


_APPENDER = """
import sys
import torch
import kernelgate

kernelgate.configure(log_path=sys.argv[1], mode="reference")
x = torch.zeros(2, 3)
print("ready", flush=True)
sys.stdin.readline()
for _ in range(int(sys.argv[2])):
    kernelgate.softmax(x)
"""


def test_two_processes_appending_at_once(tmp_path: Path) -> None:
    """Two processes released together to log 300 calls each leave one header and 600 whole rows."""
    path = tmp_path / "shared.csv"
    calls = 300
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELGATE_")}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _APPENDER, str(path), str(calls)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline() == "ready\n"
        for process in processes:  # both are waiting on stdin: release them together
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.close()
        for process in processes:
            assert process.wait(timeout=120) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            if process.stdout is not None:
                process.stdout.close()
    rows = rows_of(path)
    assert len(rows) == 2 * calls
    pids = sorted({row["pid"] for row in rows})
    assert pids == sorted(str(p.pid) for p in processes)
    assert all(sum(row["pid"] == pid for row in rows) == calls for pid in pids)
    assert all(row["op"] == "softmax" and row["shapes"] == "[2, 3]" for row in rows)
    assert all(row["reason"] == "mode-reference: mode is 'reference'" for row in rows)
