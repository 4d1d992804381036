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
    """Interpreted, at 3 rows of 9000 (past SPLIT_MIN_COLS, a ragged last block), every configuration of split and
    split_rows of each norm backward, and of the lagged and staged variants of the rms norms', runs and matches the
    reference;
    the JSON has provenance and no timing."""
    pytest.importorskip("triton")
    script = benchmark_script("norm_backward_split_rows")
    out = tmp_path / "split-rows.json"
    args = ["--interpret", "--rows", "3", "--lengths", "9000", "--dtype", "float32", "--out", str(out)]
    assert script.main(args) == 0
    result = json.loads(out.read_text())
    assert result["copy_gbps"] is None and "kernelgate_commit" in result
    assert [case["op"] for case in result["cases"]] == [
        "rms_norm_backward", "add_rms_norm_backward", "layer_norm_backward"
    ]  # fmt: skip
    for case in result["cases"]:
        assert case["shape"] == [3, 9000]
        variants = {r["variant"] for r in case["results"]}
        variants_of_rms = {"split_rows_lagged", "split_rows_staged"}
        assert variants == {"split", "split_rows"} | (set() if case["op"] == "layer_norm_backward" else variants_of_rms)
        assert all(r["matches_reference"] and "time_us" not in r for r in case["results"]), case["op"]


@pytest.mark.parametrize("variant", ["split_rows_lagged", "split_rows_staged"])
@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize("op_name", ["rms_norm_backward", "add_rms_norm_backward"])
def test_the_variants_match_the_reference_over_several_groups(
    benchmark_script: Callable[[str], ModuleType], op_name: str, prefetch: int, variant: str
) -> None:
    """The lagged variant (each row's wait put off by a row, its last row finished after the loop) and the staged one
    (the row loop in tl.range stages) give the reference's dx and dweight, interpreted, where 7 rows of 3000 fall
    into 2 groups of 3 programs (4 and 3 rows), with and without PREFETCH."""
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
    got = run_candidate(script.split_rows_variant(op, variant), config, values, True, poison=True)
    expected = op.reference(*values)
    assert compare(got, expected, op.reduction_length(*values), normwise=op.normwise_outputs) is None


def test_the_lagged_variant_compiles_for_sm90(
    benchmark_script: Callable[[str], ModuleType], triton_cache: Path
) -> None:
    """The lagged kernel goes through Triton's compiler for sm_90 (a compile-only driver where there is no GPU), with
    and without PREFETCH, at bfloat16 rows of 16448 (a ragged last block)."""
    import torch

    import kernelgate
    from kernelgate.launch import call_state
    from kernelgate.selection import run_candidate

    script = benchmark_script("norm_backward_split_rows")
    op = kernelgate.rms_norm_backward
    assert op.make_inputs is not None
    values = tuple(op.make_inputs((2, 16448), torch.bfloat16, torch.device("cpu")))
    for prefetch in (0, 1):
        call_state.collect = []
        try:
            config = {"BLOCK_N": 4096, "num_warps": 8, "PER_SM": 2, "PREFETCH": prefetch}
            run_candidate(
                script.split_rows_variant(op, "split_rows_lagged"), config, values, interpret=False, poison=False
            )
        finally:
            call_state.collect = None
    lagged = [p for p in triton_cache.rglob("*.cubin") if "lagged" in p.name]
    assert len(lagged) == 2, lagged  # one each with and without PREFETCH


def test_the_staged_variant_pipelines_its_row_loop_for_sm90(
    benchmark_script: Callable[[str], ModuleType], triton_cache: Path
) -> None:
    """Compiled for sm_90, the staged kernel's row loop holds asynchronous copies (cp.async) with PREFETCH (three
    tl.range stages) and none without: its wait and barrier, in inline assembly, leave the loop one that Triton's
    pipeliner takes (a while loop or a tl.debug_barrier in it, as in the package's kernel, and it takes none). The
    copies are of the bfloat16 blocks only: the row's float32 partials, copied ahead, would be read before the row's
    programs stored them (on an H100 the variant returned NaN that way)."""
    import torch

    import kernelgate
    from kernelgate.launch import call_state
    from kernelgate.selection import run_candidate

    script = benchmark_script("norm_backward_split_rows")
    op = kernelgate.rms_norm_backward
    assert op.make_inputs is not None
    values = tuple(op.make_inputs((2, 16448), torch.bfloat16, torch.device("cpu")))
    copies = {}
    for prefetch in (0, 1):
        call_state.collect = []
        try:
            config = {"BLOCK_N": 4096, "num_warps": 8, "PER_SM": 2, "PREFETCH": prefetch}
            run_candidate(
                script.split_rows_variant(op, "split_rows_staged"), config, values, interpret=False, poison=False
            )
        finally:
            call_state.collect = None
        ptx = [p for p in triton_cache.rglob("*.ptx") if "staged" in p.name]
        copies[prefetch] = sum(p.read_text().count("cp.async.c") for p in ptx)
    assert copies[0] == 0 and copies[1] > 0, copies
    ttgir = "".join(p.read_text() for p in triton_cache.rglob("*.ttgir") if "staged" in p.name)
    copied = [line for line in ttgir.splitlines() if "ttg.async_copy_global_to_local" in line]
    assert copied and all("!tt.ptr<bf16>" in line for line in copied), copied
