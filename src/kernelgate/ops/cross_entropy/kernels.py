"""Triton kernels of cross_entropy. One program per row of logits; rows are contiguous, ``stride_xm`` apart.

Notation of the docstrings: ``x`` a row of logits, ``t`` its target, ``w`` the class weights (ones
without HAS_WEIGHT), ``W = sum(w)``, ``eps`` the label smoothing, ``C = n_cols``. A row is *valid*
when ``t`` is a class index in ``[0, C)``, *ignored* when ``t == ignore_index``, and otherwise
*bad*: its loss and gradient are NaN and nothing is read at ``t``.

The row's log-sum-exp is kept as ``m + log(s)`` (``m`` the row's maximum), and differences such as
``m - x[t]`` are taken before ``log(s)`` is added: near the maximum they are exact, so large logits
(``|x| ~ 1e4``) lose no precision to the rounding of ``lse``.

With EXP2 the streamed forwards sum ``exp2(fma(x, log2(e), -b))`` instead of ``exp(x - m)``: one fused
multiply-add and one ``ex2`` per element, a subtraction fewer (the bf16 forward is bound by its instructions).
The base ``b = m * log2(e)`` is rounded once (an fma with a zero addend, which the compiler cannot fuse into
the rescale's subtraction), every term carries the same rounding, and :func:`_log_sum_exp2` takes it back out
exactly (another fma gives the product's residual). That needs an fma rounded once: compiled kernels have it;
the launchers leave EXP2 off in a Triton interpreter that rounds twice.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelgate.ops.split_rows import leave_row, load_row_partials, split_row_block, split_row_segment, wait_for_row
from kernelgate.ops.tiles import LOG2E, load_tile, store_tile

LN2: tl.constexpr = tl.constexpr(0.6931471805599453)  # ln(2)


@triton.jit
def _row_target(target_ptr, row, stride_tm, n_cols, ignore_index):
    """The row's target ``t``: whether the row is ignored, whether it is valid, and ``t`` where valid (else 0)."""
    t = tl.load(target_ptr + row * stride_tm)
    ignored = t == ignore_index
    valid = (t != ignore_index) & (t >= 0) & (t < n_cols)
    return ignored, valid, tl.where(valid, t, 0)


@triton.jit
def _target_logit(x_row, t_safe, valid):
    """``x[t]`` in float32 (0 unless the row is valid), and the pivot of the smoothing sums: ``x[t]`` where finite,
    else 0 (-inf and NaN would poison the sums)."""
    x_t = tl.load(x_row + t_safe, mask=valid, other=0.0).to(tl.float32)
    return x_t, tl.where(tl.abs(x_t) < float("inf"), x_t, 0.0)


@triton.jit
def _target_weight(weight_ptr, t_safe, valid, HAS_WEIGHT: tl.constexpr):
    """``w[t]`` in float32 for a valid row (1 without HAS_WEIGHT), 0 for any other row."""
    if HAS_WEIGHT:
        w_t = tl.load(weight_ptr + t_safe, mask=valid, other=0.0).to(tl.float32)
    else:
        w_t = tl.where(valid, 1.0, 0.0)
    return w_t


@triton.jit
def _online_lse(m, s, x):
    """One block ``x`` (float32, -inf where masked) added to a streamed log-sum-exp: the running maximum ``m``
    and the per-lane sums ``s`` of ``exp(x - m)``, returned updated."""
    m_new = tl.maximum(m, tl.max(x, axis=0))
    # Equal maxima (both -inf included) keep s; a NaN anywhere makes s NaN, as torch's result is.
    s = s * tl.where(m_new == m, 1.0, tl.exp(m - m_new))
    s += tl.exp(x - tl.where(m_new == float("-inf"), 0.0, m_new))
    return m_new, s


@triton.jit
def _exponent_base(m):
    """``b = m * log2(e)``, rounded once; 0 while ``m`` is -inf (nothing read yet), so that a -inf logit gives
    exp2(-inf) = 0 and not NaN."""
    return tl.where(m == float("-inf"), 0.0, tl.fma(m, LOG2E, 0.0))


@triton.jit
def _online_lse_exp2(m, b, s, x):
    """:func:`_online_lse` in the exp2 form: ``s`` holds the per-lane sums of ``exp2(x * log2(e) - b)``, ``b`` the
    base of ``m`` (:func:`_exponent_base`); all three returned updated."""
    m_new = tl.maximum(m, tl.max(x, axis=0))
    b_new = _exponent_base(m_new)
    # Equal maxima keep s; from -inf (s is 0) the factor is 0, not exp2 of a base that may overflow.
    s = s * tl.where(m_new == m, 1.0, tl.where(m == float("-inf"), 0.0, tl.exp2(b - b_new)))
    s += tl.exp2(tl.fma(x, LOG2E, -b_new))
    return m_new, b_new, s


@triton.jit
def _log_sum_exp2(m, b, total):
    """``log(sum(exp(x - m)))`` from the total of the sums of :func:`_online_lse_exp2`: it is
    ``2**(m * log2(e) - b)`` times that, and an fma gives the exponent exactly (0 unless ``m`` is finite)."""
    residual = tl.where(tl.abs(m) < float("inf"), tl.fma(m, LOG2E, -b), 0.0)
    return tl.log(total) - residual * LN2


@triton.jit
def _smoothing_sums(sum_w, sum_wx, x, cols, mask, pivot, weight_ptr, HAS_WEIGHT: tl.constexpr):
    """One block added to the per-lane sums of the smoothing term: ``w`` and ``w * (x - pivot)``."""
    if HAS_WEIGHT:
        w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        sum_w += w
        sum_wx += tl.where(mask, w * (x - pivot), 0.0)
    else:
        sum_wx += tl.where(mask, x - pivot, 0.0)
    return sum_w, sum_wx


@triton.jit
def _streamed_block(
    m, b, s, sum_w, sum_wx, x_row, cols, n_cols, pivot, weight_ptr, HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr, EVICTION: tl.constexpr, MASKED: tl.constexpr, EXP2: tl.constexpr,
):  # fmt: skip
    """The columns ``cols`` of a row added to the sums of :func:`_streamed_sums`; without MASKED every column
    is in the row and the load takes no mask."""
    x = load_tile(x_row + cols, cols < n_cols, float("-inf"), not MASKED, EVICTION).to(tl.float32)
    if EXP2:
        m, b, s = _online_lse_exp2(m, b, s, x)
    else:
        m, s = _online_lse(m, s, x)
    if HAS_SMOOTHING:
        sum_w, sum_wx = _smoothing_sums(sum_w, sum_wx, x, cols, cols < n_cols, pivot, weight_ptr, HAS_WEIGHT)
    return m, b, s, sum_w, sum_wx


@triton.jit
def _streamed_sums(
    x_row, weight_ptr, n_read, n_cols, pivot, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    EVICTION: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, EXP2: tl.constexpr,
):  # fmt: skip
    """The first ``n_read`` (0 or ``n_cols``) elements of a row streamed in blocks of BLOCK_N with an online
    maximum (one exp per element): ``m``, ``log(sum(exp(x - m)))``, with HAS_SMOOTHING the per-lane sums of
    :func:`_smoothing_sums`, and with EXP2 the sums' base ``b`` and the log2 of their total, from which
    :func:`_store_dlogits_block` forms the softmax. EVICTION: the cache policy of the row's loads. EXP2: the
    sums' form (module docstring).

    The whole blocks are read without a mask, the last partial one (if any) with one: the mask's compare and
    select per element cost the bf16 forward 5 to 13 % on the H200, where it is bound by instructions
    (benchmarks/results/h200/ce-variants-bb6a88a.txt).
    NUM_STAGES goes to the loop's ``tl.range``: from 2 on, the next blocks' loads are in flight (asynchronous
    copies on sm_90) while one is reduced; a plain loop compiles to none."""
    m = tl.full((), float("-inf"), tl.float32)
    b = tl.zeros((), tl.float32)  # with EXP2, the base of m (_exponent_base)
    s = tl.zeros([BLOCK_N], tl.float32)  # per lane: sum of exp(x - m), or with EXP2 of exp2(x * log2(e) - b)
    sum_w = tl.zeros([BLOCK_N], tl.float32)
    sum_wx = tl.zeros([BLOCK_N], tl.float32)  # per lane: sum of w * (x - pivot)
    n_whole = n_read // BLOCK_N * BLOCK_N
    for start in tl.range(0, n_whole, BLOCK_N, num_stages=NUM_STAGES):
        m, b, s, sum_w, sum_wx = _streamed_block(
            m, b, s, sum_w, sum_wx, x_row, start + tl.arange(0, BLOCK_N), n_cols, pivot, weight_ptr, HAS_WEIGHT,
            HAS_SMOOTHING, EVICTION, False, EXP2,
        )  # fmt: skip
    if n_whole < n_read:
        m, b, s, sum_w, sum_wx = _streamed_block(
            m, b, s, sum_w, sum_wx, x_row, n_whole + tl.arange(0, BLOCK_N), n_cols, pivot, weight_ptr, HAS_WEIGHT,
            HAS_SMOOTHING, EVICTION, True, EXP2,
        )  # fmt: skip
    total = tl.sum(s, axis=0)
    log_s = _log_sum_exp2(m, b, total) if EXP2 else tl.log(total)
    return m, log_s, sum_w, sum_wx, b, tl.log2(total)


@triton.jit
def _store_row_loss(
    loss_ptr, target_weight_ptr, row, m, log_s, sum_w, sum_wx, x_t, pivot, weight_ptr, t_safe, valid, ignored,
    n_cols, label_smoothing, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, WRITE_TARGET_WEIGHT: tl.constexpr,
):  # fmt: skip
    """Store the row's loss from its maximum ``m``, ``log(s)`` and smoothing sums (see
    :func:`_cross_entropy_fwd_kernel`), and with WRITE_TARGET_WEIGHT ``w[t]``; return ``w[t]`` and ``W`` (``C``
    unless HAS_WEIGHT and HAS_SMOOTHING). An ignored row's loss is 0, a bad row's NaN."""
    w_t = _target_weight(weight_ptr, t_safe, valid, HAS_WEIGHT)
    loss = w_t * ((m - x_t) + log_s)
    total_w = n_cols + 0.0
    if HAS_SMOOTHING:
        if HAS_WEIGHT:
            total_w = tl.sum(sum_w, axis=0)
        smooth = total_w * ((m - pivot) + log_s) - tl.sum(sum_wx, axis=0)
        loss = (1.0 - label_smoothing) * loss + label_smoothing / n_cols * smooth
    loss = tl.where(valid, loss, tl.where(ignored, 0.0, float("nan")))
    tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
    if WRITE_TARGET_WEIGHT:
        tl.store(target_weight_ptr + row, w_t)
    return w_t, total_w


@triton.jit
def _cross_entropy_fwd_kernel(
    x_ptr, target_ptr, weight_ptr, loss_ptr, target_weight_ptr, stats_ptr, stride_xm, stride_tm, n_cols,
    ignore_index, label_smoothing, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    WRITE_TARGET_WEIGHT: tl.constexpr, WRITE_STATS: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    EXP2: tl.constexpr,
):  # fmt: skip
    """loss[m] = (1 - eps) * w[t] * (lse - x[t]) + eps / C * sum_c w[c] * (lse - x[c]), in one read of the row.

    x_ptr: (n_rows, n_cols). target_ptr: (n_rows,) int64, ``stride_tm`` apart. weight_ptr: (n_cols,)
    (read only with HAS_WEIGHT). loss_ptr: (n_rows,), the output dtype or float32. target_weight_ptr:
    (n_rows,) float32, ``w[t]`` (0 unless valid), written only with WRITE_TARGET_WEIGHT. stats_ptr:
    (n_rows, 2) float32, the row's ``m`` and ``log(s)`` (so ``lse = m + log(s)``; both -inf for a row
    that is not valid, which is not read), written only with WRITE_STATS, for the backward.
    Grid: (n_rows,). The smoothing term (only with HAS_SMOOTHING) is ``W * (lse - p) - sum(w * (x - p))``
    with the pivot ``p = x[t]``, which takes a common offset of the logits out of the sum.

    The row is streamed in blocks of BLOCK_N with an online maximum: one exp per element, NUM_STAGES blocks in
    flight (:func:`_streamed_sums`). An ignored row's loss is 0 and a bad row's NaN; neither reads the row.
    """
    row = tl.program_id(0)
    ignored, valid, t_safe = _row_target(target_ptr, row, stride_tm, n_cols, ignore_index)
    x_row = x_ptr + row * stride_xm
    x_t, pivot = _target_logit(x_row, t_safe, valid)
    m, log_s, sum_w, sum_wx, _, _ = _streamed_sums(
        x_row, weight_ptr, tl.where(valid, n_cols, 0), n_cols, pivot, HAS_WEIGHT, HAS_SMOOTHING, "evict_first", BLOCK_N,
        NUM_STAGES, EXP2,
    )  # fmt: skip
    _store_row_loss(
        loss_ptr, target_weight_ptr, row, m, log_s, sum_w, sum_wx, x_t, pivot, weight_ptr, t_safe, valid, ignored,
        n_cols, label_smoothing, HAS_WEIGHT, HAS_SMOOTHING, WRITE_TARGET_WEIGHT,
    )  # fmt: skip
    if WRITE_STATS:
        tl.store(stats_ptr + 2 * row, m)
        tl.store(stats_ptr + 2 * row + 1, log_s)


@triton.jit
def _cross_entropy_reduce_kernel(
    loss_ptr, target_weight_ptr, out_ptr, n_rows, MEAN: tl.constexpr, BLOCK_M: tl.constexpr
):
    """out = sum(loss), divided by sum(target_weight) when MEAN (0 / 0 = NaN when no row counts).

    loss_ptr, target_weight_ptr: (n_rows,) float32. out_ptr: (), the output dtype. Grid: (1,): one
    program sums in a fixed order, so the result is deterministic.
    """
    total = tl.zeros([BLOCK_M], tl.float32)
    weights = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, n_rows, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        mask = rows < n_rows
        total += tl.load(loss_ptr + rows, mask=mask, other=0.0)
        if MEAN:
            weights += tl.load(target_weight_ptr + rows, mask=mask, other=0.0)
    result = tl.sum(total, axis=0)
    if MEAN:
        result = result / tl.sum(weights, axis=0)
    tl.store(out_ptr, result.to(out_ptr.dtype.element_ty))


@triton.jit
def _cross_entropy_bwd_scale_kernel(
    grad_ptr, target_ptr, weight_ptr, scale_ptr, stride_tm, n_rows, n_cols, ignore_index,
    HAS_GRAD: tl.constexpr, SKIP_UNIT: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """scale = grad / sum(w[t] over the valid rows): each row's share of the gradient of a "mean" loss.

    grad_ptr: () the loss's gradient (read only with HAS_GRAD; 1 without). target_ptr: (n_rows,)
    int64, ``stride_tm`` apart. weight_ptr: (n_cols,) (read only with HAS_WEIGHT). scale_ptr: (1,)
    float32, not written with SKIP_UNIT where grad is 1 (the backward kernel then writes nothing
    either). Grid: (1,). The gradient and the divisor stay on the device: no synchronisation.
    """
    if SKIP_UNIT:
        unit = tl.load(grad_ptr).to(tl.float32) == 1.0
        if unit:
            return
    acc = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, n_rows, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        in_rows = rows < n_rows
        t = tl.load(target_ptr + rows * stride_tm, mask=in_rows, other=0)
        valid = in_rows & (t != ignore_index) & (t >= 0) & (t < n_cols)
        acc += _target_weight(weight_ptr, tl.where(valid, t, 0), valid, HAS_WEIGHT)
    grad = tl.load(grad_ptr).to(tl.float32) if HAS_GRAD else 1.0
    tl.store(scale_ptr, grad / tl.sum(acc, axis=0))


@triton.jit
def _dlogits_scales(g, w_t, total_w, n_cols, label_smoothing, HAS_SMOOTHING: tl.constexpr):
    """The row's gradient ``g * d loss / d x`` as ``p * a - [c == t] * b - w[c] * c_w``, the scalars ``(a, b, c_w)``
    with ``g`` folded in: ``d loss / d x = p * ((1 - eps) * w[t] + eps / C * W) - (1 - eps) * w[t] * [c == t]
    - eps / C * w[c]``, without smoothing ``p * w[t] - w[t] * [c == t]``."""
    if HAS_SMOOTHING:
        on_target = g * ((1.0 - label_smoothing) * w_t)
        spread = g * (label_smoothing / n_cols)
        a = on_target + spread * total_w
        b = on_target
        c_w = spread
    else:
        a = g * w_t
        b = a
        c_w = 0.0
    return a, b, c_w


@triton.jit
def _store_dlogits(
    dx_ptr, p, cols, mask, weight_ptr, t_safe, a, b, c_w, keep, HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr, MASKED: tl.constexpr, EVICTION: tl.constexpr,
):  # fmt: skip
    """Store the gradient of :func:`_dlogits_scales` for the columns ``cols`` of a row at ``dx_ptr``, NaN unless
    ``keep`` (a bad row); without MASKED every column is in the row and the store takes no mask. EVICTION: the
    store's cache policy (:func:`~kernelgate.ops.tiles.store_tile`).

    The kernels that hold a row in registers pass ``keep`` (a select per element). Folding the NaN into ``a``
    instead took split_rows' fused kernel from 64 to 82 registers a thread for float32 at BLOCK_N=4096 and 4
    warps (8 programs a multiprocessor to 5; sm_90, Triton 3.6), and that configuration's tuned time at
    2048x256000 from 1596 to 1952 us on an H100. The streamed gradient pass folds it
    (:func:`_store_dlogits_looped`) and passes True."""
    dx = p * a - tl.where(cols == t_safe, b, 0.0)
    if HAS_SMOOTHING:
        if HAS_WEIGHT:
            w = load_tile(weight_ptr + cols, mask, 0.0, not MASKED, "")
            dx -= c_w * w.to(tl.float32)
        else:
            dx -= c_w
    dx = tl.where(keep, dx, float("nan"))
    store_tile(dx_ptr + cols, dx.to(dx_ptr.dtype.element_ty), mask, not MASKED, EVICTION)


@triton.jit
def _store_dlogits_block(
    x_row, dx_row, cols, n_cols, m, log_s, b_m, log2_s, weight_ptr, t_safe, a, b, c_w, HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr, MASKED: tl.constexpr, EXP2: tl.constexpr,
):  # fmt: skip
    """The gradient of the columns ``cols`` of a row from its ``m`` and ``log(s)``; with EXP2 the softmax is
    ``exp2(fma(x, log2(e), -b_m) - log2_s)``, ``b_m`` the base of the streamed sums and ``log2_s`` the log2 of
    their total (:func:`_streamed_sums`): an fma, a subtraction and an ``ex2`` per element."""
    mask = cols < n_cols
    x = load_tile(x_row + cols, mask, float("-inf"), not MASKED, "evict_first").to(tl.float32)
    p = tl.exp2(tl.fma(x, LOG2E, -b_m) - log2_s) if EXP2 else tl.exp((x - m) - log_s)
    _store_dlogits(
        dx_row, p, cols, mask, weight_ptr, t_safe, a, b, c_w, True, HAS_WEIGHT, HAS_SMOOTHING, MASKED, "evict_first"
    )


@triton.jit
def _store_dlogits_looped(
    x_row, dx_row, m, log_s, b_m, log2_s, weight_ptr, t_safe, a, b, c_w, keep, n_cols, HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, EXP2: tl.constexpr,
):  # fmt: skip
    """The gradient of a row longer than one block (:func:`_store_dlogits_block`): one more read of the row, the
    whole blocks without a mask and NUM_STAGES of them in flight, as :func:`_streamed_sums` reads them. A bad
    row's NaN (unless ``keep``) is folded into ``a``, so no block selects per element.

    The row is read back to front, the partial last block first: the blocks the first pass read last are the
    likeliest still in L2. The gradient's stores ask L2 to drop their lines first, so they do not push out the
    row's lines still to be read. Both together, on an H100, took the looped kernel's best tuned time at bf16
    4096x128256 from 1060 to 999 us, float32 from 2080 to 1972 and bf16 8192x32000 from 415 to 404
    (benchmarks/results/h100/ce-gradient-pass-order-8bada93)."""
    a = tl.where(keep, a, float("nan"))
    n_blocks = n_cols // BLOCK_N
    if n_blocks * BLOCK_N < n_cols:
        _store_dlogits_block(
            x_row, dx_row, n_blocks * BLOCK_N + tl.arange(0, BLOCK_N), n_cols, m, log_s, b_m, log2_s, weight_ptr,
            t_safe, a, b, c_w, HAS_WEIGHT, HAS_SMOOTHING, True, EXP2,
        )  # fmt: skip
    for i in tl.range(0, n_blocks, num_stages=NUM_STAGES):
        _store_dlogits_block(
            x_row, dx_row, (n_blocks - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N), n_cols, m, log_s, b_m, log2_s,
            weight_ptr, t_safe, a, b, c_w, HAS_WEIGHT, HAS_SMOOTHING, False, EXP2,
        )  # fmt: skip


@triton.jit
def _cross_entropy_bwd_kernel(
    grad_ptr, loss_grad_ptr, x_ptr, target_ptr, weight_ptr, dx_ptr, stride_gm, stride_xm, stride_tm, stride_dxm, n_cols,
    ignore_index, label_smoothing, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, SKIP_UNIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dx[m, :] = g[m] * d loss / d x (:func:`_dlogits_scales`) for a row that fits one block: read once, written
    once.

    grad_ptr: (n_rows,) ``stride_gm`` apart (0 for one value shared by every row: "sum", or the
    float32 scale of "mean"). x_ptr, dx_ptr: (n_rows, n_cols). target_ptr: (n_rows,) int64,
    ``stride_tm`` apart. weight_ptr: (n_cols,) (read only with HAS_WEIGHT). Grid: (n_rows,).
    BLOCK_N >= n_cols, a power of two. An ignored row is 0 * (...): 0, or NaN where its softmax is
    NaN, as torch's; a bad row is NaN. With SKIP_UNIT, dx already holds the gradient for an
    incoming gradient of 1 (cross_entropy_with_grad's), and where the loss's gradient
    ``loss_grad_ptr`` () is 1 the program returns at once: nothing is read or written.
    """
    if SKIP_UNIT:
        unit = tl.load(loss_grad_ptr).to(tl.float32) == 1.0
        if unit:
            return
    row = tl.program_id(0)
    ignored, valid, t_safe = _row_target(target_ptr, row, stride_tm, n_cols, ignore_index)
    g = tl.where(valid, tl.load(grad_ptr + row * stride_gm).to(tl.float32), 0.0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    p = e / tl.sum(e, axis=0)
    w_t = _target_weight(weight_ptr, t_safe, valid, HAS_WEIGHT)
    if HAS_WEIGHT and HAS_SMOOTHING:
        total_w = tl.sum(tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32), axis=0)
    else:
        total_w = n_cols + 0.0
    a, b, c_w = _dlogits_scales(g, w_t, total_w, n_cols, label_smoothing, HAS_SMOOTHING)
    _store_dlogits(
        dx_ptr + row * stride_dxm, p, cols, mask, weight_ptr, t_safe, a, b, c_w, valid | ignored, HAS_WEIGHT,
        HAS_SMOOTHING, True, "",
    )  # fmt: skip


@triton.jit
def _cross_entropy_bwd_looped_kernel(
    grad_ptr, loss_grad_ptr, x_ptr, target_ptr, weight_ptr, stats_ptr, dx_ptr, stride_gm, stride_xm, stride_tm,
    stride_dxm, n_cols, ignore_index, label_smoothing, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    HAS_STATS: tl.constexpr, SKIP_UNIT: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The gradient of a row longer than one block: the row's ``m`` and ``log(s)``, then one pass writing dx.

    Pointers as in :func:`_cross_entropy_bwd_kernel`; grid (n_rows,). stats_ptr: (n_rows, 2) float32,
    the forward's ``m`` and ``log(s)`` per row (read only with HAS_STATS). A valid row with HAS_STATS
    is read once and written once. Otherwise a first pass computes them (asking the cache to keep the
    row, so the second read mostly hits L2 for rows of a few 10K elements): an ignored row is always
    read, so that its gradient is NaN exactly where torch's is, since the forward did not read it.
    SKIP_UNIT as in :func:`_cross_entropy_bwd_kernel`.
    """
    if SKIP_UNIT:
        unit = tl.load(loss_grad_ptr).to(tl.float32) == 1.0
        if unit:
            return
    row = tl.program_id(0)
    ignored, valid, t_safe = _row_target(target_ptr, row, stride_tm, n_cols, ignore_index)
    g = tl.where(valid, tl.load(grad_ptr + row * stride_gm).to(tl.float32), 0.0)
    x_row = x_ptr + row * stride_xm
    first_pass = tl.where(valid, 0, n_cols) if HAS_STATS else n_cols
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, first_pass, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf"), eviction_policy="evict_last")
        m, s = _online_lse(m, s, x.to(tl.float32))
    log_s = tl.log(tl.sum(s, axis=0))
    if HAS_STATS:
        m = tl.where(valid, tl.load(stats_ptr + 2 * row, mask=valid, other=0.0), m)
        log_s = tl.where(valid, tl.load(stats_ptr + 2 * row + 1, mask=valid, other=0.0), log_s)
    w_t = _target_weight(weight_ptr, t_safe, valid, HAS_WEIGHT)
    if HAS_WEIGHT and HAS_SMOOTHING:
        sum_w = tl.zeros([BLOCK_N], tl.float32)  # W: the weights are a few KB to 1 MB, read from L2
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            sum_w += tl.load(weight_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        total_w = tl.sum(sum_w, axis=0)
    else:
        total_w = n_cols + 0.0
    a, b, c_w = _dlogits_scales(g, w_t, total_w, n_cols, label_smoothing, HAS_SMOOTHING)
    _store_dlogits_looped(
        x_row, dx_ptr + row * stride_dxm, m, log_s, m, log_s, weight_ptr, t_safe, a, b, c_w, valid | ignored, n_cols,
        HAS_WEIGHT, HAS_SMOOTHING, BLOCK_N, 1, False,
    )  # fmt: skip


@triton.jit
def _cross_entropy_fwd_grad_kernel(
    x_ptr, target_ptr, weight_ptr, share_ptr, loss_ptr, target_weight_ptr, dx_ptr, stride_xm, stride_tm, n_cols,
    ignore_index, label_smoothing, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr, MEAN: tl.constexpr,
    WRITE_TARGET_WEIGHT: tl.constexpr, LOOPED: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    EXP2: tl.constexpr,
):  # fmt: skip
    """The row's loss, as :func:`_cross_entropy_fwd_kernel` writes it, and its gradient for an incoming gradient
    of 1: ``dx[m, :] = g * d loss / d x`` (:func:`_dlogits_scales`).

    Pointers as in :func:`_cross_entropy_fwd_kernel` (without stats); dx_ptr: (n_rows, n_cols),
    contiguous. share_ptr: (1,) float32, ``g`` of every valid row for "mean" (1 / sum of the target
    weights, from :func:`_cross_entropy_bwd_scale_kernel`; read only with MEAN); ``g`` is 1 otherwise,
    0 for a row that is not valid. Grid: (n_rows,). Without LOOPED, BLOCK_N >= n_cols (a power of
    two) and the row is read once, held in registers. With LOOPED a first pass streams the row for
    its loss, ``m`` and ``log(s)`` (asking the cache to keep it; NUM_STAGES blocks in flight) and a second reads
    it again to write dx: on the H200 that read costs about as much as the first, even for rows of 32000 bf16.
    An ignored row is read (its gradient is 0, or NaN where its softmax is NaN, as torch's); a bad
    row is not (its gradient is NaN).
    """
    row = tl.program_id(0)
    ignored, valid, t_safe = _row_target(target_ptr, row, stride_tm, n_cols, ignore_index)
    x_row = x_ptr + row * stride_xm
    x_t, pivot = _target_logit(x_row, t_safe, valid)
    n_read = tl.where(valid | ignored, n_cols, 0)
    if LOOPED:
        m, log_s, sum_w, sum_wx, b_m, log2_s = _streamed_sums(
            x_row, weight_ptr, n_read, n_cols, pivot, HAS_WEIGHT, HAS_SMOOTHING, "evict_last", BLOCK_N, NUM_STAGES, EXP2
        )
    else:
        cols = tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < n_read, other=float("-inf")).to(tl.float32)
        m, s = _online_lse(tl.full((), float("-inf"), tl.float32), tl.zeros([BLOCK_N], tl.float32), x)
        log_s = tl.log(tl.sum(s, axis=0))
        sum_w = tl.zeros([BLOCK_N], tl.float32)
        sum_wx = tl.zeros([BLOCK_N], tl.float32)
        if HAS_SMOOTHING:
            sum_w, sum_wx = _smoothing_sums(sum_w, sum_wx, x, cols, cols < n_cols, pivot, weight_ptr, HAS_WEIGHT)
    w_t, total_w = _store_row_loss(
        loss_ptr, target_weight_ptr, row, m, log_s, sum_w, sum_wx, x_t, pivot, weight_ptr, t_safe, valid, ignored,
        n_cols, label_smoothing, HAS_WEIGHT, HAS_SMOOTHING, WRITE_TARGET_WEIGHT,
    )  # fmt: skip
    g = tl.where(valid, tl.load(share_ptr) if MEAN else 1.0, 0.0)
    a, b, c_w = _dlogits_scales(g, w_t, total_w, n_cols, label_smoothing, HAS_SMOOTHING)
    dx_row = dx_ptr + row * n_cols
    if LOOPED:
        _store_dlogits_looped(
            x_row, dx_row, m, log_s, b_m, log2_s, weight_ptr, t_safe, a, b, c_w, valid | ignored, n_cols, HAS_WEIGHT,
            HAS_SMOOTHING, BLOCK_N, NUM_STAGES, EXP2,
        )  # fmt: skip
    else:
        _store_dlogits(
            dx_row, tl.exp((x - m) - log_s), cols, cols < n_cols, weight_ptr, t_safe, a, b, c_w, valid | ignored,
            HAS_WEIGHT, HAS_SMOOTHING, True, "",
        )  # fmt: skip


@triton.jit
def _store_split_partials(partial_row, part, m_part, s_part, sum_w, sum_wx, SPLIT_BLOCK: tl.constexpr):
    """Store a program's partials of its row at ``partial_row`` (``4 * SPLIT_BLOCK`` float32 slots, see
    :func:`_cross_entropy_fwd_grad_split_kernel`): its part's maximum, its sum of ``exp(x - max)``, and the
    totals of its per-lane smoothing sums."""
    tl.store(partial_row + part, m_part)
    tl.store(partial_row + SPLIT_BLOCK + part, s_part)
    tl.store(partial_row + 2 * SPLIT_BLOCK + part, tl.sum(sum_w, axis=0))
    tl.store(partial_row + 3 * SPLIT_BLOCK + part, tl.sum(sum_wx, axis=0))


@triton.jit
def _split_row_loss_and_scales(
    partial_row, arrived_ptr, loss_ptr, target_weight_ptr, share_ptr, weight_ptr, row, part, n_split, x_t, pivot,
    t_safe, valid, ignored, n_cols, label_smoothing, HAS_WEIGHT: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    MEAN: tl.constexpr, WRITE_TARGET_WEIGHT: tl.constexpr, PHASE: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    """Once a row's programs have all stored their partials (:func:`_store_split_partials`): the row's ``m`` and
    ``log(s)`` combined from them, its loss written by the row's first program, and the gradient's scalars
    ``a``, ``b``, ``c_w`` (:func:`_dlogits_scales`) for this program's part. Counts the program out of the row
    (``leave_row``) on a GPU (PHASE 0)."""
    m_parts = load_row_partials(partial_row, 0, n_split, float("-inf"), SPLIT_BLOCK)
    s_parts = load_row_partials(partial_row, 1, n_split, 0.0, SPLIT_BLOCK)
    w_parts = load_row_partials(partial_row, 2, n_split, 0.0, SPLIT_BLOCK)
    wx_parts = load_row_partials(partial_row, 3, n_split, 0.0, SPLIT_BLOCK)
    if PHASE == 0:
        leave_row(arrived_ptr, row, part, n_split)
    m = tl.max(m_parts, axis=0)
    # A part with nothing but -inf has a sum of 0 (its rescale would be NaN); a NaN part's stays NaN.
    scale = tl.where(m_parts == float("-inf"), 0.0, tl.exp(m_parts - tl.where(m == float("-inf"), 0.0, m)))
    log_s = tl.log(tl.sum(s_parts * scale, axis=0))
    if part == 0:
        _store_row_loss(
            loss_ptr, target_weight_ptr, row, m, log_s, w_parts, wx_parts, x_t, pivot, weight_ptr, t_safe, valid,
            ignored, n_cols, label_smoothing, HAS_WEIGHT, HAS_SMOOTHING, WRITE_TARGET_WEIGHT,
        )  # fmt: skip
    w_t = _target_weight(weight_ptr, t_safe, valid, HAS_WEIGHT)
    total_w = tl.sum(w_parts, axis=0) if HAS_WEIGHT and HAS_SMOOTHING else n_cols + 0.0
    g = tl.where(valid, tl.load(share_ptr) if MEAN else 1.0, 0.0)
    a, b, c_w = _dlogits_scales(g, w_t, total_w, n_cols, label_smoothing, HAS_SMOOTHING)
    return m, log_s, a, b, c_w


@triton.jit
def _cross_entropy_fwd_grad_split_kernel(
    x_ptr, target_ptr, weight_ptr, share_ptr, loss_ptr, target_weight_ptr, dx_ptr, partial_ptr, arrived_ptr,
    stride_xm, stride_tm, n_cols, n_split, ignore_index, label_smoothing, HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr, MEAN: tl.constexpr, WRITE_TARGET_WEIGHT: tl.constexpr, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """:func:`_cross_entropy_fwd_grad_kernel`'s loss and gradient with each row split over ``n_split`` programs
    that hold a block of BLOCK_N columns each in registers: the row is read once and its gradient written once,
    however long it is.

    Grid: (n_rows * n_split,); program ``p`` holds columns ``[k * BLOCK_N, (k + 1) * BLOCK_N)`` of row
    ``p // n_split``, ``k = p % n_split``, so a row's programs are consecutive. Each reduces its block to its
    maximum, its sum of ``exp(x - max)`` and (with HAS_SMOOTHING) the smoothing sums, and stores them at
    partial_ptr: (n_rows, 4 * SPLIT_BLOCK) float32, SPLIT_BLOCK >= n_split a power of two; then it waits for
    the row's other programs (arrived_ptr: (n_rows,) int32, zeros; :mod:`kernelgate.ops.split_rows` says why the
    waiting ends, and how PHASE runs it under the interpreter). Every program then combines the row's partials
    into ``m`` and ``log(s)``, the row's first writes the loss, and each writes its block's gradient.
    Other pointers as in :func:`_cross_entropy_fwd_grad_kernel`.
    """
    row, part, cols, in_row = split_row_block(n_split, n_cols, BLOCK_N)
    ignored, valid, t_safe = _row_target(target_ptr, row, stride_tm, n_cols, ignore_index)
    x_row = x_ptr + row * stride_xm
    x_t, pivot = _target_logit(x_row, t_safe, valid)
    x = tl.load(x_row + cols, mask=cols < tl.where(valid | ignored, n_cols, 0), other=float("-inf")).to(tl.float32)
    partial_row = partial_ptr + row * (4 * SPLIT_BLOCK)
    if PHASE != 2:
        m_part = tl.max(x, axis=0)
        s_part = tl.sum(tl.exp(x - tl.where(m_part == float("-inf"), 0.0, m_part)), axis=0)
        sum_w = tl.zeros([BLOCK_N], tl.float32)
        sum_wx = tl.zeros([BLOCK_N], tl.float32)
        if HAS_SMOOTHING:
            sum_w, sum_wx = _smoothing_sums(sum_w, sum_wx, x, cols, in_row, pivot, weight_ptr, HAS_WEIGHT)
        _store_split_partials(partial_row, part, m_part, s_part, sum_w, sum_wx, SPLIT_BLOCK)
    if PHASE == 0:
        wait_for_row(arrived_ptr, row, n_split)
    if PHASE != 1:
        m, log_s, a, b, c_w = _split_row_loss_and_scales(
            partial_row, arrived_ptr, loss_ptr, target_weight_ptr, share_ptr, weight_ptr, row, part, n_split, x_t,
            pivot, t_safe, valid, ignored, n_cols, label_smoothing, HAS_WEIGHT, HAS_SMOOTHING, MEAN,
            WRITE_TARGET_WEIGHT, PHASE, SPLIT_BLOCK,
        )  # fmt: skip
        _store_dlogits(
            dx_ptr + row * n_cols, tl.exp((x - m) - log_s), cols, in_row, weight_ptr, t_safe, a, b, c_w,
            valid | ignored, HAS_WEIGHT, HAS_SMOOTHING, True, "",
        )  # fmt: skip


@triton.jit
def _cross_entropy_fwd_grad_split_looped_kernel(
    x_ptr, target_ptr, weight_ptr, share_ptr, loss_ptr, target_weight_ptr, dx_ptr, partial_ptr, arrived_ptr,
    stride_xm, stride_tm, n_cols, n_split, ignore_index, label_smoothing, HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr, MEAN: tl.constexpr, WRITE_TARGET_WEIGHT: tl.constexpr, PHASE: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, STREAM_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    EXP2: tl.constexpr,
):  # fmt: skip
    """:func:`_cross_entropy_fwd_grad_split_kernel` (arguments, grid and waiting as its) with a segment of BLOCK_N
    columns a program, streamed STREAM_N at a time (NUM_STAGES in flight), instead of a block held in registers:
    the segment's partial sums from a first read (:func:`_streamed_sums`, asking L2 to keep it), the row's from
    every program's once they have all arrived, then the segment's gradient from a second read, back to front
    (:func:`_store_dlogits_looped`).

    The looped kernel's second read of a row comes mostly from memory: a program a row, every row in flight
    holds its whole length in L2 between the reads. Here only a segment a program is in flight between its two
    reads, which L2 holds, and a program's wait for the row's sums is spread over a segment's read rather than a
    block's. On an H100, bf16 4096x128256 took 884 us against looped's 981 and split_rows' 1010, 2048x256000 860
    against 1040 and 1042; float32, whose split_rows kernel holds more of a row, it does not help
    (benchmarks/results/h100/ce-split-looped-cc1334d)."""
    row, part, start, seg_len = split_row_segment(n_split, n_cols, BLOCK_N)
    ignored, valid, t_safe = _row_target(target_ptr, row, stride_tm, n_cols, ignore_index)
    x_row = x_ptr + row * stride_xm
    x_t, pivot = _target_logit(x_row, t_safe, valid)
    partial_row = partial_ptr + row * (4 * SPLIT_BLOCK)
    if PHASE != 2:
        n_read = tl.where(valid | ignored, seg_len, 0)
        m_part, log_s_part, sum_w, sum_wx, _, _ = _streamed_sums(
            x_row + start, weight_ptr + start, n_read, seg_len, pivot, HAS_WEIGHT, HAS_SMOOTHING, "evict_last",
            STREAM_N, NUM_STAGES, EXP2,
        )  # fmt: skip
        # A segment of nothing but -inf, or not read (a bad row), sums to 0; a NaN in it makes its sum NaN.
        s_part = tl.where(m_part == float("-inf"), 0.0, tl.exp(log_s_part))
        _store_split_partials(partial_row, part, m_part, s_part, sum_w, sum_wx, SPLIT_BLOCK)
    if PHASE == 0:
        wait_for_row(arrived_ptr, row, n_split)
    if PHASE != 1:
        m, log_s, a, b, c_w = _split_row_loss_and_scales(
            partial_row, arrived_ptr, loss_ptr, target_weight_ptr, share_ptr, weight_ptr, row, part, n_split, x_t,
            pivot, t_safe, valid, ignored, n_cols, label_smoothing, HAS_WEIGHT, HAS_SMOOTHING, MEAN,
            WRITE_TARGET_WEIGHT, PHASE, SPLIT_BLOCK,
        )  # fmt: skip
        # The exp2 form's base and log2 total of the row's m and log(s): exp(x - m - log(s)) is
        # exp2(fma(x, log2(e), -b_m) - log2_s) with log2_s = log(s) * log2(e) + (m * log2(e) - b_m), the last term
        # exact by an fma (as _log_sum_exp2 takes it).
        b_m = _exponent_base(m)
        log2_s = log_s * LOG2E + tl.where(tl.abs(m) < float("inf"), tl.fma(m, LOG2E, -b_m), 0.0)
        _store_dlogits_looped(
            x_row + start, dx_ptr + row * n_cols + start, m, log_s, b_m, log2_s, weight_ptr + start, t_safe - start,
            a, b, c_w, valid | ignored, seg_len, HAS_WEIGHT, HAS_SMOOTHING, STREAM_N, NUM_STAGES, EXP2,
        )  # fmt: skip


@triton.jit
def _cross_entropy_fma_probe_kernel(x_ptr, out_ptr):
    """out = fma(a, b, -(a * b)) for x = (a, b): the product's rounding residual where an fma rounds once, 0 where
    it rounds twice (see the launchers' EXP2)."""
    a = tl.load(x_ptr)
    b = tl.load(x_ptr + 1)
    tl.store(out_ptr, tl.fma(a, b, -(a * b)))
