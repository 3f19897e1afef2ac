"""The main kernel of :class:`numbatma.kernels.AttentionBackward` (split from attention_backward.py: one idea a
module): the work items and their order, the warp-specialized kernel factory - producer (TMA loads; at D = 128 and
256 also the store warp of dQ's reduce-adds), two consumer warpgroups (Sᵀ, dPᵀ, P, dS, dV, dQ, dK on wgmma) - and its
shared-memory budget. attention_backward.py says what each step computes and holds the plan."""
from __future__ import annotations

import numpy as np
from numba import cuda, int32

from numbatma import SIMULATING
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    elect_one_sync,
    fast_exp2,
    ldmatrix,
    persistent_item,
    pingpong,
    register_budget,
    shared_view,
    store_buffers,
    store_warp,
    swizzle_offset,
    tile_handoff,
    tma_reduce,
    warp_specialize,
    wgmma,
    wgmma_a_fragments,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_map,
    wgmma_map2,
    wgmma_store,
    wgmma_store_global,
    wgmma_wait_group,
    wgmma_zeros,
)

from ._attention_backward_rows import BQ
from ._attention_config import CHUNK, WARPGROUP, ZERO
from ._compile_cache import kernel_factory
from ._device import grid_dependency_sync

MAILBOX = 8  # int32 words of the dq_writer's mailbox (batch, head, first row, turn count, item end)

def keys_per_item(d):
    """Keys of an item: 128 (each consumer warpgroup owns 64 of them, dK and dV of the whole head dim) for D <= 128;
    64 at D = 256 (both consumers see the same 64 keys, each owns half of the head dim of dK, dV and dQ: 64 x 128
    accumulators, the registers of the D = 128 kernel)."""
    return 64 if d == 256 else 128
SMEM_LIMIT = 227 * 1024


# -- the main kernel -----------------------------------------------------------------------------------------------
@cuda.jit(device=True, inline="always")
def backward_work(batch, hk, sq, sk, kb, qw):
    """(items, key blocks per head, query blocks, rounds) of the persistent loop (``kb`` keys an item, ``qw``
    queries a step)."""
    nkb = (sk + kb - 1) // kb
    nqb = (sq + qw - 1) // qw
    items = batch * hk * nkb
    rounds = (items + cuda.gridDim.x - 1) // cuda.gridDim.x
    return items, nkb, nqb, rounds


@cuda.jit(device=True, inline="always")
def backward_item(t, hk, nkb, kb):
    """Item ``t``: (batch, key/value head, first key). Key blocks fastest: the CTAs running at one time work on few
    heads, so the float32 dQ tiles they reduce into (and the Q, dO tiles they load) stay in L2 - with heads
    fastest, a round's dQ accumulators spanned one head per CTA, far beyond L2, and every reduce-add went to
    DRAM."""
    bh = t // nkb
    return bh // hk, bh % hk, (t % nkb) * kb


@cuda.jit(device=True, inline="always")
def backward_item_descending(t, hk, nkb, kb):
    """:func:`backward_item` with each head's key blocks in descending order (``deterministic``: a query block takes
    its dQ additions from the highest key block down - causal items reach it in that order - and an item only waits
    for items of its head with higher key blocks, which come earlier in every CTA's order, never in a later
    round). (A function of its own: a flag and a branch in backward_item cost the D = 128 consumer spills.)"""
    bh = t // nkb
    return bh // hk, bh % hk, (nkb - 1 - t % nkb) * kb


DQ_SPLITS = ("cols", "keys")


def default_dq_split(d):
    """How the two consumers share ``dQ = dS K`` of a query block (64 x D): "cols" (D = 128: consumer ``w`` the
    columns ``64 w ..`` over all 128 keys of the item - both dSᵀ halves: one float32 tile per query block and item
    reaches the accumulator), "keys" (D = 64: consumer ``w`` all 64 columns over its own 64 keys, both adding theirs
    - a 32-wide column half would cut the 128-byte swizzle of K's tile, and taking turns puts a branch around wgmma,
    which ptxas answers by waiting after every wgmma of the kernel), "halves" (D = 256: consumer ``w`` the columns
    ``128 w ..`` over the item's 64 keys, in two 64-wide chunks)."""
    return {64: "keys", 128: "cols"}.get(d, "halves")


def dq_chunks_per_step(d, split=None, queries=BQ):
    """64-wide chunks of dQ a consumer computes per step: 2 at D = 256 (its half of the head dim), D / 64 with
    ``split="keys"`` (every column, over its own keys), else 1 (its 64 columns - or, ``queries=128``, every column of
    its own 64 queries). The kernel's and the plan's count (the store warp's staging buffers) of one rule."""
    if d == 256:
        return 2
    if queries == BQ and (split or default_dq_split(d)) == "keys":
        return d // CHUNK
    return 1


@kernel_factory
def _backward_kernel(nb_dtype, d, causal, kind, stages, dq_reduce="tma", dq_buffers=2, split=None,
                     deterministic=False, take_turns=False, kv_stages=1, kv_regs=False, writer=False, dv_first=False,
                     queries=BQ, split_scores=False):
    """The main kernel of one configuration (compile-time constants of the closure). ``queries``: query rows a step,
    64 or (D = 64 only) 128 - FA3's D = 64 tile: Sᵀ and dPᵀ 64 keys x 128 queries per consumer, and each consumer's
    dQ the rows of its own 64 queries over all 128 keys (no partial sums of one tile from two consumers).
    ``split_scores`` (D = 256): consumer ``w`` computes Sᵀ and dPᵀ of the step's queries ``32 w ..`` only (m64n32,
    not both consumers all 64: 5/7 of the products' work) and leaves its Pᵀ and dSᵀ columns in shared tiles of
    64 x 32 (64-byte swizzle, the ``half_map``'s box); dV and dK take its own 32 queries from registers and the
    other consumer's from those tiles after the dSᵀ barrier, dQ reads both dSᵀ halves."""
    QW = queries  # query rows a step
    wide = QW != BQ
    qbox = QW // BQ  # 64-row boxes of a Q / dO / dSᵀ tile along its queries
    writer = writer and dq_reduce == "tma"  # (dQ's reduce-adds issued by warp 1 of the producer warpgroup)
    chunks = d // CHUNK
    halves = d == 256  # (the consumers split the head dim, not the keys: see keys_per_item)
    # (each consumer Sᵀ and dPᵀ of half the step's queries; not ``split``, which is dQ's split among the consumers)
    scores_split = halves and split_scores
    SN = QW // 2 if scores_split else QW  # queries of a consumer's Sᵀ and dPᵀ
    HALF = BQ * (QW // 2)  # elements of a 64 x 32 half tile (scores_split: a consumer's Pᵀ or dSᵀ columns)
    own_keys = not wide and (split or default_dq_split(d)) == "keys"  # (wide: each consumer its own queries)
    dq_chunks = dq_chunks_per_step(d, split, QW)  # 64-wide chunks of dQ a consumer computes per step
    # reduce-adds into a 64-row query block's dQ per item (deterministic: the turn counter's step); wide: only the
    # consumer whose queries they are adds into a block
    adds = dq_chunks if wide else 2 * dq_chunks
    # pingpong: the consumers issue their Sᵀ and dPᵀ in turn, so that the first one's softmax runs while the
    # second one's products do (named barriers 3 and 4; 1, 2: warpgroup_sync; 5: the dSᵀ handoff)
    turn_start, wait_turn, pass_turn, turn_finish = pingpong(2)
    ds_handoff = tile_handoff(2)  # (dSᵀ from wgmma_store to the dQ product's operand)
    item_of = backward_item_descending if deterministic else backward_item
    kb = keys_per_item(d)
    dn = d // 2 if halves else d  # a consumer's columns of dK, dV and dQ
    own = chunks // 2 if halves else chunks  # its 64-wide chunks of them
    box = BQ * CHUNK  # elements of one 64 x 64 box (every TMA box of the kernel)
    q_elems = QW * d  # a Q (or dO) tile: ``chunks`` groups of ``qbox`` boxes (queries along the rows)
    kw_elems = BQ * d  # a consumer's 64 keys of K (or V): ``chunks`` boxes
    kv_elems = kb * d  # K (or V) of an item: 64-row tiles of ``chunks`` boxes (consumer w's at w kw_elems)
    v_base = kv_elems
    kv_stage_elems = 2 * kv_elems  # K and V of one item (``kv_stages`` of them: the next item's load under this one)
    q_base = kv_stages * kv_stage_elems  # stage s: Q at q_base + 2 s q_elems, dO after it
    ds_base = q_base + 2 * stages * q_elems  # dSᵀ of a query block: buffer u (by step parity), keys 64 j.. (D = 256:
    # consumer j's copy) at ds_base + (2 u + j) qbox box, its queries 64 c.. ``c`` boxes further
    dq_elems = BQ * CHUNK  # a staged dQ chunk: 64 x 64 float32, two 64 x 32 boxes (128-byte swizzle)
    # (written by the warpgroup, TMA-reduced into dq's accumulator by its thread 0; one barrier a chunk)
    dq_out = store_buffers(dq_buffers, wait_in_publish=dq_buffers >= 2)
    dq_writer = store_warp(2)  # (writer: each consumer's chunks of a step handed to the store warp; barriers 6..9)
    if writer:
        dq_buffers = dq_chunks  # (a buffer per chunk of a step: the store warp has read them by the next step)
    stats_elems = 2 * stages * QW  # (static shared memory, float32: lse·log2 e and delta of each stage's queries)
    dq_stage_elems = 2 * dq_buffers * dq_elems  # (static: each consumer's rotating dQ chunks)

    @cuda.jit(device=True, inline="always")
    def weights(s, half, col, ex):
        """Pᵀ of query ``col`` of the block: exp2(s · scale·log2 e - lse·log2 e), ``ex = (c, lse·log2 e of the
        block's 64 queries in shared memory)`` (+inf past the queries: 0 there)."""
        return fast_exp2(s * ex[0] - ex[1][col])

    @cuda.jit(device=True, inline="always")
    def weights_masked(s, half, col, ex):
        """:func:`weights`, 0 for key ``key0 + 8 half`` past the keys or, causal, after query ``m0 + col``."""
        c, lse2, key0, m0, sk = ex  # (int32: numba would widen the comparisons to 64 bits, two instructions each)
        key = int32(key0 + 8 * half)
        if key >= sk or (causal and key > int32(m0 + col)):
            return ZERO
        return fast_exp2(s * c - lse2[col])

    @cuda.jit(device=True, inline="always")
    def softmax_grad(p, dp, half, col, delta):
        """dSᵀ = Pᵀ (dPᵀ - delta), ``delta`` of the block's 64 queries in shared memory (0 past them)."""
        return p * (dp - delta[col])

    @cuda.jit(device=True, inline="always")
    def times(x, half, col, f):
        return x * f

    @cuda.jit(device=True, inline="always")
    def add_dq(x, half, col, ex):
        """``dq_reduce="atomic"``: x into dq's float32 accumulator at query row ``row0 + 8 half``, column ``c0 + col``
        (``red.global.add.f32``, one per element)."""
        dqacc, b, h, row0, c0, sq = ex
        row = row0 + 8 * half
        if row < sq:
            cuda.atomic.add(dqacc, (b, h, row, c0 + col), x)
        return x

    @cuda.jit(device=True, inline="always")
    def box_fragments(smem, base, tw):
        """``kv_regs``: the 64 x 64 box at ``base`` (rows the M of a product, its 128-byte-swizzled columns the K) as
        the four k-steps' register A fragments of a wgmma - one ``ldmatrix.x4`` a k-step and warp: lanes 0-15 give
        rows ``16 warp + lane % 16`` of the step's first 8 columns, lanes 16-31 those rows' next 8 (the fragment's
        four 8 x 8 quarters in the A order), each row's 16 bytes where the swizzle put them."""
        lane = tw % 32
        row = int32(16 * (tw // 32) + lane % 16)
        tile = shared_view(smem, base, (box,))
        at = int32(row * 2 * CHUNK + 16 * (lane // 16))  # (bytes: the row's first 16-byte chunk of k-step 0)
        return (ldmatrix(tile, swizzle_offset(128, at) // 2, 4, False),
                ldmatrix(tile, swizzle_offset(128, int32(at + 32)) // 2, 4, False),
                ldmatrix(tile, swizzle_offset(128, int32(at + 64)) // 2, 4, False),
                ldmatrix(tile, swizzle_offset(128, int32(at + 96)) // 2, 4, False))

    @cuda.jit(device=True, inline="always")
    def box_at(smem, base, c):
        """Box ``c`` (64 x 64) of the tile at ``base``."""
        return shared_view(smem, base + c * box, (BQ, CHUNK))

    @cuda.jit(device=True, inline="always")
    def dq_product(smem, kvo, dq, u, w, cc, ds_map, k_map, h_map):
        """dQ's chunk ``cc`` of consumer ``w`` from the dSᵀ buffer ``u`` (issued, not committed): over both 64-key
        halves (two products of K = 64: the halves' K tiles are not adjacent), or at D = 256 over the item's 64 keys
        (the consumer's own dSᵀ copy) for columns ``64 (2 w + cc) ..``."""
        if scores_split:  # (dSᵀ of the step: both consumers' 32-query halves, side by side along the queries)
            ds_op = shared_view(smem, ds_base + 2 * u * box, (2, BQ, SN))
            k_op = shared_view(smem, kvo + (2 * w + cc) * box, (1, BQ, CHUNK))
            return wgmma(dq, wgmma_desc(ds_op, h_map, "MN", 0, (0, BQ)), wgmma_desc(k_op, k_map, "MN", 0, (0, BQ)),
                         0)
        if halves:
            ds_op = shared_view(smem, ds_base + (2 * u + w) * box, (1, BQ, CHUNK))
            k_op = shared_view(smem, kvo + (2 * w + cc) * box, (1, BQ, CHUNK))
            return wgmma(dq, wgmma_desc(ds_op, ds_map, "MN", 0, (0, BQ)), wgmma_desc(k_op, k_map, "MN", 0, (0, BQ)),
                         0)
        if own_keys:
            ds_op = shared_view(smem, ds_base + (2 * u + w) * box, (1, BQ, CHUNK))
            k_op = shared_view(smem, kvo + w * kw_elems + cc * box, (1, BQ, CHUNK))
            return wgmma(dq, wgmma_desc(ds_op, ds_map, "MN", 0, (0, BQ)), wgmma_desc(k_op, k_map, "MN", 0, (0, BQ)),
                         0)
        ch = 0 if wide else w  # (wide: the consumer's 64 queries, every column; else its 64 columns, every query)
        qc = w if wide else 0
        ds_lo = shared_view(smem, ds_base + (2 * u * qbox + qc) * box, (1, BQ, CHUNK))
        ds_hi = shared_view(smem, ds_base + ((2 * u + 1) * qbox + qc) * box, (1, BQ, CHUNK))
        k_lo = shared_view(smem, kvo + ch * box, (1, BQ, CHUNK))
        k_hi = shared_view(smem, kvo + kw_elems + ch * box, (1, BQ, CHUNK))
        dq = wgmma(dq, wgmma_desc(ds_lo, ds_map, "MN", 0, (0, BQ)), wgmma_desc(k_lo, k_map, "MN", 0, (0, BQ)), 0)
        return wgmma(dq, wgmma_desc(ds_hi, ds_map, "MN", 0, (0, BQ)), wgmma_desc(k_hi, k_map, "MN", 0, (0, BQ)), 1)

    @cuda.jit(device=True, inline="always")
    def dq_buffer_at(w, nd):
        """Where consumer ``w``'s staging buffer of its dQ chunk ``nd`` starts in ``dq_stage`` (elements)."""
        return int32((w * dq_buffers + nd % dq_buffers) * dq_elems)

    @cuda.jit(device=True, inline="always")
    def stage_dq(dq, nd, dq_stage, dq_map, dqacc, w, tw, b, h, m0, row_in_wg, sq, col0):
        """The first half of adding the 64 x 64 chunk ``dq`` (query rows ``m0 ..``, columns ``col0 ..``) into dq's
        float32 accumulator: written into the consumer's next rotating staging buffer (``nd`` chunks staged
        before it), for :func:`send_dq` to reduce-add - or, ``dq_reduce="atomic"``, added right here with one
        ``red.global.add.f32`` an element."""
        if dq_reduce == "atomic":  # (the first version's way, kept for the benchmark)
            wgmma_map(dq, add_dq, (dqacc, b, h, m0 + row_in_wg, col0, sq))
        else:
            if not writer:  # (writer: chunk nd of the step into its own buffer, which the caller acquired)
                dq_out.acquire(w, tw)  # (one staging buffer: the reduce that last read it has read it)
            wgmma_store(dq, shared_view(dq_stage, dq_buffer_at(w, nd), (2, BQ, 32)), dq_map, 0, 0)

    @cuda.jit(device=True, inline="always")
    def send_dq(nd, pending, dq_stage, dq_map, turns, rank, nkb, offset, w, tw, b, h, m0, col0):
        """The second half: the staged chunk ``nd`` made visible to TMA and reduce-added by thread 0 (one
        barrier of the warpgroup: ``store_buffers(wait_in_publish=True)``); returns (the chunks staged so far,
        ``pending``). Called after the step's dV and dK products have completed where there is one chunk per step,
        so the staging stores drain under them instead of stalling the fence.

        ``deterministic``: the adds into a query block go in descending key-block order (the items run in that
        order too: :func:`backward_item_descending`). Thread 0 first counts its previous add (:func:`count_pending`:
        waits for it to be performed, then adds 1 to that query block's turn counter - deferred to here, so that the
        wait overlaps the step's products), then waits until this block's counter reaches ``adds`` x (the key
        blocks above this item's that see the block) + ``offset`` (D = 64, ``dq_split="keys"``: consumer 1 after
        consumer 0, their chunks overlap - counted at once for that), then reduce-adds: one order whatever the
        timing."""
        if dq_reduce == "atomic":
            return nd, pending
        at = dq_buffer_at(w, nd)
        if dq_out.publish(w, tw):
            if deterministic:
                pending = count_pending(turns, pending)
                i = m0 // BQ
                last = min(nkb - 1, (m0 + BQ - 1) // kb) if causal else nkb - 1  # (the block's highest key block)
                while cuda.atomic.add(turns, (b, h, i), 0) < adds * (last - rank) + offset:
                    pass
                cuda.threadfence()
            for j in range(2):
                tma_reduce("add", dq_map, (b, h, m0, col0 + 32 * j), shared_view(dq_stage, at + j * BQ * 32, (BQ, 32)))
            bulk_commit_group()
            if deterministic:
                pending = (int32(b), int32(h), int32(m0 // BQ))
                if own_keys:  # (the other consumer waits for this add within the step: counted now)
                    pending = count_pending(turns, pending)
        return nd + 1, pending

    @cuda.jit(device=True, inline="always")
    def count_pending(turns, pending):
        """``deterministic``: thread 0's last reduce-add (``pending`` = its (batch, head, query block); block -1:
        none) waited for (``bulk_wait_group(0)``: performed) and counted in the block's turn counter; returns
        "none"."""
        pb, ph, pi = pending
        if pi >= 0:
            bulk_wait_group(0)
            cuda.threadfence()
            cuda.atomic.add(turns, (pb, ph, pi), 1)
        return pb, ph, int32(-1)

    @cuda.jit(device=True, inline="always")
    def producer(args):
        """One elected thread: per item K and V (into the next of ``kv_stages`` stages), then Q and dO of every
        query block of every query head of the group that sees the item's keys."""
        (smem, stats, dq_stage, mailbox, kvpipe, qpipe, q_map, k_map, v_map, do_map, stats_map, dq_map, h_map, dqacc,
         turns, dk, dv, batch, hk, group, sq, sk, c, scale) = args
        items, nkb, nqb, rounds = backward_work(batch, hk, sq, sk, kb, QW)
        if cuda.threadIdx.x < 32:
            if elect_one_sync():
                # (32-bit from here: with numba's 64-bit loop counters and coordinates the producer warpgroup's 24
                # registers spilled - 18 local-memory instructions at D = 128, none now)
                items, nkb, nqb, rounds = int32(items), int32(nkb), int32(nqb), int32(rounds)
                hk32, group32 = int32(hk), int32(group)
                for r in range(rounds):
                    t = int32(persistent_item(r, causal))
                    if t >= items:
                        break
                    b, g, n0 = item_of(t, hk32, nkb, kb)
                    b, g, n0 = int32(b), int32(g), int32(n0)
                    kvo = (kvpipe.producer_acquire() % kv_stages) * kv_stage_elems  # (0 with one stage, folded)
                    for ww in range(kb // BQ):  # each consumer's 64 keys as a tile of their own (one at D = 256)
                        for ch in range(chunks):
                            at = (b, g, int32(n0 + BQ * ww), int32(CHUNK * ch))
                            kvpipe.load(box_at(smem, kvo + ww * kw_elems, ch), k_map, at)
                            kvpipe.load(box_at(smem, kvo + v_base + ww * kw_elems, ch), v_map, at)
                    kvpipe.producer_commit()
                    first = int32(n0 // QW) if causal else int32(0)
                    for hh in range(group32):
                        h = int32(g * group32 + hh)
                        for i in range(first, nqb):
                            s = qpipe.producer_acquire()  # (Q, dO and their rows' statistics)
                            for ch in range(chunks):
                                for qb in range(qbox):  # (wide: two 64-row boxes of queries, stacked)
                                    at = (ch * qbox + qb) * box
                                    xy = (b, h, int32(i * QW + BQ * qb), int32(CHUNK * ch))
                                    qpipe.load(shared_view(smem, q_base + 2 * s * q_elems + at, (BQ, CHUNK)), q_map, xy)
                                    qpipe.load(shared_view(smem, q_base + (2 * s + 1) * q_elems + at, (BQ, CHUNK)),
                                               do_map, xy)
                            qpipe.load(shared_view(stats, 2 * s * QW, (2, QW)), stats_map, (b, h, int32(0),
                                                                                               int32(i * QW)))
                            qpipe.producer_commit()
        elif writer and cuda.threadIdx.x < 64:
            store_dq(dq_stage, mailbox, dq_map, turns)

    @cuda.jit(device=True, inline="always")
    def store_dq(dq_stage, mailbox, dq_map, turns):
        """``writer``: warp 1 of the producer warpgroup, the consumers' store warp (``store_warp``). Per query block
        the consumers stage: frees both consumers' dQ buffers once its last reduce-adds have read them, takes consumer
        0's chunks - and from its mailbox (batch, head, first row; batch -1: no more blocks) what they are - then
        consumer 1's, lane 0 reduce-adding each into dq's float32 accumulator (two 64 x 32 boxes a chunk, one bulk
        group a consumer). It keeps no schedule of its own: its few registers hold no item state.

        ``deterministic``: before its first add into a block, lane 0 waits until the block's turn counter reaches the
        mailbox's count (the key blocks above this item's that see the block, each counted once all its adds are
        performed - at the warp's next block, or at once for an item's last block); at D = 64, where both
        consumers add into the same tile, consumer 1's adds go after consumer 0's are performed."""
        lane = cuda.threadIdx.x % 32
        pb, ph, pi = int32(0), int32(0), int32(-1)  # (deterministic: the block whose adds are not yet counted)
        while True:
            if deterministic and lane == 0 and pi >= 0:  # (the last block's adds performed, then counted)
                bulk_wait_group(0)
                cuda.threadfence()
                cuda.atomic.add(turns, (pb, ph, pi), 1)
                pi = int32(-1)
            dq_writer.free(lane)  # (both consumers' buffers: the last reduce-adds have read them)
            dq_writer.take(0)
            b = mailbox[0]
            if b < 0:  # (the consumers' last hand-off: nothing staged)
                dq_writer.take(1)
                break
            h = mailbox[1]
            m0 = mailbox[2]
            if deterministic and lane == 0:
                while cuda.atomic.add(turns, (b, h, m0 // BQ), 0) < mailbox[3]:
                    pass
                cuda.threadfence()
            for w in range(2):
                if w == 1:
                    dq_writer.take(1)
                if lane == 0:
                    if deterministic and own_keys and w == 1:
                        bulk_wait_group(0)  # (consumer 0's adds into the same tile first)
                    col0 = int32(CHUNK * own * w if halves else (0 if own_keys or wide else CHUNK * w))
                    row0 = int32(m0 + BQ * w if wide else m0)  # (wide: each consumer's dQ is its own 64 queries)
                    for cc in range(dq_chunks):
                        at = dq_buffer_at(w, cc)
                        for j in range(2):
                            tma_reduce("add", dq_map, (b, h, row0, int32(col0 + CHUNK * cc + 32 * j)),
                                       shared_view(dq_stage, at + j * BQ * 32, (BQ, 32)))
                    bulk_commit_group()
            if deterministic:
                pb, ph, pi = b, h, m0 // BQ
                if mailbox[4] != 0 and lane == 0:  # (an item's last block: counted before the next item, whose
                    bulk_wait_group(0)              # adds may wait for it in another CTA)
                    cuda.threadfence()
                    cuda.atomic.add(turns, (pb, ph, pi), 1)
                    pi = int32(-1)
        if lane == 0:
            bulk_wait_group(0)  # (dq's last reduces complete before the kernel ends)

    @cuda.jit(device=True, inline="always")
    def post_block(mailbox, b, h, m0, rank, nkb, item_end):
        """``writer``: the query block whose dQ chunks the consumers stage now, for the store warp: batch, head,
        first row, (``deterministic``) the key blocks above the item's that see the block - its turn count - and
        whether it is the item's last block."""
        mailbox[0] = b
        mailbox[1] = h
        mailbox[2] = m0
        if deterministic:
            last = min(nkb - 1, (m0 + BQ - 1) // kb) if causal else nkb - 1  # (the block's highest key block)
            mailbox[3] = int32(last - rank)
            mailbox[4] = int32(item_end)

    @cuda.jit(device=True, inline="always")
    def consumer(w, args):
        """Consumer warpgroup ``w``: keys ``64 w ..`` of each item - dK and dV over every query block, dq's share."""
        (smem, stats, dq_stage, mailbox, kvpipe, qpipe, q_map, k_map, v_map, do_map, stats_map, dq_map, h_map, dqacc,
         turns, dk, dv, batch, hk, group, sq, sk, c, scale) = args
        items, nkb, nqb, rounds = backward_work(batch, hk, sq, sk, kb, QW)
        # (w as warp_specialize passes it. Made again and broadcast from lane 0, as the forward does, ptxas keeps the
        # descriptors in uniform registers - the step's loop 15-30% fewer SASS instructions, no R2UR - but it ran
        # 3-5% slower at D = 128 and 1-5% at D = 256 on an H200, same run, 2026-11-28: not done)
        tw = cuda.threadIdx.x - (w + 1) * WARPGROUP
        lane = cuda.threadIdx.x % 32
        row_in_wg = 16 * (tw // 32) + lane // 4  # the thread's first row of a 64-row accumulator (the second: + 8)
        kv_w = 0 if halves else w * kw_elems  # this consumer's 64 keys of K and V (D = 256: the item's, shared)
        c0 = own * w if halves else 0  # its first chunk of dK, dV and dQ
        dq_col0 = CHUNK * c0 if halves else (0 if own_keys or wide else CHUNK * w)  # its first column of dQ
        q0 = int32(SN * w) if scores_split else int32(0)  # its first query of a step's Sᵀ and dPᵀ
        qo = int32(SN * (1 - w))  # (scores_split: the other consumer's)
        step = 0  # query blocks so far (the dSᵀ buffer)
        nd = 0  # dQ chunks staged so far (the rotating staging buffer)
        pending = (int32(0), int32(0), int32(-1))  # (deterministic: thread 0's last reduce-add, not yet counted)
        active = cuda.blockIdx.x < items  # (the CTA has work: both consumers take the same turns)
        sk32 = int32(sk)
        if take_turns:
            turn_start(w, active)
        for r in range(rounds):
            t = persistent_item(r, causal)
            if t >= items:
                break
            b, g, n0 = item_of(t, hk, nkb, kb)
            k0 = n0 if halves else n0 + BQ * w  # the consumer's first key
            key0 = int32(k0 + row_in_wg)
            key_hi = int32(k0 + BQ - 1)  # the consumer's last key (warp-uniform: the masks' branch)
            rank = n0 // kb  # (deterministic: the item's key block; at D = 64 consumer 1's adds after consumer 0's)
            offset = w * dq_chunks if own_keys else 0
            kvo = (kvpipe.consumer_wait() % kv_stages) * kv_stage_elems  # (the item's K/V stage; 0 with one)
            k_w = shared_view(smem, kvo + kv_w, (chunks, BQ, CHUNK))
            v_w = shared_view(smem, kvo + v_base + kv_w, (chunks, BQ, CHUNK))
            # (zeroed, then fenced once: inside the loop dK and dV pass only through their own wgmma - tied through
            # every step's fence and wait as well, ptxas moved them between registers, ~180 moves a step at D = 128)
            dkacc, dvacc = wgmma_fence((wgmma_zeros(dn), wgmma_zeros(dn)))
            if kv_regs:  # (D = 64: K_w and V_w as register A fragments for the whole item; Sᵀ, dPᵀ read only Q, dO)
                kf, vf = wgmma_fence((box_fragments(smem, kvo + kv_w, tw),
                                      box_fragments(smem, kvo + v_base + kv_w, tw)))
            first = n0 // QW if causal else 0
            for hh in range(group):
                h = g * group + hh
                for i in range(first, nqb):
                    m0 = int32(i * QW)
                    dq_row0 = int32(m0 + BQ * w) if wide else m0  # (the first query row of this consumer's dQ)
                    s = qpipe.consumer_wait()
                    q_at = int32(q_base + 2 * s * q_elems)  # (32-bit offsets: shared memory is a 32-bit window)
                    q_all = shared_view(smem, q_at, (chunks, QW, CHUNK))
                    do_all = shared_view(smem, int32(q_at + q_elems), (chunks, QW, CHUNK))
                    # Sᵀ = K_w Qᵀ, dPᵀ = V_w dOᵀ (64 keys x 64 queries, the head dim as K), two groups: P is computed
                    # while dPᵀ runs (and the lse values P needs are dead before dPᵀ's registers fill)
                    if take_turns:
                        wait_turn(w)  # my turn to issue
                    st = wgmma_fence(wgmma_zeros(SN))
                    if kv_regs:
                        st = wgmma(st, kf, wgmma_desc(q_all, q_map, "K", 0, (0, d)), 0)
                    else:
                        st = wgmma(st, wgmma_desc(k_w, k_map, "K", 0, (0, d)),
                                   wgmma_desc(q_all, q_map, "K", q0, (0, d)), 0)
                    wgmma_commit_group()
                    dpt = wgmma_fence(wgmma_zeros(SN))
                    if kv_regs:
                        dpt = wgmma(dpt, vf, wgmma_desc(do_all, do_map, "K", 0, (0, d)), 0)
                    else:
                        dpt = wgmma(dpt, wgmma_desc(v_w, v_map, "K", 0, (0, d)),
                                    wgmma_desc(do_all, do_map, "K", q0, (0, d)), 0)
                    wgmma_commit_group()
                    if take_turns:
                        pass_turn(w)  # the other's turn
                    if scores_split:  # (this consumer's queries of the step)
                        lse2 = shared_view(stats, int32(2 * s * QW + q0), (SN,))
                        delta = shared_view(stats, int32((2 * s + 1) * QW + q0), (SN,))
                        mq = int32(m0 + q0)
                    else:
                        lse2 = shared_view(stats, 2 * s * QW, (QW,))
                        delta = shared_view(stats, (2 * s + 1) * QW, (QW,))
                        mq = m0
                    st = wgmma_wait_group(1, st)
                    if key_hi >= sk32 or (causal and key_hi > mq):  # (a ragged key block, the causal diagonal)
                        p = wgmma_map(st, weights_masked, (c, lse2, key0, mq, sk32))
                    else:
                        p = wgmma_map(st, weights, (c, lse2))
                    dpt = wgmma_wait_group(0, dpt)
                    dst = wgmma_map2(p, dpt, softmax_grad, delta)
                    # dSᵀ into shared memory (dQ's A operand, read MN-major), then only P's and dS's 16-bit fragments
                    # stay in registers beside dK and dV. Two buffers by step parity: a consumer at this step's
                    # barrier knows the other finished the step before (its dQ product included)
                    u = step % 2
                    if scores_split:  # (its 32 queries of dSᵀ and Pᵀ: for dQ and the other consumer's dK, dV)
                        wgmma_store(dst, shared_view(smem, ds_base + 2 * u * box + w * HALF, (BQ, SN)), h_map, 0, 0)
                        wgmma_store(p, shared_view(smem, ds_base + (2 * u + 1) * box + w * HALF, (BQ, SN)), h_map, 0,
                                    0)
                    else:
                        wgmma_store(dst, shared_view(smem, ds_base + (2 * u + w) * qbox * box, (qbox, BQ, CHUNK)),
                                    q_map, 0, 0)
                    pf = wgmma_a_fragments(p, kind)
                    dsf = wgmma_a_fragments(dst, kind)
                    # (dO and Q of the consumer's columns, from its first query of Sᵀ: scores_split, the products below
                    # take their rows 0 .. 31 - the view's base moved, a k-range is a constant; a branch of its own, as
                    # the offset 0 in the other kernels changed their registers: 3 more local-memory instructions)
                    if scores_split:
                        do_own = shared_view(smem, int32(q_at + q_elems + c0 * qbox * box + q0 * CHUNK),
                                             (own, QW, CHUNK))
                        q_own = shared_view(smem, int32(q_at + c0 * qbox * box + q0 * CHUNK), (own, QW, CHUNK))
                    else:
                        do_own = shared_view(smem, int32(q_at + q_elems + c0 * qbox * box), (own, QW, CHUNK))
                        q_own = shared_view(smem, int32(q_at + c0 * qbox * box), (own, QW, CHUNK))
                    if dv_first:  # (dV += Pᵀ dO issued before the barrier: the tensor cores work while it waits)
                        pf = wgmma_fence(pf)
                        dvacc = wgmma(dvacc, pf, wgmma_desc(do_own, do_map, "MN", 0, (0, SN)), 1)
                        wgmma_commit_group()
                    if scores_split:
                        ds_handoff.all()  # (both consumers' Pᵀ and dSᵀ halves written: each reads the other's)
                    elif halves or own_keys:
                        ds_handoff.own(w)  # (dQ reads only this consumer's dSᵀ)
                    else:
                        ds_handoff.all()  # (both 64-key halves of dSᵀ written: dQ reads both)
                    step += 1
                    # dQ = dS K (first, its staging overlaps dV and dK), dV += Pᵀ dO, dK += dSᵀ Q (the queries as
                    # K; dO and Q MN-major from the stage; Pᵀ and dSᵀ from registers)
                    if dv_first:
                        dq, dsf = wgmma_fence((wgmma_zeros(CHUNK), dsf))
                    else:
                        pf, dsf = wgmma_fence((pf, dsf))
                        dq = wgmma_fence(wgmma_zeros(CHUNK))
                    dq = dq_product(smem, kvo, dq, u, w, 0, q_map, k_map, h_map)
                    wgmma_commit_group()
                    if not dv_first:
                        dvacc = wgmma(dvacc, pf, wgmma_desc(do_own, do_map, "MN", 0, (0, SN)), 1)
                    if scores_split:  # (the other consumer's 32 queries: its Pᵀ from shared memory)
                        do_other = shared_view(smem, int32(q_at + q_elems + c0 * qbox * box + qo * CHUNK),
                                               (own, QW, CHUNK))
                        pt_other = shared_view(smem, ds_base + (2 * u + 1) * box + (1 - w) * HALF, (1, BQ, SN))
                        dvacc = wgmma(dvacc, wgmma_desc(pt_other, h_map, "K", 0, (0, SN)),
                                      wgmma_desc(do_other, do_map, "MN", 0, (0, SN)), 1)
                    dkacc = wgmma(dkacc, dsf, wgmma_desc(q_own, q_map, "MN", 0, (0, SN)), 1)
                    if scores_split:
                        q_other = shared_view(smem, int32(q_at + c0 * qbox * box + qo * CHUNK), (own, QW, CHUNK))
                        ds_other = shared_view(smem, ds_base + 2 * u * box + (1 - w) * HALF, (1, BQ, SN))
                        dkacc = wgmma(dkacc, wgmma_desc(ds_other, h_map, "K", 0, (0, SN)),
                                      wgmma_desc(q_other, q_map, "MN", 0, (0, SN)), 1)
                    wgmma_commit_group()
                    dq = wgmma_wait_group(1, dq)  # (dV's group, if first, and dQ's completed)
                    if writer:  # (the buffers free again; consumer 0 tells the store warp what this block is)
                        dq_writer.acquire(w)
                        if w == 0 and tw == 0:
                            post_block(mailbox, b, h, m0, int32(rank), nkb, hh == group - 1 and i == nqb - 1)
                    stage_dq(dq, 0 if writer else nd, dq_stage, dq_map, dqacc, w, tw, b, h, dq_row0, row_in_wg, sq,
                             dq_col0)
                    for cc in range(1, dq_chunks):  # (D = 256, or "keys" at D = 128: the second 64-wide chunk)
                        if not writer:
                            nd, pending = send_dq(nd, pending, dq_stage, dq_map, turns, rank, nkb, offset, w, tw, b, h,
                                                  dq_row0, dq_col0 + CHUNK * (cc - 1))
                        dq = wgmma_fence(wgmma_zeros(CHUNK))
                        dq = dq_product(smem, kvo, dq, u, w, cc, q_map, k_map, h_map)
                        wgmma_commit_group()
                        dq = wgmma_wait_group(0, dq)
                        stage_dq(dq, cc if writer else nd, dq_stage, dq_map, dqacc, w, tw, b, h, dq_row0, row_in_wg,
                                 sq, dq_col0 + CHUNK * cc)
                    pf, dsf = wgmma_wait_group(0, (pf, dsf))
                    if lane == 0:
                        qpipe.consumer_release()  # every product reading this stage's Q and dO has completed
                    if writer:
                        dq_writer.publish(w)  # (the store warp reduce-adds the step's chunks: no wait here)
                    else:
                        nd, pending = send_dq(nd, pending, dq_stage, dq_map, turns, rank, nkb, offset, w, tw, b, h,
                                              dq_row0, dq_col0 + CHUNK * (dq_chunks - 1))
            if deterministic and not writer and tw == 0:
                pending = count_pending(turns, pending)  # (the item's last add counted before its epilogue)
            if kv_regs:  # (the warp's ldmatrix reads of K and V before lane 0's release: an item no query block sees
                cuda.syncwarp()  # - causal, Sk > Sq - has no barrier between them)
            if lane == 0:
                kvpipe.consumer_release()
            dkacc, dvacc = wgmma_wait_group(0, (dkacc, dvacc))  # (their last products completed: read below)
            dkacc = wgmma_map(dkacc, times, scale)
            wgmma_store_global(dkacc, dk[b, g], k0, CHUNK * c0)
            wgmma_store_global(dvacc, dv[b, g], k0, CHUNK * c0)
        if writer:  # (the last hand-off: no block - the store warp stops)
            dq_writer.acquire(w)
            if w == 0 and tw == 0:
                mailbox[0] = -1
            dq_writer.publish(w)
        if take_turns:
            turn_finish(w, active)
        if tw == 0 and not writer:
            bulk_wait_group(0)  # (dq's last reduces complete before the kernel ends)

    budget = register_budget(2, producer=24)  # (consumers 240: dK and dV, Sᵀ and dPᵀ live together)
    roles = warp_specialize(budget, producer, consumer)
    jit = cuda.jit(**({} if SIMULATING else {"max_registers": budget.launch}))

    @jit
    def attention_backward_kernel(q_map, k_map, v_map, do_map, stats_map, dq_map, h_map, dqacc, turns, dk, dv, batch,
                                  hk, group, sq, sk, c, scale):
        smem = cuda.shared.array(0, nb_dtype, alignment=1024)
        stats = cuda.shared.array(stats_elems, np.float32, alignment=128)  # per stage: lse·log2 e, delta
        dq_stage = cuda.shared.array(dq_stage_elems, np.float32, alignment=1024)  # the consumers' dQ tiles
        mailbox = cuda.shared.array(MAILBOX, np.int32)  # (dq_writer: what the staged chunks are, for the store warp)
        kvpipe = Pipeline(kv_stages, 1, 8)  # K and V of an item: one arrival per consumer warp at its end
        qpipe = Pipeline(stages, 1, 8)  # Q and dO of a query block: one arrival per consumer warp
        grid_dependency_sync()
        roles((smem, stats, dq_stage, mailbox, kvpipe, qpipe, q_map, k_map, v_map, do_map, stats_map, dq_map, h_map,
               dqacc, turns, dk, dv, batch, hk, group, sq, sk, c, scale))

    return attention_backward_kernel


def shared_bytes(d, stages, kv_stages=1, queries=BQ):
    """Dynamic shared memory of the main kernel: ``kv_stages`` x K and V (``keys_per_item(d)`` x D each),
    ``stages`` x (Q, dO) of ``queries`` x D, two buffers of two dSᵀ tiles of 64 x ``queries`` (16-bit elements)."""
    return 2 * (2 * kv_stages * keys_per_item(d) * d + 2 * stages * queries * d + 4 * queries * CHUNK)


def static_shared_bytes(stages, dq_buffers=2, queries=BQ):
    """Static shared memory of the main kernel: ``dq_buffers`` staged dQ chunks (64 x 64 float32) per consumer, the
    rows' statistics of every stage (2 x ``queries`` float32), the pipelines' barriers (at most 1 KiB)."""
    return 4 * (2 * dq_buffers * BQ * CHUNK + 2 * stages * queries) + 1024
