"""benchmarks/norm_backward_split_rows.py: the norms' split and split_rows backwards at every configuration."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


def test_every_configuration_is_checked_interpreted(
    benchmark_script: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    """Interpreted, at 3 rows of 9000 in bfloat16 (past SPLIT_MIN_COLS, a ragged last block), every configuration of
    split, split_rows, split_rows_pipelined and the tagged variant of each norm backward runs and matches the
    reference; the JSON has provenance and no timing."""
    pytest.importorskip("triton")
    script = benchmark_script("norm_backward_split_rows")
    out = tmp_path / "split-rows.json"
    args = ["--interpret", "--rows", "3", "--lengths", "9000", "--dtype", "bfloat16", "--out", str(out)]
    assert script.main(args) == 0
    result = json.loads(out.read_text())
    assert result["copy_gbps"] is None and "kernelgate_commit" in result
    assert [case["op"] for case in result["cases"]] == [
        "rms_norm_backward", "add_rms_norm_backward", "layer_norm_backward"
    ]  # fmt: skip
    for case in result["cases"]:
        assert case["shape"] == [3, 9000]
        variants = {r["variant"] for r in case["results"]}
        assert variants == {"split", "split_rows", "split_rows_pipelined", "split_rows_tagged"}
        assert all(r["matches_reference"] and "time_us" not in r for r in case["results"]), case["op"]


def test_per_sm_adds_crowded_pipelined_and_tagged_kernels_at_blocks_of_2048(
    benchmark_script: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    """``--per-sm 6`` adds the pipelined and tagged kernels at blocks of 2048 / 4 warps with 6 programs a
    multiprocessor (tuning's space has 4 there): one configuration each, which matches the reference interpreted;
    ``--op`` keeps one backward."""
    pytest.importorskip("triton")
    script = benchmark_script("norm_backward_split_rows")
    out = tmp_path / "crowded.json"
    args = ["--interpret", "--rows", "3", "--lengths", "9000", "--dtype", "bfloat16", "--out", str(out)]
    assert script.main([*args, "--op", "rms_norm_backward", "--per-sm", "6"]) == 0
    (case,) = json.loads(out.read_text())["cases"]
    crowded = [r for r in case["results"] if r["variant"].endswith("_6")]
    assert sorted(r["variant"] for r in crowded) == ["split_rows_pipelined_6", "split_rows_tagged_6"]
    for r in crowded:
        assert r["config"] == {"BLOCK_N": 2048, "PER_SM": 6, "PREFETCH": 1, "num_warps": 4}
        assert r["matches_reference"], r


VARIANTS = [
    (op_name, variant)
    for op_name in ("rms_norm_backward", "add_rms_norm_backward", "layer_norm_backward")
    for variant in ("split_rows_tagged", "split_rows_pipelined")
]


@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize(("op_name", "variant"), VARIANTS)
def test_the_variants_match_the_reference_over_several_groups(
    benchmark_script: Callable[[str], ModuleType], op_name: str, prefetch: int, variant: str
) -> None:
    """The tagged variants (the row's partials exchanged through slots tagged by the launch) and the package's
    pipelined split_rows of each norm (the row loop in tl.range stages) give the reference's gradients, interpreted,
    where 7 rows of 3000 fall into 2 groups of 3 programs (4 and 3 rows), with and without PREFETCH."""
    pytest.importorskip("triton")
    import torch

    import kernelgate
    from kernelgate.rowwise import split_rows_groups
    from kernelgate.selection import compare, run_candidate

    script = benchmark_script("norm_backward_split_rows")
    op = kernelgate.get_op(op_name)
    assert op.make_inputs is not None
    values = tuple(op.make_inputs((7, 3000), torch.bfloat16, torch.device("cpu")))
    config = {"BLOCK_N": 1024, "num_warps": 4, "PER_SM": 4, "PREFETCH": prefetch}
    assert split_rows_groups(torch.device("cpu"), 7, 3000, 1024, 4) == 2
    impl = next((i for i in op.implementations if i.name == variant), None) or script.tagged_variant(op)
    got = run_candidate(impl, config, values, True, poison=True)
    expected = op.reference(*values)
    assert compare(got, expected, op.reduction_length(*values), normwise=op.normwise_outputs) is None


@pytest.mark.parametrize(("op_name", "exchanged"), [("rms_norm_backward", 2), ("layer_norm_backward", 4)])
def test_the_tagged_variant_compiles_for_sm90_without_atomics(
    benchmark_script: Callable[[str], ModuleType], triton_cache: Path, op_name: str, exchanged: int
) -> None:
    """The tagged kernels go through Triton's compiler for sm_90 (a compile-only driver where there is no GPU) at
    bfloat16 rows of 16448 (a ragged last block), with PREFETCH (three stages): the loop copies the blocks ahead, and
    the exchange is a relaxed 64-bit store and a polling load a partial (rms_norm's two, layer_norm's four), with no
    atomic and no count. Two launches, so two tags, make one kernel (a tag never selects another specialisation)."""
    import torch

    import kernelgate
    from kernelgate.launch import call_state
    from kernelgate.selection import run_candidate

    script = benchmark_script("norm_backward_split_rows")
    op = kernelgate.get_op(op_name)
    assert op.make_inputs is not None
    values = tuple(op.make_inputs((2, 16448), torch.bfloat16, torch.device("cpu")))
    config = {"BLOCK_N": 4096, "num_warps": 8, "PER_SM": 2, "PREFETCH": 1}
    for _ in range(2):
        call_state.collect = []
        try:
            run_candidate(script.tagged_variant(op), config, values, interpret=False, poison=False)
        finally:
            call_state.collect = None
    ptx = [p for p in triton_cache.rglob("*.ptx") if "tagged" in p.name]
    assert len(ptx) == 1, ptx
    text = ptx[0].read_text()
    assert "cp.async" in text
    assert text.count("st.relaxed.gpu.global.b64") == exchanged
    assert text.count("ld.relaxed.gpu.global.b64") == exchanged
    assert "atom." not in text
