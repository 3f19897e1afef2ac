"""Attention backward on Hopper tensor cores (FlashAttention-2/3's algorithm, key/value blocks stationary): given
``q, k, v``, the forward's ``o`` and log-sum-exp ``lse``, and ``do`` (the gradient of the loss with respect to
``o``), compute ``dq, dk, dv`` - written with numbatma's public API only.

Arrays as :class:`numbatma.kernels.Attention` takes them: ``q``, ``o``, ``do``, ``dq`` (B, Hq, Sq, D), ``k``, ``v``,
``dk``, ``dv`` (B, Hkv, Sk, D) with ``layout="bhsd"`` (or (B, S, H, D) with ``layout="bshd"``; any strides TMA can
describe, the head dim contiguous; o, do and dq with rows on 4-byte boundaries), bfloat16 or float16 (all the
same), D = 64, 128 or 256, ``Hq`` a multiple of ``Hkv`` (grouped-query attention: ``dk`` and ``dv`` of a key/value
head sum over its query heads), any Sq, Sk >= 1;
``lse`` (B, Hq, Sq) float32 as the forward wrote it (natural log). ``causal``: top-left alignment, as the forward.

Three kernels, launched in order on one stream:

1. **Preprocess** (a block per (batch, head) and 32 query rows, as many lanes a row as it has words):
   ``delta_i = sum_d do[i, d] o[i, d]`` (float32) - the row term of the softmax gradient, ``dS = P (dP - delta)`` -
   and the float32 accumulator of ``dq`` zeroed.
2. **Main** (a persistent grid - at D = 256 causal a CTA per item -, 384 threads:
   :func:`numbatma.intrinsics.warp_specialize` with a producer and two consumer warpgroups). An item is 128 keys of
   one (batch, key/value head); consumer ``w`` owns keys ``64 w .. 64 w + 63`` of it and holds their ``dK`` and
   ``dV`` (64 x D, float32) in registers across the whole item. At D = 256 an item is 64 keys and consumer ``w``
   owns head-dim columns ``128 w ..`` of their dK, dV and of dQ (in the registers of D = 128), and computes ``Sᵀ`` and ``dPᵀ`` of the step's queries ``32 w ..`` only
   (``split_scores``): its ``Pᵀ`` and ``dSᵀ`` columns go to shared 64 x 32 tiles, from which the other consumer's dV
   and dK take them (+9-22% on an H200 over both consumers computing all of them, 7/5 of the products' work). The
   producer TMA-loads the item's K and V once, then Q and dO of every 64-row query block that sees the keys
   (causal: from the diagonal on), of every query head of the group, through a ``stages``-deep :class:`Pipeline`.
   Per query block a consumer computes, all on wgmma:

   * ``Sᵀ = K_w Qᵀ`` and ``dPᵀ = V_w dOᵀ`` (64 keys x 64 queries, K-major; at D = 64 ``K_w`` and ``V_w`` are
     register A fragments, read once per item with ``ldmatrix`` from their swizzled tiles - ``kv_registers``: the
     products then read only Q and dO from shared memory, whose bandwidth these 64-wide products exhaust);
   * ``Pᵀ = exp2(Sᵀ · scale·log2 e - lse·log2 e)`` per column (:func:`wgmma_map`: masked keys and queries 0),
     ``dSᵀ = Pᵀ (dPᵀ - delta)`` (:func:`wgmma_map2`);
   * ``dV += Pᵀ dO`` (issued first: ``dv_first``, FA4's order - it runs while the consumers meet at the dSᵀ
     barrier) and ``dK += dSᵀ Q`` with ``Pᵀ`` and ``dSᵀ`` straight from registers (:func:`wgmma_a_fragments`), dO
     and Q read MN-major from the same tiles; dK and dV pass through nothing but their own wgmma within an item
     (fenced once when zeroed, waited for once at its end: tied through every step's fence and wait, ptxas moved
     their 128 registers about each step);
   * ``dSᵀ`` into a 64 x 64 shared tile (:func:`wgmma_store`; two buffers by step parity), and ``dQ = dS K``
     with that tile as an MN-major A operand, split between the consumers as :func:`default_dq_split` says,
     issued before dK and written to shared memory (float32, 128-byte swizzle) while dK runs, then added into the
     float32 accumulator of ``dq`` by TMA reduce-adds (every item of the key blocks adds to it, in no fixed order):
     issued by a store warp (``dq_writer``, the default at D = 128 and 256: warp 1 of the producer warpgroup,
     :func:`numbatma.intrinsics.store_warp`; consumer 0 leaves the block's coordinates in a shared mailbox) or, at
     D = 64, by each consumer's thread 0 after a warpgroup barrier (two rotating buffers).

   Items go key block fastest: the CTAs running at one time share few heads, so their dQ accumulators and Q/dO
   tiles stay in L2. Causal, the CTAs take each round's items in snake order (:func:`persistent_item`): an item's
   work falls with its key block, and in the plain order CTA ``c`` of 132 took key blocks ``(c + 4 r) % 8`` in round
   ``r`` at S = 1024 (8 key blocks a head): two values for ever - 1.29x the mean work on the busiest CTA (a model of
   the rounds; 1.08x at S = 8192), 1.03x in snake order (heavy and light items alternate).

   The item's end: ``dK · scale`` and ``dV`` converted and stored from registers (:func:`wgmma_store_global`:
   4-byte pairs where the tile lies inside, element by element at the ragged end - nothing past the keys).
3. **Postprocess**: ``dq`` = ``scale`` x the accumulator, converted to q's type (8-byte words where every row
   of dq allows, 32-bit index arithmetic; the preprocess likewise). The two row kernels and their plans:
   ``kernels/_attention_backward_rows.py``.

``deterministic=True``: dq's additions into each query block in descending key-block order, the items too (a
turn counter per query block, each add counted at the issuing thread's next one; see ``send_dq`` and ``store_dq``),
bitwise reproducible.

Not yet here (issue 26): the overlap of one consumer's softmax with the other's products (the dSᵀ barrier keeps them
in step), |scale| > 1 (the forward's "exact" softmax mode); FlashAttention-4's SM90 backward is 14-23% ahead at
D = 64 and 128 on an H200, level at D = 256 (docs/attention.md: what it does differently - dQ's accumulator in
fragment order with 1-D bulk reduce-adds, 80 queries a step at D = 128 without a mask, fewer instructions a step).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from numbatma import SIMULATING, Swizzle, TensorMap, TensorMapError, array_layout
from numbatma.views import ArrayLayout, kernel_view, layout_view

from ._attention_backward_kernel import (DQ_SPLITS, SMEM_LIMIT, _backward_kernel, default_dq_split,
                                         dq_chunks_per_step, keys_per_item, shared_bytes, static_shared_bytes)
from ._attention_backward_rows import BQ, Post, Prep, aligned, word_layout
from ._attention_config import CHUNK, DTYPES, FUSED_MAX_SCALE, LAYOUTS, WARPGROUP
from ._launch import ceil_div, persistent_grid
from ._options import bool_option, choice_option, int_option, scalar_option
from ._plan import Plan, run

__all__ = ["AttentionBackward", "attention_backward"]

# BQ (64): query rows per step - one box of Q and of dO per 64-wide chunk of the head dim (from the row kernels' module,
# whose statistics are padded to it)
HEAD_DIMS = (64, 128, 256)
MAX_QUERY_ROWS = 65535 * 32  # (the preprocess's grid: 32-row blocks along y)
DQ_REDUCES = ("tma", "atomic")  # dq's additions: TMA reduce-adds of staged tiles (default), or one atomic an element

# -- the plans -----------------------------------------------------------------------------------------------------
def _scratch_maker(q):
    """``make(shape, dtype=float32)``: a new work array of the plan (the rows' statistics, dq's accumulator, the turn
    counters) on q's device - a torch tensor when q is one (torch's caching allocator, ordered on its current
    stream), else a numba device array. It holds q's device, not q (a cached plan keeps its makers: they must not
    keep its first call's q alive)."""
    if type(q).__module__.split(".")[0] == "torch":
        import torch

        device = q.device
        return lambda shape, dtype=np.float32: torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name),
                                                           device=device)
    return lambda shape, dtype=np.float32: cuda.device_array(shape, dtype)


def _heads_major(lay, layout):
    """(batch, heads, seq, head_dim) view of a "bhsd" or "bshd" array (its layout)."""
    if layout == "bhsd":
        return lay
    s = lay.strides
    return ArrayLayout(lay.ptr, (lay.shape[0], lay.shape[2], lay.shape[1], lay.shape[3]), (s[0], s[2], s[1], s[3]),
                       lay.dtype)


class AttentionBackward(Plan):
    """A planned attention backward (see the module docstring): ``dq, dk, dv`` from ``q, k, v, o, do, lse``.
    Options: ``causal`` (as the forward), ``scale`` (default ``1 / sqrt(D)``; |scale| <= 1), ``layout``
    ("bhsd" or "bshd"), ``stages`` (Q/dO stages, default 3 at D = 64 and 128, 1 at 256), ``dq_reduce`` ("tma":
    dQ tiles staged in shared memory and TMA reduce-added, the default; "atomic": one ``red.global.add.f32`` an
    element - the first version's way, 1.5-2.3x slower on an H100, kept for the benchmark), ``dq_split`` ("cols"
    or "keys" at D = 128: see :func:`default_dq_split`), ``deterministic`` (dq's additions in a fixed order:
    bitwise reproducible; 0.37-0.63x of the default causal, ~0.5x full on an H200), ``pingpong`` (the consumers
    issue Sᵀ and dPᵀ in turn - a benchmark switch, off: 1-5% slower on an H200), ``kv_stages`` (1 or 2: the next
    item's K and V loaded under this one, where shared memory allows - D = 64 with two Q/dO stages; a benchmark
    switch, default 1: 2 is 1% slower at D = 64, 25% at D = 128), ``kv_registers`` (D = 64 only, with
    ``queries=64``: K and V of a consumer's keys as register A fragments for the whole item, read once with
    ``ldmatrix``; +4-7% over shared-memory operands on an H200; False reads them from shared memory in every
    product), ``dq_writer`` (default at D = 128 and 256: warp 1 of the producer warpgroup issues dQ's reduce-adds, the
    consumers hand it their staged chunks through named barriers - ``numbatma.intrinsics.store_warp``; False: each
    consumer's thread 0 issues its own after a warpgroup barrier, 1-4% faster at D = 64), ``dv_first`` (default
    True: ``dV += Pᵀ dO`` issued before the dSᵀ barrier, FA4's order; False: after it, with dK), ``persistent``
    (default True: a CTA per SM taking items round by round; False: a CTA per item, as FA4's grid - the default at D = 256 causal, +3-7% there on
    an H200, 0-6% slower elsewhere; refused with ``deterministic``), ``queries`` (query rows a step: 64, or 128 at
    D = 64 - FA3's D = 64 tile, each consumer's dQ its own 64 queries over all 128 keys; the default at D = 64, +2-8%
    on an H200, unless ``kv_registers`` or ``dq_split`` is asked for, or ``deterministic`` with ``dq_writer``, which
    need 64), ``split_scores`` (D = 256 only, the default there: each consumer computes Sᵀ and dPᵀ of half the
    step's queries and hands its Pᵀ and dSᵀ to the other through shared memory; False: both compute all of them,
    9-22% slower on an H200 - a benchmark switch). ``launch(stream)``
    runs the three kernels in order on the stream and returns ``(dq, dk, dv)``."""

    writes = ("dq", "dk", "dv")
    subplans = ("prep", "post")  # (the row kernels' plans: re-pointed with this one)

    def __init__(self, q, k, v, o, do, lse, dq, dk, dv, *, causal=False, scale=None, layout="bhsd", stages=None,
                 dq_reduce="tma", dq_split=None, deterministic=False, pingpong=False, kv_stages=1, kv_registers=None,
                 dq_writer=None, dv_first=True, persistent=None, queries=None, split_scores=None):
        op = "AttentionBackward"
        if layout not in LAYOUTS:
            raise TensorMapError(f"{op}: layout must be 'bhsd' (batch, heads, seq, head_dim) or 'bshd' (batch, seq, "
                                 f"heads, head_dim), got {layout!r}")
        lays = {name: array_layout(x) for name, x in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do),
                                                       ("dq", dq), ("dk", dk), ("dv", dv))}
        for name, lay in lays.items():
            if len(lay.shape) != 4:
                raise TensorMapError(f"{op}: {name} is a {lay.name}; attention takes 4-D arrays ({layout}).")
            if lay.dtype.name not in DTYPES or lay.dtype != lays["q"].dtype:
                raise TensorMapError(f"{op}: {name} is a {lay.name}; q, k, v, o, do, dq, dk and dv must all be "
                                     f"bfloat16 or all float16.")
        hm = {name: _heads_major(lay, layout) for name, lay in lays.items()}
        bq, hq, sq, d = hm["q"].shape
        bk, hk, sk, dk_ = hm["k"].shape
        for name in ("o", "do", "dq"):
            if lays[name].shape != lays["q"].shape:
                raise TensorMapError(f"{op}: {name} is {lays[name].shape} but q is {lays['q'].shape}; it takes q's "
                                     f"shape.")
        for name in ("v", "dk", "dv"):
            if lays[name].shape != lays["k"].shape:
                raise TensorMapError(f"{op}: {name} is {lays[name].shape} but k is {lays['k'].shape}; it takes k's "
                                     f"shape.")
        if bk != bq or dk_ != d:
            raise TensorMapError(f"{op}: q is {lays['q'].shape} and k is {lays['k'].shape} ({layout}): the batch "
                                 f"and the head dim must agree.")
        if d not in HEAD_DIMS:
            raise TensorMapError(f"{op}: head dim {d} (q is {lays['q'].shape}); supported: "
                                 f"{', '.join(map(str, HEAD_DIMS))}.")
        if hk == 0 or hq % hk:
            raise TensorMapError(f"{op}: q has {hq} heads and k/v {hk}; the query heads must be a multiple of the "
                                 f"key/value heads (grouped-query attention).")
        if sk == 0 and sq > 0:
            raise TensorMapError(f"{op}: k and v have no keys (k is {lays['k'].shape}).")
        if sq == 0 and sk > 0 and bq * hk > 0:
            raise TensorMapError(f"{op}: q has no query rows (q is {lays['q'].shape}): dk and dv are then all 0 - "
                                 f"fill them directly (this plan writes nothing without queries).")
        for name, lay in lays.items():
            if hm[name].strides[3] != lay.dtype.itemsize:
                raise TensorMapError(f"{op}: {name} is a {lay.name}; its head dim must be contiguous.")
        for name in ("o", "do", "dq"):  # (read / written as pairs of elements, 4-byte words, by the row kernels)
            lay = hm[name]
            if not aligned(lay, 4):
                raise TensorMapError(f"{op}: {name} is a {lay.name} starting at byte {lay.ptr % 16} of a 16-byte "
                                     f"unit with byte strides {lay.strides}: its rows must start on 4-byte "
                                     f"boundaries (the row kernels move pairs of elements)")
        ll = array_layout(lse)
        if ll.shape != (bq, hq, sq) or ll.dtype != np.float32:
            raise TensorMapError(f"{op}: lse is a {ll.name}; it must be the forward's float32 log-sum-exp, shape "
                                 f"{(bq, hq, sq)} (batch, heads, query rows).")
        self.causal = bool_option(op, "causal", causal)
        scale = 1.0 / math.sqrt(d) if scale is None else scalar_option(op, "scale", scale, finite=True)
        if abs(scale) > FUSED_MAX_SCALE:
            raise TensorMapError(f"{op}: |scale| must be at most {FUSED_MAX_SCALE:g} (the backward recomputes P as "
                                 f"exp2(s · scale·log2 e - lse·log2 e), which loses precision to cancellation beyond "
                                 f"it; the forward's 'exact' mode has no backward yet), got {scale!r}")
        self.scale = scale
        self.kv_stages = int_option(op, "kv_stages", kv_stages, 1, 2)
        # D = 64: 128 queries a step by default (+2% at S = 1024, +5..8% at S >= 4096 against 64 on an H200, same
        # run, 2026-11-28), unless an option that needs 64 is asked for
        if queries is None:
            queries = 128 if (d == 64 and kv_registers is not True and dq_split is None
                              and not (deterministic is True and dq_writer is True)) else 64
        self.queries = choice_option(op, "queries", queries, (64, 128))
        if self.queries == 128 and dq_split is not None:
            raise TensorMapError(f"{op}: dq_split={dq_split!r} is not a choice with queries=128: each consumer adds "
                                 f"the dQ rows of its own 64 queries")
        if self.queries == 128 and d != 64:
            raise TensorMapError(f"{op}: queries=128 (query rows a step) needs head dim 64 (Sᵀ and dPᵀ of 64 x 128 "
                                 f"per consumer: the registers of D = 64 only), got head dim {d}")
        self.dq_reduce = choice_option(op, "dq_reduce", dq_reduce, DQ_REDUCES)
        # (D = 128 and 256: the store warp by default, +3..10% and, with dv_first, +13..21% at D = 256 against the
        # consumers' own reduce-adds; D = 64 -1..-4%: H200, same run, 2026-11-28)
        self.dq_writer = (d != 64 and self.dq_reduce == "tma" if dq_writer is None
                          else bool_option(op, "dq_writer", dq_writer))
        self.dv_first = bool_option(op, "dv_first", dv_first)
        # a CTA per item by default at D = 256 causal only (+3..7% at S >= 4096 on an H200; elsewhere the persistent
        # grid is 0..6% faster: same run, 2026-11-28)
        if persistent is None:
            persistent = not (d == 256 and self.causal and deterministic is not True)
        self.persistent = bool_option(op, "persistent", persistent)
        self.split_scores = d == 256 if split_scores is None else bool_option(op, "split_scores", split_scores)
        if self.split_scores and d != 256:
            raise TensorMapError(f"{op}: split_scores=True shares Sᵀ and dPᵀ of a step between the consumers at head "
                                 f"dim 256 (at 64 and 128 each consumer has keys of its own), got head dim {d}")
        if self.dq_writer and self.dq_reduce != "tma":
            raise TensorMapError(f"{op}: dq_writer=True hands dq's TMA reduce-adds to a store warp; "
                                 f"dq_reduce={self.dq_reduce!r} has none")
        if dq_split is not None:
            choice_option(op, "dq_split", dq_split, DQ_SPLITS)
            if d == 256 or (dq_split == "cols" and d != 128):
                raise TensorMapError(f"{op}: dq_split={dq_split!r} is not a choice at head dim {d}: 'cols' needs "
                                     f"128, 'keys' 64 or 128 (at 256 the consumers split the head dim of one "
                                     f"64-key item)")
        self.dq_split = dq_split or default_dq_split(d)
        # (dq_writer: one staging buffer per 64-wide dQ chunk a consumer makes per query block - the store warp has
        # read it by the next block; otherwise two rotating ones where they fit)
        writer_buffers = dq_chunks_per_step(d, self.dq_split, self.queries)

        def fits(n, buffers=1):
            return (shared_bytes(d, n, self.kv_stages, self.queries) + static_shared_bytes(n, buffers, self.queries)
                    <= SMEM_LIMIT)

        # default: three stages where they fit beside two staged dQ chunks per consumer (D = 64: +1.5% over two on
        # an H200), else two (D = 128: a third would cost the second dQ buffer, -28%), else one (D = 256)
        default = 3 if fits(3, writer_buffers if self.dq_writer else 2) else (2 if fits(2) else 1)
        self.stages = int_option(op, "stages", default if stages is None else stages, 1, 4)
        least = writer_buffers if self.dq_writer else 1  # (staged dQ chunks a consumer needs)
        if not fits(self.stages, least):
            need = (shared_bytes(d, self.stages, self.kv_stages, self.queries)
                    + static_shared_bytes(self.stages, least, self.queries))
            raise TensorMapError(f"{op}: stages={self.stages} and kv_stages={self.kv_stages} with head dim {d} need "
                                 f"{need} bytes of shared memory; a block may use {SMEM_LIMIT}")
        self.deterministic = bool_option(op, "deterministic", deterministic)
        self.pingpong = bool_option(op, "pingpong", pingpong)
        # D = 64: K and V in registers by default (+4..7% on an H200 against cuDNN in the same run, 2026-11-28)
        self.kv_registers = (d == 64 and self.queries == 64 if kv_registers is None
                             else bool_option(op, "kv_registers", kv_registers))
        if self.kv_registers and self.queries == 128:
            raise TensorMapError(f"{op}: kv_registers=True and queries=128 do not fit together: Sᵀ and dPᵀ of 128 "
                                 f"queries take the registers K and V would")
        if self.kv_registers and d != 64:
            raise TensorMapError(f"{op}: kv_registers=True needs head dim 64 (K and V of a consumer's keys as register "
                                 f"A fragments: {d // 2} more registers a thread at head dim {d}, which the consumers "
                                 f"do not have), got head dim {d}")
        if self.deterministic and self.queries == 128 and self.dq_writer:
            raise TensorMapError(f"{op}: deterministic=True with queries=128 orders the consumers' own reduce-adds; "
                                 f"it is not implemented with dq_writer=True")
        if self.deterministic and not self.persistent:
            raise TensorMapError(f"{op}: deterministic=True needs persistent=True (an item waits for items of higher "
                                 f"key blocks, which a persistent CTA has taken earlier; a grid of one CTA an item "
                                 f"would rely on the hardware starting CTAs in order)")
        if self.deterministic and self.dq_reduce != "tma":
            raise TensorMapError(f"{op}: deterministic=True orders dq's TMA reduce-adds; it cannot order "
                                 f"dq_reduce={self.dq_reduce!r}")
        self.shape = (bq, hq, hk, sq, sk, d)
        self.layout = layout
        self.dtype = lays["q"].dtype
        self.dq, self.dk, self.dv = dq, dk, dv
        kind = "bf16" if self.dtype.name == "bfloat16" else "f16"
        self.kernel = None
        if bq * hq * sq == 0 or bq * hk * sk == 0:
            return
        q_box = kv_box = (1, 1, BQ, CHUNK)
        self.q_map = TensorMap(layout_view(hm["q"], q), q_box, swizzle=Swizzle.B128)
        self.do_map = TensorMap(layout_view(hm["do"], do), q_box, swizzle=Swizzle.B128)
        self.k_map = TensorMap(layout_view(hm["k"], k), kv_box, swizzle=Swizzle.B128)
        self.v_map = TensorMap(layout_view(hm["v"], v), kv_box, swizzle=Swizzle.B128)
        self.lse = lse
        self.dk_view = kernel_view(hm["dk"], dk)
        self.dv_view = kernel_view(hm["dv"], dv)
        padded = ceil_div(sq, self.queries) * self.queries  # (the statistics: whole steps of query rows)
        if padded > MAX_QUERY_ROWS:
            raise TensorMapError(f"{op}: q has {sq} query rows (q is {lays['q'].shape}); the row kernels take at most "
                                 f"{MAX_QUERY_ROWS} (a grid dimension of 32-row blocks)")
        # Work arrays, made again for every call of a cached plan (Plan.owned_output: the function form's plan cache
        # gives each call fresh ones, so that calls on different streams never share one; the row statistics
        # kernel initializes all three every launch)
        make = _scratch_maker(q)
        self.stats = self.owned_output(lambda: make((bq, hq, 2, padded)))  # lse · log2 e and delta per row, padded
        self.dqacc = self.owned_output(lambda: make((bq, hq, sq, d)))
        self.turns = self.owned_output(lambda: make((bq, hq, padded // BQ), np.int32))  # (deterministic: dQ's adds
        # per query block)
        self.stats_map = TensorMap(self.stats, (1, 1, 2, self.queries))
        self.dq_map = TensorMap(self.dqacc, (1, 1, BQ, 32), swizzle=Swizzle.B128)  # (reduce-adds of dQ tiles)
        # (the layout of split_scores' 64 x 32 Pᵀ and dSᵀ halves in shared memory: only its type is used)
        self.half_map = TensorMap(layout_view(hm["q"], q), (1, 1, BQ, CHUNK // 2), swizzle=Swizzle.B64)
        # (views, not the arrays: a torch tensor handed to the launch itself goes through DLPack, which synchronizes
        # with torch's stream - refused while a CUDA graph is being captured; and a re-point re-makes views)
        stats_view, dqacc_view, turns_view = (kernel_view(array_layout(x), x)
                                              for x in (self.stats, self.dqacc, self.turns))
        # (the row kernels move 8-byte words where every row allows it, else 4-byte ones)
        acc2 = kernel_view(word_layout(array_layout(self.dqacc), True), self.dqacc)  # (pairs of float32)
        wide_in = aligned(hm["o"], 8) and aligned(hm["do"], 8)
        wide_out = aligned(hm["dq"], 8)
        self.prep = Prep(kernel_view(word_layout(hm["o"], wide_in), o), kernel_view(word_layout(hm["do"], wide_in), do),
                          kernel_view(ll, lse), stats_view, acc2, turns_view, kind, wide_in, hq, sq, bq * hq, padded, d)
        self.post = Post(acc2, kernel_view(word_layout(hm["dq"], wide_out), dq), kind, wide_out, hq, sq,
                          np.float32(scale), bq * hq * sq * d // (4 if wide_out else 2))
        self.items = bq * hk * ceil_div(sk, keys_per_item(d))
        self.block = 3 * WARPGROUP
        self.shared_mem = shared_bytes(d, self.stages, self.kv_stages, self.queries)
        self._grid = None
        self._args = (self.q_map, self.k_map, self.v_map, self.do_map, self.stats_map, self.dq_map, self.half_map,
                      dqacc_view,
                      turns_view, self.dk_view, self.dv_view, bq, hk, hq // hk, sq, sk,
                      np.float32(scale * 1.4426950408889634),
                      np.float32(scale))
        self.dq_buffers = (writer_buffers if self.dq_writer else  # (staged dQ chunks per consumer)
                           2 if fits(self.stages, 2) else 1)
        self.kernel = _backward_kernel(self.q_map.numba_type.dtype, d, self.causal, kind, self.stages,
                                       self.dq_reduce, self.dq_buffers, self.dq_split, self.deterministic,
                                       self.pingpong, self.kv_stages, self.kv_registers, self.dq_writer,
                                       self.dv_first, self.queries, self.split_scores)

    args = property(lambda self: self._args)

    @property
    def grid(self):
        """CTAs: one per SM (persistent; the SMs counted on first use), never more than there are items - or, with
        ``persistent=False``, one per item (the hardware hands the next item to the SM that frees up first)."""
        if self._grid is None:
            # (the simulator runs blocks one after another: a deterministic plan's block would wait forever for
            # a later one's turn - one block there, which takes every item in order)
            self._grid = (1 if SIMULATING and self.deterministic else
                          persistent_grid(self.items) if self.persistent else self.items)
        return self._grid

    @property
    def output(self):
        return self.dq, self.dk, self.dv

    def launch(self, stream=None):
        """The three kernels in order on ``stream``; returns ``(dq, dk, dv)``."""
        if self.kernel is not None:
            handle = self.stream_for(stream)  # (torch's current stream for torch tensors: all three on it)
            self.prep.launch(handle)
            super().launch(handle)
            self.post.launch(handle)
        return self.output

    def __repr__(self):
        b, hq, hk, sq, sk, d = self.shape
        return (f"AttentionBackward(batch {b}, heads {hq}/{hk}, seq {sq}x{sk}, head dim {d}, {self.dtype.name}, "
                f"{self.layout}, causal={self.causal}, stages={self.stages})")


def attention_backward(q, k, v, o, do, lse, dq, dk, dv, **options):
    """``dq, dk, dv`` with :class:`AttentionBackward` (options as there, plus ``stream``)."""
    return run(AttentionBackward, q, k, v, o, do, lse, dq, dk, dv, **options)
