"""benchmarks/split_rows_variants.py: softmax's and rms_norm's long-row forwards against variants of their kernels."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def variants_script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("triton")
    return benchmark_script("split_rows_variants")


def test_every_variant_matches_the_reference_interpreted(variants_script: ModuleType, tmp_path: Path) -> None:
    """Interpreted (where a kernel's programs do not wait for each other: the partials, then the rest), each
    variant of each op at every configuration that suits a row of 20000 matches the reference; the result has
    provenance and no timing. Every variant suits a row of 20000 (one block holds up to 32768); the grouped and
    pipelined ones loop over both rows in one group at two programs a multiprocessor."""
    out = tmp_path / "variants.json"
    args = ["--interpret", "--rows", "2", "--lengths", "20000", "--dtype", "float32", "--out", str(out)]
    assert variants_script.main(args) == 0
    result = json.loads(out.read_text())
    assert result["copy_gbps"] is None and "kernelgate_commit" in result
    assert [(c["op"], c["shape"]) for c in result["cases"]] == [("softmax", [2, 20000]), ("rms_norm", [2, 20000])]
    softmax, rms_norm = ({r["variant"] for r in c["results"]} for c in result["cases"])
    assert softmax == {
        "split_rows", "split_grouped", "split_pipelined", "split_tagged", "split_one_exp", "split_one_exp_last",
        "split_one_exp_volatile", "looped", "single_block", "single_block_reciprocal", "persistent",
        "persistent_reciprocal",
    }  # fmt: skip
    assert rms_norm == {
        "split_rows", "split_grouped", "split_pipelined", "split_tagged", "split_last", "split_volatile"
    }  # fmt: skip
    for case in result["cases"]:
        for r in case["results"]:
            assert r["matches_reference"] is True and "time_us" not in r, r


def test_only_times_the_named_variants_and_layer_norm_offers_its_split_variants(
    variants_script: ModuleType, tmp_path: Path
) -> None:
    """``--only`` keeps the named variants and drops the rest; layer_norm's split variants, split_recompute_zero's
    float32 deviations formed again among them, match the reference interpreted (in bfloat16 too: split_looped runs
    only for 2-byte inputs, and split_pipelined's copies of x, the weight and the bias fit only at 2 bytes)."""
    out = tmp_path / "variants.json"
    named = ("split_rows", "split_recompute_zero", "split_looped", "split_pipelined")
    only = [arg for name in named for arg in ("--only", name)]
    args = ["--interpret", "--op", "layer_norm", "--rows", "2", "--lengths", "40000", *only, "--out", str(out)]
    assert variants_script.main(args) == 0
    cases = json.loads(out.read_text())["cases"]
    assert [(c["op"], c["dtype"]) for c in cases] == [("layer_norm", "float32"), ("layer_norm", "bfloat16")]
    float32, bfloat16 = ({r["variant"] for r in c["results"]} for c in cases)
    assert float32 == {"split_rows", "split_recompute_zero"}
    assert bfloat16 == {"split_rows", "split_recompute_zero", "split_looped", "split_pipelined"}
    for case in cases:
        for r in case["results"]:
            assert r["matches_reference"] is True and "time_us" not in r, r


@pytest.mark.parametrize("op_name", ["softmax", "rms_norm", "layer_norm"])
def test_the_pipelined_forwards_copy_their_blocks_ahead_for_sm90(
    variants_script: ModuleType, triton_cache: Path, op_name: str
) -> None:
    """Compiled for sm_90 (a compile-only driver where there is no GPU), the pipelined forwards' row loops hold
    asynchronous copies, of the bfloat16 blocks only: not of the row's float32 partials, which copied ahead would be
    read before the row's programs stored them."""
    import torch

    from kernelgate.launch import call_state
    from kernelgate.selection import run_candidate

    impl = next(i for i in variants_script.variants(op_name) if i.name == "split_pipelined")
    x = torch.randn(4, 40000).bfloat16()
    w = torch.rand(40000).bfloat16() + 0.5
    if op_name == "softmax":
        values: tuple[object, ...] = (x, -1)
    elif op_name == "rms_norm":
        values = (x, w, 1e-6)
    else:
        values = (x, (40000,), w, torch.randn(40000).bfloat16(), 1e-5)
    call_state.collect = []
    try:
        config = {"BLOCK_N": 8192, "num_warps": 16, "PER_SM": 2, "PREFETCH": 1}
        run_candidate(impl, config, values, interpret=False, poison=False)
    finally:
        call_state.collect = None
    ttgir = "".join(p.read_text() for p in triton_cache.rglob("*.ttgir") if "pipelined" in p.name)
    copied = [line for line in ttgir.splitlines() if "ttg.async_copy_global_to_local" in line]
    assert copied and all("!tt.ptr<bf16>" in line for line in copied), copied


@pytest.mark.parametrize(("op_name", "exchanged"), [("softmax", 2), ("rms_norm", 1)])
def test_the_tagged_forwards_exchange_without_atomics_for_sm90(
    variants_script: ModuleType, triton_cache: Path, op_name: str, exchanged: int
) -> None:
    """Compiled for sm_90 (a compile-only driver where there is no GPU), the split_tagged forwards exchange a row's
    partials (softmax's max and sum, rms_norm's sum) by relaxed 64-bit stores and polling loads, with no atomic;
    two launches, so two tags, make one kernel."""
    import torch

    from kernelgate.launch import call_state
    from kernelgate.selection import run_candidate

    impl = next(i for i in variants_script.variants(op_name) if i.name == "split_tagged")
    x = torch.randn(4, 40000).bfloat16()
    values = (x, -1) if op_name == "softmax" else (x, torch.rand(40000).bfloat16() + 0.5, 1e-6)
    for _ in range(2):
        call_state.collect = []
        try:
            run_candidate(impl, {"BLOCK_N": 8192, "num_warps": 8, "maxnreg": 0}, values, interpret=False, poison=False)
        finally:
            call_state.collect = None
    ptx = [p for p in triton_cache.rglob("*.ptx") if "tagged" in p.name]
    assert len(ptx) == 1, ptx
    text = ptx[0].read_text()
    assert text.count("st.relaxed.gpu.global.b64") == exchanged
    assert text.count("ld.relaxed.gpu.global.b64") == exchanged
    assert "atom." not in text
