"""The attention kernel's small device functions (kernels/attention.py builds the kernel from them; each is inlined):
the element functions of the online softmax, passed to ``wgmma_map`` / ``wgmma_row_reduce`` (masks, the shifted
``exp2``, the row rescale), and the persistent work order (the work counts, the item - or the cluster's unit - a CTA
takes in each round, and the key blocks an item sees, also used on the host for the plan's FLOP count)."""
from __future__ import annotations

from numba import cuda

from numbatma.intrinsics import cluster_ctarank, fast_exp2, persistent_item, poly_exp2, wgmma_map

from ._attention_config import BM, LOG2E_F32, NEG_INF, POS_INF, ZERO

# -- element functions of the online softmax (inlined into wgmma_map; the row reductions are numbatma.intrinsics'
# row_max, row_min and row_sum) --------------------------------------------------------------------------------------
@cuda.jit(device=True, inline="always")
def masked(half, col, limits):
    """Whether key ``kv0 + col`` is past the keys (``>= sk``) or, causal, after the row's query."""
    kv0, sk, row0, causal = limits
    key = kv0 + col
    return key >= sk or (causal and key > row0 + 8 * half)


def _mask_filling(fill):
    """The element function that puts ``fill`` where :func:`masked` and leaves the logit elsewhere."""
    @cuda.jit(device=True, inline="always")
    def mask(s, half, col, limits):
        if masked(half, col, limits):
            return fill
        return s

    return mask


mask_below = _mask_filling(NEG_INF)  # -inf where masked
mask_above = _mask_filling(POS_INF)  # +inf: a negative scale (the row's extremum is its raw minimum; +inf · scale = -inf)


@cuda.jit(device=True, inline="always")
def mask_uniform(s, half, col, limits):
    """scale 0: every logit 0, and -inf where :func:`masked` (every key weighs exp2(0) = 1 or nothing)."""
    return mask_below(ZERO, half, col, limits)


@cuda.jit(device=True, inline="always")
def exp2_shifted(s, half, col, st):
    """``exp2(s · scale·log2 e - m_row)`` (``st = (scale_log2, m0, m1)``): one FFMA and one ``MUFU.EX2``
    (:func:`numbatma.intrinsics.fast_exp2`: a weight below 2^-126 flushes to 0, next to a row sum >= 1)."""
    return fast_exp2(s * st[0] - (st[1] if half == 0 else st[2]))


@cuda.jit(device=True, inline="always")
def exp2_exact(s, half, col, st):
    """``exp2((s - M_row) · scale · log2 e)`` with ``M_row`` the row's raw extremum (``st = (scale, M0, M1)``):
    ``s - M`` has the sign opposite to the scale's, so the exponent is <= 0 or -inf, never inf - inf."""
    return fast_exp2((s - (st[1] if half == 0 else st[2])) * st[0] * LOG2E_F32)


def weights(exact, poly_eighths):
    """The element function of ``P``: :func:`exp2_shifted` (or :func:`exp2_exact`), with the weights of
    ``poly_eighths`` of every eight 8-column groups of the tile (groups ``g`` with ``g % 8 < poly_eighths``) computed
    by :func:`numbatma.intrinsics.poly_exp2` on the FMA units instead of ``MUFU.EX2``. The test on the column is a
    compile-time constant per register (a thread's column is ``2 (lane % 4) + 8 (i // 4) + i % 2``: LLVM's known
    bits fold ``col >> 3`` to ``i // 4``), so each register gets one of the two, no select."""
    if poly_eighths == 0:
        return exp2_exact if exact else exp2_shifted

    if exact:
        @cuda.jit(device=True, inline="always")
        def mixed(s, half, col, st):
            x = (s - (st[1] if half == 0 else st[2])) * st[0] * LOG2E_F32
            if (col >> 3) % 8 < poly_eighths:
                return poly_exp2(x)
            return fast_exp2(x)
    else:
        @cuda.jit(device=True, inline="always")
        def mixed(s, half, col, st):
            x = s * st[0] - (st[1] if half == 0 else st[2])
            if (col >> 3) % 8 < poly_eighths:
                return poly_exp2(x)
            return fast_exp2(x)

    return mixed


@cuda.jit(device=True, inline="always")
def scale_rows(o, half, col, f):
    return o * (f[0] if half == 0 else f[1])


@cuda.jit(device=True, inline="always")
def rescale(o, f):
    """O's rows times their factors ``f = (f_a, f_b, go)`` from the softmax: 64 ``FMUL`` a thread at D = 128 - or
    none where ``go`` (warp-uniform) says no row of the warp changed its maximum (a lazy rescale: a branch around
    them)."""
    if f[2]:
        return wgmma_map(o, scale_rows, f)
    return o


@cuda.jit(device=True, inline="always")
def work_counts(lse, heads, sq, sk, bn, cm):
    """(batch·heads, units of query blocks per head, key blocks, units, rounds of the persistent loop). A unit is
    one query block (``cm = 1``) or the ``cm`` query blocks of a cluster's CTAs (``cm = 2``: the last one of a
    head past the rows when their number is odd - computed on zeros, never stored)."""
    batch_heads = lse.shape[0] * heads
    nmb = ((sq + BM - 1) // BM + cm - 1) // cm
    total = batch_heads * nmb
    groups = cuda.gridDim.x // cm
    return batch_heads, nmb, (sk + bn - 1) // bn, total, (total + groups - 1) // groups


@cuda.jit(device=True, inline="always")
def work_item(t, heads, batch_heads, nmb, causal, queries_fastest, cm):
    """(batch, head, first query row) of work unit ``t`` (for this CTA of its cluster: query block ``cm u +
    rank``): query blocks in decreasing order when causal (the longest first); batch·head fastest, or the query
    block fastest."""
    if queries_fastest:
        bh = t // nmb
        mb = t - bh * nmb
    else:
        mb = t // batch_heads
        bh = t - mb * batch_heads
    if causal:
        mb = nmb - 1 - mb
    if cm > 1:
        mb = mb * cm + cluster_ctarank()
    b = bh // heads
    return b, bh - b * heads, mb * BM


@cuda.jit(device=True, inline="always")
def work_unit(r, snake, cm):
    """The unit this CTA takes in round ``r``: :func:`persistent_item` over CTAs (``cm = 1``) or clusters."""
    if cm == 1:
        return persistent_item(r, snake)
    g = cuda.gridDim.x // cm
    c = cuda.blockIdx.x // cm
    if snake and r % 2 == 1:
        return r * g + g - 1 - c
    return r * g + c


def key_blocks(m0, nkb, bn, causal):
    """Key blocks the query rows ``m0 .. m0 + BM - 1`` see: all ``nkb``, or causal up to the diagonal. (Host and
    device: the plan's FLOP count and the kernel's loops use the same rule.)"""
    if causal:
        return min(nkb, (m0 + BM - 1) // bn + 1)
    return nkb


key_blocks_device = cuda.jit(device=True, inline="always")(key_blocks)
