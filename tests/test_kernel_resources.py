"""Kernels compiled, not run, and their registers and local memory read from the cubin: kernelgate.bench.resources,
the bench summary's notes on forward misses, and benchmarks/kernel_resources.py (every candidate configuration)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelgate.bench import resources
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


def test_an_implementations_kernels_are_compiled_not_run_and_their_resources_read(triton_cache: Path) -> None:
    """kernelgate.bench.resources: rms_norm's single-block candidate at 4x1024 float32, named as tuning names it,
    compiles (for sm_90 without a GPU) to one kernel whose registers and warps are read from its cubin; a label
    that is not among the candidates is refused with what it was."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    op = get_op("rms_norm")
    [impl] = [i for i in op.implementations if i.name == "single_block"]
    assert op.make_inputs is not None
    config = impl.candidate_configs(op.make_inputs((4, 1024), torch.float32, device))[0]
    assert config is not None
    label = f"single_block[{config_label(config)}]"
    [found] = resources.implementation_resources("rms_norm", (4, 1024), torch.float32, label, device)
    assert found.kernel == "_rms_norm_fwd_kernel" and found.num_warps == config["num_warps"]
    assert 0 < found.registers <= 255 and found.local_bytes >= 0 and found.programs_per_sm >= 1
    clause = resources.describe([found], 90, "3.x")
    assert clause.startswith(f"; its kernel _rms_norm_fwd_kernel keeps {found.registers} registers a thread")
    with pytest.raises(KeyError, match=r"single_block\[num_warps=3\] is not among rms_norm's candidates"):
        resources.implementation_resources("rms_norm", (4, 1024), torch.float32, "single_block[num_warps=3]", device)


def test_a_steps_kernels_are_collected_in_launch_order_once_each(triton_cache: Path) -> None:
    """step_resources of a step that launches rms_norm's single-block forward twice and then its backward's
    single-block kernel: the forward kernel once, then the backward's, each read from its cubin, nothing run."""
    from kernelgate.selection import run_candidate

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    forward, backward = get_op("rms_norm"), get_op("rms_norm_backward")
    assert forward.make_inputs is not None and backward.make_inputs is not None
    fwd_values = forward.make_inputs((4, 1024), torch.float32, device)
    bwd_values = backward.make_inputs((4, 1024), torch.float32, device)
    [fwd_impl] = [i for i in forward.implementations if i.name == "single_block"]
    [bwd_impl] = [i for i in backward.implementations if i.name == "single_block"]
    fwd_config = fwd_impl.candidate_configs(fwd_values)[0]
    bwd_config = bwd_impl.candidate_configs(bwd_values)[0]

    def step() -> None:
        for _ in range(2):
            run_candidate(fwd_impl, fwd_config, fwd_values, interpret=False, poison=False)
        run_candidate(bwd_impl, bwd_config, bwd_values, interpret=False, poison=False)

    found = resources.step_resources(step)
    names = [r.kernel for r in found]
    assert names[0] == "_rms_norm_fwd_kernel" and names.count("_rms_norm_fwd_kernel") == 1, names
    assert "_rms_norm_bwd_kernel" in names and all(0 < r.registers <= 255 for r in found), found


@pytest.mark.parametrize(
    ("num_warps", "registers", "shared_bytes", "programs"),
    [
        (16, 101, 1024, 1),  # registers: 104 a thread, 512 threads, 53248 of 65536
        (8, 255, 0, 1),  # registers: 256 a thread (a warp's share rounded up to 256), 2048 a warp, all 65536
        (4, 32, 0, 16),  # threads and registers: 2048 threads a multiprocessor
        (1, 16, 0, 32),  # resident blocks
        (4, 32, 100 * 1024, 2),  # shared memory: 228 KiB, 1 KiB reserved a block
    ],
)
def test_programs_a_multiprocessor_follow_the_scarcest_resource(
    num_warps: int, registers: int, shared_bytes: int, programs: int
) -> None:
    """An sm_90 multiprocessor holds as many programs as its registers, threads, blocks and shared memory allow."""
    found = resources.KernelResources("_k", num_warps, registers, 0, shared_bytes)
    assert found.programs_per_sm == programs


def test_the_cli_adds_the_kernels_resources_to_a_redrawn_forward_miss(tmp_path: Path) -> None:
    """kernelgate bench --plot CSV --kernel-arch 90 compiles the kernels behind a forward bandwidth miss for sm_90
    (no GPU needed) and ends that miss in summary.md with their registers and local memory."""
    from kernelgate.bench import BenchRow, write_csv

    common = dict(
        op="rms_norm", dtype="float32", shape="4x1024", rows=4, row_length=1024, regime="bandwidth", target_bytes=0,
        direction="forward", status="ok", host_us=float("nan"), bytes=32768, byte_formula="2*M*N*e", gbps=1.0,
        copy_gbps=10.0, peak_mib=0.0, first_call_ms=1.0, device="cuda:0", gpu="NVIDIA H200", driver="",
        torch_version="",
        triton_version="", kernelgate_version="", kernelgate_commit="", liger_version="", timer="", started="",
    )  # fmt: skip
    op = get_op("rms_norm")
    [impl] = [i for i in op.implementations if i.name == "single_block"]
    assert op.make_inputs is not None
    config = impl.candidate_configs(op.make_inputs((4, 1024), torch.float32, torch.device("cpu")))[0]
    assert config is not None
    label = f"single_block[{config_label(config)}]"
    rows = [
        BenchRow(**common, impl="eager", time_us=10.0, frac_of_copy=0.5, note=""),  # type: ignore[arg-type]
        BenchRow(**common, impl="kernelgate", time_us=9.0, frac_of_copy=0.6, note=f"auto: {label} (tuned)"),  # type: ignore[arg-type]
    ]
    csv_path = write_csv(rows, tmp_path / "bench.csv")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELGATE_")}
    result = subprocess.run(
        [sys.executable, "-m", "kernelgate", "bench", "--plot", str(csv_path), "--kernel-arch", "90"],
        capture_output=True,
        text=True,
        env={**env, "TRITON_CACHE_DIR": str(tmp_path / "triton"), "KERNELGATE_CACHE_DIR": str(tmp_path / "cache")},
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = (tmp_path / "summary.md").read_text().splitlines()
    [miss] = [line for line in summary if line.startswith("- rms_norm") and "of copy bandwidth" in line]
    assert re.search(
        r"; kernelgate's kernel _rms_norm_fwd_kernel keeps \d+ registers a thread at \d+ warps and "
        r"(none|\d+ bytes a thread) in local memory: \d+ programs? a multiprocessor, \d+ of its 64 warps "
        r"\(compiled for sm_90 by Triton ",
        miss,
    ), miss
