"""benchmarks/cluster_rows.py: the single-block forwards with a row spread over a thread-block cluster."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch


@pytest.fixture
def cluster_script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("triton")
    return benchmark_script("cluster_rows")


def _lowers_cluster_reductions() -> bool:
    """Whether the installed Triton compiles a reduction over a tensor spread over a cluster: 3.6.0's CTA-planning
    pass fails on one (an assertion that ends the process, so it is not tried here), 3.9.0 lowers it; the versions
    between are untested."""
    import triton

    major, minor = (int(part) for part in triton.__version__.split(".")[:2])
    return (major, minor) >= (3, 9)


def test_every_variant_matches_the_reference_interpreted(cluster_script: ModuleType, tmp_path: Path) -> None:
    """Interpreted (which runs a program's block whole, whatever num_ctas), each variant at every configuration that
    suits a row of 20000 matches the reference, and the result has provenance and no timing."""
    out = tmp_path / "cluster.json"
    args = ["--interpret", "--rows", "2", "--lengths", "20000", "--dtype", "float32", "--op", "rms_norm",
            "--op", "softmax", "--out", str(out)]  # fmt: skip
    assert cluster_script.main(args) == 0
    result = json.loads(out.read_text())
    assert result["copy_gbps"] is None and "kernelgate_commit" in result
    assert [(c["op"], c["shape"]) for c in result["cases"]] == [("rms_norm", [2, 20000]), ("softmax", [2, 20000])]
    for case in result["cases"]:
        assert {r["variant"] for r in case["results"]} == {"cluster", "split_rows", "looped", "single_block"}
        clusters = {
            (r["config"]["num_ctas"], r["config"]["num_warps"]) for r in case["results"] if r["variant"] == "cluster"
        }
        assert {ctas for ctas, _ in clusters} == {2, 4, 8, 16}, clusters
        for r in case["results"]:
            assert r["matches_reference"] is True and "time_us" not in r, r


@pytest.mark.skipif(not _lowers_cluster_reductions(), reason="this Triton does not lower cluster reductions")
def test_cubins_are_built_for_the_cluster_and_replace_the_stand_ins(cluster_script: ModuleType, tmp_path: Path) -> None:
    """Built for sm_90a without a GPU, each cluster configuration's kernel spreads the row over num_ctas blocks (a
    quarter of the loads a thread at num_ctas 4 against 1); on the run's side each stand-in compiled with num_ctas 1
    then carries the stored cubin, shared memory size and num_ctas."""
    from kernelgate.bench.resources import compile_only, compiled_kernels

    cubins, out = tmp_path / "cubins", tmp_path / "built.json"
    args = ["--build-cubins", str(cubins), "--rows", "4", "--lengths", "65536", "--dtype", "bfloat16",
            "--op", "rms_norm", "--out", str(out)]  # fmt: skip
    assert cluster_script.main(args) == 0
    (case,) = json.loads(out.read_text())["cases"]
    for r in case["results"]:
        assert r["num_ctas"] == r["config"]["num_ctas"] and r["local_bytes"] == 0, r
    op, values = cluster_script._inputs("rms_norm", torch.bfloat16, 4, 65536, torch.device("cpu"))
    per_cta = cluster_script._cluster_variant(op, replaced=False)
    with compile_only(90):
        loads = {
            ctas: compiled_kernels(per_cta, {"ROWS": 1, "num_ctas": ctas, "num_warps": 8}, values)[0]
            .asm["ptx"]
            .count("ld.global")
            for ctas in (1, 4)
        }
        assert loads[1] == 4 * loads[4], loads
        stand_in = cluster_script._cluster_variant(op, replaced=True)
        assert cluster_script.replace_kernels(cubins, stand_in, "rms_norm", values) == []
        for config in stand_in.candidate_configs(values):
            (kernel,) = compiled_kernels(stand_in, config, values)
            name = cluster_script._cubin_name("rms_norm", torch.bfloat16, (4, 65536), config)
            stored = json.loads((cubins / f"{name}.json").read_text())
            assert kernel.packed_metadata == (config["num_warps"], config["num_ctas"], stored["shared"])
            assert kernel.kernel == (cubins / f"{name}.cubin").read_bytes()
