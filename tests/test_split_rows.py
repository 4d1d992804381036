"""split_rows of softmax and log_softmax, forward and backward, and of rms_norm's, add_rms_norm's and layer_norm's
forwards: each row split over programs that hold a block of it each and wait for the row's others
(kernelgate.ops.split_rows), against the reference; and split_looped of softmax's, log_softmax's and layer_norm's
forwards, whose programs stream a segment of the row twice instead of holding a block."""

from __future__ import annotations

import importlib

import pytest
import torch

import kernelgate
from kernelgate import rowwise
from kernelgate.launch import Unsupported
from kernelgate.op import Op, TritonImpl
from kernelgate.ops.cross_entropy import cross_entropy_with_grad
from kernelgate.selection import run_candidate
from kernelgate.tolerance import assert_close, assert_close_or_no_worse

FORWARDS = [kernelgate.softmax, kernelgate.log_softmax]
BACKWARDS = [kernelgate.softmax_backward, kernelgate.log_softmax_backward]
INF = float("inf")


def _split_rows(op: Op) -> TritonImpl:
    return next(impl for impl in op.implementations if impl.name == "split_rows")


def _rows(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """3 * randn rows where row 1 starts with two whole blocks of 2048 of -inf and holds one more -inf."""
    gen = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(shape, generator=gen)
    x[..., 1, :4096] = -INF
    x[..., 1, 9000] = -INF
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [2048, 8192])
@pytest.mark.parametrize("op", FORWARDS, ids=lambda op: op.name)
def test_split_rows_forward_matches_the_reference(target: torch.device, op: Op, block: int, dtype: torch.dtype) -> None:
    """Rows of 20000 over 10 and 3 programs (the last one partial), blocks of nothing but -inf among them, in
    float32 and bfloat16, give the reference's result."""
    x = _rows((3, 20000), dtype, target)
    impl = _split_rows(op)
    assert impl.supports is not None and impl.supports(x, -1) is None
    y = run_candidate(impl, {"BLOCK_N": block, "num_warps": 4}, (x, -1), target.type == "cpu", poison=True)
    assert (y.dtype, y.shape, y.is_contiguous()) == (dtype, x.shape, True)
    assert_close(y, op.reference(x, -1), reduction_length=x.shape[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", FORWARDS, ids=lambda op: op.name)
def test_split_rows_forward_of_special_rows(target: torch.device, op: Op, dtype: torch.dtype) -> None:
    """A row of only -inf and a row holding a NaN give NaN rows, as in torch, and leave the other rows right, in
    float32 and in bfloat16 (whose blocks' exponentials take the exp2 form, kernelgate.ops.tiles.exp_below_max);
    rows along another dimension than the last, whose length divides into whole blocks, run too."""
    x = _rows((4, 16896), dtype, target)
    x[2] = -INF
    x[3, 7] = float("nan")
    y = run_candidate(_split_rows(op), {"BLOCK_N": 2048, "num_warps": 4}, (x, -1), target.type == "cpu", poison=True)
    assert bool(torch.isnan(y[2]).all()) and bool(torch.isnan(y[3]).all())
    assert_close(y[:2], op.reference(x[:2], -1), reduction_length=x.shape[-1])
    along = _rows((2, 3, 32768), torch.float32, target).transpose(1, 2)  # rows along dim 1, 32768 / 4096 = 8 blocks
    y = run_candidate(_split_rows(op), {"BLOCK_N": 4096, "num_warps": 4}, (along, 1), target.type == "cpu", True)
    assert y.is_contiguous() and y.shape == along.shape
    assert_close(y, op.reference(along, 1), reduction_length=along.shape[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [2048, 8192])
@pytest.mark.parametrize("op", BACKWARDS, ids=lambda op: op.name)
def test_split_rows_backward_matches_the_reference(
    target: torch.device, op: Op, block: int, dtype: torch.dtype
) -> None:
    """The gradients of rows of 20000 over 10 and 3 programs give the reference's, in float32 and bfloat16."""
    forward = kernelgate.softmax if op is kernelgate.softmax_backward else kernelgate.log_softmax
    y = forward.reference(_rows((3, 20000), torch.float32, target), -1).to(dtype)
    gen = torch.Generator().manual_seed(1)
    grad = torch.randn(y.shape, generator=gen).to(device=target, dtype=dtype)
    dx = run_candidate(
        _split_rows(op), {"BLOCK_N": block, "num_warps": 4}, (grad, y, -1), target.type == "cpu", poison=True
    )
    assert (dx.dtype, dx.shape, dx.is_contiguous()) == (dtype, y.shape, True)
    assert_close(dx, op.reference(grad, y, -1), reduction_length=y.shape[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("block", [2048, 8192])
def test_split_rows_rms_norm_matches_the_reference(
    target: torch.device, block: int, with_weight: bool, dtype: torch.dtype
) -> None:
    """rms_norm of rows of 20000 over 10 and 3 programs, with and without a weight, a row of zeros among them
    (rsqrt(eps) times 0), in float32 and bfloat16, gives the reference's result."""
    gen = torch.Generator().manual_seed(2)
    x = (3 * torch.randn((3, 20000), generator=gen)).to(device=target, dtype=dtype)
    x[1] = 0
    weight = torch.randn(20000, generator=gen).to(device=target, dtype=dtype) if with_weight else None
    impl = _split_rows(kernelgate.rms_norm)
    assert impl.supports is not None and impl.supports(x, weight, 1e-6) is None
    y = run_candidate(impl, {"BLOCK_N": block, "num_warps": 4}, (x, weight, 1e-6), target.type == "cpu", poison=True)
    assert (y.dtype, y.shape, y.is_contiguous()) == (dtype, x.shape, True)
    assert bool((y[1] == 0).all())
    assert_close(y, kernelgate.rms_norm.reference(x, weight, 1e-6), reduction_length=x.shape[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("block", [2048, 8192])
def test_split_rows_add_rms_norm_matches_the_reference(
    target: torch.device, block: int, with_weight: bool, dtype: torch.dtype
) -> None:
    """add_rms_norm of rows of 20000 over 10 and 3 programs, with and without a weight, a row whose sum is zero
    among them, in float32 and bfloat16, gives the reference's y and s; y is the rms_norm of s as stored (rounded
    to its dtype). A residual of another dtype gives s and y torch's promoted dtype."""
    gen = torch.Generator().manual_seed(4)
    x = (3 * torch.randn((3, 20000), generator=gen)).to(device=target, dtype=dtype)
    residual = torch.randn((3, 20000), generator=gen).to(device=target, dtype=dtype)
    residual[1] = -x[1]
    weight = torch.randn(20000, generator=gen).to(device=target, dtype=dtype) if with_weight else None
    impl = _split_rows(kernelgate.add_rms_norm)
    args = (x, residual, weight, 1e-6)
    assert impl.supports is not None and impl.supports(*args) is None
    y, s = run_candidate(impl, {"BLOCK_N": block, "num_warps": 4}, args, target.type == "cpu", poison=True)
    y_ref, s_ref = kernelgate.add_rms_norm.reference(*args)
    assert all((t.dtype, t.shape, t.is_contiguous()) == (dtype, x.shape, True) for t in (y, s))
    assert bool((s[1] == 0).all()) and bool((y[1] == 0).all())
    assert_close(s, s_ref, reduction_length=1)
    assert_close(y, y_ref, reduction_length=x.shape[-1])
    if dtype is torch.bfloat16:
        mixed = (x, residual.float(), None if weight is None else weight.float(), 1e-6)
        y, s = run_candidate(impl, {"BLOCK_N": block, "num_warps": 4}, mixed, target.type == "cpu", poison=True)
        y_ref, s_ref = kernelgate.add_rms_norm.reference(*mixed)
        assert (y.dtype, s.dtype) == (torch.float32, torch.float32)
        assert_close(s, s_ref, reduction_length=1)
        assert_close(y, y_ref, reduction_length=x.shape[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("block", [2048, 8192])
@pytest.mark.parametrize("n", [20000, 24576])
def test_split_rows_layer_norm_matches_the_reference(
    target: torch.device, n: int, block: int, affine: bool, dtype: torch.dtype
) -> None:
    """layer_norm of rows of 20000 over 10 and 3 programs (the last one partial, its mean weighted by its count),
    and of 24576 over 12 and 3 whole blocks (EVEN_N), with and without weight and bias, a row far from zero (mean
    1000: the blocks' means merge without cancelling) and a constant row among them, in float32 and bfloat16,
    gives the reference's result or one closer to float64's. (float32 at 24576: torch's layer_norm of the row
    near 1000 is 2.4e-5 from float64's, the kernel's 2e-7.)"""
    _check_layer_norm(_split_rows(kernelgate.layer_norm), {"BLOCK_N": block, "num_warps": 4}, target, n, affine, dtype)


def _check_layer_norm(
    impl: TritonImpl, config: dict[str, int], target: torch.device, n: int, affine: bool, dtype: torch.dtype
) -> None:
    """layer_norm's ``impl`` at ``config`` on 3 rows of ``n``: random, far from zero (mean 1000) and constant, with
    weight and bias if ``affine``, against the reference (or closer to float64's than it)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn((3, n), generator=gen)
    x[1] += 1000
    x[2] = 5
    x = x.to(device=target, dtype=dtype)
    weight = torch.randn(n, generator=gen).to(device=target, dtype=dtype) if affine else None
    bias = torch.randn(n, generator=gen).to(device=target, dtype=dtype) if affine else None
    args = (x, (n,), weight, bias, 1e-5)
    assert impl.supports is not None and impl.supports(*args) is None
    y = run_candidate(impl, config, args, target.type == "cpu", poison=True)
    assert (y.dtype, y.shape, y.is_contiguous()) == (dtype, x.shape, True)
    in_float64 = [a.double() if isinstance(a, torch.Tensor) else a for a in args]
    truth = kernelgate.layer_norm.reference(*in_float64)
    assert_close_or_no_worse(y, kernelgate.layer_norm.reference(*args), truth, reduction_length=n)


def _long_row_args(op: Op, n: int) -> tuple[object, ...]:
    if op is kernelgate.rms_norm:
        return torch.zeros(2, n), torch.zeros(n), 1e-6
    if op is kernelgate.add_rms_norm:
        return torch.zeros(2, n), torch.zeros(2, n), torch.zeros(n), 1e-6
    if op is kernelgate.layer_norm:
        return torch.zeros(2, n), (n,), None, None, 1e-5
    return (torch.zeros(2, n), -1) if op in FORWARDS else (torch.zeros(2, n), torch.zeros(2, n), -1)


@pytest.mark.parametrize(
    "op",
    [*FORWARDS, *BACKWARDS, kernelgate.rms_norm, kernelgate.add_rms_norm, kernelgate.layer_norm],
    ids=lambda op: op.name,
)
def test_split_rows_takes_only_rows_longer_than_one_block(op: Op) -> None:
    """split_rows declines rows that fit one block, naming why, and keeps only blocks shorter than the row that
    give each thread 4 to 32 elements; a register cap (maxnreg, 0: none) only where a thread holds 32."""
    impl = _split_rows(op)
    assert impl.supports is not None and impl.prune is not None
    args = lambda n: _long_row_args(op, n)
    assert "fit one block" in str(impl.supports(*args(16384)))
    kept = [dict(c) for c in impl.configs or () if impl.prune(c, *args(20000))]
    assert {"BLOCK_N": 16384, "num_warps": 32, "maxnreg": 0} in kept
    assert {"BLOCK_N": 16384, "num_warps": 8, "maxnreg": 0} not in kept
    assert {"BLOCK_N": 2048, "num_warps": 32, "maxnreg": 0} not in kept  # 2 elements a thread
    assert all(c["BLOCK_N"] < 20000 for c in kept)
    capped = {(c["BLOCK_N"], c["num_warps"], c["maxnreg"]) for c in kept if c["maxnreg"]}
    assert capped == {(block, block // 1024, cap) for block in (4096, 8192, 16384) for cap in (40, 48)}


def test_split_rows_launches_with_the_register_cap_of_its_config() -> None:
    """A split_rows config's maxnreg reaches the launch (Triton compiles under it), and its 0 (no cap) does not."""
    launch_state = importlib.import_module("kernelgate.launch").call_state
    impl = _split_rows(kernelgate.softmax)
    args = (_rows((2, 20000), torch.float32, torch.device("cpu")), -1)
    for cap in (0, 40):
        launches: list[tuple[str, tuple[int, ...], dict[str, object]]] = []
        saved, launch_state.launches = launch_state.launches, launches
        try:
            with kernelgate.use_interpreter():
                result = run_candidate(impl, {"BLOCK_N": 8192, "num_warps": 8, "maxnreg": cap}, args, True, poison=True)
        finally:
            launch_state.launches = saved
        assert_close(result, torch.softmax(args[0], -1))
        assert [meta.get("maxnreg") for _, _, meta in launches] == [cap or None] * 2  # two phases interpreted


def test_split_rows_count_refuses_more_programs_a_row_than_multiprocessors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's programs must all run at once for their waiting to end: more of them than the GPU's multiprocessors
    raise Unsupported (the call takes another implementation), naming the count; CPU tensors are not limited."""
    monkeypatch.setattr(rowwise.backend, "multiprocessors", lambda device: 8)
    cuda = torch.device("cuda")
    assert rowwise.split_rows_count(cuda, 16384, 2048) == 8
    with pytest.raises(Unsupported, match="need 9 programs of 2048 columns each, more than the device's 8"):
        rowwise.split_rows_count(cuda, 16385, 2048)
    assert rowwise.split_rows_count(torch.device("cpu"), 131072, 2048) == 64
    # However many multiprocessors, the counts' encoding holds 2047 programs a row.
    monkeypatch.setattr(rowwise.backend, "multiprocessors", lambda device: 4096)
    assert rowwise.split_rows_count(cuda, 2047 * 2048, 2048) == 2047
    with pytest.raises(Unsupported, match="need 2048 programs of 2048 columns each, more than split_rows' 2047"):
        rowwise.split_rows_count(cuda, 2048 * 2048, 2048)


def _split_rows_cases(n: int, device: torch.device) -> list[tuple[Op, tuple[object, ...]]]:
    """Each op with a split_rows implementation and arguments of 3 rows of ``n`` on ``device``."""
    gen = torch.Generator().manual_seed(5)
    x, other = (torch.randn((3, n), generator=gen).to(device) for _ in range(2))
    w = torch.randn(n, generator=gen).to(device)
    target = torch.randint(0, n, (3,), generator=gen).to(device)
    y = torch.softmax(x, -1)
    return [
        (kernelgate.softmax, (x, -1)),
        (kernelgate.log_softmax, (x, -1)),
        (kernelgate.softmax_backward, (other, y, -1)),
        (kernelgate.log_softmax_backward, (other, torch.log(y), -1)),
        (kernelgate.rms_norm, (x, w, 1e-6)),
        (kernelgate.add_rms_norm, (x, other, w, 1e-6)),
        (kernelgate.layer_norm, (x, (n,), w, other[0], 1e-5)),
        (cross_entropy_with_grad, (x, target, None, -100, 0.0, "mean")),
    ]


@pytest.mark.gpu
def test_split_rows_leaves_its_counts_zero_for_the_next_launch() -> None:
    """On a GPU every split_rows kernel leaves the stream's arrival counts zero (the next launch there reuses them
    without a fill), so launches one after another, with rows split over 10, 3 and then 5 programs, each give the
    reference's result."""
    cuda = torch.device("cuda")
    kernelgate.configure(tune=False)
    with kernelgate.use_mode("triton"):
        for n, block in ((20000, 2048), (20000, 8192), (20000, 4096)):
            for op, args in _split_rows_cases(n, cuda):
                got = run_candidate(_split_rows(op), {"BLOCK_N": block, "num_warps": 4}, args, False, poison=True)
                expected = op.reference(*args)
                for g, e in zip(got, expected, strict=True) if isinstance(got, tuple) else ((got, expected),):
                    assert_close(g, e, reduction_length=n)
                torch.cuda.synchronize()
                counts = rowwise.split_rows_counts(cuda, 3)
                assert counts.tolist() == [0, 0, 0], (op.name, n, block)


def test_split_rows_counts_are_new_zeros_on_the_cpu() -> None:
    """CPU tensors (the interpreter, which does not count) get new zeros each launch, beside partials of SPLIT_BLOCK
    slots a value."""
    cpu = torch.device("cpu")
    a, b = rowwise.split_rows_counts(cpu, 4), rowwise.split_rows_counts(cpu, 4)
    assert a.tolist() == [0] * 4 and a.data_ptr() != b.data_ptr()
    partials, counts, split_block = rowwise.split_rows_buffers(cpu, 5, 3, 2)
    assert counts.tolist() == [0] * 5 and split_block == 4 and partials.shape == (5, 8)


@pytest.mark.gpu
def test_split_rows_counts_reuse_one_buffer_per_stream() -> None:
    """On a GPU one stream's launches share a buffer (the first rows of it), grown when more rows come; another
    stream has its own; fresh_counts and a CUDA graph's capture get new zeros."""
    cuda = torch.device("cuda")
    first = rowwise.split_rows_counts(cuda, 8)
    assert rowwise.split_rows_counts(cuda, 3).data_ptr() == first.data_ptr()
    longer = rowwise.split_rows_counts(cuda, 4096)
    assert longer.numel() == 4096 and longer.tolist() == [0] * 4096
    assert rowwise.split_rows_counts(cuda, 8).data_ptr() == longer.data_ptr()
    with torch.cuda.stream(torch.cuda.Stream()):
        assert rowwise.split_rows_counts(cuda, 8).data_ptr() != longer.data_ptr()
    # A kernel that does not set its counts back gets new zeros, and so does a launch captured into a CUDA graph.
    _, fresh, _ = rowwise.split_rows_buffers(cuda, 8, 3, 1, fresh_counts=True)
    assert fresh.data_ptr() != longer.data_ptr() and fresh.tolist() == [0] * 8
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = rowwise.split_rows_counts(cuda, 8)
    assert captured.data_ptr() != longer.data_ptr()


# --- split_looped: a row's programs each stream a segment of it twice ------------------------------------------------

SPLIT_LOOPED_FORWARDS = [kernelgate.softmax, kernelgate.log_softmax, kernelgate.layer_norm]
# Segments of 8192 read 2048 at a time, and of 16384 read 4096: the two shapes of SPLIT_LOOPED_CONFIGS.
SEGMENTS = [{"BLOCK_N": 8192, "STREAM_N": 2048, "num_warps": 4}, {"BLOCK_N": 16384, "STREAM_N": 4096, "num_warps": 4}]


def _split_looped(op: Op) -> TritonImpl:
    return next(impl for impl in op.implementations if impl.name == "split_looped")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("config", SEGMENTS, ids=lambda c: f"segment{c['BLOCK_N']}")
@pytest.mark.parametrize("op", FORWARDS, ids=lambda op: op.name)
def test_split_looped_forward_matches_the_reference(
    target: torch.device, op: Op, config: dict[str, int], dtype: torch.dtype
) -> None:
    """softmax and log_softmax of rows of 40000 over 5 and 3 segments (the last one partial, the first two of row 1
    starting with -inf, a whole segment of it at 8192), with a row of only -inf and a row holding a NaN (NaN rows, as
    in torch), give the reference's result; so do rows of 49152 along another dimension than the last (whole
    segments, no masks)."""
    x = _rows((5, 40000), dtype, target)
    x[1, :8192] = -INF
    x[3] = -INF
    x[4, 20000] = float("nan")
    impl = _split_looped(op)
    assert impl.supports is not None and impl.supports(x, -1) is None
    y = run_candidate(impl, config, (x, -1), target.type == "cpu", poison=True)
    assert (y.dtype, y.shape, y.is_contiguous()) == (dtype, x.shape, True)
    assert bool(torch.isnan(y[3]).all()) and bool(torch.isnan(y[4]).all())
    assert_close(y[:3], op.reference(x[:3], -1), reduction_length=x.shape[-1])
    along = (3 * torch.randn((2, 49152, 2), generator=torch.Generator().manual_seed(1))).to(target, dtype)  # dim 1
    y = run_candidate(impl, config, (along, 1), target.type == "cpu", poison=True)
    assert y.is_contiguous() and y.shape == along.shape
    assert_close(y, op.reference(along, 1), reduction_length=along.shape[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("config", SEGMENTS, ids=lambda c: f"segment{c['BLOCK_N']}")
@pytest.mark.parametrize("n", [40000, 49152])
def test_split_looped_layer_norm_matches_the_reference(
    target: torch.device, n: int, config: dict[str, int], affine: bool, dtype: torch.dtype
) -> None:
    """layer_norm of rows of 40000 (a partial last segment, its mean weighted by its count) and 49152 (whole
    segments, no masks), with and without weight and bias, a row far from zero (mean 1000: each segment's sums are
    shifted by its own first columns' mean, and the segments' means merge without cancelling) and a constant row among
    them, gives the reference's result or one closer to float64's."""
    _check_layer_norm(_split_looped(kernelgate.layer_norm), config, target, n, affine, dtype)


@pytest.mark.parametrize("op", SPLIT_LOOPED_FORWARDS, ids=lambda op: op.name)
def test_split_looped_takes_two_byte_rows_longer_than_32768(op: Op) -> None:
    """split_looped declines rows of up to SPLIT_LOOPED_ABOVE (the looped and single-block kernels were faster there
    on the GPU) and float32 x (untimed; split_rows holds more of a row a program), naming why, and keeps segments
    shorter than the row, read a quarter at a time."""
    impl = _split_looped(op)
    assert impl.supports is not None and impl.prune is not None

    def args(n: int, dtype: torch.dtype) -> tuple[object, ...]:
        x = torch.zeros(2, n, dtype=dtype)
        return (x, (n,), None, None, 1e-5) if op is kernelgate.layer_norm else (x, -1)

    assert rowwise.SPLIT_LOOPED_ABOVE == 32768
    refusal = str(impl.supports(*args(32768, torch.bfloat16)))
    assert "rows of 32768: up to 32768 the looped and single-block kernels were faster" in refusal
    assert "torch.float32 x: split_rows" in str(impl.supports(*args(40000, torch.float32)))
    assert impl.supports(*args(32769, torch.float16)) is None
    kept = [dict(c) for c in impl.configs or () if impl.prune(c, *args(40000, torch.bfloat16))]
    assert {(c["BLOCK_N"], c["STREAM_N"]) for c in kept} == {(8192, 2048), (16384, 4096)}
    assert len(kept) == 6  # 4, 8 and 16 warps each


@pytest.mark.gpu
def test_split_looped_leaves_its_counts_zero_for_the_next_launch() -> None:
    """On a GPU each split_looped forward leaves the stream's arrival counts zero, as split_rows' kernels do, so
    launches one after another, segments of 8192 then 16384, each give the reference's result."""
    cuda = torch.device("cuda")
    kernelgate.configure(tune=False)
    n = 40000
    with kernelgate.use_mode("triton"):
        for config in SEGMENTS:
            for op, args in _split_rows_cases(n, cuda):
                if op not in SPLIT_LOOPED_FORWARDS:
                    continue
                half = tuple(a.bfloat16() if isinstance(a, torch.Tensor) else a for a in args)
                got = run_candidate(_split_looped(op), config, half, False, poison=True)
                assert_close(got, op.reference(*half), reduction_length=n)
                torch.cuda.synchronize()
                assert rowwise.split_rows_counts(cuda, 3).tolist() == [0, 0, 0], (op.name, config)


@pytest.mark.parametrize(
    "op",
    [kernelgate.rms_norm_backward, kernelgate.add_rms_norm_backward, kernelgate.layer_norm_backward],
    ids=lambda op: op.name,
)
def test_the_pipelined_backward_is_offered_for_2_byte_rows_on_nvidia_gpus(op: kernelgate.Op) -> None:
    """split_rows_pipelined takes 2-byte rows on a CUDA device (and the interpreter's CPU tensors), says why not for
    float32 rows and for other devices, and keeps PREFETCH's three configurations whose threads hold 16 elements and
    whose copies ahead fit PIPELINED_SHARED_BYTES (reckoned at the widest of the tensors' elements)."""
    impl = next(i for i in op.implementations if i.name == "split_rows_pipelined")
    assert impl.supports is not None and impl.prune is not None and op.make_inputs is not None

    def args(n: int, dtype: torch.dtype, device: str = "cpu") -> tuple[object, ...]:
        return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in op.make_inputs((2, n), dtype, "cpu"))

    assert impl.supports(*args(20000, torch.bfloat16)) is None
    assert "torch.float32 rows: made for 2-byte rows" in str(impl.supports(*args(20000, torch.float32)))
    assert "NVIDIA PTX" in str(impl.supports(*args(20000, torch.bfloat16, "meta")))
    kept = [c for c in impl.configs or () if impl.prune(c, *args(40000, torch.bfloat16))]
    assert {(c["BLOCK_N"], c["num_warps"]) for c in kept} == {(2048, 4), (4096, 8), (8192, 16)}
    assert all(c["PREFETCH"] for c in kept)
    # float32 weights make the copies of the weight twice as wide: BLOCK_N 8192 no longer fits.
    wide_weight = tuple(
        a.float() if isinstance(a, torch.Tensor) and a.dim() == 1 else a for a in args(40000, torch.bfloat16)
    )
    assert {c["BLOCK_N"] for c in impl.configs or () if impl.prune(c, *wide_weight)} == {2048, 4096}


SPLITTING = ("split_rows", "split_rows_pipelined", "split_looped")
_SHARED_COUNT_OPS = [
    o.name for o in kernelgate.registered_ops() if any(impl.name in SPLITTING for impl in o.implementations)
]


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", _SHARED_COUNT_OPS)
@pytest.mark.parametrize(("shape", "dtype"), [((40, 20000), torch.float32), ((6, 40000), torch.bfloat16)])
def test_every_split_config_leaves_the_streams_counts_zero(
    op_name: str, shape: tuple[int, int], dtype: torch.dtype
) -> None:
    """On a GPU, every configuration of every implementation that splits rows over programs (split_rows, the norms'
    looping groups and their pipelined form, split_looped) leaves the whole of the stream's arrival
    counts zero: a count left behind would let a later launch on any op read partials too early, or wait for ever.
    Rows enough that the norms' backward groups loop over several; the bf16 case long enough for split_looped."""
    from kernelgate.op import get_op
    from kernelgate.selection import clone_args

    cuda = torch.device("cuda")
    op = get_op(op_name)
    torch.manual_seed(0)
    values = op.make_inputs(shape, dtype, cuda)
    launched = 0
    for impl in op.implementations:
        if impl.name not in SPLITTING:
            continue
        for config in impl.candidate_configs(values):
            try:
                run_candidate(impl, config, clone_args(values, op.mutated_positions), False, poison=True)
            except Unsupported:
                continue
            torch.cuda.synchronize()
            launched += 1
            for key, counts in rowwise._SPLIT_ROWS_COUNTS.items():
                assert not counts.any(), (impl.name, config, key, counts.nonzero().flatten()[:8].tolist())
    if dtype == torch.float32 or any(impl.name == "split_looped" for impl in op.implementations):
        assert launched, "no configuration ran"
