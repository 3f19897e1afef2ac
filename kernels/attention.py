"""Attention forward on Hopper tensor cores, FlashAttention-3 style: ``O = softmax(Q Kᵀ · scale (+ causal mask)) V``
and the log-sum-exp of every row, written with numbatma's public API only.

Arrays: ``q`` (B, Hq, Sq, D), ``k`` and ``v`` (B, Hkv, Sk, D) with ``layout="bhsd"``; (B, Sq, Hq, D) and
(B, Sk, Hkv, D) with ``layout="bshd"`` (any strides TMA can describe: torch tensors of either layout, views).
bfloat16 or float16 (all four the same), D = 64, 128 or 256, ``Hq`` a multiple of ``Hkv`` (grouped-query
attention: query head ``h`` reads key/value head ``h // (Hq // Hkv)``), any Sq and Sk >= 1. ``o`` is written
in q's layout and dtype; ``lse`` (B, Hq, Sq) float32 receives ``log(sum_j exp(scale * q_i·k_j))`` (natural log)
per row. ``causal=True`` masks key ``j > i`` for query ``i`` (the top-left alignment of
``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``).

Design (a persistent grid, one CTA per SM, 384 threads in three warpgroups, put together from the blocks of
``numbatma.intrinsics.warp_roles``: ``register_budget(2)`` + ``warp_specialize`` for the roles, ``persistent_item``
for the order, ``pingpong(2)`` for the turns, ``wait_release`` for the K/V stages, ``store_buffers(1)`` +
``store_release(0)`` for O's TMA stores and the Q stage):

* **Work**: one item is 128 query rows of one (batch, head); full attention numbers the items query block first
  (the CTAs running at once share few heads' K and V in L2); causal items are ordered longest first over all heads
  (the rows near the end of the sequence see the most keys), and the CTAs take them in snake order (round ``r``:
  CTA ``c`` takes item ``rG + c``, or ``rG + G - 1 - c`` in odd rounds), which balances the CTAs' total work.
* **Producer** (warpgroup 0, ``setmaxnreg_dec``): one elected thread TMA-loads, per item, the Q tile (both
  consumers' 64 rows, ``D / 64`` boxes of 64 x 64 with the 128-byte swizzle) through a one-stage
  :class:`Pipeline`, and for every key block the K tile and the V tile (``D / 64`` boxes of ``bn`` x 64 each)
  through two ``stages``-deep Pipelines - separate, so that ``Q Kᵀ`` can start while V is still in flight. Q
  goes after the item's first K and V: their stages free up before the previous item's epilogue frees Q's.
* **Consumers** (warpgroups 1 and 2, ``setmaxnreg_inc``): each owns 64 of the 128 rows, its O accumulator
  (64 x D, float32) and the running row maxima and sums. Per key block: ``S = Q Kᵀ`` (wgmma, both operands
  from shared memory), release K; mask (only the blocks that need it: the ragged last block, the causal
  diagonal); row maxima over the quad (:func:`wgmma_row_reduce`), ``P = exp2(S · scale·log2 e - m)`` and the
  correction of O and of the row sums (:func:`wgmma_map`; with ``lazy_rescale`` only when a row's maximum grew
  by more than a factor 2^8 - a warp-uniform branch around it, decided by ``vote.any``); ``O += P V`` with P
  straight from registers (:func:`wgmma_a_fragments`: no shared memory for P), release V.
* **Epilogue**: ``O / l`` in registers, the log-sum-exp of each row (plain stores of its four-thread quad's
  first lane), O into the consumer's own 64 rows of the Q tile (swizzled, :func:`wgmma_store`) and TMA
  stores (clipped at the sequence end: never a byte outside ``o``); the Q stage goes back to the producer once
  the stores have read it.

Scale: any finite value up to float32's largest - 0, negative, tiny, huge; the host picks a compile-time softmax mode
from it (:func:`softmax_mode`: "fused", the default scale's, unchanged; "exact" for |scale| > 1; "zero"), and a
plan's ``scale`` may be reassigned (the kernel follows its mode).

Tile: ``bm = 128`` query rows, ``bn`` keys per block (:func:`default_config`, by head dim, mask and key length:
192 for full D = 64 (128 where 192 pads), 128 for D = 128 and causal D = 64, 80 for full and 64 for causal
D = 256; the ``bn`` option takes multiples of 16 up to 192, or 96 for D = 256 - the wider ones may spill
registers: tests/test_attention_cpu.py pins the defaults to none). Shared memory: ``q_stages`` Q tiles of
``128 D`` (two at D = 64 and mostly at D = 128: the next item's Q loads while this one's epilogue runs) +
``2 stages bn D`` elements (two bytes each) (+ ``128 D`` with ``o_buffer``).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from numbatma import SIMULATING, Swizzle, TensorMap, TensorMapError, array_layout, cluster_kernel, max_active_clusters
from numbatma.autotune import bucket, tune
from numbatma.views import ArrayLayout, layout_view
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    cluster_ctarank,
    cluster_sync,
    elect_one_sync,
    pingpong,
    register_budget,
    row_max,
    row_min,
    row_sum,
    shared_view,
    store_buffers,
    store_release,
    tma_store,
    wait_release,
    wgmma,
    wgmma_a_fragments,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_map,
    wgmma_row_reduce,
    wgmma_store,
    wgmma_wait_group,
    wgmma_zeros,
    vote_any,
    warp_specialize,
    warpgroup_sync,
)

from ._compile_cache import kernel_factory
from ._device import grid_dependency_sync
from ._launch import ceil_div, persistent_grid
from ._options import bool_option, int_option, scalar_option
from ._plan import Plan, run

__all__ = ["Attention", "AttentionConfig", "attention"]

from ._attention_config import (  # noqa: F401  (re-exported: the plan, tests and users name them here)
    BM,
    WG_ROWS,
    CHUNK,
    WARPGROUP,
    MAX_REGISTERS,
    HEAD_DIMS,
    DTYPES,
    LAYOUTS,
    LOG2E,
    LN2_F32,
    NEG_INF,
    POS_INF,
    LOG2E_F32,
    ZERO,
    ONE,
    RESCALE_THRESHOLD,
    AttentionConfig,
    softmax_mode,
    TUNE_SPACE,
    TILE_OPTIONS,
    default_config,
)

from ._attention_steps import (  # (key_blocks re-exported: the plan and tests name it here)
    key_blocks,
    key_blocks_device,
    mask_above,
    mask_below,
    mask_uniform,
    rescale,
    scale_rows,
    weights,
    work_counts,
    work_item,
    work_unit,
)


@kernel_factory
def _attention_kernel(nb_dtype, d, bn, stages, causal, kind, schedule, order="snake", sweep="heads", q_stages=1,
                      producer_registers=40, o_buffer=False, carry=False, cluster_m=1, lazy_rescale=False,
                      poly_exp2=0.0, softmax_mode="fused", negative=False):
    """The kernel of one configuration (every argument a compile-time constant of the closure). ``softmax_mode``
    and ``negative`` (:func:`softmax_mode`) say how the scale is applied; the kernel's last argument is then
    ``scale · log2 e`` ("fused"), ``scale`` ("exact") or 1 ("zero")."""
    exact = softmax_mode == "exact"
    zero = softmax_mode == "zero"
    # the row extremum: the max of the raw logits, or their min for a negative scale (max of the scaled ones)
    extremum, far = (row_min, POS_INF) if negative else (row_max, NEG_INF)
    mask = mask_uniform if zero else (mask_above if negative else mask_below)
    m_start = far if exact else NEG_INF  # running extremum: raw ("exact") or scaled by scale·log2 e
    exp2_weights = weights(exact, round(poly_exp2 * 8))  # (P's element function: MUFU, or part on the FMA units)
    take_turns = schedule == "pingpong"
    snake = order == "snake"
    turn_start, wait_turn, pass_turn, turn_finish = pingpong(2)  # named barriers 3, 4 (1, 2: warpgroup_sync)
    if cluster_m == 2:
        @cuda.jit(device=True, inline="always")
        def release_kv(pipe):
            """A K or V stage back to the producers of both CTAs of the cluster (each multicasts half into it)."""
            pipe.consumer_release_remote(cluster_ctarank() ^ 1)
            pipe.consumer_release()
    else:
        release_kv = None  # (pipe.consumer_release())
    release_done = wait_release(0, release_kv)  # wait for every group, lane 0 releases the stage
    release_older = wait_release(1, release_kv)  # wait for the older group (the newer runs on), release its stage
    q_release = store_release(0)  # the Q stage, once the epilogue's TMA stores have read it
    out_tile = store_buffers(1)  # O's staging tile: the consumer's rows of the Q stage, or of its own tile
    queries_fastest = sweep == "queries"
    # O's rescale under S's wgmma: +2.5% causal D = 128 (eager), +2.6% with the lazy rescale; at D = 256 -2..-4%
    # eager, with the lazy rescale +1.5% causal and +0.7% full (ratios to cuDNN, H100; not in the "exact" mode, which
    # rescales eagerly: its D = 256 kernels spill with it)
    early_rescale = d == 128 or (d == 256 and lazy_rescale and not exact)
    chunks = d // CHUNK
    box_q = WG_ROWS * CHUNK  # elements of one Q box (64 x 64)
    box_kv = bn * CHUNK  # elements of one K or V chunk (bn x 64)
    half = bn // cluster_m  # key rows of a K or V box: with a cluster each CTA loads its half, multicast to both
    q_elems = BM * d  # one Q stage
    kv_elems = bn * d  # one K (or V) stage
    k_base = q_stages * q_elems
    v_base = k_base + stages * kv_elems
    o_base = v_base + stages * kv_elems  # (o_buffer: O's staging tile, 128 x D)

    @cuda.jit(device=True, inline="always")
    def q_tile(smem, qs, w, c):
        """Consumer ``w``'s 64 rows, head-dim chunk ``c`` of Q stage ``qs`` (also its O staging tile)."""
        return shared_view(smem, qs * q_elems + (w * chunks + c) * box_q, (WG_ROWS, CHUNK))

    @cuda.jit(device=True, inline="always")
    def o_tile(smem, qs, w, c):
        """Consumer ``w``'s O staging tile, head-dim chunk ``c``: in its own buffer, or Q stage ``qs``'s rows."""
        if o_buffer:
            return shared_view(smem, o_base + (w * chunks + c) * box_q, (WG_ROWS, CHUNK))
        return q_tile(smem, qs, w, c)

    @cuda.jit(device=True, inline="always")
    def issue_qk(smem, q_map, k_map, qs, w, ks):
        """Issue ``S = Q_w Kᵀ`` for K stage ``ks`` - the D / 16 k-steps in one wgmma call, back to back - and commit
        it (the caller waits). Both tiles are K-major with their 64-wide chunks side by side along K (the head
        dim)."""
        q_all = shared_view(smem, qs * q_elems + w * chunks * box_q, (chunks, WG_ROWS, CHUNK))
        k_all = shared_view(smem, k_base + ks * kv_elems, (chunks, bn, CHUNK))
        s = wgmma_fence(wgmma_zeros(bn))
        s = wgmma(s, wgmma_desc(q_all, q_map, "K", 0, (0, d)), wgmma_desc(k_all, k_map, "K", 0, (0, d)), 0)
        wgmma_commit_group()
        return s

    @cuda.jit(device=True, inline="always")
    def issue_pv(o, p, smem, v_map, vs):
        """Issue ``O += P V`` for V stage ``vs``, P from registers - the bn / 16 k-steps in one call - and commit it.
        V's tile is (keys = K) x (head dim = N): MN-major, its chunks side by side along N."""
        v_tile = shared_view(smem, v_base + vs * kv_elems, (chunks, bn, CHUNK))
        o, p = wgmma_fence((o, p))
        o = wgmma(o, p, wgmma_desc(v_tile, v_map, "MN", 0, (0, bn)), 1)
        wgmma_commit_group()
        return o

    @cuda.jit(device=True, inline="always")
    def softmax(s, j, sk, m0, w, row0, scale_log2, state):
        """The online softmax of key block ``j`` on S (returned by its wait): the mask where needed, the new row
        maxima, ``P = exp2(S·scale·log2 e - m)`` (float32), the factor ``f`` that rescales O and the sums
        from the old maxima to the new. ``state = (m_a, m_b, l_a, l_b)`` of the thread's two rows."""
        m_a, m_b, l_a, l_b = state
        kv0 = j * bn
        if zero or kv0 + bn > sk or (causal and kv0 + bn - 1 > m0 + WG_ROWS * w):
            s = wgmma_map(s, mask, (kv0, sk, row0, causal))
        r_a, r_b = wgmma_row_reduce(s, extremum, far)
        if exact:  # the raw extremum; P = exp2((S - M) · scale · log2 e)
            n_a = extremum(m_a, r_a)
            n_b = extremum(m_b, r_b)
            u_a = n_a if n_a != far else ZERO  # (a row with no key yet)
            u_b = n_b if n_b != far else ZERO
            p = wgmma_map(s, exp2_weights, (scale_log2, u_a, u_b))
            f_a = math.exp2((m_a - u_a) * scale_log2 * LOG2E_F32)
            f_b = math.exp2((m_b - u_b) * scale_log2 * LOG2E_F32)
            go = True
        else:  # the extremum scaled: the max of S · scale·log2 e (a negative scale turns the raw min into it)
            n_a = max(m_a, r_a * scale_log2)
            n_b = max(m_b, r_b * scale_log2)
            if lazy_rescale:  # keep the old maxima while no row of the warp grows past them by the threshold
                go = vote_any(not (n_a - m_a <= RESCALE_THRESHOLD and n_b - m_b <= RESCALE_THRESHOLD)) != 0
                if go:  # (a warp-uniform branch: the factors' exp2 and O's rescale skipped together)
                    u_a = n_a if n_a != NEG_INF else ZERO  # (a row with no key yet)
                    u_b = n_b if n_b != NEG_INF else ZERO
                    f_a = math.exp2(m_a - u_a)
                    f_b = math.exp2(m_b - u_b)
                else:  # (m finite: n - m <= threshold; the weights below are at most 2^threshold)
                    n_a, n_b, u_a, u_b, f_a, f_b = m_a, m_b, m_a, m_b, ONE, ONE
                # (the weights after the branch: with them between the maxima and the factors, as in the eager
                # order below, the D = 128 kernel measured 4-6% slower - ptxas schedules the two differently)
                p = wgmma_map(s, exp2_weights, (scale_log2, u_a, u_b))
            else:
                go = True
                u_a = n_a if n_a != NEG_INF else ZERO  # (a row with no key yet)
                u_b = n_b if n_b != NEG_INF else ZERO
                p = wgmma_map(s, exp2_weights, (scale_log2, u_a, u_b))
                f_a = math.exp2(m_a - u_a)
                f_b = math.exp2(m_b - u_b)
        sum_a, sum_b = wgmma_row_reduce(p, row_sum, ZERO)
        return p, (f_a, f_b, go), (n_a, n_b, l_a * f_a + sum_a, l_b * f_b + sum_b)

    @cuda.jit(device=True, inline="always")
    def finish_item(o, state, b, h, m0, qs, w, tw, lane, row0, smem, qpipe, o_map, lse, sq, scale_log2):
        """The epilogue of consumer ``w``'s rows of item (``b``, ``h``, ``m0``), every product of it completed:
        ``O / l``, the log-sum-exp of its rows, O through its staging tile (the rows of Q stage ``qs``, or its own
        tile with ``o_buffer``) and TMA stores; without ``o_buffer``, the Q stage goes back once they have read it."""
        m_a, m_b, l_a, l_b = state
        # normalise, log-sum-exp, O through this warpgroup's rows of the Q stage
        o = wgmma_map(o, scale_rows, (ONE / l_a, ONE / l_b))
        if lane % 4 == 0:
            if exact:  # M · scale + ln l: M · scale is ±inf only where the true lse is beyond float32
                if row0 < sq:
                    lse[b, h, row0] = m_a * scale_log2 + math.log2(l_a) * LN2_F32
                if row0 + 8 < sq:
                    lse[b, h, row0 + 8] = m_b * scale_log2 + math.log2(l_b) * LN2_F32
            else:
                if row0 < sq:
                    lse[b, h, row0] = (m_a + math.log2(l_a)) * LN2_F32
                if row0 + 8 < sq:
                    lse[b, h, row0 + 8] = (m_b + math.log2(l_b)) * LN2_F32
        if o_buffer:  # the previous item's store (issued an item ago) has read O's tile
            out_tile.acquire(w, tw)
        else:
            warpgroup_sync(w)  # every wgmma of this warpgroup has read its Q rows
        for c in range(chunks):
            wgmma_store(o, o_tile(smem, qs, w, c), o_map, 0, CHUNK * c)
        if out_tile.publish(w, tw):  # (fence.proxy.async, warpgroup_sync: thread 0 stores)
            for c in range(chunks):
                tma_store(o_map, (b, h, m0 + WG_ROWS * w, CHUNK * c), o_tile(smem, qs, w, c))
            if o_buffer:
                bulk_commit_group()
            else:
                q_release(qpipe, 0)  # once the stores have read the Q stage, the producer may refill it

    if cluster_m == 2:
        @cuda.jit(device=True, inline="always")
        def load_kv(pipe, smem, base, kv_map, b, hk, j):
            """This CTA's half of key block ``j``'s K (or V) tile - its ``bn / 2`` rows of every 64-wide chunk -
            multicast into the same stage of both CTAs of the cluster (whose full barriers expect the whole tile)."""
            r = cluster_ctarank()
            for c in range(chunks):
                pipe.load_multicast(shared_view(smem, base + c * box_kv + r * half * CHUNK, (half, CHUNK)), kv_map,
                                    (b, hk, j * bn + r * half, CHUNK * c), 3)
    else:
        @cuda.jit(device=True, inline="always")
        def load_kv(pipe, smem, base, kv_map, b, hk, j):
            """Key block ``j``'s K (or V) tile, ``D / 64`` boxes of ``bn`` x 64, into the stage at ``base``."""
            for c in range(chunks):
                pipe.load(shared_view(smem, base + c * box_kv, (bn, CHUNK)), kv_map, (b, hk, j * bn, CHUNK * c))

    @cuda.jit(device=True, inline="always")
    def producer(args):
        """One elected thread walks this CTA's items: per key block the K and V tiles, the item's Q after its first
        K and V."""
        smem, qpipe, kpipe, vpipe, q_map, k_map, v_map, o_map, lse, heads, group, sq, sk, scale_log2 = args
        # (the work counts are computed in each role, after setmaxnreg: values live across it get spilled)
        batch_heads, nmb, nkb, total, rounds = work_counts(lse, heads, sq, sk, bn, cluster_m)
        if cuda.threadIdx.x < 32:
            if elect_one_sync():
                for r in range(rounds):
                    t = work_unit(r, snake, cluster_m)
                    if t >= total:  # (only in the last round)
                        break
                    b, h, m0 = work_item(t, heads, batch_heads, nmb, causal, queries_fastest, cluster_m)
                    hk = h // group
                    blocks = key_blocks_device(m0, nkb, bn, causal)
                    for j in range(blocks):
                        s = kpipe.producer_acquire()
                        load_kv(kpipe, smem, k_base + s * kv_elems, k_map, b, hk, j)
                        kpipe.producer_commit()
                        s = vpipe.producer_acquire()
                        load_kv(vpipe, smem, v_base + s * kv_elems, v_map, b, hk, j)
                        vpipe.producer_commit()
                        if j == 0:
                            # Q after the item's first K and V: their stages free up while the consumers still
                            # finish the previous item, Q's only after its epilogue, so K and V are in flight
                            # (or landed) by the time Q's stage is free.
                            qs = qpipe.producer_acquire()
                            for w in range(2):
                                for c in range(chunks):
                                    qpipe.load(q_tile(smem, qs, w, c), q_map, (b, h, m0 + WG_ROWS * w, CHUNK * c))
                            qpipe.producer_commit()


    @cuda.jit(device=True, inline="always")
    def issue_step(o, pf, f, smem, q_map, k_map, v_map, kpipe, vpipe, qs, w, lane):
        """One step of the "overlap" schedule: ``S`` of the next key block issued with ``P V`` of the block whose
        weights ``pf`` hold (O first rescaled by that block's ``f`` at D = 128, FA3's place: O is in no wgmma
        then), both committed; returns ``(S, O)`` once ``S`` has completed - its K stage given back, ``P V``
        still running. With turns, the issue is this warpgroup's turn. Between an issue and its wait no
        instruction writes a register a later wgmma reads (else ptxas serializes every wgmma: C7513)."""
        if take_turns:
            wait_turn(w)  # my turn to issue
        ks = kpipe.consumer_wait()
        sacc = issue_qk(smem, q_map, k_map, qs, w, ks)
        if early_rescale:  # while S runs: O to the maxima of the block whose P V follows
            o = rescale(o, f)
        vs = vpipe.consumer_wait()
        o = issue_pv(o, pf, smem, v_map, vs)
        if take_turns:
            pass_turn(w)  # the other's turn
        return release_older(kpipe, sacc, lane), o

    @cuda.jit(device=True, inline="always")
    def last_pv(o, pf, f, smem, v_map, vpipe, lane):
        """The "overlap" schedule's last ``P V`` of an item (nothing to overlap it with), waited for; its V stage
        given back."""
        if early_rescale:
            o = rescale(o, f)
        vs = vpipe.consumer_wait()
        return release_done(vpipe, issue_pv(o, pf, smem, v_map, vs), lane)

    @cuda.jit(device=True, inline="always")
    def consumer_lanes(w):
        """(w, the thread's index in its warpgroup, its lane, its first row in the warpgroup's 64 - its second is
        8 below). ``w`` is made again from ``threadIdx.x`` and broadcast from lane 0 (but with pingpong): see
        :func:`consumer`."""
        if not take_turns:
            w = cuda.shfl_sync(0xFFFFFFFF, cuda.threadIdx.x // WARPGROUP, 0) - 1
        tw = cuda.threadIdx.x - (w + 1) * WARPGROUP
        lane = cuda.threadIdx.x % 32
        return w, tw, lane, 16 * (tw // 32) + lane // 4

    @cuda.jit(device=True, inline="always")
    def consumer(w, args):
        """Consumer warpgroup ``w``: its 64 rows of each item - the key blocks in the ``schedule``, then the
        epilogue."""
        smem, qpipe, kpipe, vpipe, q_map, k_map, v_map, o_map, lse, heads, group, sq, sk, scale_log2 = args
        batch_heads, nmb, nkb, total, rounds = work_counts(lse, heads, sq, sk, bn, cluster_m)
        # The warpgroup index again, made here (after setmaxnreg and the work counts) and broadcast from lane 0
        # (shfl.sync.idx): ptxas then knows it is warp-uniform and keeps w, m0 + 64 w and the causal block test
        # in uniform registers. warp_specialize's w is a per-thread value from before the split, live across
        # setmaxnreg: with it the causal D = 256 overlapped kernel (240 registers) spilled it and row_in_wg to
        # local memory. (Made before the work counts, or w broadcast as passed, it spills again: the SASS tests
        # pin it. Not with pingpong: its D = 256 kernels spill more with it.)
        w, tw, lane, row_in_wg = consumer_lanes(w)
        active = cuda.blockIdx.x // cluster_m < total
        if take_turns:
            turn_start(w, active)  # consumer 0 issues first
        for r in range(rounds):
            t = work_unit(r, snake, cluster_m)
            if t >= total:
                break
            b, h, m0 = work_item(t, heads, batch_heads, nmb, causal, queries_fastest, cluster_m)
            blocks = key_blocks_device(m0, nkb, bn, causal)
            row0 = m0 + WG_ROWS * w + row_in_wg
            m_a = m_start  # running maxima (scaled by scale·log2 e; "exact": raw extrema) of the thread's rows
            m_b = m_start
            l_a = ZERO  # running sums of exp2(...)
            l_b = ZERO
            o = wgmma_zeros(d)
            qs = qpipe.consumer_wait()
            state = (m_a, m_b, l_a, l_b)
            if schedule == "serial":  # each product issued and waited for in turn
                for j in range(blocks):
                    ks = kpipe.consumer_wait()
                    sacc = release_done(kpipe, issue_qk(smem, q_map, k_map, qs, w, ks), lane)
                    p, f, state = softmax(sacc, j, sk, m0, w, row0, scale_log2, state)
                    o = rescale(o, f)
                    vs = vpipe.consumer_wait()
                    o = release_done(vpipe, issue_pv(o, wgmma_a_fragments(p, kind), smem, v_map, vs), lane)
                if o_buffer and lane == 0:  # every Q Kᵀ of the item has completed: Q's stage goes back
                    qpipe.consumer_release()
            else:  # S of block j is issued with P V of block j - 1; the softmax of j runs while P V does.
                # Between an issue and its wait no instruction writes a register a later wgmma reads (P's
                # fragments, O's rescaling come after the wait): else ptxas serializes every wgmma (C7513).
                if take_turns:
                    wait_turn(w)  # my turn to issue
                ks = kpipe.consumer_wait()
                sacc = issue_qk(smem, q_map, k_map, qs, w, ks)
                if take_turns:
                    pass_turn(w)  # the other's turn
                sacc = release_done(kpipe, sacc, lane)
                p, f, state = softmax(sacc, 0, sk, m0, w, row0, scale_log2, state)
                pf = wgmma_a_fragments(p, kind)  # (O is zero: block 0's factor f, 0, keeps it so)
                for j in range(1, blocks):  # S of block j with P V of block j - 1
                    sacc, o = issue_step(o, pf, f, smem, q_map, k_map, v_map, kpipe, vpipe, qs, w, lane)
                    p, f, state = softmax(sacc, j, sk, m0, w, row0, scale_log2, state)
                    o = release_done(vpipe, o, lane)
                    if not early_rescale:
                        o = rescale(o, f)  # O (through block j - 1) to the maxima of block j
                    pf = wgmma_a_fragments(p, kind)
                if o_buffer and lane == 0:  # every Q Kᵀ of the item has completed: Q's stage goes back
                    qpipe.consumer_release()
                o = last_pv(o, pf, f, smem, v_map, vpipe, lane)
            finish_item(o, state, b, h, m0, qs, w, tw, lane, row0, smem, qpipe, o_map, lse, sq, scale_log2)
        if take_turns:
            turn_finish(w, active)  # the other's last hand-over (balances its first)
        if tw == 0:
            bulk_wait_group(0)

    @cuda.jit(device=True, inline="always")
    def consumer_carried(w, args):
        """Consumer warpgroup ``w`` with the "overlap" pipeline carried across its items (``carry``): the first
        ``Q Kᵀ`` of the next item is issued together with the last ``P V`` of this one, and the next item's first
        softmax runs while that ``P V`` does; this item's epilogue follows. An item then costs its key blocks
        only, not a pipeline start and drain besides. Needs the next item's Q in shared memory before this one's
        epilogue frees its stage (``q_stages = 2``, or ``o_buffer``: Q's stage goes back after the item's last
        ``Q Kᵀ``) and a second V stage (the next item's first V loads before this one's last is released)."""
        smem, qpipe, kpipe, vpipe, q_map, k_map, v_map, o_map, lse, heads, group, sq, sk, scale_log2 = args
        batch_heads, nmb, nkb, total, rounds = work_counts(lse, heads, sq, sk, bn, cluster_m)
        w, tw, lane, row_in_wg = consumer_lanes(w)
        fresh = (m_start, m_start, ZERO, ZERO)  # an item's running (m_a, m_b, l_a, l_b) before its first block
        t = work_unit(0, snake, cluster_m)
        if t < total:
            # the first item's first block: nothing to overlap it with
            b, h, m0 = work_item(t, heads, batch_heads, nmb, causal, queries_fastest, cluster_m)
            blocks = key_blocks_device(m0, nkb, bn, causal)
            row0 = m0 + WG_ROWS * w + row_in_wg
            qs = qpipe.consumer_wait()
            ks = kpipe.consumer_wait()
            sacc = release_done(kpipe, issue_qk(smem, q_map, k_map, qs, w, ks), lane)
            if o_buffer and blocks == 1 and lane == 0:  # (the item's last Q Kᵀ: Q's stage goes back)
                qpipe.consumer_release()
            p, f, state = softmax(sacc, 0, sk, m0, w, row0, scale_log2, fresh)
            pf = wgmma_a_fragments(p, kind)
            o = wgmma_zeros(d)
            item = (b, h, m0, qs, row0)  # the item O accumulates: its epilogue comes after its last P V
            for r in range(rounds):
                if r > 0:  # the next item: its first block's S issued with the last P V of the item O holds
                    t = work_unit(r, snake, cluster_m)
                    if t >= total:
                        break
                    b, h, m0 = work_item(t, heads, batch_heads, nmb, causal, queries_fastest, cluster_m)
                    blocks = key_blocks_device(m0, nkb, bn, causal)
                    row0 = m0 + WG_ROWS * w + row_in_wg
                    qs = qpipe.consumer_wait()
                    sacc, o = issue_step(o, pf, f, smem, q_map, k_map, v_map, kpipe, vpipe, qs, w, lane)
                    if o_buffer and blocks == 1 and lane == 0:
                        qpipe.consumer_release()
                    p, f, nstate = softmax(sacc, 0, sk, m0, w, row0, scale_log2, fresh)
                    o = release_done(vpipe, o, lane)
                    pf = wgmma_a_fragments(p, kind)  # (P packed before the epilogue: half the registers)
                    pb, ph, pm0, pqs, prow0 = item  # O holds the previous item, complete: its epilogue
                    finish_item(o, state, pb, ph, pm0, pqs, w, tw, lane, prow0, smem, qpipe, o_map, lse, sq,
                                scale_log2)
                    o = wgmma_zeros(d)  # (block 0's factor f, 0, keeps it so)
                    item = (b, h, m0, qs, row0)
                    state = nstate
                for j in range(1, blocks):  # the key blocks after the first: as in the per-item pipeline
                    sacc, o = issue_step(o, pf, f, smem, q_map, k_map, v_map, kpipe, vpipe, qs, w, lane)
                    if o_buffer and j == blocks - 1 and lane == 0:
                        qpipe.consumer_release()
                    p, f, state = softmax(sacc, j, sk, m0, w, row0, scale_log2, state)
                    o = release_done(vpipe, o, lane)
                    if not early_rescale:
                        o = rescale(o, f)
                    pf = wgmma_a_fragments(p, kind)
            o = last_pv(o, pf, f, smem, v_map, vpipe, lane)  # the last item's last P V, then its epilogue
            pb, ph, pm0, pqs, prow0 = item
            finish_item(o, state, pb, ph, pm0, pqs, w, tw, lane, prow0, smem, qpipe, o_map, lse, sq, scale_log2)
        if tw == 0:
            bulk_wait_group(0)

    budget = register_budget(2, producer=producer_registers)
    roles = warp_specialize(budget, producer, consumer_carried if carry else consumer)
    jit = cuda.jit(**({} if SIMULATING else {"max_registers": budget.launch}))
    if cluster_m == 2:
        jit = _compose(cluster_kernel((2, 1, 1)), jit)

    @jit
    def attention_kernel(q_map, k_map, v_map, o_map, lse, heads, group, sq, sk, scale_log2):
        smem = cuda.shared.array(0, nb_dtype, alignment=1024)
        # Q: full: the producer + Q's bytes; empty: one arrival per consumer warpgroup (after its epilogue's stores),
        # or with o_buffer one per consumer warp (after the item's last Q Kᵀ)
        qpipe = Pipeline(q_stages, 1, 8 if o_buffer else 2)
        kpipe = Pipeline(stages, 1, 8 * cluster_m)  # empty: one arrival per consumer warp (of both CTAs)
        vpipe = Pipeline(stages, 1, 8 * cluster_m)
        if cluster_m > 1:
            cluster_sync()  # every CTA's barriers are initialised before any multicast or remote arrive
        grid_dependency_sync()
        roles((smem, qpipe, kpipe, vpipe, q_map, k_map, v_map, o_map, lse, heads, group, sq, sk, scale_log2))
        if cluster_m > 1:
            cluster_sync()  # no CTA leaves while its partner may still multicast into it or arrive on it

    return attention_kernel


def _compose(outer, inner):
    return lambda fn: outer(inner(fn))


def _new_lse(q, shape):
    """A float32 array for the log-sum-exp: a torch tensor on q's device when q is one (torch's caching allocator:
    cheap per call, and what a torch user expects back), else a numba device array."""
    if type(q).__module__.split(".")[0] == "torch":
        import torch

        return torch.empty(shape, dtype=torch.float32, device=q.device)
    return cuda.device_array(shape, np.float32)


class Attention(Plan):
    """A planned attention forward (see the module docstring): ``o = softmax(q kᵀ · scale (+ mask)) v`` and
    ``lse``. Options: ``causal``, ``scale`` (default ``1 / sqrt(D)``), ``layout`` ("bhsd" or "bshd"), ``bn``,
    ``stages``, ``schedule`` ("serial", "overlap", "pingpong"), ``order`` ("snake", "cyclic"), ``sweep`` ("heads",
    "queries"), ``q_stages`` (1 or 2), ``producer_registers`` (24, 32, 40), ``o_buffer`` (True, False; default
    False), ``carry`` (True, False; head dim 64), ``cluster_m`` (1 or 2; full attention), ``lazy_rescale`` (True,
    False; default True for head dims 128 and 256), ``poly_exp2`` (0, 1/8, ... 1: the share of the weights whose
    exp2 runs on the FMA units) - :class:`AttentionConfig`
    says what they do - ``autotune`` (True: the tile options are chosen by timing the default and
    :data:`TUNE_SPACE`'s configurations once per shape class and device, :mod:`numbatma.autotune`; ``plan.tuning``
    says what was measured; the first plan of a shape class compiles and times each), ``grid`` (CTAs; default one
    per SM; a multiple of 2 with ``cluster_m=2``). ``lse``: a (B, Hq, Sq) float32 array, or None (the plan
    allocates one: a torch tensor when q is one). ``launch(stream)`` returns ``(o, lse)``."""

    #: (the plan contract's declaration: attributes a built plan lets you assign; the property checks the value)
    settable = {"scale": None}

    def __init__(self, q, k, v, o, lse=None, *, causal=False, scale=None, layout="bhsd", bn=None, stages=None,
                 schedule=None, order="snake", sweep=None, q_stages=None, producer_registers=None, o_buffer=None,
                 carry=None, cluster_m=None, lazy_rescale=None, poly_exp2=None, grid=None, autotune=False):
        op = "Attention"
        if layout not in LAYOUTS:
            raise TensorMapError(f"{op}: layout must be 'bhsd' (batch, heads, seq, head_dim) or 'bshd' (batch, seq, "
                                 f"heads, head_dim), got {layout!r}")
        lq, lk, lv, lo = (array_layout(x) for x in (q, k, v, o))
        for what, lay in (("q", lq), ("k", lk), ("v", lv), ("o", lo)):
            if len(lay.shape) != 4:
                raise TensorMapError(f"{op}: {what} is a {lay.name}; attention takes 4-D arrays ({layout}).")
            if lay.dtype.name not in DTYPES or lay.dtype != lq.dtype:
                raise TensorMapError(f"{op}: {what} is a {lay.name}; q, k, v and o must all be bfloat16 or all "
                                     f"float16.")

        def dims(shape):  # (batch, heads, seq, head_dim)
            return shape if layout == "bhsd" else (shape[0], shape[2], shape[1], shape[3])

        bq, hq, sq, d = dims(lq.shape)
        bk, hk, sk, dk = dims(lk.shape)
        if dims(lv.shape) != (bk, hk, sk, dk):
            raise TensorMapError(f"{op}: k is {lk.shape} but v is {lv.shape}; they must have the same shape.")
        if lo.shape != lq.shape:
            raise TensorMapError(f"{op}: o is {lo.shape} but q is {lq.shape}; o takes q's shape.")
        if bk != bq or dk != d:
            raise TensorMapError(f"{op}: q is {lq.shape} and k is {lk.shape} ({layout}): the batch and the head "
                                 f"dim must agree.")
        if d not in HEAD_DIMS:
            raise TensorMapError(f"{op}: head dim {d} (q is {lq.shape}); supported: {', '.join(map(str, HEAD_DIMS))}.")
        if hk == 0 or hq % hk:
            raise TensorMapError(f"{op}: q has {hq} heads and k/v {hk}; the query heads must be a multiple of the "
                                 f"key/value heads (grouped-query attention).")
        if sk == 0 and sq > 0:
            raise TensorMapError(f"{op}: k and v have no keys (k is {lk.shape}); softmax over nothing is undefined.")
        self.shape = (bq, hq, hk, sq, sk, d)
        self.layout = layout
        self.causal = bool_option(op, "causal", causal)
        if grid is not None:
            grid = int_option(op, "grid", grid, 1, (1 << 31) - 1)
        self.kernel = None
        self._kernel_config = None  # (the kernel factory's arguments but the softmax mode's: set below)
        self.scale = 1.0 / math.sqrt(d) if scale is None else scale  # (checked: the property)
        self.dtype = lq.dtype
        self.o = o
        given_lse = lse
        if lse is not None:
            ll = array_layout(lse)
            if ll.shape != (bq, hq, sq) or ll.dtype != np.float32:
                raise TensorMapError(f"{op}: lse is a {ll.name}; it must be float32 with shape {(bq, hq, sq)} "
                                     f"(batch, heads, query rows).")
        self.tuning = None
        if bq * hq * sq == 0:
            self._take_lse(q, lse)
            return
        tile = dict(bn=bn, stages=stages, schedule=schedule, q_stages=q_stages,  # (TILE_OPTIONS, in its order)
                    producer_registers=producer_registers, o_buffer=o_buffer, carry=carry,
                    cluster_m=cluster_m, lazy_rescale=lazy_rescale, poly_exp2=poly_exp2)
        if bool_option(op, "autotune", autotune):
            given = {name: value for name, value in tile.items() if value is not None}
            if given:
                raise TensorMapError(f"{op}: autotune=True chooses {', '.join(TILE_OPTIONS)}; got "
                                     f"{', '.join(f'{k}={v!r}' for k, v in given.items())} as well - pass one or the "
                                     f"other")
            self.tuning = _tuned(q, k, v, o, given_lse, self, d, dict(causal=self.causal, scale=self._scale,
                                 layout=layout, order=order, sweep=sweep, grid=grid))
            tile = {name: self.tuning.best.get(name) for name in TILE_OPTIONS}
        self.config = default_config(d, **tile, order=order, sweep=sweep, causal=self.causal,
                                     sk=sk)
        cfg = self.config
        q_box, kv_box = (1, 1, WG_ROWS, CHUNK), (1, 1, cfg.bn // cfg.cluster_m, CHUNK)  # (a cluster: halves)

        def heads_major(x, lay):  # every descriptor sees (batch, heads, seq, head_dim): one kernel for both layouts
            if layout == "bhsd":
                return x
            st = lay.strides
            return layout_view(ArrayLayout(lay.ptr, dims(lay.shape), (st[0], st[2], st[1], st[3]), lay.dtype), x)

        self.q_map = TensorMap(heads_major(q, lq), q_box, swizzle=Swizzle.B128)
        self.k_map = TensorMap(heads_major(k, lk), kv_box, swizzle=Swizzle.B128)
        self.v_map = TensorMap(heads_major(v, lv), kv_box, swizzle=Swizzle.B128)
        self.o_map = TensorMap(heads_major(o, lo), q_box, swizzle=Swizzle.B128)
        self.items = bq * hq * ceil_div(sq, BM)
        self.units = bq * hq * ceil_div(ceil_div(sq, BM), cfg.cluster_m)  # (what a CTA, or a cluster, takes)
        if grid is not None and cfg.cluster_m > 1 and grid % cfg.cluster_m:
            raise TensorMapError(f"Attention: grid={grid} with cluster_m={cfg.cluster_m}: the grid must be a "
                                 f"multiple of the cluster")
        self._grid = grid
        self.block = 3 * WARPGROUP
        self.flops = 4.0 * bq * hq * sq * sk * d * (0.5 if self.causal else 1.0)
        nkb = ceil_div(sk, cfg.bn)  # key blocks a (batch, head) computes, over all its query blocks:
        self.key_blocks = sum(key_blocks(m0, nkb, cfg.bn, self.causal) for m0 in range(0, sq, BM))
        kind = "bf16" if self.dtype.name == "bfloat16" else "f16"
        self._kernel_config = (self.q_map.numba_type.dtype, d, cfg.bn, cfg.stages, self.causal, kind, cfg.schedule,
                               cfg.order, cfg.sweep, cfg.q_stages, cfg.producer_registers, cfg.o_buffer, cfg.carry,
                               cfg.cluster_m, cfg.lazy_rescale, cfg.poly_exp2)
        self._take_lse(q, lse)  # (only now: an option refused above allocates nothing)
        self._use_kernel()

    def _take_lse(self, q, lse):
        """The plan's ``lse``: the one given, or a new one per call (:meth:`Plan.owned_output`)."""
        b, hq, _, sq, _, _ = self.shape
        self.lse = lse if lse is not None else self.owned_output(functools.partial(_new_lse, q, (b, hq, sq)))
        self._owns_lse = lse is None  # (allocated here: a cache hit of attention() makes a new one)

    def _use_kernel(self):
        """The kernel of the configuration and the scale's :func:`softmax_mode` (through :meth:`Plan._update`, past
        the rule for public names: the kernel follows the scale, which may be assigned)."""
        self._kernel_mode = self._softmax[:2]
        self._update(kernel=_attention_kernel(*self._kernel_config, *self._kernel_mode))

    @property
    def scale(self):
        """The softmax scale (a float). Assigning it after the plan is built is allowed (``plan.scale = 0.5``): a
        new value of another :func:`softmax_mode` (sign, zero, beyond ``FUSED_MAX_SCALE``) switches the plan to that
        mode's kernel."""
        return self._scale

    @scale.setter
    def scale(self, value):
        value = scalar_option("Attention", "scale", value, finite=True)
        mode = softmax_mode(value)
        self._scale, self._softmax = value, mode
        if self._kernel_config is not None and mode[:2] != self._kernel_mode:
            self._use_kernel()

    @property
    def grid(self):
        """CTAs: one per SM (persistent), never more than there are items; with clusters, as many clusters as
        the GPU holds at once (:func:`numbatma.max_active_clusters`), never more than there are units."""
        cm = self.config.cluster_m
        if self._grid is None:
            if cm == 1:
                self._grid = persistent_grid(self.items)
            else:
                self._grid = cm * max_active_clusters(self.kernel, self.launch_args(), self.block,
                                                      self.config.smem_bytes, (cm, 1, 1))
        return min(self._grid // cm, self.units) * cm

    @property
    def args(self):
        b, hq, hk, sq, sk, d = self.shape
        return (self.q_map, self.k_map, self.v_map, self.o_map, self.lse, hq, hq // hk, sq, sk, self._softmax[2])

    shared_mem = property(lambda self: self.config.smem_bytes)

    @property
    def output(self):
        return self.o, self.lse

    def __repr__(self):
        b, hq, hk, sq, sk, d = self.shape
        return (f"Attention(batch {b}, heads {hq}/{hk}, seq {sq}x{sk}, head dim {d}, {self.dtype.name}, "
                f"{self.layout}, causal={self.causal}, {getattr(self, 'config', None)})")


def _tuned(q, k, v, o, lse, plan, d, options):
    """``Attention(..., autotune=True)``: the fastest of the default and :data:`TUNE_SPACE`'s configurations for this
    shape class on this device (:func:`numbatma.autotune.tune`: timed once, then cached in memory and on disk;
    the default untimed under the simulator or with ``NUMBATMA_AUTOTUNE=0``), as a :class:`numbatma.autotune.Tuning`
    whose ``best`` is a dict of tile options."""
    b, hq, hk, sq, sk, _ = plan.shape
    mode = plan._softmax[0]
    resolve = functools.partial(default_config, d, causal=options["causal"], sk=sk)
    configs, seen = [], set()
    for candidate in ({},) + TUNE_SPACE[d]:
        resolved = resolve(**candidate)
        if resolved not in seen:
            seen.add(resolved)
            configs.append(dict(candidate))
    key = ("attention", plan.dtype.name, d, "causal" if options["causal"] else "full", mode, bucket(max(sq, 1)),
           bucket(max(sk, 1)), bucket(b * hq), "gqa" if hq != hk else "mha")

    def build(config):
        return Attention(q, k, v, o, lse, **options, **config).launch

    return tune(key, configs, build)


def attention(q, k, v, o, lse=None, **options):
    """``o = softmax(q kᵀ · scale (+ causal mask)) v`` with :class:`Attention` (options as there, plus ``stream``);
    returns ``(o, lse)``."""
    return run(Attention, q, k, v, o, lse, **options)
