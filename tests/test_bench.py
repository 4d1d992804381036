"""kernelgate bench: suites, specs, the measuring run, the CSV schema, summary, plots and the command."""

from __future__ import annotations

import dataclasses
import gzip
import importlib.resources
import importlib.util
import io
import itertools
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

import kernelgate
import kernelgate.bench as bench
from kernelgate.bench import report
from kernelgate.bench import runner as bench_runner
from kernelgate.bench import specs as bench_specs
from kernelgate.bench.precompile import WORKER_DEVICE_BYTES, compile_cases, default_workers, precompile
from kernelgate.cli import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, _parser, main
from kernelgate.op import get_op

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20
# Latency below 10 kB here: (4, 1000) float32 (16 kB) is a bandwidth shape, (2, 1000) a latency one.
TINY = bench.Suite(("float32",), {"rowwise": (bench.ShapeGroup(shapes=((4, 1000), (2, 1000))),)})


def _write(tmp_path: Path, data: object, name: str = "suite.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[bench.BenchRow]]:
    """softmax measured once for the module: Triton kernels interpreted, torch.compile with the eager backend."""
    kernelgate.reload_settings({"KERNELGATE_CACHE_DIR": str(tmp_path_factory.mktemp("bench-cache"))})
    saved = os.environ.get("KERNELGATE_COMMIT")
    os.environ["KERNELGATE_COMMIT"] = "abc1234"
    try:
        yield bench.run(
            ["softmax"],
            suite=TINY,
            interpret=True,
            compile_backend="eager",
            cpu_repeats=1,
            host_calls=2,
            latency_bytes=10_000,
        )
    finally:
        if saved is None:
            del os.environ["KERNELGATE_COMMIT"]
        else:
            os.environ["KERNELGATE_COMMIT"] = saved


# --- suites --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_default_suite_sizes_rowwise_inputs_to_128_mib(dtype: str) -> None:
    """Each row length of the built-in suite gets the row count that makes its input 128 MiB in that dtype."""
    suite = bench.default_suite()
    cases = suite.cases("softmax", "rowwise", ("M", "N"), dtype)
    element = torch.empty((), dtype=bench.DTYPES[dtype]).element_size()
    sized = [c for c in cases if c.target_bytes]
    assert [c.shape[1] for c in sized] == [2**k for k in (7, 9, 10, 11, 12, 13, 14, 15, 16, 17)]
    assert all(c.shape[0] * c.shape[1] * element == 128 * MiB for c in sized)
    assert [c.shape for c in cases if not c.target_bytes] == [(1, 4096), (64, 4096), (512, 4096)]
    assert suite.dtypes == ("float32", "bfloat16")
    assert [c.shape for c in suite.cases("cross_entropy", "cross_entropy", ("M", "V"), dtype)] == [
        (8192, 32000),
        (4096, 128256),
        (2048, 256000),
    ]
    assert [c.shape for c in suite.cases("rotary_embedding", "rotary", "BSHKD", dtype)] == [(4, 4096, 32, 8, 128)]


def test_quick_suite_is_smaller() -> None:
    """--quick: rows of 1024, 4096 and 32768 at 32 MiB, and 64x4096."""
    cases = bench.default_suite(quick=True).cases("rms_norm", "rowwise", ("M", "N"), "bfloat16")
    assert [c.shape for c in cases] == [(16384, 1024), (4096, 4096), (512, 32768), (64, 4096)]


def test_suite_file_ships_as_package_data() -> None:
    """shapes.json is read through importlib.resources, and pyproject ships it in the wheel."""
    assert importlib.resources.files("kernelgate.bench").joinpath("shapes.json").is_file()
    assert '"kernelgate.bench" = ["shapes.json"]' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize("name", ["short-rows.json", "long-rows.json", "whole-tiles.json"])
def test_the_repository_suites_load(name: str) -> None:
    """The suite files kept under benchmarks/ (named in docs/bench.md) are valid suites of row-wise shapes."""
    suite = bench.load_suite(ROOT / "benchmarks" / name)
    assert suite.dtypes and set(suite.groups) == {"rowwise"}, suite


def test_user_suite_replaces_or_extends(tmp_path: Path) -> None:
    """A suite file replaces the built-in suite; with extend it adds its groups (an op's own group wins)."""
    own = _write(tmp_path, {"schema": 1, "dtypes": ["float16"], "shapes": {"softmax": [{"shapes": [[3, 5]]}]}})
    suite = bench.load_suite(own)
    assert suite.dtypes == ("float16",)
    assert [c.shape for c in suite.cases("softmax", "rowwise", ("M", "N"), "float16")] == [(3, 5)]
    assert suite.cases("rms_norm", "rowwise", ("M", "N"), "float16") == []
    extended = bench.load_suite(
        _write(tmp_path, {"schema": 1, "extend": True, "shapes": {"rowwise": [{"shapes": [[3, 5]]}]}}), quick=True
    )
    shapes = [c.shape for c in extended.cases("rms_norm", "rowwise", ("M", "N"), "float32")]
    assert shapes[-1] == (3, 5) and (64, 4096) in shapes
    assert extended.dtypes == ("float32", "bfloat16")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not valid JSON"),
        ({"schema": 1, "dtypes": ["float32"], "shapes": {"rowwize": []}}, "group 'rowwize'"),
        ({"schema": 1, "dtypes": ["float32"], "shapes": {"rowwise": [{"row_lengths": [128, "x"]}]}}, "row_lengths"),
        ({"schema": 1, "dtypes": ["float32"], "shapes": {"rowwise": [{"rows": [1]}]}}, "unknown key(s) 'rows'"),
        ({"schema": 1, "dtypes": ["int8"], "shapes": {}}, "'dtypes' must be"),
        ({"dtypes": ["float32"], "shapes": {}}, "'schema' must be 1"),
    ],
)
def test_malformed_suite_names_the_problem_and_the_remedy(tmp_path: Path, content: object, expected: str) -> None:
    """A malformed suite file raises BenchError naming the file, what is wrong, and where the format is shown."""
    path = _write(tmp_path, content)
    with pytest.raises(bench.BenchError) as err:
        bench.load_suite(path)
    message = str(err.value)
    assert expected in message and str(path) in message
    if "group" in expected:
        assert "rowwise" in message and "cross_entropy" in message
    else:
        assert str(bench.DEFAULT_SUITE_PATH) in message and "docs/bench.md" in message
    assert isinstance(err.value, ValueError) and isinstance(err.value, kernelgate.KernelgateError)


def test_shapes_of_the_wrong_rank_are_refused(tmp_path: Path) -> None:
    """A rowwise group's (M, N) shape given to rotary_embedding's 5 sizes is refused with the remedy."""
    suite = bench.load_suite(
        _write(tmp_path, {"schema": 1, "dtypes": ["float32"], "shapes": {"rotary": [{"shapes": [[2, 3]]}]}})
    )
    with pytest.raises(bench.BenchError, match="own group"):
        suite.cases("rotary_embedding", "rotary", ("B", "S", "Hq", "Hk", "D"), "float32")
    sized = bench.load_suite(
        _write(
            tmp_path,
            {"schema": 1, "dtypes": ["float32"], "shapes": {"rotary": [{"target_bytes": 8, "row_lengths": [2]}]}},
        )
    )
    with pytest.raises(bench.BenchError, match="fixed 'shapes'"):
        sized.cases("rotary_embedding", "rotary", ("B", "S", "Hq", "Hk", "D"), "float32")


# --- specs and op selection ------------------------------------------------------------------------


@pytest.mark.parametrize("spec", bench.SPECS, ids=lambda s: s.op)
def test_spec_inputs_and_byte_counts(spec: bench.BenchSpec) -> None:
    """Each spec makes inputs at a small shape; its forward bytes are the inputs read once plus the outputs written.

    A scalar output (a loss) is not counted.
    """
    shape = (2, 3, 4, 2, 8) if len(spec.dims) == 5 else (3, 16)
    args = spec.make_args(shape, torch.bfloat16, torch.device("cpu"))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    inputs = sum(t.numel() * t.element_size() for t in tensors)
    assert all(isinstance(args[i], torch.Tensor) and args[i].is_floating_point() for i in spec.grad_args)
    forward, both = spec.forward_bytes.count(shape, 2), spec.forward_backward_bytes.count(shape, 2)
    assert inputs <= forward < both
    assert spec.forward_bytes.formula and spec.forward_backward_bytes.formula
    rows, length = spec.rows_and_length(shape)
    assert rows * length <= math.prod(shape) * 2 and length == shape[-1]
    if spec.op in {op.name for op in kernelgate.registered_ops()}:
        outputs = get_op(spec.op).reference(*args)
        produced = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
        written = sum(t.numel() * t.element_size() for t in produced if t.dim() > 0)
        assert forward == inputs + written


def test_specs_take_effect_only_for_registered_ops() -> None:
    """bench_specs() lists the registered ops with a spec: softmax and rms_norm now, the others once they register."""
    names = [s.op for s in bench.bench_specs()]
    registered = {op.name for op in kernelgate.registered_ops()}
    assert {"softmax", "rms_norm"} <= set(names)
    assert set(names) == {s.op for s in bench.SPECS} & registered
    assert bench.resolve_ops(None) == bench.bench_specs()


def test_unknown_op_names_the_known_ones() -> None:
    """An unknown op, an op without a spec, and a spec'd op not registered each raise BenchError with the remedy."""
    with pytest.raises(bench.BenchError, match=r"no op named 'nosuch'; ops with a bench spec: softmax"):
        bench.run(["nosuch"], device="cpu")
    with pytest.raises(bench.BenchError, match=r"registered but has no bench spec.*specs\.py"):
        bench.run(["softmax_backward"], device="cpu")
    with pytest.raises(bench.BenchError, match="dtype must be one of"):
        bench.run(["softmax"], ["int8"], suite=TINY, device="cpu")


def test_a_negative_hold_is_refused_and_the_cli_default_is_the_modules() -> None:
    """hold_us is a time to hold the GPU busy: a negative one raises BenchError naming it. The CLI holds as long
    as the Python API does by default."""
    with pytest.raises(bench.BenchError, match=r"hold_us must be >= 0 microseconds; got -1"):
        bench.run(["softmax"], suite=TINY, device="cpu", hold_us=-1.0)
    assert _parser().parse_args(["bench"]).hold_us == bench_runner.DEFAULT_HOLD_US > 0


def _late_call(seconds: float) -> Callable[[], None]:
    """A call that keeps the host busy ``seconds`` before it launches a short kernel on the current GPU."""
    x = torch.zeros(1024, device="cuda")

    def late() -> None:
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass
        x.add_(1)

    return late


@pytest.mark.gpu
def test_the_hold_keeps_the_hosts_lateness_out_of_the_device_time() -> None:
    """A call that keeps the host busy 300 us before it launches a short kernel. do_bench's start event runs when
    its L2 flush ends, so the GPU's wait for the late launch is counted; held 1000 us after each flush, the GPU
    reaches the start event after the launch was issued, and only the kernel is counted."""
    late = _late_call(300e-6)
    device = torch.device("cuda", torch.cuda.current_device())
    plain = bench_runner._Timing(
        warmup_ms=2, rep_ms=10, hold_us=0.0, cpu_repeats=1, repeats=1, host_calls=10, latency_bytes=1
    )
    late_us = bench_runner._time_us(late, device, plain)
    held_us = bench_runner._time_us(late, device, dataclasses.replace(plain, hold_us=1000.0))
    assert late_us > 150, late_us
    assert held_us < 50, held_us


def test_the_hold_grows_with_the_calls_issue_time() -> None:
    """The hold is the least asked for, or HOLD_PER_ISSUE times the call's host issue time where longer, capped at
    MAX_HOLD_US (a call that waits for the device is not helped by holding it)."""
    per_issue = bench_runner.HOLD_PER_ISSUE
    assert bench_runner._hold_us(100.0, 20.0) == 100.0
    assert bench_runner._hold_us(100.0, 400.0) == per_issue * 400.0 > 100.0
    assert bench_runner._hold_us(100.0, 1e6) == bench_runner.MAX_HOLD_US
    assert bench_runner._hold_us(2 * bench_runner.MAX_HOLD_US, 1e6) == 2 * bench_runner.MAX_HOLD_US


@pytest.mark.gpu
def test_the_default_hold_covers_a_late_call() -> None:
    """At the default hold (100 us) a call that keeps the host busy 300 us before its launch is timed as its kernel
    alone: the hold grows to cover the call's issue time."""
    late = _late_call(300e-6)
    device = torch.device("cuda", torch.cuda.current_device())
    timing = bench_runner._Timing(
        warmup_ms=2, rep_ms=10, hold_us=bench_runner.DEFAULT_HOLD_US, cpu_repeats=1, repeats=1, host_calls=10,
        latency_bytes=1,
    )  # fmt: skip
    assert bench_runner._time_us(late, device, timing) < 50


def test_spec_of_an_unregistered_op_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec whose op is not registered is not run by default, and naming it says how to make it available."""
    waiting = dataclasses.replace(bench.spec_for("softmax"), op="not_registered_yet")
    monkeypatch.setattr(bench_specs, "SPECS", (*bench.SPECS, waiting))
    monkeypatch.setattr(bench_runner, "SPECS", (*bench.SPECS, waiting))
    assert "not_registered_yet" not in [s.op for s in bench.bench_specs()]
    with pytest.raises(bench.BenchError, match=r"has a bench spec but is not registered.*Import the module"):
        bench.resolve_ops(["not_registered_yet"])


# --- the run -------------------------------------------------------------------------------------


def test_run_measures_every_implementation(interpreted: list[bench.BenchRow]) -> None:
    """Each shape and direction has eager, compile, kernelgate and each Triton implementation (Liger-Kernel runs
    on GPUs only, so an interpreted run on the CPU has no liger row even where it is installed)."""
    expected = {"eager", "compile", "kernelgate", "triton:single_block", "triton:looped", "triton:persistent"}
    for shape in ("4x1000", "2x1000"):
        for direction in ("forward", "forward+backward"):
            got = [r for r in interpreted if r.shape == shape and r.direction == direction]
            assert {r.impl for r in got} == expected, (shape, direction)
            assert all(r.status == "ok" and r.time_us > 0 for r in got), [(r.impl, r.note) for r in got]
    notes = {r.impl: r.note for r in interpreted}
    chosen = (
        r"(reference|single_block\[ROWS=\d+,num_warps=\d+\]|looped\[BLOCK_N=\d+,num_warps=\d+\]"
        r"|persistent\[NUM_STAGES=\d+,PER_SM=\d+,num_warps=\d+\])"
    )
    decided = rf"auto: {chosen} \((tuned|cached|reference-faster)"
    assert re.match(decided, notes["kernelgate"]), notes["kernelgate"]
    assert "BLOCK_N=1024" in notes["triton:looped"] and "num_warps=" in notes["triton:single_block"]
    # The forward+backward row says which path the timed autograd steps took; the forward row has no step.
    for r in interpreted:
        if r.impl == "kernelgate":
            stepped = re.search(r"; autograd step: (function|eager|undecided): \w", r.note)
            assert (stepped is not None) == (r.direction == "forward+backward"), r.note


def test_run_rows_carry_bytes_regime_and_provenance(interpreted: list[bench.BenchRow]) -> None:
    """Rows state bytes and formula, bandwidth over the copy measured in the run, regime, host cost, provenance."""
    row = next(r for r in interpreted if r.shape == "4x1000" and r.direction == "forward" and r.impl == "eager")
    assert (row.rows, row.row_length, row.regime, row.target_bytes) == (4, 1000, "bandwidth", 0)
    assert row.bytes == 2 * 4 * 1000 * 4 and row.byte_formula.startswith("2*M*N*e")
    assert math.isclose(row.gbps, row.bytes / (row.time_us * 1e-6) / 1e9, rel_tol=1e-2)
    assert math.isclose(row.frac_of_copy, row.gbps / row.copy_gbps, rel_tol=1e-2) and row.copy_gbps > 0
    assert math.isnan(row.host_us) and math.isnan(row.peak_mib) and row.first_call_ms > 0
    both = next(r for r in interpreted if r.shape == "4x1000" and r.direction == "forward+backward")
    assert both.bytes == 5 * 4 * 1000 * 4
    latency = [r for r in interpreted if r.shape == "2x1000"]
    assert all(r.regime == "latency" and r.host_us > 0 for r in latency)
    assert row.torch_version == torch.__version__ and row.kernelgate_version == kernelgate.__version__
    assert row.triton_version == kernelgate.backend.triton_version()
    assert row.kernelgate_commit == "abc1234" and row.device == "cpu" and row.gpu == "cpu"
    assert "perf_counter" in row.timer and "interpreter" in row.timer
    assert row.schema_version == bench.SCHEMA_VERSION
    assert len({r.started for r in interpreted}) == 1


def test_kernelgate_first_forward_call_includes_planning_and_the_summary_sums_first_calls(
    interpreted: list[bench.BenchRow], tmp_path: Path
) -> None:
    """kernelgate's forward first_call_ms includes planning its bucket (the note's "planned in N ms");
    summary.md adds the first calls up per op and implementation."""
    for r in interpreted:
        if r.impl == "kernelgate" and r.direction == "forward":
            match = re.search(r"planned in (\d+) ms", r.note)
            assert match is not None and r.first_call_ms >= int(match.group(1)) - 1, (r.first_call_ms, r.note)
    text = bench.write_summary(interpreted, tmp_path / "summary.md").read_text()
    first = text.split("## First calls")[1].split("## Targets missed")[0]
    assert "| op | eager | compile | kernelgate | kernelgate, forward+backward | triton:* | total |" in first
    [row] = [line for line in first.splitlines() if line.startswith("| softmax |")]
    cells = [float(c) for c in row.strip("|").split("|")[1:]]
    assert cells[-1] == pytest.approx(sum(cells[:-1]), abs=0.3), "the total is the sum of its columns"
    expected = sum(r.first_call_ms for r in interpreted if r.op == "softmax" and not math.isnan(r.first_call_ms))
    assert cells[-1] == pytest.approx(expected / 1e3, abs=0.1)


def test_csv_schema_round_trip(interpreted: list[bench.BenchRow], tmp_path: Path) -> None:
    """The CSV's header is the BenchRow schema (version first); reading and writing it again changes nothing."""
    path = bench.write_csv(interpreted, tmp_path / "bench.csv")
    header = path.read_text().splitlines()[0].split(",")
    assert tuple(header) == bench.COLUMNS and header[0] == "schema_version"
    assert set(header) == {f.name for f in dataclasses.fields(bench.BenchRow)}
    for column in (
        "gpu",
        "driver",
        "torch_version",
        "triton_version",
        "kernelgate_version",
        "kernelgate_commit",
        "timer",
    ):
        assert column in header
    again = bench.write_csv(bench.read_csv(path), tmp_path / "again.csv")
    assert again.read_text() == path.read_text()
    # Compressed (as the repository keeps its large results), it reads the same.
    packed = tmp_path / "bench.csv.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert bench.write_csv(bench.read_csv(packed), tmp_path / "unpacked.csv").read_text() == path.read_text()


def test_csv_of_another_schema_is_refused(interpreted: list[bench.BenchRow], tmp_path: Path) -> None:
    """A CSV with other columns or another schema version raises BenchError saying to write it again."""
    path = bench.write_csv(interpreted[:1], tmp_path / "bench.csv")
    text = path.read_text()
    _write(tmp_path, text.replace("schema_version,", "version,", 1), "renamed.csv")
    with pytest.raises(bench.BenchError, match="missing columns: schema_version"):
        bench.read_csv(tmp_path / "renamed.csv")
    lines = text.splitlines()
    _write(tmp_path, "\n".join([lines[0], "99" + lines[1][1:]]), "future.csv")
    with pytest.raises(bench.BenchError, match=r"schema_version 99.*kernelgate bench"):
        bench.read_csv(tmp_path / "future.csv")


def test_summary_tables_and_misses(interpreted: list[bench.BenchRow], tmp_path: Path) -> None:
    """summary.md has per op and dtype a bandwidth table, a latency table, and the list of missed targets."""
    text = bench.write_summary(interpreted, tmp_path / "summary.md").read_text()
    assert "## softmax float32" in text and "Fraction of copy bandwidth" in text and "Microseconds per call" in text
    assert "| 4x1000 | forward |" in text and "| 2x1000 | forward+backward |" in text
    assert "triton:single_block" in text and "vs best peer" in text and "## Targets missed" in text
    for missed in bench.misses(interpreted):
        assert missed in text


def test_misses_apply_each_target(interpreted: list[bench.BenchRow]) -> None:
    """A slow kernelgate row misses the bandwidth, best-peer and eager targets; a fast one misses none of them."""
    base = next(r for r in interpreted if r.shape == "4x1000" and r.direction == "forward" and r.impl == "eager")
    eager = dataclasses.replace(base, time_us=100.0, frac_of_copy=0.95)
    fast = dataclasses.replace(base, impl="kernelgate", time_us=99.0, frac_of_copy=0.96)
    assert bench.misses([eager, fast]) == []
    slow = dataclasses.replace(fast, time_us=110.0, frac_of_copy=0.86)
    found = bench.misses([eager, slow])
    assert len(found) == 3 and "0.86 of copy bandwidth (target 0.90)" in found[0]
    assert "speed of eager" in found[1] and "slower than eager" in found[2]
    host = dataclasses.replace(eager, regime="latency", host_us=10.0, impl="triton:single_block")
    assert "host cost" in bench.misses([host, dataclasses.replace(fast, regime="latency", host_us=12.5)])[0]


def test_kernel_notes_end_the_forward_bandwidth_misses_of_their_cases(
    interpreted: list[bench.BenchRow], tmp_path: Path
) -> None:
    """A forward case at a bandwidth shape below the target, where kernelgate ran a Triton candidate, is one of
    kernel_cases with that candidate's label; its note ends the bandwidth miss in the summary and no other miss. A
    case that meets the target, or ran the reference, is not one."""
    base = next(r for r in interpreted if r.shape == "4x1000" and r.direction == "forward" and r.impl == "eager")
    eager = dataclasses.replace(base, regime="bandwidth", time_us=100.0, frac_of_copy=0.5)
    ours = dataclasses.replace(
        eager, impl="kernelgate", time_us=99.0, frac_of_copy=0.8, note="auto: single_block[ROWS=1,num_warps=4] (tuned)"
    )
    assert report.kernel_cases([eager, ours]) == [("softmax", base.dtype, "4x1000", "single_block[ROWS=1,num_warps=4]")]
    assert report.kernel_cases([eager, dataclasses.replace(ours, frac_of_copy=0.95)]) == []
    reference = dataclasses.replace(ours, note="auto: reference (reference-faster: the reference was faster)")
    assert report.kernel_cases([eager, reference]) == []
    slower = dataclasses.replace(ours, time_us=110.0)  # also slower than eager and behind it
    note = "; its kernel _k keeps 101 registers a thread"
    text = bench.write_summary(
        [eager, slower], tmp_path / "summary.md", kernel_notes={("softmax", base.dtype, "4x1000"): note}
    ).read_text()
    missed = [line for line in text.splitlines() if line.startswith("- softmax")]
    assert len(missed) == 3, missed
    assert missed[0].endswith(note) and "of copy bandwidth" in missed[0]
    assert all(note not in line for line in missed[1:])


def test_a_forward_backward_miss_of_short_kernels_ends_with_what_they_hold(interpreted: list[bench.BenchRow]) -> None:
    """Where a forward+backward miss names kernels short of the target, what their triton:* row's note says they
    hold (written there on a GPU) ends the miss."""
    base = next(r for r in interpreted if r.direction == "forward+backward" and r.impl == "eager")
    eager = dataclasses.replace(base, regime="bandwidth", time_us=100.0, host_us=math.nan, frac_of_copy=0.5)
    ours = dataclasses.replace(eager, impl="kernelgate", time_us=300.0, frac_of_copy=0.2)
    held = "; its kernels: _f keeps 64 registers a thread at 16 warps and none in local memory"
    kernels = dataclasses.replace(
        eager, impl="triton:single_block", time_us=160.0, frac_of_copy=0.45, note="single_block; tuned 80 us" + held
    )
    found = bench.misses([eager, ours, kernels])
    assert found and all(line.endswith("the kernels themselves are short of the target" + held) for line in found)


def test_forward_backward_misses_name_the_autograd_gap(interpreted: list[bench.BenchRow]) -> None:
    """A forward+backward miss says when the kernels called without autograd take at most half the time, or reach the
    target and are at least 5 % faster than the step (with what the step adds); else not."""
    base = next(r for r in interpreted if r.direction == "forward+backward" and r.impl == "eager")
    eager = dataclasses.replace(base, regime="bandwidth", time_us=100.0, host_us=math.nan, frac_of_copy=0.5)
    ours = dataclasses.replace(eager, impl="kernelgate", time_us=300.0, frac_of_copy=0.2)
    kernels = dataclasses.replace(eager, impl="triton:single_block", time_us=80.0, frac_of_copy=0.9)
    found = bench.misses([eager, ours, kernels])
    assert len(found) == 3
    for line in found:
        assert line.endswith(
            "; without autograd its kernels (triton:single_block) take 80.0 us, 0.90 of copy: "
            "most of the step is the autograd step (host time), not the kernels"
        )
    # Kernels that reach the target and take more than half of the step: the clause says what the step adds.
    near = dataclasses.replace(ours, time_us=100.0, frac_of_copy=0.72)
    found = bench.misses([eager, near, kernels])
    assert found and all(
        line.endswith(
            "; without autograd its kernels (triton:single_block) take 80.0 us, 0.90 of copy: the autograd step "
            "adds 20.0 us to them (host time), the kernels are not short"
        )
        for line in found
    ), found
    # Within 5 % of the step, the kernels are not what the step adds to: no cause is named.
    level = dataclasses.replace(ours, time_us=82.0, frac_of_copy=0.78)
    assert all("autograd step" not in line for line in bench.misses([eager, level, kernels]))
    slow_kernels = dataclasses.replace(kernels, time_us=160.0, frac_of_copy=0.45)
    found = bench.misses([eager, ours, slow_kernels])
    assert found and all("autograd step" not in line for line in found)
    assert all(
        line.endswith(
            "; its kernels alone (triton:single_block, without autograd) reach 0.45 of copy: "
            "the kernels themselves are short of the target"
        )
        for line in found
    )
    fast_enough = dataclasses.replace(kernels, time_us=160.0, frac_of_copy=0.85)
    assert all(
        line.endswith("the autograd step adds 140.0 us to them (host time), the kernels are not short")
        for line in bench.misses([eager, ours, fast_enough])
    )


def test_forward_backward_steady_state_is_reported_beside_the_do_bench_time(
    interpreted: list[bench.BenchRow], tmp_path: Path
) -> None:
    """At bandwidth shapes, forward+backward steps issued back to back get their own table and a clause in a
    miss; they never replace the do_bench time in the targets."""
    base = next(r for r in interpreted if r.direction == "forward+backward" and r.impl == "eager")
    # 1e6 bytes per step at 1000 GB/s of copy: 10 us back to back is 0.10 of copy.
    common = {"regime": "bandwidth", "bytes": 10**6, "copy_gbps": 1000.0, "shape": "8x1000"}
    eager = dataclasses.replace(base, **common, time_us=100.0, host_us=10.0, frac_of_copy=0.5)
    ours = dataclasses.replace(base, **common, impl="kernelgate", time_us=300.0, host_us=5.0, frac_of_copy=0.2)
    assert bench.steady_fraction(ours) == pytest.approx(0.2) and bench.steady_fraction(eager) == pytest.approx(0.1)
    assert bench.effective_us(ours) == 300.0, "the do_bench time stays the measure at bandwidth shapes"
    found = bench.misses([eager, ours])
    assert len(found) == 3, found
    assert all(
        line.endswith(
            "; with steps issued back to back, as in a training loop, it reaches 0.20 of copy (best peer eager 0.10)"
        )
        for line in found
    )
    text = bench.write_summary([eager, ours], tmp_path / "summary.md").read_text()
    assert "Forward+backward with steps issued back to back" in text
    assert "| 8x1000 | forward+backward | 0.10 | 0.20 | 2.00x |" in text
    plain = [dataclasses.replace(r, host_us=math.nan) for r in (eager, ours)]
    assert all("back to back" not in line for line in bench.misses(plain))
    assert "back to back" not in bench.write_summary(plain, tmp_path / "plain.md").read_text()


def test_plots_are_png_files(interpreted: list[bench.BenchRow], tmp_path: Path) -> None:
    """write_plots draws one non-empty PNG per op."""
    paths = bench.write_plots(interpreted, tmp_path)
    assert paths == [tmp_path / "softmax.png"]
    data = paths[0].read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000


def test_compile_failure_is_a_skipped_row(tmp_path: Path) -> None:
    """When torch.compile fails the compile rows are skipped with the error, and later shapes skip it at once."""

    def broken(graph: Any, example_inputs: Any) -> Any:
        raise RuntimeError("no compiler here")

    suite = bench.Suite(("float32",), {"rowwise": (bench.ShapeGroup(shapes=((2, 16), (3, 16))),)})
    rows = bench.run(["rms_norm"], suite=suite, device="cpu", backward=False, compile_backend=broken, cpu_repeats=1)
    compiled = [r for r in rows if r.impl == "compile"]
    assert [r.status for r in compiled] == ["skipped", "skipped"]
    assert "torch.compile failed" in compiled[0].note and "no compiler here" in compiled[0].note
    assert "at an earlier shape" in compiled[1].note
    assert all(r.status == "ok" for r in rows if r.impl != "compile")


def test_a_case_that_cannot_run_is_an_error_row(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Inputs that cannot be made give one error row and the run goes on; the command then exits 1."""

    def no_memory(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        raise RuntimeError("out of memory (simulated)")

    broken = dataclasses.replace(bench.spec_for("softmax"), make_args=no_memory)
    monkeypatch.setattr(bench_specs, "SPECS", tuple(broken if s.op == "softmax" else s for s in bench.SPECS))
    rows = bench.run(["softmax", "rms_norm"], suite=TINY, device="cpu", compile=False, backward=False, cpu_repeats=1)
    failed = [r for r in rows if r.op == "softmax"]
    assert [(r.status, r.shape) for r in failed] == [("error", "4x1000"), ("error", "2x1000")]
    assert "could not be measured: RuntimeError: out of memory (simulated)" in failed[0].note
    assert all(r.status == "ok" for r in rows if r.op == "rms_norm")
    suite = _write(tmp_path, {"schema": 1, "dtypes": ["float32"], "shapes": {"rowwise": [{"shapes": [[2, 8]]}]}})
    argv = ["bench", "--suite", str(suite), "--op", "softmax", "--no-compile", "--out", str(tmp_path / "out")]
    assert main(argv) == EXIT_PROBLEM


# --- the command ---------------------------------------------------------------------------------


@pytest.fixture
def cli_suite(tmp_path: Path) -> Path:
    return _write(
        tmp_path,
        {"schema": 1, "dtypes": ["float32"], "shapes": {"rowwise": [{"target_bytes": 8192, "row_lengths": [64, 256]}]}},
    )


def test_cli_writes_csv_summary_and_plots(
    cli_suite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """kernelgate bench writes bench.csv, summary.md and a PNG per op; --plot CSV redraws them without measuring."""
    out = tmp_path / "out"
    argv = ["bench", "--suite", str(cli_suite), "--op", "rms_norm", "--no-compile", "--out", str(out)]
    code = main([*argv, "--latency-mib", "0.001", "--dtype", "float32"])
    printed = capsys.readouterr().out
    assert code == EXIT_OK, printed
    assert "rms_norm float32" in printed and "kernelgate" in printed
    rows = bench.read_csv(out / "bench.csv")
    assert {r.impl for r in rows} >= {"eager", "kernelgate"} and {r.shape for r in rows} == {"32x64", "8x256"}
    assert (out / "summary.md").read_text().startswith("# kernelgate bench")
    assert (out / "rms_norm.png").stat().st_size > 0

    def no_measuring(*args: object, **kwargs: object) -> None:
        raise AssertionError("--plot must not measure")

    monkeypatch.setattr(bench, "run", no_measuring)
    again = tmp_path / "again"
    assert main(["bench", "--plot", str(out / "bench.csv"), "--out", str(again)]) == EXIT_OK
    assert sorted(p.name for p in again.iterdir()) == ["rms_norm.png", "summary.md"]
    assert (again / "summary.md").read_text() == (out / "summary.md").read_text()


def test_progress_draws_between_cases_without_a_thread_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a case is measured, the progress display runs no refresh thread beside it (a second Python thread
    slows host-bound autograd steps); the bar still moves as cases finish."""
    threads_while_measuring: list[list[str]] = []
    measure = bench_runner._Runner.op_rows

    def spying(self: Any, spec: Any, cases: Any, advance: Any) -> list[bench.BenchRow]:
        def advance_and_look() -> None:
            threads_while_measuring.append([type(t).__name__ for t in threading.enumerate()])
            advance()

        return measure(self, spec, cases, advance_and_look)

    monkeypatch.setattr(bench_runner._Runner, "op_rows", spying)
    kernelgate.reload_settings({"KERNELGATE_CACHE_DIR": str(tmp_path)})
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    rows = bench.run(
        ["softmax"], suite=TINY, compile=False, backward=False, cpu_repeats=1, host_calls=2, console=console
    )
    assert rows and len(threads_while_measuring) == 2, "one look per case: (4, 1000) and (2, 1000)"
    assert all("_RefreshThread" not in names for names in threads_while_measuring), threads_while_measuring
    assert "softmax" in console.file.getvalue()  # type: ignore[attr-defined]


def test_cli_latency_regime_is_the_reports_unless_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kernelgate bench classes inputs under report.LATENCY_BYTES as latency shapes, as its summary says;
    --latency-mib overrides it."""
    seen: list[object] = []

    def record(*args: object, **kwargs: object) -> list[bench.BenchRow]:
        seen.append(kwargs["latency_bytes"])
        return []

    monkeypatch.setattr(bench, "run", record)
    argv = ["bench", "--op", "softmax", "--no-compile", "--out", str(tmp_path)]
    main(argv)
    main([*argv, "--latency-mib", "0.5"])
    assert seen == [bench.report.LATENCY_BYTES, 2**19]


def test_cli_keeps_a_calls_time_and_rows_after_each_op_when_stopped_from_outside(
    cli_suite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call stopped between ops (a machine's time limit; here an interrupt in the second op) has kept the first
    op's rows in bench.csv and its own time in runs.json, so a --resume call adds up both; each op's line says how
    far into the run it ended."""
    out = tmp_path / "out"
    argv = [
        "bench",
        "--suite",
        str(cli_suite),
        "--op",
        "rms_norm",
        "--op",
        "softmax",
        "--no-compile",
        "--out",
        str(out),
    ]
    argv += ["--no-backward", "--dtype", "float32"]
    op_rows = bench_runner._Runner.op_rows

    def stopped_at_softmax(self: Any, spec: Any, *args: Any) -> list[bench.BenchRow]:
        if spec.op == "softmax":
            raise KeyboardInterrupt
        return op_rows(self, spec, *args)

    monkeypatch.setattr(bench_runner._Runner, "op_rows", stopped_at_softmax)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    assert re.search(r"^rms_norm: \d+ s \(\d+ s into the run\)$", capsys.readouterr().out, re.MULTILINE)
    assert {r.op for r in bench.read_csv(out / "bench.csv")} == {"rms_norm"}
    first = bench.read_runs(out)
    assert len(first) == 1 and not first[0]["resumed"] and first[0]["seconds"] > 0, first
    monkeypatch.setattr(bench_runner._Runner, "op_rows", op_rows)
    assert main([*argv, "--resume"]) == EXIT_OK
    runs = bench.read_runs(out)
    assert runs[0] == first[0] and len(runs) == 2 and runs[1]["resumed"], runs
    assert {r.op for r in bench.read_csv(out / "bench.csv")} == {"rms_norm", "softmax"}


def test_cli_resume_measures_only_what_the_folder_lacks(
    cli_suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--resume keeps the cases OUT/bench.csv holds and measures the rest, including those a time limit skipped;
    with nothing left, the CSV stays as it was."""
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "out"
    argv = ["bench", "--suite", str(cli_suite), "--op", "rms_norm", "--no-compile", "--no-backward", "--out", str(out)]
    main([*argv, "--dtype", "float32", "--time-limit", "1e-9"])
    csv = out / "bench.csv"
    assert {(r.shape, r.status) for r in bench.read_csv(csv)} == {("32x64", "skipped"), ("8x256", "skipped")}
    main([*argv, "--dtype", "float32", "--resume"])
    measured = bench.read_csv(csv)
    assert {r.status for r in measured} == {"ok"} and {r.shape for r in measured} == {"32x64", "8x256"}
    runs = bench.read_runs(out)
    # The first call measured nothing (its time limit had passed); the second measured both cases.
    assert [r["resumed"] for r in runs] == [False, True] and runs[0]["seconds"] >= 0 and runs[1]["seconds"] > 0
    total = sum(r["seconds"] for r in runs)
    assert f"- run time: {total:.0f} s in 2 calls" in (out / "summary.md").read_text()
    before = csv.read_text()
    main([*argv, "--dtype", "float32", "--resume"])
    assert csv.read_text() == before, "nothing left to measure"
    main([*argv, "--dtype", "float32"])
    assert csv.read_text() != before, "without --resume the folder is measured afresh"
    assert len(bench.read_runs(out)) == 1 and "- run time: " in (out / "summary.md").read_text()


def test_cli_without_matplotlib_says_how_to_plot_later(
    cli_suite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without matplotlib the CSV and summary are written and one line says how to get the plots."""
    monkeypatch.setattr(bench, "plots_available", lambda: False)
    out = tmp_path / "out"
    code = main(
        ["bench", "--suite", str(cli_suite), "--op", "softmax", "--no-compile", "--no-backward", "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == EXIT_OK
    assert "pip install matplotlib" in printed and "kernelgate bench --plot CSV" in printed
    assert sorted(p.name for p in out.iterdir()) == ["bench.csv", "runs.json", "summary.md"]


def test_a_time_limit_stops_starting_cases_and_the_rest_are_listed(tmp_path: Path) -> None:
    """With a time limit that has passed before the first case, no case runs: each gets one skipped row saying
    why, and the summary lists them under "Not measured"; a limit that does not pass changes nothing."""
    kwargs: dict[str, Any] = {"suite": TINY, "device": "cpu", "backward": False, "compile": False, "cpu_repeats": 1}
    stopped = bench.run(["softmax"], time_limit_s=1e-9, **kwargs)
    assert [(r.shape, r.status, r.impl) for r in stopped] == [
        ("4x1000", "skipped", "kernelgate"),
        ("2x1000", "skipped", "kernelgate"),
    ]
    assert all(r.note == "not measured: the run's time limit passed" for r in stopped)
    text = bench.write_summary(stopped, tmp_path / "summary.md").read_text()
    assert "softmax float32 4x1000 forward kernelgate: skipped: not measured: the run's time limit passed" in text
    measured = bench.run(["softmax"], time_limit_s=3600, **kwargs)
    assert {r.status for r in measured} == {"ok"} and {r.shape for r in measured} == {"4x1000", "2x1000"}
    with pytest.raises(bench.BenchError, match=r"time_limit_s must be > 0 seconds; got 0"):
        bench.run(["softmax"], time_limit_s=0, **kwargs)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--op", "nosuch"], "no op named 'nosuch'"),
        (["--suite", "{bad"], "not valid JSON"),
        (["--plot", "missing.csv"], "cannot read"),
        (["--kernel-arch", "9"], "--kernel-arch must be an NVIDIA compute capability written as one number"),
    ],
)
def test_cli_usage_errors(
    argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown op, a malformed suite, a missing CSV or an architecture that is no compute capability exits 2
    with the message."""
    monkeypatch.chdir(tmp_path)
    if argv[0] == "--suite":
        argv = ["--suite", str(_write(tmp_path, argv[1]))]
    monkeypatch.setenv("COLUMNS", "400")
    code = main(["bench", *argv, "--out", str(tmp_path / "out")])
    assert code == EXIT_USAGE
    assert expected in " ".join(capsys.readouterr().out.split())


def test_precompiled_graphs_are_found_in_inductors_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A case compiled by a precompile worker is loaded from inductor's caches by the run's own torch.compile of
    the same reference on the same inputs: forward and forward+backward, with no graph compiled again."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    spec, case, cpu = bench.spec_for("softmax"), bench.Case((4, 32)), torch.device("cpu")
    done = precompile([(spec, [("float32", case)])], cpu, backward=True, workers=1)
    assert (done.jobs, done.compiled, done.failed) == (1, 1, 0)
    assert str(done).startswith("torch.compile ahead: 1 of 1 case(s) compiled in ")
    counters = torch._dynamo.utils.counters
    counters.clear()
    torch._dynamo.reset()
    compiled = torch.compile(get_op("softmax").reference, dynamic=False)
    fwd_args, bwd_args = bench_runner.case_args(spec, torch.float32, case, cpu)
    compiled(*fwd_args)
    bench_runner._autograd_step(compiled, bwd_args, spec.grad_args)()()
    assert counters["inductor"]["fxgraph_cache_hit"] >= 2, dict(counters["inductor"])
    assert counters["inductor"]["fxgraph_cache_miss"] == 0, dict(counters["inductor"])


def test_a_case_a_worker_cannot_compile_is_reported_and_the_rest_go_on() -> None:
    """A worker that fails on one case says so in its reply line and compiles the next."""
    jobs = {
        "device": "cpu",
        "backward": True,
        "backend": "eager",
        "cases": [["softmax", "float32", [-1, 8]], ["softmax", "float32", [2, 8]]],
    }
    part_seconds: dict[str, float] = {}
    lines = compile_cases(jobs, jobs["cases"], part_seconds)
    assert lines[0].startswith("failed softmax float32 [-1, 8]: ") and lines[1] == "ok softmax float32 [2, 8]"
    assert list(part_seconds) == ["torch.compile"] and part_seconds["torch.compile"] > 0, part_seconds


def test_a_step_out_of_device_memory_is_tried_again_then_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that runs out of device memory (other workers' peaks) is tried again, up to OOM_RETRIES times after the
    first: one that then succeeds counts as compiled; one that never does is a failed line naming the error. Other
    errors are not retried."""
    from kernelgate.bench import precompile as module

    calls: dict[str, int] = {}

    def steps(jobs: dict[str, Any], spec: Any, *args: Any) -> list[tuple[str, Callable[[], Any]]]:
        def step() -> None:
            calls[spec.op] = calls.get(spec.op, 0) + 1
            if spec.op == "rms_norm" or (spec.op == "softmax" and calls[spec.op] == 1):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1000.00 MiB.")
            if spec.op == "layer_norm":
                raise ValueError("not a memory error")

        return [("kernelgate", step)]

    monkeypatch.setattr(module, "_case_steps", steps)
    monkeypatch.setattr(module, "OOM_WAIT_S", 0.0)
    jobs = {
        "device": "cpu",
        "backward": False,
        "backend": None,
        "cases": [["softmax", "float32", [2, 8]], ["rms_norm", "float32", [2, 8]], ["layer_norm", "float32", [2, 8]]],
    }
    lines = compile_cases(jobs, jobs["cases"])
    assert lines[0] == "ok softmax float32 [2, 8]"
    assert lines[1] == (
        "failed rms_norm float32 [2, 8]: kernelgate: OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 1000.00 MiB."
    )
    assert lines[2] == "failed layer_norm float32 [2, 8]: kernelgate: ValueError: not a memory error"
    assert calls == {"softmax": 2, "rms_norm": 1 + module.OOM_RETRIES, "layer_norm": 1}


def test_a_worker_asked_for_kernelgate_and_liger_leaves_the_settings_and_the_decisions_as_they_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's kernelgate part runs with tuning off, into a scratch decision cache, with untuned buckets compiling
    their candidates, and the settings are restored afterwards; Liger-Kernel's part, off a GPU, is left out (the run
    measures Liger-Kernel on GPUs only)."""
    from kernelgate import compile_ahead
    from kernelgate.bench import precompile as module

    before = kernelgate.settings()
    seen: list[tuple[str, bool, Path | None, bool]] = []
    case_steps = module._case_steps

    def watched(*args: Any) -> list[tuple[str, Callable[[], Any]]]:
        def watch(part: str, step: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                now = kernelgate.settings()
                seen.append((part, now.tune, now.cache_dir, compile_ahead.compiling_untuned()))
                return step()

            return run

        return [(part, watch(part, step)) for part, step in case_steps(*args)]

    monkeypatch.setattr(module, "_case_steps", watched)
    jobs = {
        "device": "cpu",
        "backward": True,
        "backend": None,
        "kernelgate": True,
        "liger": True,
        "cases": [["softmax", "float32", [2, 8]], ["rms_norm", "float32", [2, 8]]],
    }
    assert compile_cases(jobs, jobs["cases"]) == ["ok softmax float32 [2, 8]", "ok rms_norm float32 [2, 8]"]
    assert [part for part, *_ in seen] == ["kernelgate"] * 4, "forward and forward+backward of each case, no Liger"
    assert all(not tune and cache not in (None, before.cache_dir) and untuned for _, tune, cache, untuned in seen), seen
    assert kernelgate.settings() == before and not compile_ahead.compiling_untuned()


def test_cases_sharing_kernels_are_queued_as_one_group_the_largest_and_longest_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cases of one op, dtype and row length (a latency shape beside a 128 MiB one) are queued as one group,
    which one worker takes whole and compiles their kernels once; the groups are queued the largest first, then the
    longest rows (the most candidates), and the workers share one queue."""
    from kernelgate.bench import precompile as module

    seen: list[Any] = []

    class Recorder:
        def __init__(self, argv: list[str], stdin: Any, stdout: Any, **kwargs: Any) -> None:
            self.stdin, self.stdout = io.StringIO(), stdout

            def close() -> None:
                jobs = json.loads(self.stdin.getvalue())
                queue = sorted(Path(jobs["queue"]).glob(f"*{module.GROUP_SUFFIX}"))
                seen.append((jobs["queue"], [json.loads(path.read_text()) for path in queue]))

            self.stdin.close = close  # type: ignore[method-assign]

        def wait(self, timeout: float) -> int:
            return 0

    monkeypatch.setattr(module.subprocess, "Popen", Recorder)
    spec = bench.spec_for("softmax")
    shapes = ((8, 4096), (1, 4096), (8, 1024), (2, 4096), (8, 512), (4, 8192))
    cases = [("float32", bench.Case(shape)) for shape in shapes]
    done = precompile([(spec, cases)], torch.device("cpu"), backward=False, workers=2, backend=None, kernelgate=True)
    assert len(seen) == 2 and seen[0] == seen[1], "two workers, one queue"
    assert seen[0][1] == [
        [["softmax", "float32", [8, 4096]], ["softmax", "float32", [1, 4096]], ["softmax", "float32", [2, 4096]]],
        [["softmax", "float32", [4, 8192]]],
        [["softmax", "float32", [8, 1024]]],
        [["softmax", "float32", [8, 512]]],
    ]
    assert str(done).startswith("kernelgate ahead: 0 of 6 case(s) compiled in ")


def test_workers_sharing_a_queue_claim_each_group_once_in_order(tmp_path: Path) -> None:
    """Two workers reading one queue, taking turns, between them get every group once, in the queue's order, and
    each group whole."""
    from kernelgate.bench.precompile import GROUP_SUFFIX, claimed_cases

    groups = [[["softmax", "float32", [2, n]], ["softmax", "float32", [4, n]]] for n in (8, 16, 32, 64, 128)]
    for position, group in enumerate(groups):
        (tmp_path / f"{position:06d}{GROUP_SUFFIX}").write_text(json.dumps(group))
    first, second = claimed_cases(tmp_path), claimed_cases(tmp_path)
    taken: list[list[Any]] = []
    for worker in itertools.cycle((first, second)):
        got = list(itertools.islice(worker, 2))  # one group
        if not got:
            break
        taken.append(got)
    assert taken == groups
    assert list(first) == [] and list(second) == [] and not list(tmp_path.glob(f"*{GROUP_SUFFIX}"))


def test_precompile_workers_answer_every_case_once() -> None:
    """Worker processes sharing the queue compile every case of the plan once between them (each answers the
    cases of the groups it took)."""
    spec = bench.spec_for("softmax")
    cases = [("float32", bench.Case((2, n))) for n in (8, 16, 24)] + [("float32", bench.Case((4, 8)))]
    done = precompile([(spec, cases)], torch.device("cpu"), backward=False, workers=2, backend="eager")
    assert (done.jobs, done.compiled, done.failed, done.workers) == (4, 4, 0, 2), str(done)
    assert len(done.worker_seconds) == 2, "both workers answered"


def test_the_precompile_summary_names_the_part_each_failure_was_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's failed lines name the part that failed (Liger-Kernel refusing a shape, say): the summary counts the
    failed cases, and how many failed in each part, and shows the first failure's case and error."""
    from kernelgate.bench import precompile as module

    replies = [
        "ok softmax float32 [8, 16]\n",
        "failed softmax float32 [8, 32]: Liger-Kernel: RuntimeError: n exceeds the block size\n",
        "failed softmax float32 [8, 64]: torch.compile: BackendCompilerFailed: x; Liger-Kernel: RuntimeError: y\n",
    ]

    class Worker:
        def __init__(self, argv: list[str], stdin: Any, stdout: Any, **kwargs: Any) -> None:
            self.stdin, self.stdout = io.StringIO(), stdout

        def wait(self, timeout: float) -> int:
            self.stdout.writelines(replies)
            return 0

    monkeypatch.setattr(module.subprocess, "Popen", Worker)
    spec = bench.spec_for("softmax")
    cases = [("float32", bench.Case((8, n))) for n in (16, 32, 64)]
    done = precompile([(spec, cases)], torch.device("cpu"), backward=False, workers=1, liger=True)
    assert (done.jobs, done.compiled, done.failed) == (3, 1, 2)
    assert str(done).startswith("torch.compile, Liger-Kernel ahead: 1 of 3 case(s) compiled in ")
    assert str(done).endswith(
        " s by 1 worker process, 2 failed (torch.compile 1, Liger-Kernel 2); the first: softmax float32 [8, 32]: "
        "Liger-Kernel: "
        "RuntimeError: n exceeds the block size"
    ), str(done)


def test_the_precompile_summary_adds_up_the_workers_time_in_each_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker's last lines give its own time and peak device memory, then its seconds in each part; the summary
    shows the parts summed over the workers, the fastest and slowest worker and the largest peak, so a run's console
    says where the precompile's time went, how evenly it was shared and what memory a worker needed."""
    from kernelgate.bench import precompile as module

    spent = iter([{"torch.compile": 10.4, "kernelgate": 20.2}, {"torch.compile": 5.3, "kernelgate": 30.1}])
    workers = iter(
        [
            {"seconds": 31.0, "peak_device_bytes": 3 << 29, "peak_case": "softmax float32 [8, 16]"},
            {"seconds": 35.6, "peak_device_bytes": 5 << 30, "peak_case": "softmax float32 [8, 32]"},
        ]
    )

    class Worker:
        def __init__(self, argv: list[str], stdin: Any, stdout: Any, **kwargs: Any) -> None:
            self.stdin, self.stdout = io.StringIO(), stdout
            self.replies = [
                "ok softmax float32 [8, 16]\n",
                f"worker {json.dumps(next(workers))}\n",
                f"seconds {json.dumps(next(spent))}\n",
            ]

        def wait(self, timeout: float) -> int:
            self.stdout.writelines(self.replies)
            return 0

    monkeypatch.setattr(module.subprocess, "Popen", Worker)
    spec = bench.spec_for("softmax")
    cases = [("float32", bench.Case((8, 16))), ("float32", bench.Case((8, 32)))]
    done = precompile([(spec, cases)], torch.device("cpu"), backward=False, workers=2, kernelgate=True)
    assert (done.jobs, done.compiled, done.failed) == (2, 2, 0)
    assert done.part_seconds == pytest.approx({"torch.compile": 15.7, "kernelgate": 50.3})
    assert done.worker_seconds == [31.0, 35.6] and done.peak_device_bytes == 5 << 30
    assert str(done).endswith(
        " s by 2 worker processes (their time: torch.compile 16 s, kernelgate 50 s; a worker's 31 to 36 s, at most "
        "5.0 GiB of device memory (softmax float32 [8, 32]))"
    ), str(done)
    alone = module.Precompiled(12.0, 1, 1, 0, ["kernelgate"], worker_seconds=[11.8], workers=1)
    assert str(alone) == "kernelgate ahead: 1 of 1 case(s) compiled in 12 s by 1 worker process (a worker's 12 s)"


def test_a_worker_reports_its_time_and_its_seconds_in_each_part_last(tmp_path: Path) -> None:
    """The worker's entry point prints a line per case of the groups it claims from the queue, then its own time
    and peak device memory (none off a GPU), then its seconds in each part, as JSON."""
    from kernelgate.bench.precompile import GROUP_SUFFIX

    (tmp_path / f"000000{GROUP_SUFFIX}").write_text(json.dumps([["softmax", "float32", [2, 8]]]))
    jobs = {"device": "cpu", "backward": False, "backend": "eager", "queue": str(tmp_path)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    worker = subprocess.run(
        [sys.executable, "-m", "kernelgate.bench.precompile"],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = worker.stdout.splitlines()
    assert worker.returncode == 0 and lines[0] == "ok softmax float32 [2, 8]", worker.stdout + worker.stderr
    own = json.loads(lines[1].removeprefix("worker "))
    assert lines[1].startswith("worker ") and own["seconds"] > 0, lines
    assert own["peak_device_bytes"] == 0 and own["peak_case"] == "", "off a GPU no device memory is counted"
    assert lines[2].startswith("seconds ") and list(json.loads(lines[2].removeprefix("seconds "))) == ["torch.compile"]


def test_a_worker_lets_a_cases_tensors_go_before_making_the_next_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """When a worker makes a case's inputs, the previous case's are gone: a worker's memory holds one case at a time
    (holding the last case's while making the next doubled a worker's peak after a large case)."""
    import weakref

    from kernelgate.bench import runner as bench_runner_module

    made: list[weakref.ref[torch.Tensor]] = []
    alive_when_made: list[int] = []
    case_args = bench_runner_module.case_args

    def tracked(*args: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        alive_when_made.append(sum(ref() is not None for ref in made))
        fwd_args, bwd_args = case_args(*args)
        made.extend(weakref.ref(a) for a in (*fwd_args, *bwd_args) if isinstance(a, torch.Tensor))
        return fwd_args, bwd_args

    monkeypatch.setattr(bench_runner_module, "case_args", tracked)
    jobs = {
        "device": "cpu",
        "backward": True,
        "backend": "eager",
        "cases": [["softmax", "float32", [2, 8]], ["softmax", "float32", [4, 8]], ["rms_norm", "float32", [2, 8]]],
    }
    assert compile_cases(jobs, jobs["cases"]) == [f"ok {op} float32 {shape}" for op, _, shape in jobs["cases"]]
    assert len(made) >= 6 and alive_when_made == [0, 0, 0], alive_when_made


def test_a_worker_out_of_time_is_stopped_and_its_cases_left_to_the_run() -> None:
    """A worker still running at the time limit is killed, and its cases are counted as not answered."""
    spec = bench.spec_for("softmax")
    done = precompile([(spec, [("float32", bench.Case((3, 16)))])], torch.device("cpu"), backward=False, timeout_s=0)
    assert (done.jobs, done.compiled, done.failed) == (1, 0, 0)
    assert str(done).endswith(", 1 not answered")


def test_precompile_workers_are_checked_and_the_cli_leaves_the_default_to_the_module(tmp_path: Path) -> None:
    """A negative worker count is refused with the argument named; the CLI passes None, default_workers' count."""
    with pytest.raises(bench.BenchError, match=r"precompile_workers must be >= 0; got -1"):
        bench.run(["softmax"], device="cpu", precompile_workers=-1)
    parser = _parser()
    assert parser.parse_args(["bench"]).precompile_workers is None
    assert parser.parse_args(["bench", "--precompile-workers", "3"]).precompile_workers == 3


@pytest.mark.parametrize(
    ("cpus", "device_gib", "expected"),
    [
        (16, 141, 15),  # the H200 machine: the CPUs bound it, one kept for the run
        (64, 141, 16),  # at most MAX_WORKERS
        (64, 80, 13),  # one per 6 GiB of device memory
        (16, 80, 13),  # the H100 machine: its memory bounds it
        (16, 24, 4),
        (1, 141, 1),  # at least one
        (16, 4, 1),
    ],
)
def test_default_precompile_workers_follow_the_cpus_and_the_device_memory(
    monkeypatch: pytest.MonkeyPatch, cpus: int, device_gib: int, expected: int
) -> None:
    """One fewer than the usable CPUs, at most 16, and no more than the GPU's memory holds at 6 GiB a worker."""
    from types import SimpleNamespace

    from kernelgate.bench import precompile as module

    monkeypatch.setattr(module, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(
        module.torch.cuda,
        "get_device_properties",
        lambda device: SimpleNamespace(total_memory=device_gib * (1 << 30)),
    )
    assert WORKER_DEVICE_BYTES == 6 << 30
    assert default_workers(torch.device("cuda", 0)) == expected
    assert default_workers(torch.device("cpu")) == max(1, min(16, cpus - 1)), "off a GPU the CPUs alone decide"


# --- on the GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_tuning_after_the_precompile_workers_compiles_nothing(triton_cache: Path) -> None:
    """On the GPU: after the workers called kernelgate's softmax on a case, forward and forward+backward, with a
    fresh Triton cache, tuning the forward's and the backward's buckets in this process compiles no kernel: every
    candidate's was in the cache (the decisions' gate_kernels say 0 compiled)."""
    spec, device = bench.spec_for("softmax"), torch.device("cuda")
    case = bench.Case((96, 1000))  # rows of 1000: a length no other test tunes
    done = precompile([(spec, [("float32", case)])], device, backward=True, workers=1, backend=None, kernelgate=True)
    assert (done.jobs, done.compiled, done.failed) == (1, 1, 0), str(done)
    assert done.peak_device_bytes > 0 and done.peak_case == "softmax float32 [96, 1000]", str(done)
    fwd_args, bwd_args = bench_runner.case_args(spec, torch.float32, case, device)
    softmax = get_op("softmax")
    softmax.plan(*fwd_args)
    bench_runner._autograd_step(softmax, bwd_args, spec.grad_args)()()
    cache = kernelgate.settings().cache_dir
    assert cache is not None
    entries = [e for f in Path(cache).rglob("*.json") for e in json.loads(f.read_text())["entries"].values()]
    assert {e["op"] for e in entries} == {"softmax", "softmax_backward"}, entries
    for entry in entries:
        assert entry["seconds"]["gate_kernels"].startswith("0 compiled"), entry["seconds"]


@pytest.mark.gpu
def test_gpu_run_measures_bandwidth_memory_and_host_cost(tmp_path: Path) -> None:
    """On the GPU: do_bench timing, a 2 GiB copy, peak memory, host cost at latency shapes, tuned Triton rows."""
    suite = bench.Suite(
        ("bfloat16",),
        {
            "rowwise": (
                # 64 MiB: the smallest input of the bandwidth regime (report.LATENCY_BYTES)
                bench.ShapeGroup(row_lengths=(4096,), target_bytes=64 * MiB),
                bench.ShapeGroup(shapes=((64, 4096),)),
            )
        },
    )
    rows = bench.run(["softmax", "rms_norm"], suite=suite)
    assert all(r.status == "ok" for r in rows if r.impl != "compile"), [(r.impl, r.note) for r in rows]
    assert rows[0].copy_gbps > 500 and "do_bench" in rows[0].timer and rows[0].gpu != "cpu"
    assert all(r.peak_mib >= 0 for r in rows if r.status == "ok")
    assert all(r.host_us > 0 for r in rows if r.status == "ok" and r.shape == "64x4096")
    bandwidth = [r for r in rows if r.shape == "8192x4096" and r.status == "ok"]
    assert bandwidth and all(r.regime == "bandwidth" for r in bandwidth)
    assert all(math.isnan(r.host_us) for r in bandwidth if r.direction == "forward")
    assert all(r.host_us > 0 for r in bandwidth if r.direction == "forward+backward"), "the steady state"
    assert any(r.impl.startswith("triton:") for r in rows)
    bench.write_summary(rows, tmp_path / "summary.md")


def test_summary_counts_misses_per_op_with_their_causes(interpreted: list[bench.BenchRow], tmp_path: Path) -> None:
    """The Targets missed section opens with a table: per op and direction, misses per target and causes named."""
    base = next(r for r in interpreted if r.direction == "forward+backward" and r.impl == "eager")
    eager = dataclasses.replace(base, regime="bandwidth", time_us=100.0, host_us=math.nan, frac_of_copy=0.5)
    ours = dataclasses.replace(eager, impl="kernelgate", time_us=300.0, frac_of_copy=0.2)
    kernels = dataclasses.replace(eager, impl="triton:single_block", time_us=80.0, frac_of_copy=0.9)
    text = bench.write_summary([eager, ours, kernels], tmp_path / "summary.md").read_text()
    digest = text[text.index("## Targets missed") :]
    # Below the bandwidth target, behind eager (the best peer here), slower than eager: each named
    # by its cause, the autograd step.
    assert f"| {base.op} | forward+backward | 1 | 1 | 1 | 0 | 3 | 0 | 0 | 0 | 0 | 0 |" in digest
    assert digest.index("| op | direction |") < digest.index("- ")


def test_summary_opens_with_the_targets_met_per_op(interpreted: list[bench.BenchRow], tmp_path: Path) -> None:
    """The summary's first section counts, per op and direction, the cases where kernelgate meets each target of
    those where it applies: bandwidth only at bandwidth shapes, the host cost only for forwards at latency shapes
    with a Triton kernel timed directly."""
    base = next(r for r in interpreted if r.direction == "forward" and r.impl == "eager")
    eager = dataclasses.replace(base, regime="bandwidth", time_us=100.0, host_us=math.nan, frac_of_copy=0.45)
    ours = dataclasses.replace(eager, impl="kernelgate", time_us=71.0, frac_of_copy=0.63, note="auto: looped")
    kernel = dataclasses.replace(ours, impl="triton:looped", note="")
    # A latency shape where kernelgate is slower than eager and its host cost is 3 us over the kernel's.
    small = dict(shape="1x8", regime="latency", time_us=5.0, frac_of_copy=math.nan)
    eager_small = dataclasses.replace(eager, **small, host_us=6.0)
    ours_small = dataclasses.replace(ours, **small, host_us=10.0)
    kernel_small = dataclasses.replace(kernel, **small, host_us=7.0)
    text = bench.write_summary(
        [eager, ours, kernel, eager_small, ours_small, kernel_small], tmp_path / "summary.md"
    ).read_text()
    glance = text[text.index("## Targets at a glance") : text.index(f"## {base.op} {base.dtype}")]
    assert f"| {base.op} | forward | 0/1 | 1/2 | 1/2 | 0/1 |" in glance, glance
    assert text.index("## Targets at a glance") < text.index("## Targets missed")


def test_a_bandwidth_miss_where_no_implementation_reaches_the_target_says_so(
    interpreted: list[bench.BenchRow], tmp_path: Path
) -> None:
    """Where every implementation measured at a case is below the bandwidth target, the miss names the best of them
    and the digest counts it; where one reaches the target, the miss gives no such cause."""
    base = next(r for r in interpreted if r.direction == "forward" and r.impl == "eager")
    eager = dataclasses.replace(base, regime="bandwidth", time_us=100.0, host_us=math.nan, frac_of_copy=0.45)
    compiled = dataclasses.replace(eager, impl="compile", time_us=76.0, frac_of_copy=0.59)
    ours = dataclasses.replace(eager, impl="kernelgate", time_us=71.0, frac_of_copy=0.63, note="auto: looped")
    kernel = dataclasses.replace(ours, impl="triton:looped", note="")
    (line,) = bench.misses([eager, compiled, ours, kernel])
    assert line.endswith(
        "0.63 of copy bandwidth (target 0.90); no implementation measured here reaches the target: "
        "the best, kernelgate, reaches 0.63 of copy"
    ), line
    digest = bench.write_summary([eager, compiled, ours, kernel], tmp_path / "s.md").read_text()
    assert f"| {base.op} | forward | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 1 | 0 | 0 |\n" in digest
    fast_compile = dataclasses.replace(compiled, time_us=49.0, frac_of_copy=0.91)
    assert all("no implementation" not in t for t in bench.misses([eager, fast_compile, ours, kernel]))


def test_a_forward_miss_whose_chosen_kernel_ran_faster_in_its_own_row_names_the_call_not_the_kernel(
    interpreted: list[bench.BenchRow], tmp_path: Path
) -> None:
    """kernelgate ran a tuned candidate, and that candidate's own row in the same case was more than 10 % faster: the
    miss says the kernel is not the cause, and the digest counts it. A different configuration's row, or one within
    10 %, gives no such cause."""
    base = next(r for r in interpreted if r.direction == "forward" and r.impl == "eager")
    eager = dataclasses.replace(base, regime="bandwidth", time_us=76.3, host_us=math.nan, frac_of_copy=0.83)
    label = "single_block[ROWS=1,num_warps=1]"
    ours = dataclasses.replace(
        eager, impl="kernelgate", time_us=116.2, frac_of_copy=0.54, note=f"auto: {label} (tuned); planned in 9 ms"
    )
    kernel = dataclasses.replace(
        eager, impl="triton:single_block", time_us=68.2, frac_of_copy=0.93, note=f"{label}; tuned 68.0 us"
    )
    texts = bench.misses([eager, ours, kernel])  # below the bandwidth target, behind eager, slower than eager
    assert len(texts) == 3, texts
    clause = (
        f"; kernelgate ran {label}, whose own row in this case took 68.2 us (0.93 of copy): the kernel is not the "
        "cause, the difference is in kernelgate's call as timed here"
    )
    assert all(t.endswith(clause) for t in texts), texts
    digest = bench.write_summary([eager, ours, kernel], tmp_path / "summary.md").read_text()
    assert f"| {base.op} | forward | 1 | 1 | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 3 | 0 |\n" in digest, digest

    other = dataclasses.replace(kernel, note="single_block[ROWS=2,num_warps=4]; tuned 68.0 us")
    close = dataclasses.replace(kernel, time_us=110.0, frac_of_copy=0.58)
    for row in (other, close):
        assert not any("the kernel is not the cause" in t for t in bench.misses([eager, ours, row]))


def test_a_bandwidth_miss_whose_chosen_kernel_met_the_target_in_its_own_row_names_the_call(
    interpreted: list[bench.BenchRow], tmp_path: Path
) -> None:
    """kernelgate's call fell just short of the bandwidth target while the same configuration's own row in the case
    reached it (within 10 %, so not the faster-alone cause): the miss names kernelgate's call, with both fractions
    and the gap, and the digest counts it. Where the own row is short too, no such cause. The times are an H100's
    at 97469f7 (cross_entropy bfloat16 8192x32000)."""
    base = next(r for r in interpreted if r.direction == "forward" and r.impl == "eager")
    eager = dataclasses.replace(base, regime="bandwidth", time_us=2153.9, host_us=math.nan, frac_of_copy=0.081)
    label = "looped[BLOCK_N=4096,NUM_STAGES=3,num_warps=4]"
    ours = dataclasses.replace(
        eager, impl="kernelgate", time_us=194.0, frac_of_copy=0.8952, note=f"auto: {label} (tuned); planned in 317 ms"
    )
    kernel = dataclasses.replace(
        eager, impl="triton:looped", time_us=192.3, frac_of_copy=0.9030, note=f"{label}; tuned 193.5 us"
    )
    [text] = bench.misses([eager, ours, kernel])
    assert text.endswith(
        f"0.90 of copy bandwidth (target 0.90); kernelgate ran {label}, whose own row in this case took 192.3 us "
        "(0.903 of copy, the target met): the kernel is not the cause; kernelgate's call, 194.0 us (0.895), was "
        "0.9% slower as timed here"
    ), text
    digest = bench.write_summary([eager, ours, kernel], tmp_path / "summary.md").read_text()
    assert f"| {base.op} | forward | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 1 | 0 |\n" in digest, digest

    short = dataclasses.replace(kernel, time_us=193.0, frac_of_copy=0.8997)
    [text] = bench.misses([eager, ours, short])
    assert "the kernel is not the cause" not in text, text


def test_a_forward_miss_whose_chosen_kernel_lost_to_another_in_this_run_names_tuning(
    interpreted: list[bench.BenchRow], tmp_path: Path
) -> None:
    """kernelgate ran the implementation tuning chose, and another implementation's own row in the same case was
    more than 10 % faster (tuning had timed them the other way round): the miss names tuning's decision, with both
    sides' times here and in tuning and the command that decides the bucket again, then, where nothing measured
    reaches the target, the best; the digest counts it. Within 10 %, or with no other Triton row, no such cause.
    The rows are the H200's at e19bd2b (rms_norm bfloat16 512x131072)."""
    base = next(r for r in interpreted if r.direction == "forward" and r.impl == "eager")
    eager = dataclasses.replace(base, regime="bandwidth", time_us=249.7, host_us=math.nan, frac_of_copy=0.25)
    label = "looped[BLOCK_N=2048,num_warps=4]"
    ours = dataclasses.replace(
        eager, impl="kernelgate", time_us=123.0, frac_of_copy=0.51, note=f"auto: {label} (tuned); planned in 449 ms"
    )
    looped = dataclasses.replace(
        eager, impl="triton:looped", time_us=122.9, frac_of_copy=0.51, note=f"{label}; tuned 145.5 us"
    )
    split_rows = dataclasses.replace(
        eager,
        impl="triton:split_rows",
        time_us=88.9,
        frac_of_copy=0.71,
        note="split_rows[BLOCK_N=8192,num_warps=8]; tuned 256.2 us",
    )
    [text] = bench.misses([eager, ours, looped, split_rows])
    shape = base.shape
    assert text.endswith(
        f"; tuning chose {label} (122.9 us in its own row here, 145.5 us in tuning), but triton:split_rows ran "
        "split_rows[BLOCK_N=8192,num_warps=8] in 88.9 us here, 256.2 us in tuning: this run contradicts tuning's "
        f"timings, so the decision is the cause (`kernelgate tune {base.op} --shape {shape} --dtype {base.dtype} "
        "--retune` decides the bucket again); no implementation measured here reaches the target: the best, "
        "triton:split_rows, reaches 0.71 of copy"
    ), text
    digest = bench.write_summary([eager, ours, looped, split_rows], tmp_path / "summary.md").read_text()
    assert f"| {base.op} | forward | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 1 |\n" in digest, digest

    close = dataclasses.replace(split_rows, time_us=115.0, frac_of_copy=0.55)
    for rows in ([eager, ours, looped, close], [eager, ours, looped]):
        assert not any("tuning chose" in t for t in bench.misses(rows))


def test_a_miss_on_the_reference_route_names_the_dispatch(interpreted: list[bench.BenchRow]) -> None:
    """Where tuning chose the reference (faster than the Triton candidates) and kernelgate is still slower than
    eager, the miss says the call is eager's plus kernelgate's dispatch, and by how much; another reason for the
    reference (a fallback) is not given that cause."""
    base = next(r for r in interpreted if r.direction == "forward" and r.impl == "eager" and r.regime == "latency")
    eager = dataclasses.replace(base, time_us=7.0, host_us=7.3)
    chosen = "auto: reference (reference-faster: reference 7.1 us; best Triton single_block 22.0 us); planned in 9 ms"
    ours = dataclasses.replace(eager, impl="kernelgate", time_us=7.0, host_us=9.8, note=chosen)
    texts = bench.misses([eager, ours])  # behind the best peer (eager) and slower than eager
    assert len(texts) == 2 and any("slower than eager" in t for t in texts)
    assert all(t.endswith("eager's plus kernelgate's dispatch: +2.5 us") for t in texts), texts
    fallback = dataclasses.replace(ours, note="auto: reference (dtype-unsupported: float64); planned in 1 ms")
    texts = bench.misses([eager, fallback])
    assert len(texts) == 2 and not any("dispatch" in t for t in texts), texts


def test_miss_breakdown_counts_the_misses_by_target_then_by_cause(interpreted: list[bench.BenchRow]) -> None:
    """The CLI's last line counts the misses by target, most first, then by the cause the summary names, and says
    how many name none; with no miss it is empty."""
    base = next(r for r in interpreted if r.direction == "forward" and r.impl == "eager" and r.regime == "latency")
    eager = dataclasses.replace(base, time_us=7.0, host_us=7.3)
    chosen = "auto: reference (reference-faster: reference 7.1 us; best Triton single_block 22.0 us); planned in 9 ms"
    ours = dataclasses.replace(eager, impl="kernelgate", time_us=7.0, host_us=9.8, note=chosen)
    wide = next(r for r in interpreted if r.shape == "4x1000" and r.direction == "forward" and r.impl == "eager")
    wide_eager = dataclasses.replace(wide, time_us=100.0, frac_of_copy=0.95)
    wide_ours = dataclasses.replace(wide, impl="kernelgate", time_us=99.0, frac_of_copy=0.86)
    assert bench.miss_breakdown([eager, dataclasses.replace(ours, host_us=7.3), wide_eager]) == ""
    rows = [eager, ours, wide_eager, wide_ours]
    assert len(bench.misses(rows)) == 3
    assert bench.miss_breakdown(rows) == (
        "1 behind the best peer, 1 slower than eager, 1 below the bandwidth target; "
        "causes: 2 the reference's call plus dispatch; 1 with no cause named"
    )


def test_forward_backward_misses_name_the_path_the_steps_took(
    interpreted: list[bench.BenchRow], tmp_path: Path
) -> None:
    """A forward+backward row's note names the path its steps took. Eager autograd: the miss is eager's step plus
    kernelgate's dispatch, even where the kernels alone are much faster. The Function, kept by a timing that found
    it faster, yet measured slower than eager: the slower-than-eager miss gives both timings, while the bandwidth
    miss keeps the autograd step as its cause."""
    base = next(r for r in interpreted if r.direction == "forward+backward" and r.impl == "eager")
    eager = dataclasses.replace(base, regime="bandwidth", time_us=100.0, host_us=math.nan, frac_of_copy=0.5)
    kernels = dataclasses.replace(eager, impl="triton:looped", time_us=40.0, frac_of_copy=0.95, note="")
    planned = "auto: looped[BLOCK_N=1024,num_warps=4] (tuned); planned in 9 ms"
    eager_step = "autograd step: eager: timed once: a step through eager autograd 101.0 us, through kernelgate's "
    eager_step += "Function 180.0 us (margin 5%)"
    ours = dataclasses.replace(
        eager, impl="kernelgate", time_us=110.0, frac_of_copy=0.45, note=f"{planned}; {eager_step}"
    )
    texts = bench.misses([eager, ours, kernels])  # below the bandwidth target, behind eager, slower than eager
    assert len(texts) == 3, texts
    suffix = f"its steps ran eager autograd of the reference ({eager_step.removeprefix('autograd step: eager: ')}), "
    assert all(f"; {suffix}so the step is eager's plus kernelgate's dispatch: +10.0 us" in t for t in texts), texts
    kernels_clause = (
        "; its own kernels, forward and backward called directly, took 40.0 us (triton:looped, 0.95 of copy): faster "
        "than eager's step, so the Function's step lost that timing to its host time, not its kernels"
    )
    assert all(kernels_clause in t for t in texts), texts
    assert not any("most of the step is the autograd step" in t for t in texts)
    # Kernels no faster than eager's step: the clause says so, and nothing of host time.
    slow_kernels = dataclasses.replace(kernels, time_us=120.0, frac_of_copy=0.4)
    texts = bench.misses([eager, ours, slow_kernels])
    assert all("took 120.0 us (triton:looped, 0.40 of copy): no faster than eager's step" in t for t in texts), texts
    assert not any("host time" in t for t in texts), texts
    # Both passes ran the reference, untimed: no clause about the kernels.
    untimed = (
        "autograd step: eager: the forward and its backward both run the reference: eager autograd does the same work"
    )
    both_reference = dataclasses.replace(ours, note=f"{planned}; {untimed}")
    assert not any("own kernels" in t for t in bench.misses([eager, both_reference, kernels]))

    function_step = "autograd step: function: timed once: a step through eager autograd 100.5 us, through "
    function_step += "kernelgate's Function 90.0 us (margin 5%)"
    kept = dataclasses.replace(ours, time_us=150.0, frac_of_copy=0.33, note=f"{planned}; {function_step}")
    texts = bench.misses([eager, kept, kernels])
    (slower,) = [t for t in texts if "slower than eager" in t]
    assert slower.endswith(
        "; its step was timed once through kernelgate's Function at 90.0 us against eager autograd's 100.5 us, "
        "so the Function was kept, but measured here it took 150.0 us: the Function's host time varies from "
        "step to step"
    ), slower
    (bandwidth,) = [t for t in texts if "of copy bandwidth" in t]
    assert "most of the step is the autograd step (host time), not the kernels" in bandwidth, bandwidth
    digest = bench.write_summary([eager, kept, kernels], tmp_path / "summary.md").read_text()
    assert f"| {base.op} | forward+backward | 1 | 1 | 1 | 0 | 2 | 0 | 0 | 1 | 0 | 0 |" in digest

    # Measured with steps back to back, as the timing ran them, the Function was no slower than eager: the miss says
    # the choice holds in that regime and this measurement's idle GPU before each step adds the host's time.
    steady_eager = dataclasses.replace(eager, host_us=100.0)
    steady_kept = dataclasses.replace(kept, host_us=95.0)
    (slower,) = [t for t in bench.misses([steady_eager, steady_kept, kernels]) if "slower than eager" in t]
    assert slower.endswith(
        "measured here it took 150.0 us. With steps issued back to back, the regime that timing chose for, it took "
        "95.0 us against eager's 100.0: the choice holds there; here each step starts on an idle GPU after an L2 "
        "flush, and the Function's longer host time adds to the device's"
    ), slower
    # Timed with the GPU held after each flush, the clause says so.
    timer = "device-time median as do_bench (L2 flushed, then the GPU held 100 us so the host has issued the call"
    held = [dataclasses.replace(r, timer=timer + ")") for r in (steady_eager, steady_kept, kernels)]
    (slower,) = [t for t in bench.misses(held) if "slower than eager" in t]
    assert slower.endswith(
        "here each step starts after an L2 flush and 100 us of the GPU held, past which the host's time counts, "
        "and the Function's longer host time adds to the device's"
    ), slower
    # Timed with a hold that grows past each step's issue time, the time is the device's, and the clause says so.
    timer = (
        "device-time median as do_bench (L2 flushed, then the GPU held 100 us, or 1.5 times the call's host issue "
        "time where longer, so the host has issued the call before its start event)"
    )
    held = [dataclasses.replace(r, timer=timer) for r in (steady_eager, steady_kept, kernels)]
    (slower,) = [t for t in bench.misses(held) if "slower than eager" in t]
    assert slower.endswith(
        "here each step starts after an L2 flush and the GPU held past its host issue time, so the time measured is "
        "the device's, and the Function's step takes the longer there"
    ), slower
    slow_steady = dataclasses.replace(kept, host_us=120.0)
    (slower,) = [t for t in bench.misses([steady_eager, slow_steady, kernels]) if "slower than eager" in t]
    assert slower.endswith("the Function's host time varies from step to step"), slower

    # A Function step kept without timing (tuning off, a forced backward): no timing to name.
    untimed = dataclasses.replace(kept, note=f"{planned}; autograd step: function: tuning is off: kept")
    assert not any("timed once" in t for t in bench.misses([eager, untimed, kernels]))

    # Kept by the device's time, though slower back to back: the miss gives the device's times and both steps.
    by_device = "autograd step: function: timed once: a step through eager autograd 100.5 us, through kernelgate's "
    by_device += "Function 300.0 us (margin 5%); on the device, the host's time hidden: eager autograd 95.0 us a step, "
    by_device += "the Function 60.0 us; the device's share of eager autograd's step back to back is 95%, at least 50%, "
    by_device += "so the device's time decides"
    device_kept = dataclasses.replace(kept, note=f"{planned}; {by_device}")
    (slower,) = [t for t in bench.misses([eager, device_kept, kernels]) if "slower than eager" in t]
    assert slower.endswith(
        "; its step was timed once on the device, the host's time hidden, at 60.0 us through kernelgate's Function "
        "against eager autograd's 95.0 us, so the Function was kept (back to back, where its host time counts, "
        "300.0 us against 100.5), but measured here it took 150.0 us"
    ), slower


def test_first_calls_of_several_ops_add_up_in_an_all_ops_row(interpreted: list[bench.BenchRow], tmp_path: Path) -> None:
    """With more than one op, the First calls table ends with their sums per implementation and in all."""
    renamed = [dataclasses.replace(r, op="softmax_copy") for r in interpreted]
    text = bench.write_summary([*interpreted, *renamed], tmp_path / "summary.md").read_text()
    first = text.split("## First calls")[1].split("## Targets missed")[0]
    rows = {line.split("|")[1].strip(): line for line in first.splitlines() if line.startswith("| ")}
    one = [float(c) for c in rows["softmax"].strip("|").split("|")[1:]]
    both = [float(c) for c in rows["all ops"].strip("|").split("|")[1:]]
    assert both == pytest.approx([2 * c for c in one], abs=0.11)
    only_one = bench.write_summary(interpreted, tmp_path / "one.md").read_text()
    assert "| all ops |" not in only_one


def test_cross_entropy_kernels_forward_backward_use_the_forward_with_grad(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A triton:<name> forward+backward row of cross_entropy ("mean") runs that implementation of
    cross_entropy_with_grad and hands its gradient to the backward, as eager autograd does (without grad: no
    recomputing backward runs); the row says so, and names the twin that formed its gradient. kernelgate's row names
    the decision stored for cross_entropy_with_grad's bucket, which its step ran."""
    module = importlib.import_module("kernelgate.ops.cross_entropy")  # the package exports the op by that name
    recomputed: list[bool] = []
    real = module.cross_entropy_backward
    monkeypatch.setattr(module, "cross_entropy_backward", lambda *a: recomputed.append(True) or real(*a))
    kernelgate.reload_settings({"KERNELGATE_CACHE_DIR": str(tmp_path / "cache")})
    suite = bench.Suite(("float32",), {"cross_entropy": (bench.ShapeGroup(shapes=((3, 20000),)),)})
    rows = bench.run(
        ["cross_entropy"], suite=suite, interpret=True, compile=False, cpu_repeats=1, host_calls=2, latency_bytes=1
    )
    direct = [r for r in rows if r.impl.startswith("triton:") and r.direction == "forward+backward"]
    assert direct and all(r.status == "ok" for r in direct), [(r.impl, r.status, r.note) for r in direct]
    assert all("its forward as cross_entropy_with_grad" in r.note for r in direct)
    for r in direct:
        assert f"; forward with the gradient ran: {r.impl.removeprefix('triton:')}[" in r.note, r.note
    (ours,) = [r for r in rows if r.impl == "kernelgate" and r.direction == "forward+backward"]
    assert re.search(r"; forward with the gradient ran: (reference|\w+\[)", ours.note), ours.note
    assert "backward ran" not in ours.note, ours.note
    assert recomputed == [], "a triton row's backward recomputed the gradient its forward wrote"


def test_cross_entropy_misses_state_the_looped_gradient_reads_the_logits_twice(
    interpreted: list[bench.BenchRow],
) -> None:
    """cross_entropy's forward+backward counts the logits read once and the gradient written once (2*M*V*e); its
    looped forward with the gradient reads them a second time, 3/2 of that, at most 0.67 of copy, which a miss
    there states. split_rows holds the row and reads it once (no clause); split_looped reads each segment twice,
    the second mostly from L2 (the clause says so past the bound); the forward alone, looped or not, reads each row
    once."""
    rows, vocab = 4096, 128256
    minimal = 2 * rows * vocab * 2 + 8 * rows
    base = next(r for r in interpreted if r.direction == "forward" and r.impl == "eager")
    eager = dataclasses.replace(
        base, op="cross_entropy", dtype="bfloat16", shape=f"{rows}x{vocab}", rows=rows, row_length=vocab,
        regime="bandwidth", direction="forward+backward", time_us=8860.0, host_us=math.nan, bytes=minimal,
        frac_of_copy=0.08, note="",
    )  # fmt: skip
    ran = "; forward with the gradient ran: looped[BLOCK_N=8192,NUM_STAGES=3,num_warps=16]"
    ours = dataclasses.replace(eager, impl="kernelgate", time_us=1049.0, frac_of_copy=0.658, note=f"auto: looped{ran}")
    looped = dataclasses.replace(ours, impl="triton:looped", time_us=1071.0, frac_of_copy=0.645, note=f"looped{ran}")
    (text,) = [t for t in bench.misses([eager, ours, looped]) if "bandwidth (target 0.80)" in t]
    assert (
        "its kernels stream rows twice (its looped forward with the gradient, M*V*e: the logits read again for the "
        f"gradient), 1.50 times the bytes the formula counts: at most 0.67 of copy with every pass from memory, and "
        f"it reaches {0.645 / (minimal / (minimal + rows * vocab * 2)):.2f} of that"
    ) in text, text
    split = "; forward with the gradient ran: split_rows[BLOCK_N=4096,num_warps=4]"
    once = [dataclasses.replace(r, note=f"split_rows{split}") for r in (ours, looped)]
    (text,) = [t for t in bench.misses([eager, *once]) if "bandwidth (target 0.80)" in t]
    assert "stream rows twice" not in text, text
    # split_looped reads each segment twice too, the second mostly from L2: past the bound, the clause says so.
    segments = "; forward with the gradient ran: split_looped[BLOCK_N=16384,NUM_STAGES=3,STREAM_N=4096,num_warps=8]"
    twice = [dataclasses.replace(r, frac_of_copy=0.78, note=f"auto: split_looped{segments}") for r in (ours, looped)]
    (text,) = [t for t in bench.misses([eager, *twice]) if "bandwidth (target 0.80)" in t]
    assert (
        "its kernels stream rows twice (its split_looped forward with the gradient, M*V*e: the logits read again "
        "for the gradient), 1.50 times the bytes the formula counts: at most 0.67 of copy with every pass from "
        "memory, and it reaches 0.78, so part of the second pass came from L2"
    ) in text, text
    # A step faster than the triton:* rows (the forward and backward launched apart, not the forward with the
    # gradient) is not described by their kernels, but by its own.
    faster = dataclasses.replace(ours, time_us=889.0, frac_of_copy=0.777, note=f"auto: looped[BLOCK_N=4096]{segments}")
    (text,) = [t for t in bench.misses([eager, faster, looped]) if "bandwidth (target 0.80)" in t]
    assert (
        "its step is faster than its kernels called without autograd (triton:looped, 0.65 of copy), so the kernels "
        "it ran, not the autograd step, are short of the target; its kernels stream rows twice (its split_looped "
        "forward with the gradient"
    ) in text, text
    assert "its kernels alone" not in text and "ran: looped[BLOCK_N=8192" not in text, text
    forward = [
        dataclasses.replace(r, direction="forward", bytes=rows * vocab * 2 + 8 * rows, frac_of_copy=f, note=n)
        for r, f, n in ((eager, 0.2, ""), (ours, 0.85, "auto: looped[BLOCK_N=4096]"), (looped, 0.85, "looped"))
    ]
    (text,) = [t for t in bench.misses(forward) if "bandwidth (target 0.90)" in t]
    assert "stream rows twice" not in text, text


def test_the_commit_is_marked_where_the_source_differs_from_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without KERNELGATE_COMMIT the provenance is the source tree's HEAD, marked ``+changes`` where the package's
    files differ from it: a tree copied onto a GPU machine beside an older checkout's .git was labelled with that
    older commit. Without git, ``unknown``."""
    monkeypatch.delenv("KERNELGATE_COMMIT", raising=False)
    answers: dict[str, str | None] = {"rev-parse": "abc1234", "status": ""}
    monkeypatch.setattr(bench_runner, "_git", lambda directory, command, *rest: answers[command])
    assert bench_runner._commit() == "abc1234"
    answers["status"] = " M src/kernelgate/ops/softmax/kernels.py"
    assert bench_runner._commit() == "abc1234+changes"
    answers["rev-parse"] = None
    assert bench_runner._commit() == "unknown"
    monkeypatch.setenv("KERNELGATE_COMMIT", "def5678")
    assert bench_runner._commit() == "def5678"


def _rms_norm_step_rows(
    interpreted: list[bench.BenchRow], rows: int, n: int, note: str
) -> tuple[bench.BenchRow, bench.BenchRow]:
    """An eager and a kernelgate row of rms_norm bf16 forward+backward at rows x n (bandwidth shape, minimal bytes
    5*M*N + 3*N elements), kernelgate's below the target, from an interpreted row's provenance."""
    base = next(r for r in interpreted if r.direction == "forward" and r.impl == "eager")
    eager = dataclasses.replace(
        base, op="rms_norm", dtype="bfloat16", shape=f"{rows}x{n}", rows=rows, row_length=n, regime="bandwidth",
        direction="forward+backward", time_us=600.0, host_us=math.nan, bytes=(5 * rows * n + 3 * n) * 2,
        frac_of_copy=0.25, note="",
    )  # fmt: skip
    return eager, dataclasses.replace(eager, impl="kernelgate", time_us=270.0, frac_of_copy=0.55, note=note)


def test_a_miss_of_kernels_that_stream_rows_twice_states_the_bound_that_sets(
    interpreted: list[bench.BenchRow],
) -> None:
    """Where the best kernels short of the target stream rows twice (a looped forward; a backward past one block),
    the miss gives their bytes over the formula's and the bound at the copy rate: at bf16 512x131072 rms_norm's
    looped forward reads x again (M*N*e) and its backward x and dy (2*M*N*e), 8/5 of the formula's 5*M*N*e, at
    most 0.63 of copy (5/8, and the weight's bytes). Rows that fit one block, or a single-block forward, add no
    such clause."""
    rows, n = 512, 131072
    eager, ours = _rms_norm_step_rows(interpreted, rows, n, "auto: looped[x] (")
    minimal = eager.bytes
    looped = dataclasses.replace(ours, impl="triton:looped", time_us=260.0, frac_of_copy=0.58, note="")
    bound = minimal / (minimal + 3 * rows * n * 2)
    assert f"{bound:.2f}" == "0.63"
    texts = [t for t in bench.misses([eager, ours, looped]) if "bandwidth (target 0.80)" in t]
    assert len(texts) == 1, texts
    assert (
        "its kernels stream rows twice (its looped forward, M*N*e: x read again; its backward past one block of "
        "16384, 2*M*N*e: x and dy read again), 1.60 times the bytes the formula counts: at most 0.63 of copy with "
        f"every pass from memory, and it reaches {0.58 / bound:.2f} of that"
    ) in texts[0], texts[0]
    # A single-block forward reads x once: only the backward's second pass counts (7/5 of the formula's bytes).
    single = dataclasses.replace(looped, impl="triton:single_block")
    (text,) = [t for t in bench.misses([eager, ours, single]) if "bandwidth (target 0.80)" in t]
    assert "(its backward past one block of 16384, 2*M*N*e: x and dy read again), 1.40 times" in text, text
    # Rows of one block: the backward reads each row once, and a single-block forward adds nothing either.
    short = {"shape": "65536x1024", "rows": 65536, "row_length": 1024}
    rows_short = [dataclasses.replace(r, **short) for r in (eager, ours, single)]
    assert all("stream rows twice" not in t for t in bench.misses(rows_short))


def test_the_backward_a_row_says_ran_decides_its_second_pass(interpreted: list[bench.BenchRow]) -> None:
    """Where a forward+backward row's note names the backward that ran, that decides whether it streams rows twice:
    a split backward at rows of 16384 does (one block would hold them), a single-block one at 32768 does not, nor
    does a split_rows one (a row's blocks held by programs that exchange its sums) at 32768; the run writes the
    decision into every forward+backward row of kernelgate and its kernels at bandwidth shapes."""
    eager, ours = _rms_norm_step_rows(interpreted, 4096, 16384, "auto: single_b (")
    split = dataclasses.replace(
        ours, impl="triton:single_block", note="single_block[ROWS=1]; backward ran: split[BLOCK_N=1024,num_warps=8]"
    )
    (text,) = [t for t in bench.misses([eager, ours, split]) if "bandwidth (target 0.80)" in t]
    assert "(its split backward, 2*M*N*e: x and dy read again), 1.40 times" in text, text
    long = {"shape": "2048x32768", "rows": 2048, "row_length": 32768}
    for ran in ("single_block[ROWS=1,num_warps=32]", "split_rows[BLOCK_N=4096,PER_SM=2,PREFETCH=0,num_warps=8]"):
        once = dataclasses.replace(split, note=f"single_block[ROWS=1]; backward ran: {ran}")
        (text,) = [
            t
            for t in bench.misses([dataclasses.replace(r, **long) for r in (eager, ours, once)])
            if "bandwidth (target 0.80)" in t
        ]
        assert "stream rows twice" not in text, (ran, text)
    recorded = [
        r
        for r in interpreted
        if r.direction == "forward+backward" and r.regime == "bandwidth" and r.status == "ok"
        and (r.impl == "kernelgate" or r.impl.startswith("triton:"))
    ]  # fmt: skip
    assert recorded and all(re.search(r"; backward ran: (reference|\w+\[)", r.note) for r in recorded), [
        r.note for r in recorded
    ]


def test_summary_counts_how_the_forward_backward_steps_ran(interpreted: list[bench.BenchRow], tmp_path: Path) -> None:
    """A table after the targets counts, per op and regime, the path each forward+backward step took as its row's
    note says: the Function kept by the timing back to back or by the device's time, kept untimed, eager autograd
    by a timing or where both passes run the reference; a note without the path counts as not recorded."""
    base = next(r for r in interpreted if r.direction == "forward+backward" and r.impl == "kernelgate")
    timed = "autograd step: {}: timed once: a step through eager autograd 100.0 us, through kernelgate's Function {}"
    device = "; on the device, the host's time hidden: ...; the device's share of eager autograd's step back to back "
    by_device = "at least 50%, so the device's time decides"
    notes = [
        timed.format("function", "90.0 us (margin 5%)"),
        timed.format("function", "300.0 us (margin 5%)") + device + f"is 80%, {by_device}",
        timed.format("function", "300.0 us (margin 5%)") + device + f"is 81%, {by_device}",
        "autograd step: function: mode triton: every autograd call runs kernelgate's Function",
        timed.format("eager", "300.0 us (margin 5%)") + device + "is 20%, under 50%, so the steps back to back decide",
        "autograd step: eager: the forward and its backward both run the reference: eager autograd does the same work",
        "auto: looped (tuned)",
    ]
    rows = [
        dataclasses.replace(base, shape=f"{i + 1}x64", regime="bandwidth", note=f"auto: looped (tuned); {note}")
        if note.startswith("autograd")
        else dataclasses.replace(base, shape=f"{i + 1}x64", regime="bandwidth", note=note)
        for i, note in enumerate(notes)
    ]
    text = bench.write_summary(rows, tmp_path / "summary.md").read_text()
    table = text[text.index("## How the forward+backward steps ran") : text.index(f"## {base.op} {base.dtype}")]
    assert f"| {base.op} | bandwidth | 1 | 2 | 1 | 1 | 1 | 1 |" in table, table
    assert text.index("## Targets at a glance") < text.index("## How the forward+backward steps ran")


def test_latency_host_cost_is_the_fastest_of_rounds_interleaved_across_implementations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a latency shape each implementation's host cost is measured in HOST_ROUNDS rounds, every implementation
    once a round, and the row keeps the fastest: a slow stretch of the host lands on each alike. One whose
    measurement raises keeps no host cost, and its row says why."""
    assert bench_runner.HOST_ROUNDS == 3
    order: list[Callable[[], object]] = []  # holding each step, so no two share an id
    per_round = (30.0, 10.0, 20.0)

    def host_us(step: Callable[[], object], device: torch.device, calls: int) -> float:
        order.append(step)
        return per_round[sum(s is step for s in order) - 1]

    monkeypatch.setattr(bench_runner, "per_call_us", host_us)
    kernelgate.reload_settings({"KERNELGATE_CACHE_DIR": str(tmp_path / "cache")})
    suite = bench.Suite(("float32",), {"softmax": (bench.ShapeGroup(shapes=((3, 64),)),)})
    rows = bench.run(
        ["softmax"], suite=suite, interpret=True, compile=False, cpu_repeats=1, host_calls=2, latency_bytes=1 << 30
    )
    measured = [r for r in rows if r.status == "ok"]
    assert measured and all(r.regime == "latency" and r.host_us == 10.0 for r in measured), rows
    # Per direction: the implementations in turn, three times over.
    for direction in ("forward", "forward+backward"):
        impls = sum(r.direction == direction for r in measured)
        stretch, order[:] = order[: 3 * impls], order[3 * impls :]
        assert stretch == stretch[:impls] * 3 and len({id(s) for s in stretch}) == impls, direction
    assert "fastest of 3 rounds interleaved" in measured[0].timer

    def failing(step: Callable[[], object], device: torch.device, calls: int) -> float:
        raise RuntimeError("host timing failed")

    monkeypatch.setattr(bench_runner, "per_call_us", failing)
    rows = bench.run(
        ["softmax"], suite=suite, interpret=True, compile=False, cpu_repeats=1, host_calls=2, latency_bytes=1 << 30
    )
    measured = [r for r in rows if r.status == "ok"]
    assert measured and all(math.isnan(r.host_us) for r in measured)
    assert all("host cost or memory not measured: RuntimeError: host timing failed" in r.note for r in measured)
