"""Every configuration of every built-in Triton implementation is correct, and tuning works with them."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernelgate
from every_config import check_every_config
from kernelgate.rowwise import (
    INTERPRETED_L2_BYTES,
    MAX_SINGLE_BLOCK,
    MAX_SINGLE_BLOCK_ALONG_BACKWARD,
    MAX_SINGLE_BLOCK_FORWARD,
    SPLIT_LOOPED_ABOVE,
    SPLIT_MIN_COLS,
    persistent_looped_programs,
    with_launch_options,
)
from kernelgate.selection import compare, run_candidate

# Every row-wise op, forward and backward: rows in one block (and a partial tile of rows), and rows
# longer than one block (the looped kernels; for the backward ops also several rows per program).
ROWWISE = [
    (kernelgate.softmax, kernelgate.softmax_backward),
    (kernelgate.log_softmax, kernelgate.log_softmax_backward),
    (kernelgate.rms_norm, kernelgate.rms_norm_backward),
    (kernelgate.add_rms_norm, kernelgate.add_rms_norm_backward),
    (kernelgate.layer_norm, kernelgate.layer_norm_backward),
]
FORWARDS = {forward.name for forward, _ in ROWWISE}
CASES = [(op, (3, 100)) for pair in ROWWISE for op in pair]
CASES += [(forward, (2, 20000)) for forward, _ in ROWWISE] + [(backward, (11, 16411)) for _, backward in ROWWISE]
CASES += [(forward, (2, MAX_SINGLE_BLOCK_FORWARD + 65)) for forward, _ in ROWWISE]
# softmax's and log_softmax's backwards hold rows in one block further than the norms' backwards.
ALONG_BACKWARDS = {"softmax_backward", "log_softmax_backward"}
CASES += [(kernelgate.get_op(name), (2, MAX_SINGLE_BLOCK_ALONG_BACKWARD + 65)) for name in sorted(ALONG_BACKWARDS)]


# Forwards with a persistent implementation too (rows that fit one block).
PERSISTENT = {"softmax", "log_softmax", "rms_norm"}
# Forwards with a persistent looped implementation too (rows longer than one block).
PERSISTENT_LOOPED = {"softmax", "log_softmax", "rms_norm"}
# Backwards with a split implementation too (rows of SPLIT_MIN_COLS or longer).
SPLIT = {"rms_norm_backward", "add_rms_norm_backward", "layer_norm_backward"}
# Ops with a split_rows implementation too (rows longer than one block split over programs).
SPLIT_ROWS = {
    "softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "rms_norm", "add_rms_norm", "layer_norm"
}  # fmt: skip
# Backwards with a split_rows implementation from SPLIT_MIN_COLS on (groups of a row's programs looping over rows).
SPLIT_ROWS_BACKWARD = {"rms_norm_backward", "add_rms_norm_backward", "layer_norm_backward"}
SPLIT_ROWS_PIPELINED = {"rms_norm_backward", "add_rms_norm_backward", "layer_norm_backward"}
# Forwards with a split_looped implementation too (2-byte rows longer than SPLIT_LOOPED_ABOVE).
SPLIT_LOOPED = {"softmax", "log_softmax", "layer_norm"}


def _expected_implementations(op: kernelgate.Op, n_cols: int, dtype: torch.dtype = torch.float32) -> set[str]:
    """single_block up to its limit (forwards go furthest, then softmax's and log_softmax's backwards, then the norms'
    backwards), and persistent beside it where the op has one; looped once a row exceeds 512 (its smallest block is
    1024, and no block may be longer than the row rounded up to a power of two); split beside looped from
    SPLIT_MIN_COLS on, where the backward has one; split_rows beyond one block, where the op has one, and from
    SPLIT_MIN_COLS on for the norms' backwards (and split_rows_pipelined beside it for 2-byte rows);
    split_looped for 2-byte rows beyond SPLIT_LOOPED_ABOVE, where the forward has one."""
    if op.name in SPLIT_LOOPED and dtype.itemsize == 2 and n_cols > SPLIT_LOOPED_ABOVE:
        return _expected_implementations(op, n_cols) | {"split_looped"}
    if op.name in FORWARDS:
        limit = MAX_SINGLE_BLOCK_FORWARD
    else:
        limit = MAX_SINGLE_BLOCK_ALONG_BACKWARD if op.name in ALONG_BACKWARDS else MAX_SINGLE_BLOCK
    one_block = {"single_block"} | ({"persistent"} if op.name in PERSISTENT else set())
    long_rows = {"persistent_looped"} if op.name in PERSISTENT_LOOPED and n_cols > MAX_SINGLE_BLOCK else set()
    split = {"split"} if op.name in SPLIT and n_cols >= SPLIT_MIN_COLS else set()
    split |= {"split_rows"} if op.name in SPLIT_ROWS and n_cols > MAX_SINGLE_BLOCK else set()
    split |= {"split_rows"} if op.name in SPLIT_ROWS_BACKWARD and n_cols >= SPLIT_MIN_COLS else set()
    pipelined = op.name in SPLIT_ROWS_PIPELINED and n_cols >= SPLIT_MIN_COLS and dtype.itemsize == 2
    split |= {"split_rows_pipelined"} if pipelined else set()
    return (one_block if n_cols <= limit else set()) | ({"looped"} if n_cols > 512 else set()) | long_rows | split


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("op", "shape"), CASES, ids=[f"{op.name}-{'x'.join(map(str, s))}" for op, s in CASES])
def test_every_config_matches_the_reference(
    target: torch.device, op: kernelgate.Op, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """Each implementation that accepts the shape gives the reference's result under every configuration it keeps;
    short rows run only the single-block kernel, rows beyond its limit only the looped one, and between the two
    both compete."""
    assert op.make_inputs is not None
    values = op.make_inputs(shape, dtype, target)
    ran = check_every_config(op, values, target.type == "cpu")
    assert ran == _expected_implementations(op, shape[-1], dtype)


@pytest.mark.parametrize("n_cols", [MAX_SINGLE_BLOCK + 27, 2 * MAX_SINGLE_BLOCK])
@pytest.mark.parametrize("op", [kernelgate.softmax, kernelgate.log_softmax], ids=lambda op: op.name)
def test_every_softmax_forward_handles_special_values(target: torch.device, op: kernelgate.Op, n_cols: int) -> None:
    """-inf entries (in the first block, in the masked last column), rows of only -inf, +inf, NaN and +-1e4 give the
    reference's results, NaN where it has NaN, under every configuration of every forward implementation: the looped
    kernels' running max and sum start at -inf and meet these values block by block."""
    inf = float("inf")
    x = torch.randn(7, n_cols, device=target)
    x[0, : n_cols // 2] = -inf
    x[1, :] = -inf
    x[2, 3] = inf
    x[3, 1] = float("nan")
    x[4, :] = 1e4
    x[5, ::2] = -1e4
    x[6, n_cols - 1] = -inf
    assert check_every_config(op, (x, -1), target.type == "cpu") == _expected_implementations(op, n_cols)


@pytest.mark.parametrize("n_cols", [300, MAX_SINGLE_BLOCK + 27])
def test_every_rms_norm_forward_runs_without_a_weight(target: torch.device, n_cols: int) -> None:
    """Without a weight, each rms_norm forward implementation that takes the row (its kernels get x's rows as the
    weight pointer and read none of it) writes every row, into poisoned outputs, as the reference does."""
    op = kernelgate.rms_norm
    x = torch.randn(5, n_cols, device=target)
    ran = set()
    for impl in op.implementations:
        if impl.supports is not None and impl.supports(x, None, 1e-6) is not None:
            continue
        result = run_candidate(impl, impl.default_for((x, None, 1e-6)), (x, None, 1e-6), target.type == "cpu", True)
        assert compare(result, op.reference(x, None, 1e-6), n_cols) is None, impl.name
        ran.add(impl.name)
    assert _expected_implementations(op, n_cols) <= ran, ran


def test_persistent_looped_programs_follow_the_multiprocessors_and_the_l2() -> None:
    """PER_SM programs per multiprocessor (two under the interpreter), never more than the rows nor than the L2
    holds rows (a 64 KiB stand-in under the interpreter), and always at least one."""
    cpu = torch.device("cpu")
    assert persistent_looped_programs(cpu, 100, 8_000, {"PER_SM": 2}) == 4
    assert persistent_looped_programs(cpu, 3, 8_000, {"PER_SM": 2}) == 3
    assert persistent_looped_programs(cpu, 100, 30_000, {"PER_SM": 2}) == INTERPRETED_L2_BYTES // 30_000 == 2
    assert persistent_looped_programs(cpu, 100, 40_000, {"PER_SM": 2}) == 1
    assert persistent_looped_programs(cpu, 100, 80_000, {"PER_SM": 1}) == 1


# (op, the dimension its rows run along): softmax and log_softmax also along the first, moved last by the launcher.
PERSISTENT_LOOPED_CASES = [
    (kernelgate.softmax, -1),
    (kernelgate.softmax, 0),
    (kernelgate.log_softmax, -1),
    (kernelgate.log_softmax, 0),
    (kernelgate.rms_norm, -1),
]


@pytest.mark.parametrize(
    ("op", "dim"), PERSISTENT_LOOPED_CASES, ids=[f"{op.name}-dim{dim}" for op, dim in PERSISTENT_LOOPED_CASES]
)
def test_persistent_looped_forwards_write_every_row_with_fewer_programs_than_rows(
    target: torch.device, op: kernelgate.Op, dim: int
) -> None:
    """With fewer programs than rows, each program of the persistent looped forward takes every programs-th row:
    under every configuration every row is written (into poisoned outputs) and matches the reference (softmax
    and log_softmax also along the first dimension). Some configurations launch fewer programs than rows."""
    launch_state = importlib.import_module("kernelgate.launch").call_state
    impl = next(impl for impl in op.implementations if impl.name == "persistent_looped")
    interpret = target.type == "cpu"
    rows = 7 if interpret else 2 * torch.cuda.get_device_properties(target).multi_processor_count + 3
    length = MAX_SINGLE_BLOCK + 27
    if op.name in ("softmax", "log_softmax"):
        x = torch.randn(rows, length, device=target)
        args: tuple[object, ...] = (x.t() if dim == 0 else x, dim)
    else:
        assert op.make_inputs is not None
        args = op.make_inputs((rows, length), torch.float32, target)
    grids = set()
    for config in impl.candidate_configs(args):
        launches: list[tuple[str, tuple[int, ...], dict[str, object]]] = []
        saved, launch_state.launches = launch_state.launches, launches
        try:
            result = run_candidate(impl, config, args, interpret, poison=True)
        finally:
            launch_state.launches = saved
        assert compare(result, op.reference(*args), length) is None, config
        ((_, grid, _),) = launches
        grids.add(grid[0])
    assert min(grids) < rows, grids


UNMASKED_FORWARDS = [
    kernelgate.rms_norm,
    kernelgate.add_rms_norm,
    kernelgate.softmax,
    kernelgate.log_softmax,
    kernelgate.layer_norm,
]


@pytest.mark.parametrize("cols", [128, 4096, 5120])
@pytest.mark.parametrize("op", UNMASKED_FORWARDS, ids=lambda op: op.name)
def test_forward_kernels_drop_their_masks_only_where_the_blocks_tile_the_row(
    target: torch.device, op: kernelgate.Op, cols: int
) -> None:
    """The single-block, persistent and looped forwards run unmasked (EVEN_N) where the row is a whole number of
    blocks: one block of exactly the row's length, or looped chunks that divide it. Every configuration, masked
    or not (and for the norms with and without a weight and bias), gives the reference's result, also where a
    program takes several rows."""
    launch_state = importlib.import_module("kernelgate.launch").call_state
    assert op.make_inputs is not None
    values = op.make_inputs((3, cols), torch.float32, target)
    variants = [values]
    if op is kernelgate.rms_norm:
        variants.append((values[0], None, values[2]))
    if op is kernelgate.add_rms_norm:
        variants.append((values[0], values[1], None, values[3]))
    if op is kernelgate.layer_norm:
        variants.append((values[0], values[1], None, None, values[4]))
    for args in variants:
        expected = op.reference(*args)
        seen: set[tuple[str, bool]] = set()
        for impl in op.implementations:
            if impl.supports is not None and impl.supports(*args) is not None:
                continue
            for config in impl.candidate_configs(args):
                launches: list[tuple[str, tuple[int, ...], dict[str, object]]] = []
                saved, launch_state.launches = launch_state.launches, launches
                try:
                    result = run_candidate(impl, config, args, target.type == "cpu", poison=True)
                finally:
                    launch_state.launches = saved
                assert compare(result, expected, cols) is None, (impl.name, config, args[1:])
                ((_, _, meta),) = launches
                assert config is not None
                block = config["BLOCK_N"] if impl.name == "looped" else 1 << (cols - 1).bit_length()
                assert meta["EVEN_N"] == (cols % block == 0 and config.get("ROWS", 1) == 1), (impl.name, config, meta)
                seen.add((impl.name, bool(meta["EVEN_N"])))
        # A power-of-two row runs both kernels unmasked (single_block masked too, with several rows a program);
        # 5120 runs single_block masked only (a block of 8192), looped unmasked at a block of 1024 and masked at
        # 2048 and 4096.
        power_of_two = cols == 1 << (cols - 1).bit_length()
        want = {("single_block", power_of_two)} | ({("persistent", power_of_two)} if op.name in PERSISTENT else set())
        if cols > 512:
            want |= {("looped", True)} | ({("looped", False)} if cols == 5120 else set())
        assert want <= seen and (power_of_two or ("single_block", True) not in seen), seen


@pytest.mark.parametrize(("rows", "cols"), [(524288, 128), (131072, 512), (16384, 4096), (3, 100), (2, 3), (1, 4096)])
def test_row_block_pruning_keeps_the_default_and_small_tiles_only_when_rows_are_few(rows: int, cols: int) -> None:
    """The untuned configuration survives pruning; tiles of several rows hold at least 1024 elements and 8 per
    thread, unless all the rows there are make a smaller tile."""
    impl = kernelgate.softmax.implementations[0]
    values = (torch.empty(rows, cols), -1)
    kept = impl.candidate_configs(values)
    assert impl.default_for(values) in kept
    block = max(16, 1 << (cols - 1).bit_length())
    everything = (1 << (rows - 1).bit_length()) * block
    for config in kept:
        tile = config["ROWS"] * block
        if config["ROWS"] > 1:
            assert min(1024, everything) <= tile <= everything, config
            assert config["num_warps"] == 1 or tile // (32 * config["num_warps"]) >= 8, config


@pytest.mark.parametrize("op", [forward for forward, _ in ROWWISE], ids=lambda op: op.name)
def test_a_nan_stays_in_its_row_when_programs_take_several_rows(target: torch.device, op: kernelgate.Op) -> None:
    """With every row of the input in one program's tile, a NaN in one row makes that row NaN (as in the
    reference) and leaves the other rows of the tile exactly as the reference computes them."""
    assert op.make_inputs is not None
    x, *rest = op.make_inputs((5, 40), torch.float32, target)
    x[2, 7] = float("nan")
    values = (x, *rest)
    (impl,) = [i for i in op.implementations if i.name == "single_block"]
    config = {"ROWS": 8, "num_warps": 1}  # one program: five rows and three masked ones
    assert impl.configs is not None and impl.configs.validate(config) is not None
    result = run_candidate(impl, config, values, target.type == "cpu", poison=True)
    expected = op.reference(*values)
    assert compare(result, expected, op.reduction_length(*values)) is None
    first = result if isinstance(result, torch.Tensor) else result[0]
    assert first[2].isnan().all() and not first[[0, 1, 3, 4]].isnan().any()


@pytest.mark.gpu
def test_tuning_on_the_gpu_then_reuse_in_a_fresh_process(tmp_path: Path) -> None:
    """On the GPU the first call of a bucket tunes, later calls and a new shape in the bucket reuse it, and
    a fresh process with the same cache times nothing."""
    kernelgate.configure(cache_dir=tmp_path, log_path=tmp_path / "log.csv")
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    first = kernelgate.softmax.plan(x)
    assert first.reason in (kernelgate.Reason.TUNED, kernelgate.Reason.REFERENCE_FASTER)
    again = kernelgate.softmax.plan(torch.randn(3000, 4096, device="cuda", dtype=torch.bfloat16))
    assert again.reason in (kernelgate.Reason.CACHED, kernelgate.Reason.REFERENCE_FASTER)
    assert (again.name, again.config) == (first.name, first.config)
    tune_rows = [line for line in (tmp_path / "log.csv").read_text().splitlines() if ",tune," in line]
    assert len(tune_rows) >= 2  # every candidate of the one tuned bucket is logged, once
    script = (
        "import torch, kernelgate, json;"
        f"kernelgate.configure(cache_dir={str(tmp_path)!r}, log_path={str(tmp_path / 'log2.csv')!r});"
        "x = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16);"
        "p = kernelgate.softmax.plan(x); y = kernelgate.softmax(x); torch.cuda.synchronize();"
        "print(json.dumps([str(p.reason), p.name, p.key, str(kernelgate.settings().cache_dir)]))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=600)
    reason, name, key, cache_dir = json.loads(out.stdout.strip().splitlines()[-1])
    # On a miss, whether the fresh process looked under another key or in another directory, and what the file held.
    cached = json.loads(next(tmp_path.glob("decisions-*.json")).read_text())["entries"]
    seen = f"fresh: {reason} {name} key {key} in {cache_dir}; first: key {first.key}; cached keys {list(cached)}"
    assert name == first.name and reason in ("cached", "reference-faster"), seen
    assert ",tune," not in (tmp_path / "log2.csv").read_text()


@pytest.mark.gpu
def test_no_tuning_or_sync_while_a_cuda_graph_is_captured(tmp_path: Path) -> None:
    """During CUDA graph capture a new bucket takes its default configuration without tuning, the log says so,
    and the replayed graph computes the reference's result."""
    kernelgate.configure(cache_dir=tmp_path, log_path=tmp_path / "log.csv")
    x = torch.randn(512, 2048, device="cuda", dtype=torch.float16)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernelgate.configure(log_path=None)
        with kernelgate.use_mode("triton"):
            # Triton compiles on first launch, which capture forbids: warm the default config up first.
            kernelgate.configure(tune=False)
            kernelgate.softmax(x)
            kernelgate.configure(tune=True, log_path=tmp_path / "log.csv")
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                y = kernelgate.softmax(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    kernelgate.tolerance.assert_close(y, torch.softmax(x, -1), reduction_length=2048)
    log = (tmp_path / "log.csv").read_text()
    assert "default-config" in log and "CUDA graph" in log and ",tune," not in log
    decisions = tmp_path / "decisions-v1.json"
    assert not decisions.exists() or json.loads(decisions.read_text())["entries"] == {}


# The norm backwards' kernel tests below run for each of these ops.
norm_backwards = pytest.mark.parametrize(
    "op",
    [kernelgate.rms_norm_backward, kernelgate.add_rms_norm_backward, kernelgate.layer_norm_backward],
    ids=lambda op: op.name,
)


@pytest.mark.parametrize("rows", [1, 2, 4])
@norm_backwards
def test_norm_backward_prefetch_matches_the_reference(target: torch.device, op: kernelgate.Op, rows: int) -> None:
    """The single-block backward of rms_norm (and add_rms_norm's, which adds the gradient reaching the sum) and of
    layer_norm with PREFETCH on, the next tile's loads issued before this tile's reductions: 11 rows split over the
    programs in tiles of ``rows`` (100 rows: several tiles a program, and a last program with fewer rows), give the
    reference's results."""
    assert op.make_inputs is not None
    values = op.make_inputs((100, 300), torch.float32, target)
    impl = next(i for i in op.implementations if i.name == "single_block")
    expected = op.reference(*values)
    for prefetch in (0, 1):
        config = {"ROWS": rows, "num_warps": 4, "PREFETCH": prefetch}
        got = run_candidate(impl, config, values, target.type == "cpu", poison=True)
        assert compare(got, expected, op.reduction_length(*values), normwise=op.normwise_outputs) is None, config


def test_norm_backward_tunes_prefetch_where_two_tiles_fit() -> None:
    """rms_norm's, add_rms_norm's and layer_norm's single-block backward try PREFETCH on only where a thread holds
    at most PREFETCH_MAX_PER_THREAD elements of a tile (two tiles live), and off everywhere."""
    from kernelgate.rowwise import PREFETCH_MAX_PER_THREAD, single_block

    for op in (kernelgate.rms_norm_backward, kernelgate.add_rms_norm_backward, kernelgate.layer_norm_backward):
        assert op.make_inputs is not None
        values = op.make_inputs((4096, 4096), torch.bfloat16, torch.device("cpu"))
        configs = next(i for i in op.implementations if i.name == "single_block").candidate_configs(values)
        on = {(c["ROWS"], c["num_warps"]) for c in configs if c["PREFETCH"]}
        off = {(c["ROWS"], c["num_warps"]) for c in configs if not c["PREFETCH"]}
        fits = {(r, w) for r, w in off if r * single_block(4096) // (32 * w) <= PREFETCH_MAX_PER_THREAD}
        assert on == fits != set(), (op.name, on, off)


@pytest.mark.parametrize("weighted", [True, False], ids=["affine", "no-affine"])
@norm_backwards
def test_norm_backward_weight_per_tile_matches_the_reference(
    target: torch.device, op: kernelgate.Op, weighted: bool
) -> None:
    """The single-block backward with WEIGHT_PER_TILE on, the weight loaded with each tile instead of once a program,
    with PREFETCH off and on and 1 or 2 rows a tile, over 100 rows of 300 split over the programs: the reference's
    results, with and without the affine parameters."""
    assert op.make_inputs is not None
    values = list(op.make_inputs((100, 300), torch.float32, target))
    if not weighted:
        for position in AFFINE_POSITIONS[op.name]:
            values[position] = None
    impl = next(i for i in op.implementations if i.name == "single_block")
    expected = op.reference(*values)
    for rows, prefetch in ((1, 0), (2, 1)):
        config = {"ROWS": rows, "num_warps": 4, "PREFETCH": prefetch, "WEIGHT_PER_TILE": 1}
        got = run_candidate(impl, config, tuple(values), target.type == "cpu", poison=True)
        assert compare(got, expected, op.reduction_length(*values), normwise=op.normwise_outputs) is None, config


@pytest.mark.parametrize("op", [kernelgate.rms_norm_backward, kernelgate.add_rms_norm_backward], ids=lambda op: op.name)
def test_rms_norm_backward_in_the_few_live_order_matches_the_reference(target: torch.device, op: kernelgate.Op) -> None:
    """At a row of 16000 (one block of 16384, masked) rms_norm's single-block backward takes the FEW_LIVE order, as
    add_rms_norm's does at every length (shorter rows of each are in the tests above): over 5 rows split over the
    programs, 1 and 2 rows a tile, with the weight kept and loaded per tile, the reference's results."""
    from kernelgate.ops.rms_norm import FEW_LIVE_MIN_BLOCK
    from kernelgate.rowwise import single_block

    assert single_block(16000) >= FEW_LIVE_MIN_BLOCK
    assert op.make_inputs is not None
    values = tuple(op.make_inputs((5, 16000), torch.float32, target))
    impl = next(i for i in op.implementations if i.name == "single_block")
    expected = op.reference(*values)
    for rows, weight_per_tile in ((1, 0), (2, 1)):
        config = {"ROWS": rows, "num_warps": 4, "PREFETCH": 0, "WEIGHT_PER_TILE": weight_per_tile}
        got = run_candidate(impl, config, values, target.type == "cpu", poison=True)
        assert compare(got, expected, op.reduction_length(*values), normwise=op.normwise_outputs) is None, config


def test_norm_backward_tunes_weight_per_tile_only_where_every_configuration_spills() -> None:
    """WEIGHT_PER_TILE is a candidate from blocks of WEIGHT_PER_TILE_MIN_BLOCK (rows of 16384), beside every
    configuration without it, and not at rows of 8192; untuned, it is off."""
    from kernelgate.rowwise import WEIGHT_PER_TILE_MIN_BLOCK

    assert WEIGHT_PER_TILE_MIN_BLOCK == 16384
    for op in (kernelgate.rms_norm_backward, kernelgate.add_rms_norm_backward, kernelgate.layer_norm_backward):
        assert op.make_inputs is not None
        impl = next(i for i in op.implementations if i.name == "single_block")
        long_rows = op.make_inputs((4, 16384), torch.bfloat16, torch.device("cpu"))
        configs = impl.candidate_configs(long_rows)
        on = [{k: v for k, v in c.items() if k != "WEIGHT_PER_TILE"} for c in configs if c["WEIGHT_PER_TILE"]]
        off = [{k: v for k, v in c.items() if k != "WEIGHT_PER_TILE"} for c in configs if not c["WEIGHT_PER_TILE"]]
        assert on == off != [], op.name
        assert impl.default_for(long_rows)["WEIGHT_PER_TILE"] == 0  # type: ignore[index]
        shorter = op.make_inputs((4, 8192), torch.bfloat16, torch.device("cpu"))
        assert not any(c["WEIGHT_PER_TILE"] for c in impl.candidate_configs(shorter)), op.name


# The positions of each backward's affine parameters (weight, and layer_norm's bias) in its make_inputs.
AFFINE_POSITIONS = {"rms_norm_backward": (2,), "add_rms_norm_backward": (3,), "layer_norm_backward": (3, 4)}


@pytest.mark.parametrize("weighted", [True, False], ids=["affine", "no-affine"])
@norm_backwards
def test_split_backward_matches_the_reference_over_uneven_row_groups(
    target: torch.device, op: kernelgate.Op, weighted: bool
) -> None:
    """The split backward (each row's statistics, then column blocks of row groups) gives the reference's dx and
    parameter gradients where the rows fall into several groups and the last group is shorter: 7 rows in groups of
    3, 3 and 1 under the interpreter, 301 rows in groups of 2 (the last of 1) on the H200's 132 multiprocessors;
    with and without the weight (and bias)."""
    from kernelgate.rowwise import column_row_groups

    assert op.make_inputs is not None
    shape = (7, 8200) if target.type == "cpu" else (301, 8200)
    values = list(op.make_inputs(shape, torch.float32, target))
    if not weighted:
        for i in AFFINE_POSITIONS[op.name]:
            values[i] = None
    impl = next(i for i in op.implementations if i.name == "split")
    assert impl.supports(*values) is None
    config = {"BLOCK_N": 4096, "num_warps": 4}
    _, rows_per_group, groups = column_row_groups(target, shape[0], shape[1], config["BLOCK_N"], 4)
    assert groups > 1 and shape[0] % rows_per_group, (rows_per_group, groups)
    expected = op.reference(*values)
    got = run_candidate(impl, config, values, target.type == "cpu", poison=True)
    assert compare(got, expected, op.reduction_length(*values), normwise=op.normwise_outputs) is None


SPLIT_ROWS_BACKWARDS = [getattr(kernelgate, name) for name in sorted(SPLIT_ROWS_BACKWARD)]


@pytest.mark.parametrize("weighted", [True, False], ids=["weight", "no-weight"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", SPLIT_ROWS_BACKWARDS, ids=lambda op: op.name)
def test_split_rows_backward_matches_the_reference_over_uneven_row_groups(
    target: torch.device, op: kernelgate.Op, dtype: torch.dtype, weighted: bool
) -> None:
    """The split_rows backward (a row's programs exchange its sums, in groups that loop over rows) gives the
    reference's dx and parameter gradients, with and without the next row loaded during the wait, where the rows fall
    unevenly into several groups and the last block of a row is partial: 7 rows in 2 groups (4 and 3) of 3 programs
    under the interpreter, 301 rows in 132 groups of 4 on the H200's 132 multiprocessors; with and without the weight
    (and layer_norm's bias), and for add_rms_norm without grad_s too."""
    from kernelgate.rowwise import split_rows_groups

    assert op.make_inputs is not None
    shape = (7, 3000) if target.type == "cpu" else (301, 3500)
    values = list(op.make_inputs(shape, dtype, target))
    if not weighted:
        for i in AFFINE_POSITIONS[op.name]:
            values[i] = None
        if op.name == "add_rms_norm_backward":
            values[1] = None  # grad_s
    impl = next(i for i in op.implementations if i.name == "split_rows")
    expected = op.reference(*values)
    for prefetch in (0, 1):
        config = {"BLOCK_N": 1024, "num_warps": 4, "PER_SM": 4, "PREFETCH": prefetch}
        groups = split_rows_groups(target, shape[0], shape[1], config["BLOCK_N"], config["PER_SM"])
        assert 1 < groups < shape[0] and shape[0] % groups, groups
        got = run_candidate(impl, config, tuple(values), target.type == "cpu", poison=True)
        assert compare(got, expected, op.reduction_length(*values), normwise=op.normwise_outputs) is None, config


def test_layer_norm_split_rows_backward_keeps_rows_far_from_zero_exact(target: torch.device) -> None:
    """layer_norm's split_rows backward at float32 rows centred on 1000 with a spread of 1 (a mean 1000 times the
    deviation; the row's first element as the statistics' shift) gives dx within the tolerance of the reference, or
    no further from the float64 result than the reference is, and dweight and dbias no further from the float64
    result than twice the reference's error."""
    from kernelgate.tolerance import assert_no_worse

    op = kernelgate.layer_norm_backward
    assert op.make_inputs is not None
    shape = (7, 3000) if target.type == "cpu" else (301, 3500)
    grad, x, normalized_shape, weight, bias, eps = op.make_inputs(shape, torch.float32, target)
    values = (grad, x + 1000.0, normalized_shape, weight, bias, eps)
    expected = op.reference(*values)
    # torch's own float32 dweight is 7e-5 from the float64 one here (relative norm), the kernel's 1e-7: the
    # parameter gradients are held to the float64 result, no worse than twice torch's error.
    exact = op.reference(grad.double(), x.double() + 1000.0, normalized_shape, weight.double(), bias.double(), eps)
    impl = next(i for i in op.implementations if i.name == "split_rows")
    for prefetch in (0, 1):
        config = {"BLOCK_N": 1024, "num_warps": 4, "PER_SM": 4, "PREFETCH": prefetch}
        dx, dw, db = run_candidate(impl, config, values, target.type == "cpu", poison=True)
        mismatch = compare(dx, expected[0], op.reduction_length(*values), truth=lambda: exact[0])
        assert mismatch is None, (config, mismatch)
        assert_no_worse(dw, expected[1], exact[1])
        assert_no_worse(db, expected[2], exact[2])


def test_split_rows_backward_tunes_blocks_of_four_to_sixteen_elements_a_thread() -> None:
    """Tuning tries the split_rows backward's configurations whose threads hold 4 to 16 elements of a block shorter
    than the row, four programs a multiprocessor at blocks of 2048 and two at longer ones, with and without
    PREFETCH; rows shorter than SPLIT_MIN_COLS are not taken."""
    impl = next(i for i in kernelgate.rms_norm_backward.implementations if i.name == "split_rows")
    assert kernelgate.rms_norm_backward.make_inputs is not None
    values = kernelgate.rms_norm_backward.make_inputs((2, 131072), torch.float32, torch.device("cpu"))
    configs = [c for c in impl.candidate_configs(values) if c is not None]
    tried = {(c["BLOCK_N"], c["num_warps"], c["PER_SM"], c["PREFETCH"]) for c in configs}
    blocks = {(2048, 4), (2048, 8), (2048, 16), (4096, 8), (4096, 16), (4096, 32), (8192, 16), (8192, 32), (16384, 32)}
    per_sm = {2048: 4, 4096: 2, 8192: 2, 16384: 2}
    assert tried == {(*block, per_sm[block[0]], prefetch) for block in blocks for prefetch in (0, 1)}
    at_8192 = kernelgate.rms_norm_backward.make_inputs((2, SPLIT_MIN_COLS), torch.float32, torch.device("cpu"))
    assert {c["BLOCK_N"] for c in impl.candidate_configs(at_8192) if c is not None} == {
        2048,
        4096,
    }  # shorter than the row
    short = kernelgate.rms_norm_backward.make_inputs((2, SPLIT_MIN_COLS - 1), torch.float32, torch.device("cpu"))
    assert "shorter than" in (impl.supports(*short) or "")


def test_split_backward_keeps_a_few_rows_of_partial_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the looped backward keeps a row of dweight partial sums a program (at 512 rows of 131072 on the H200's
    132 multiprocessors, a program a row: 512 rows), the split backward keeps one a row group: 17 there, with
    BLOCK_N 4096. It takes rows of SPLIT_MIN_COLS or longer only."""
    from kernelgate import backend
    from kernelgate.rowwise import column_row_groups, row_groups

    monkeypatch.setattr(backend, "multiprocessors", lambda device: 132)
    gpu = torch.device("cuda")
    assert row_groups(gpu, 512, 4, {})[1] == 512
    assert column_row_groups(gpu, 512, 131072, 4096, 4) == (32, 31, 17)
    impl = next(i for i in kernelgate.rms_norm_backward.implementations if i.name == "split")
    assert kernelgate.rms_norm_backward.make_inputs is not None
    short = kernelgate.rms_norm_backward.make_inputs((2, SPLIT_MIN_COLS - 1), torch.float32, torch.device("cpu"))
    assert impl.supports(*short) is not None and "shorter than" in impl.supports(*short)
    long = kernelgate.rms_norm_backward.make_inputs((2, SPLIT_MIN_COLS), torch.float32, torch.device("cpu"))
    assert impl.supports(*long) is None


@pytest.mark.parametrize("op_name", sorted(SPLIT))
def test_split_backward_tunes_four_to_eight_elements_a_thread(op_name: str) -> None:
    """Tuning tries the split backward's configurations whose threads hold 4 to 8 elements of a block, the
    only ones tuning chose on the H200: BLOCK_N 1024 with 4 or 8 warps, 2048 with 8 or 16, 4096 with 16."""
    op = getattr(kernelgate, op_name)
    impl = next(i for i in op.implementations if i.name == "split")
    assert op.make_inputs is not None
    values = op.make_inputs((2, 131072), torch.float32, torch.device("cpu"))
    tried = {(c["BLOCK_N"], c["num_warps"]) for c in impl.candidate_configs(values) if c is not None}
    assert tried == {(1024, 4), (1024, 8), (2048, 8), (2048, 16), (4096, 16)}
    assert impl.default_config is not None
    assert (impl.default_config["BLOCK_N"], impl.default_config["num_warps"]) in tried


@pytest.mark.parametrize("op", [kernelgate.rms_norm, kernelgate.layer_norm, kernelgate.softmax], ids=lambda op: op.name)
def test_single_block_forwards_pass_every_launch_option_of_a_config(op: kernelgate.Op) -> None:
    """A single-block forward launched at a config that names num_stages and num_ctas (a user's config space may)
    launches with both, beside num_warps, and still matches the reference (interpreted, where they change nothing)."""
    launch_state = importlib.import_module("kernelgate.launch").call_state
    impl = next(impl for impl in op.implementations if impl.name == "single_block")
    assert op.make_inputs is not None
    args = op.make_inputs((3, 1000), torch.float32, torch.device("cpu"))
    launches: list[tuple[str, tuple[int, ...], dict[str, object]]] = []
    saved, launch_state.launches = launch_state.launches, launches
    try:
        with kernelgate.use_interpreter():
            config = {"ROWS": 1, "num_warps": 4, "num_stages": 2, "num_ctas": 2}
            result = run_candidate(impl, config, args, True, poison=True)
    finally:
        launch_state.launches = saved
    assert compare(result, op.reference(*args), 1000) is None
    ((_, grid, meta),) = launches
    assert grid == (3,) and {k: meta[k] for k in ("num_warps", "num_stages", "num_ctas")} == {
        "num_warps": 4, "num_stages": 2, "num_ctas": 2,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("impl_name", "n_cols"), [("persistent", 1000), ("persistent_looped", 20000), ("split_rows", 20000)]
)
def test_persistent_and_split_rows_forwards_pass_every_launch_option_of_a_config(impl_name: str, n_cols: int) -> None:
    """The persistent, persistent_looped and split_rows forwards launch with a config's num_stages and maxnreg (a
    register cap: Triton compiles under it) beside num_warps, every launch of a call (split_rows' two phases
    interpreted), and still match the reference."""
    launch_state = importlib.import_module("kernelgate.launch").call_state
    impl = next(impl for impl in kernelgate.softmax.implementations if impl.name == impl_name)
    x = torch.randn((2, n_cols), generator=torch.Generator().manual_seed(3))
    first = next(config for config in impl.candidate_configs((x, -1)) if config is not None)
    launches: list[tuple[str, tuple[int, ...], dict[str, object]]] = []
    saved, launch_state.launches = launch_state.launches, launches
    try:
        with kernelgate.use_interpreter():
            config = {**first, "num_stages": 2, "maxnreg": 40}
            result = run_candidate(impl, config, (x, -1), True, poison=True)
    finally:
        launch_state.launches = saved
    assert compare(result, torch.softmax(x, -1), 1000) is None
    assert len(launches) == (2 if impl_name == "split_rows" else 1)
    assert all((meta["num_stages"], meta["maxnreg"]) == (2, 40) for _, _, meta in launches)


def test_with_launch_options_adds_only_nonzero_options_and_leaves_meta_unchanged() -> None:
    """with_launch_options returns the same meta where a config names no option besides num_warps, or names them
    only as 0 (split_rows' "no register cap"), and otherwise a new dict with them; the caller's meta is not changed."""
    meta = {"BLOCK_N": 8192}
    assert with_launch_options(meta, {"BLOCK_N": 8192, "num_warps": 8}) is meta
    assert with_launch_options(meta, {"BLOCK_N": 8192, "num_warps": 8, "maxnreg": 0}) is meta
    capped = with_launch_options(meta, {"BLOCK_N": 8192, "num_warps": 8, "maxnreg": 48, "num_stages": 2})
    assert capped == {"BLOCK_N": 8192, "maxnreg": 48, "num_stages": 2}
    assert meta == {"BLOCK_N": 8192}
