"""Every built-in kernel compiles for an H100/H200-class GPU (sm_90), here on the CPU.

Triton's interpreter, which runs the kernels in the other CPU tests, accepts programs its compiler would
reject (a non-constant where a compile-time value is needed, a layout the backend cannot lower). Here a
compile-only driver names sm_90, and each implementation's untuned configuration goes through Triton's
real compiler, ptxas included, without a GPU. On a GPU the compiled tests cover this.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from kernelgate.launch import call_state
from kernelgate.op import Op
from kernelgate.ops import BUILTIN_OPS
from kernelgate.selection import run_candidate

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the compiled tests cover this")

# A row that needs masks everywhere, and one that is a power of two (whole blocks).
SHAPES = [(3, 100), (2, 4096)]


def _cubins(cache: Path) -> set[Path]:
    return set(cache.rglob("*.cubin")) if cache.exists() else set()


def _compile(impl: Any, config: Any, values: tuple[Any, ...]) -> None:
    """Compile what one call of ``impl`` at ``config`` launches, without running it: launches only compile
    (Triton's warmup) while ``call_state.collect`` is set."""
    call_state.collect = []
    try:
        run_candidate(impl, config, values, interpret=False, poison=False)
    finally:
        call_state.collect = None


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", [op for op in BUILTIN_OPS if op.make_inputs is not None], ids=lambda op: op.name)
def test_every_implementation_compiles_for_sm90(triton_cache: Path, op: Op, shape: tuple[int, ...]) -> None:
    """Each implementation that accepts the shape compiles its kernels at its untuned configuration, in bf16 (the
    narrowest type the kernels convert from); every launch leaves a new cubin in the cache."""
    assert op.make_inputs is not None
    values = op.make_inputs(shape, torch.bfloat16, torch.device("cpu"))
    compiled = 0
    for impl in op.implementations:
        if impl.supports is not None and impl.supports(*values) is not None:
            continue
        before = _cubins(triton_cache)
        _compile(impl, impl.default_for(values), values)
        assert _cubins(triton_cache) - before, f"{op.name} {impl.name}: no kernel was compiled"
        compiled += 1
    assert compiled, f"{op.name}: no implementation accepts {shape}"


def test_implementations_for_long_rows_compile_for_sm90(triton_cache: Path) -> None:
    """Implementations that take only rows longer than one block (the persistent looped forwards, the split_looped
    forwards and cross_entropy_with_grad's) compile too, at their untuned configuration, at a row of 40000 elements
    in bf16 (a partial last block or segment)."""
    compiled = set()
    for op in BUILTIN_OPS:
        if op.make_inputs is None:
            continue
        short = op.make_inputs(SHAPES[-1], torch.bfloat16, torch.device("cpu"))
        values = op.make_inputs((2, 40000), torch.bfloat16, torch.device("cpu"))
        for impl in op.implementations:
            if impl.supports is None or impl.supports(*short) is None or impl.supports(*values) is not None:
                continue
            before = _cubins(triton_cache)
            _compile(impl, impl.default_for(values), values)
            assert _cubins(triton_cache) - before, f"{op.name} {impl.name}: no kernel was compiled"
            compiled.add(f"{op.name} {impl.name}")
    persistent_looped = {f"{name} persistent_looped" for name in ("softmax", "log_softmax", "rms_norm")}
    segments = ("softmax", "log_softmax", "layer_norm", "cross_entropy_with_grad")
    split_looped = {f"{name} split_looped" for name in segments}
    assert persistent_looped | split_looped <= compiled, compiled


# (op, implementation, a configuration with a compile-time switch on that the untuned configuration leaves off)
SWITCHED = [("layer_norm", "looped", {"BLOCK_N": 4096, "num_warps": 8, "PREFETCH": 1})]


@pytest.mark.parametrize(("op_name", "impl_name", "config"), SWITCHED, ids=[f"{s[0]}-{s[1]}" for s in SWITCHED])
def test_switched_configurations_compile_for_sm90(
    triton_cache: Path, op_name: str, impl_name: str, config: dict[str, int]
) -> None:
    """A configuration of the tuned space whose switch the tests above leave off compiles too, at a row of 16448
    elements in bf16 (a ragged last block)."""
    op = next(op for op in BUILTIN_OPS if op.name == op_name)
    impl = next(i for i in op.implementations if i.name == impl_name)
    assert op.make_inputs is not None
    values = op.make_inputs((2, 16448), torch.bfloat16, torch.device("cpu"))
    assert impl.configs is not None and impl.configs.validate(config) is not None, "not a member of the space"
    before = _cubins(triton_cache)
    _compile(impl, config, values)
    assert _cubins(triton_cache) - before, f"{op_name} {impl_name} {config}: no kernel was compiled"


@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize("op_name", ["rms_norm_backward", "add_rms_norm_backward", "layer_norm_backward"])
def test_norm_backwards_compile_with_the_weight_per_tile_for_sm90(
    triton_cache: Path, op_name: str, prefetch: int
) -> None:
    """The norms' single-block backwards with WEIGHT_PER_TILE on (tuned only at rows of 16384 and more) compile, with
    PREFETCH off and on, at a row of 16000 elements in bf16 (one block of 16384, masked)."""
    op = next(op for op in BUILTIN_OPS if op.name == op_name)
    impl = next(i for i in op.implementations if i.name == "single_block")
    assert op.make_inputs is not None
    values = op.make_inputs((2, 16000), torch.bfloat16, torch.device("cpu"))
    config = {"ROWS": 1, "num_warps": 32, "PREFETCH": prefetch, "WEIGHT_PER_TILE": 1}
    assert config in impl.candidate_configs(values), "not a configuration tuning tries here"
    before = _cubins(triton_cache)
    _compile(impl, config, values)
    assert _cubins(triton_cache) - before, f"{op_name} {config}: no kernel was compiled"


@pytest.mark.parametrize("op_name", ["softmax_backward", "log_softmax_backward"])
def test_along_backwards_compile_one_block_of_32768_for_sm90(triton_cache: Path, op_name: str) -> None:
    """softmax's and log_softmax's single-block backwards, which take rows up to MAX_SINGLE_BLOCK_ALONG_BACKWARD,
    compile at its untuned configuration for a row of 32000 elements in bf16 (one block of 32768, masked)."""
    op = next(op for op in BUILTIN_OPS if op.name == op_name)
    impl = next(i for i in op.implementations if i.name == "single_block")
    assert op.make_inputs is not None
    values = op.make_inputs((2, 32000), torch.bfloat16, torch.device("cpu"))
    assert impl.supports is not None and impl.supports(*values) is None
    before = _cubins(triton_cache)
    _compile(impl, impl.default_for(values), values)
    assert _cubins(triton_cache) - before, f"{op_name}: no kernel was compiled"


# (op, implementation, its configuration but for NUM_STAGES, the kernel whose loop takes the stages)
STAGED = [
    ("softmax", "persistent", {"num_warps": 8, "PER_SM": 1}, "_softmax_fwd_persistent_kernel"),
    ("log_softmax", "persistent", {"num_warps": 8, "PER_SM": 1}, "_log_softmax_fwd_persistent_kernel"),
    ("rms_norm", "persistent", {"num_warps": 8, "PER_SM": 1}, "_rms_norm_fwd_persistent_kernel"),
    ("cross_entropy", "looped", {"BLOCK_N": 1024, "num_warps": 4}, "_cross_entropy_fwd_kernel"),
    ("cross_entropy_with_grad", "looped", {"BLOCK_N": 1024, "num_warps": 4}, "_cross_entropy_fwd_grad_kernel"),
]


@pytest.mark.parametrize(("op_name", "impl_name", "config", "kernel"), STAGED, ids=[s[0] for s in STAGED])
def test_stages_compile_to_asynchronous_copies(
    triton_cache: Path, op_name: str, impl_name: str, config: dict[str, int], kernel: str
) -> None:
    """A loop's NUM_STAGES is what keeps the next loads in flight: with the launch's specialisation, 3 stages
    compile to cp.async copies for sm_90 and 1 stage to none (the persistent kernels' row loop, cross_entropy's
    streaming of a long row). A plain ``range`` loop compiled to none, and on the H200 bf16 softmax at rows of
    4096 fell from 0.72 to 0.53 of copy through its persistent kernel."""
    op = next(op for op in BUILTIN_OPS if op.name == op_name)
    impl = next(impl for impl in op.implementations if impl.name == impl_name)
    assert op.make_inputs is not None
    values = op.make_inputs((4, 4096), torch.bfloat16, torch.device("cpu"))
    copies = {}
    for stages in (1, 3):
        before = set(triton_cache.rglob(f"{kernel}.ptx")) if triton_cache.exists() else set()
        _compile(impl, {**config, "NUM_STAGES": stages}, values)
        (ptx,) = set(triton_cache.rglob(f"{kernel}.ptx")) - before
        copies[stages] = ptx.read_text().count("cp.async.c")
    assert copies[1] == 0, copies
    assert copies[3] > 0, copies


@pytest.mark.parametrize(
    ("op_name", "kernel"),
    [("cross_entropy", "_cross_entropy_fwd_kernel"), ("cross_entropy_with_grad", "_cross_entropy_fwd_grad_kernel")],
    ids=["cross_entropy", "cross_entropy_with_grad"],
)
def test_streamed_sums_round_their_base_once(triton_cache: Path, op_name: str, kernel: str) -> None:
    """cross_entropy's streamed forwards sum exp2(fma(x, log2(e), -b)) and take the rounding of ``b = m * log2(e)``
    back out at the end, which is exact only if ``b`` is one rounded value everywhere. Compiled for sm_90, each
    ``b`` is an fma with a zero addend (rounded once, never fused into the rescale's subtraction), and no plain
    product by log2(e) is left for the compiler to fuse: when the rescale was ``m * log2(e) - m_new * log2(e)``,
    it became one fma and the loss at logits of 1e4 was 3.4e-4 off on the H200. The forward with the gradient
    forms the softmax of its second pass from the same ``b`` (``exp2(fma(x, log2(e), -b) - log2(s))``), so it has
    no product by log2(e) either."""
    op = next(op for op in BUILTIN_OPS if op.name == op_name)
    impl = next(impl for impl in op.implementations if impl.name == "looped")
    assert op.make_inputs is not None
    values = op.make_inputs((4, 4096), torch.bfloat16, torch.device("cpu"))
    call_state.collect = []
    try:
        # A configuration no other test here compiles: a kernel compiled before in this process is not compiled
        # again, and leaves no PTX in this test's cache.
        config = {"BLOCK_N": 2048, "num_warps": 8, "NUM_STAGES": 2}
        run_candidate(impl, config, values, interpret=False, poison=False)
    finally:
        call_state.collect = None
    (ptx,) = set(triton_cache.rglob(f"{kernel}.ptx"))
    text = ptx.read_text()
    log2e = "0f3FB8AA3B"
    assert re.search(rf"fma\.rn\.f32\s+%r\d+, %r\d+, {log2e}, 0f00000000;", text), "the base is not an fma"
    assert not re.search(rf"mul(\.rn)?\.f32\s+%r\d+, %r\d+, {log2e};", text), "a plain product by log2(e) is left"
    assert re.search(rf"fma\.rn\.f32\s+%r\d+, %r\d+, {log2e}, %r\d+;", text), "the terms are not fma + ex2"


@pytest.mark.parametrize("op_name", ["rms_norm_backward", "add_rms_norm_backward", "layer_norm_backward"])
def test_the_pipelined_split_rows_backward_copies_its_blocks_ahead_for_sm90(triton_cache: Path, op_name: str) -> None:
    """Compiled for sm_90, the norms' split_rows_pipelined row loop holds asynchronous copies (cp.async), of the
    bfloat16 blocks only, where split_rows' holds none: its exchange, in inline assembly, leaves the loop one that
    Triton's pipeliner takes (it takes none that holds a while loop or a tl.debug_barrier, split_rows' exchange), and
    the row's float32 partials, copied ahead, would be read before the row's programs stored them (on an H100 a form
    that let the pipeliner copy them returned NaN)."""
    op = next(op for op in BUILTIN_OPS if op.name == op_name)
    assert op.make_inputs is not None
    values = op.make_inputs((2, 16448), torch.bfloat16, torch.device("cpu"))
    config = {"BLOCK_N": 4096, "num_warps": 8, "PER_SM": 2, "PREFETCH": 1}
    copied: dict[str, list[str]] = {}
    for name in ("split_rows", "split_rows_pipelined"):
        before = set(triton_cache.rglob("*.ttgir")) if triton_cache.exists() else set()
        _compile(next(i for i in op.implementations if i.name == name), config, values)
        ttgir = "".join(p.read_text() for p in set(triton_cache.rglob("*.ttgir")) - before if "split_rows" in p.name)
        copied[name] = [line for line in ttgir.splitlines() if "ttg.async_copy_global_to_local" in line]
    assert not copied["split_rows"], copied["split_rows"]
    assert copied["split_rows_pipelined"], "no asynchronous copy in the pipelined loop"
    assert all("!tt.ptr<bf16>" in line for line in copied["split_rows_pipelined"]), copied["split_rows_pipelined"]
