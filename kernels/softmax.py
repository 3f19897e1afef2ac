"""Softmax over the last axis with TMA: :class:`Softmax` (``out[i, :] = softmax(x[i, :])``, numerically stable);
the design shared with :class:`numbatma.kernels.RowSum` is described in :mod:`numbatma.kernels.rows`.

*rows* mode (default whenever at least two stages of whole rows fit in shared memory): the stage holds whole
rows. Register path (default when a thread owns at most 64 elements of a row under the register cap;
``registers=False`` turns it off): each thread loads its elements once into registers (generated, unrolled
code, constant shared-memory offsets), then max, group max, ``exp(x - max)`` and its sum, group sum, and
writes ``e * (1 / sum)`` back: one load, one exp, one store per element. Otherwise loops over shared memory:
max (one pass), ``exp(x - max)`` and its sum (second pass; for float32 the exponentials are written back),
normalisation written back into the same buffer (third pass). Consumers then ``fence.proxy.async`` and hand
the stage (an mbarrier per stage) to a *storer* warp whose lane 0 TMA-stores it and releases the stage to
the producer once the store has read it (``bulk_wait_group_read(store_lag)``). HBM traffic: one read and one
write per element.

*chunked* mode (rows too long for shared memory; or ``mode="chunked"``): two passes over each row block
through the same ring: pass 1 keeps an online (max, sum) per lane, reduced per row at the end; pass 2
re-loads the chunks, writes ``exp(x - max) / sum`` in place and TMA-stores them. HBM traffic: two reads and
one write per element (the second read may hit L2: a row block is re-read soon after the first pass).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, uint32

from numbatma import SIMULATING, TensorMap, TensorMapError, array_layout
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    fence_proxy_async_shared_cta,
    persistent_share,
    shared_view,
    store_release,
    tma_store,
)

from ._compile_cache import kernel_factory
from ._device import grid_dependency_sync
from ._exact_store import ExactStore, tail_store_2d
from ._launch import ceil_div, next_pow2
from ._options import bool_option, int_option
from ._plan import run
from ._reduce import NEG_INF, converters, dev, group_reducers, ld, st
from ._rows_plan import (RowsPlan, box_cols, check_common, check_tpr, plan_chunked, plan_rows, register_cap,
                         rows_view, smem_budget)

__all__ = ["Softmax", "softmax"]

LONG_ROW = 2048  # rows mode: rows of at least this many elements (box-rounded) use LONG_ROW_WARPS
LONG_ROW_WARPS = 8  # 8 consumer warps + producer + storer = 10 warps: up to 168 registers per thread

def _row_loops(to_f32, from_f32, tpr, box_c, slot, cache_exp):
    """Device functions over the part of one row that thread ``sub`` of its group owns: ``nb`` boxes of
    ``box_c`` elements, ``slot`` apart in shared memory; ``p`` is the index of the row's first element in
    the first box plus ``sub``; ``left`` elements of the row are valid from the first box on (the rest is
    padding and is skipped)."""
    per_box = ceil_div(box_c, tpr)

    def row_max(buf, p, sub, nb, left):
        m = NEG_INF
        for b in range(nb):
            lim = min(box_c, left - b * box_c) - sub
            q = p + b * slot
            for t in range(per_box):
                if t * tpr < lim:
                    m = max(m, to_f32(ld(buf, q + t * tpr)))
        return m

    def row_expsum(buf, p, sub, nb, left, m):
        total = float32(0)
        for b in range(nb):
            lim = min(box_c, left - b * box_c) - sub
            q = p + b * slot
            for t in range(per_box):
                if t * tpr < lim:
                    e = math.exp(to_f32(ld(buf, q + t * tpr)) - m)
                    total += e
                    if cache_exp:
                        st(buf, q + t * tpr, e)
        return total

    def row_normalise(buf, p, sub, nb, left, m, inv):
        for b in range(nb):
            lim = min(box_c, left - b * box_c) - sub
            q = p + b * slot
            for t in range(per_box):
                if t * tpr < lim:
                    if cache_exp:
                        st(buf, q + t * tpr, ld(buf, q + t * tpr) * inv)
                    else:
                        st(buf, q + t * tpr, from_f32(math.exp(to_f32(ld(buf, q + t * tpr)) - m) * inv))

    return dev(row_max), dev(row_expsum), dev(row_normalise)


REG_ELEMS = 64  # most elements of a row a thread keeps in registers (rows mode's register path)


def _reg_layout(tpr, box_c, slot, kc):
    """The elements thread ``sub`` of a row group owns, for the register path: ``(grouped, elems)`` with
    ``elems`` a list of ``(offset, column, inbox)``: shared-memory offset from the thread's base index,
    row column less ``sub``, and (None when every ``sub`` stays inside the box) the column within its box
    less ``sub``. ``grouped``:
    ``tpr`` spans ``tpr // box_c`` whole boxes (the base index then includes ``sub``'s box). None when a
    thread would own more than :data:`REG_ELEMS` elements."""
    g = tpr // box_c
    if tpr > box_c and tpr % box_c == 0 and kc % g == 0:
        elems = [(t * g * slot, t * g * box_c, None) for t in range(kc // g)]
        grouped = True
    else:
        per_box = ceil_div(box_c, tpr)
        elems = [(b * slot + t * tpr, b * box_c + t * tpr, t * tpr if (t + 1) * tpr > box_c else None)
                 for b in range(kc) for t in range(per_box)]
        grouped = False
    if len(elems) > REG_ELEMS:
        return None
    return grouped, elems


def _tree(op, names):
    """Source of a balanced ``op`` tree over ``names`` (independent operations for ILP)."""
    while len(names) > 1:
        names = [op.format(a, b) for a, b in zip(names[::2], names[1::2])] + (names[-1:] if len(names) % 2 else [])
    return names[0]


def _row_softmax_regs(to_f32, from_f32, group_sum, group_max, elems, exact):
    """A device function ``(buf, p, lim, lbox, scratch, warp, lane, grp)`` computing the softmax of one row
    with the thread's elements held in registers: one load per element, max, one ``exp`` per element and
    its sum, group reductions, one store per element. ``p``: the thread's base index; an element is valid
    when its ``column < lim`` (``n - sub``; skipped when ``exact``, n filling every box) and, for elements
    that may leave their box, ``inbox < lbox`` (``box_c - sub``). Invalid elements count as -inf and partial ones
    outside their box are neither read nor written (they would belong to the next row or box). The code
    is generated unrolled (constant offsets: ``LDS [R+imm]``)."""
    lines = ["def row_softmax(buf, p, lim, lbox, scratch, warp, lane, grp):"]
    names = []
    for k, (off, col, inbox) in enumerate(elems):
        conds = [] if inbox is None else [f"{inbox} < lbox"]
        if not exact:
            conds.append(f"{col} < lim")
        load = f"to_f32(ld(buf, p + {off}))"
        lines.append(f"    v{k} = {load} if {' and '.join(conds)} else NEG_INF" if conds else f"    v{k} = {load}")
        names.append(f"v{k}")
    lines.append(f"    m = group_max({_tree('max({}, {})', names)}, scratch, warp, lane, grp)")
    for k in range(len(elems)):
        lines.append(f"    v{k} = math.exp(v{k} - m)")
    lines.append(f"    inv = float32(1) / group_sum({_tree('({} + {})', names)}, scratch, warp, lane, grp)")
    for k, (off, col, inbox) in enumerate(elems):
        store = f"st(buf, p + {off}, from_f32(v{k} * inv))"
        if inbox is not None:
            lines.append(f"    if {inbox} < lbox:")
            lines.append(f"        {store}")
        else:
            lines.append(f"    {store}")
    scope = dict(to_f32=to_f32, from_f32=from_f32, group_sum=group_sum, group_max=group_max, ld=ld, st=st,
                 NEG_INF=NEG_INF, math=math, float32=float32)
    exec("\n".join(lines), scope)  # noqa: S102 - source generated above from integers only
    return dev(scope["row_softmax"])


@kernel_factory
def _softmax_rows_kernel(dtype_name, nb_dtype, warps, stages, tpr, box_r, box_c, kr, kc, slot, lag, fastmath,
                         exact=False, tma_part=True, has_tail=False, registers=True, max_registers=None):
    to_f32, from_f32 = converters(dtype_name)
    group_sum, group_max = group_reducers(tpr, warps)
    cache = dtype_name == "float32"
    row_max, row_expsum, row_normalise = _row_loops(to_f32, from_f32, tpr, box_c, slot, cache)
    layout = _reg_layout(tpr, box_c, slot, kc) if registers else None
    if layout is not None and max_registers and len(layout[1]) * 3 // 2 + 32 > max_registers:
        layout = None  # would spill under the register cap: loop over shared memory instead
    use_regs = layout is not None
    grouped = use_regs and layout[0]
    if use_regs:
        row_softmax = _row_softmax_regs(to_f32, from_f32, group_sum, group_max, layout[1], exact)
    else:
        row_softmax = None
    rf = 32 * warps // tpr
    br = kr * box_r
    stage_elems = kr * kc * slot
    nscratch = 2 * warps
    store_tail = tail_store_2d((box_r, box_c), nb_dtype.bitwidth // 8)
    release = store_release(lag)

    @cuda.jit(fastmath=fastmath, **({} if SIMULATING else {"max_registers": max_registers}))
    def softmax_rows_kernel(x, y, tail, aligned, rows, n, nblocks):
        dyn = cuda.shared.array(0, nb_dtype, alignment=1024)
        scratch = cuda.shared.array(nscratch, np.float32)
        pipe = Pipeline(stages, 1, 1)  # full: producer + TMA bytes; empty: the storer (after the store read it)
        done = Pipeline(stages, 32 * warps, 1)  # full: one arrival per consumer thread; empty: the storer
        grid_dependency_sync()
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        first, step, mine = persistent_share(nblocks)
        if warp == warps:
            if lane == 0:  # producer
                for i in range(mine):
                    r0 = (first + i * step) * br
                    nbr = min(kr, (rows - r0 + box_r - 1) // box_r)
                    s = pipe.producer_acquire()
                    base = s * stage_elems
                    for a in range(nbr):
                        for b in range(kc):
                            pipe.load(shared_view(dyn, base + (a * kc + b) * slot, (box_r, box_c)), x,
                                      (r0 + a * box_r, b * box_c))
                    pipe.producer_commit()
        elif warp == warps + 1:
            if lane == 0:  # storer
                for i in range(mine):
                    r0 = (first + i * step) * br
                    nbr = min(kr, (rows - r0 + box_r - 1) // box_r)
                    s = done.consumer_wait()
                    base = s * stage_elems
                    for a in range(nbr):
                        for b in range(kc):
                            if tma_part and b * box_c < aligned:  # y describes columns [0, aligned): exact
                                tma_store(y, (r0 + a * box_r, b * box_c),
                                          shared_view(dyn, base + (a * kc + b) * slot, (box_r, box_c)))
                        if has_tail:  # the rows' last partial 16-byte unit (inside box aligned // box_c)
                            b = aligned // box_c
                            store_tail(shared_view(dyn, base + (a * kc + b) * slot, (box_r, box_c)), tail,
                                       r0 + a * box_r, b * box_c, aligned, 0, 1)
                    done.consumer_release()
                    release(pipe, i)  # commit; once the store lag stages back has read its stage, free it
                bulk_wait_group(0)
        else:
            grp = tid // tpr
            sub = tid % tpr
            if grouped:  # the thread's first element: box sub // box_c, column sub % box_c (box_c: a power of 2)
                poff = uint32(sub // box_c * slot + sub % box_c)
            else:
                poff = uint32(sub)
            lim = int32(n - sub)
            lbox = int32(box_c - sub)
            for i in range(mine):
                s = pipe.consumer_wait()
                base = uint32(s * stage_elems)
                for r in range(grp, br, rf):
                    if use_regs:
                        rr = uint32(r)
                        rb = rr // uint32(box_r)
                        p = base + rb * uint32(kc * slot) + (rr - rb * uint32(box_r)) * uint32(box_c) + poff
                        row_softmax(dyn, p, lim, lbox, scratch, warp, lane, grp)
                    else:
                        rb = r // box_r
                        p = base + rb * kc * slot + (r - rb * box_r) * box_c + sub
                        m = group_max(row_max(dyn, p, sub, kc, n), scratch, warp, lane, grp)
                        total = group_sum(row_expsum(dyn, p, sub, kc, n, m), scratch, warp, lane, grp)
                        row_normalise(dyn, p, sub, kc, n, m, float32(1) / total)
                fence_proxy_async_shared_cta()
                # Every consumer thread arrives (release) for its own writes; the storer's wait (acquire) then
                # covers each of them, its generic reads of the tail included. (A __syncwarp and one arrival per
                # warp is as correct by the PTX memory model, but compute-sanitizer's racecheck reports the
                # storer's reads as racing with the other lanes' writes: scripts/probe_racecheck_mbarrier.py.)
                done.producer_acquire()
                done.producer_commit()

    return softmax_rows_kernel


@kernel_factory
def _softmax_chunked_kernel(dtype_name, nb_dtype, warps, stages, tpr, box_c, kcs, slot, lag, fastmath,
                            tma_part=True, has_tail=False):
    to_f32, from_f32 = converters(dtype_name)
    group_sum, group_max = group_reducers(tpr, warps)
    row_max, row_expsum, row_normalise = _row_loops(to_f32, from_f32, tpr, box_c, slot, False)
    br = 32 * warps // tpr  # one row per group
    stage_elems = kcs * slot
    nscratch = 2 * warps
    store_tail = tail_store_2d((br, box_c), nb_dtype.bitwidth // 8)

    @cuda.jit(fastmath=fastmath)
    def softmax_chunked_kernel(x, y, tail, aligned, rows, n, nblocks, kc_total):
        dyn = cuda.shared.array(0, nb_dtype, alignment=1024)
        scratch = cuda.shared.array(nscratch, np.float32)
        pipe = Pipeline(stages, 1, 1)
        done = Pipeline(stages, 32 * warps, 1)  # as in the rows kernel: every consumer thread arrives
        grid_dependency_sync()
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        first, step, mine = persistent_share(nblocks)
        nchunks = (kc_total + kcs - 1) // kcs
        if warp == warps:
            if lane == 0:  # producer: every chunk twice (statistics pass, output pass)
                for i in range(mine):
                    r0 = (first + i * step) * br
                    for q in range(2 * nchunks):
                        c0 = (q % nchunks) * kcs
                        nb = min(kcs, kc_total - c0)
                        s = pipe.producer_acquire()
                        base = s * stage_elems
                        for b in range(nb):
                            pipe.load(shared_view(dyn, base + b * slot, (br, box_c)), x, (r0, (c0 + b) * box_c))
                        pipe.producer_commit()
        elif warp == warps + 1:
            if lane == 0:  # storer: stores the output pass, releases every stage in order
                k = 0
                for i in range(mine):
                    r0 = (first + i * step) * br
                    for q in range(2 * nchunks):
                        c0 = (q % nchunks) * kcs
                        nb = min(kcs, kc_total - c0)
                        s = done.consumer_wait()
                        if q >= nchunks:
                            base = s * stage_elems
                            for b in range(nb):
                                if tma_part and (c0 + b) * box_c < aligned:  # y: columns [0, aligned)
                                    tma_store(y, (r0, (c0 + b) * box_c),
                                              shared_view(dyn, base + b * slot, (br, box_c)))
                                if has_tail and (c0 + b) * box_c + box_c > aligned:  # the partial unit
                                    store_tail(shared_view(dyn, base + b * slot, (br, box_c)), tail, r0,
                                               (c0 + b) * box_c, aligned, 0, 1)
                            bulk_commit_group()
                        done.consumer_release()
                        bulk_wait_group_read(lag)
                        if k >= lag:
                            pipe.consumer_release()
                        k += 1
                bulk_wait_group(0)
        else:
            grp = tid // tpr
            sub = tid % tpr
            for i in range(mine):
                m = NEG_INF
                total = float32(0)
                inv = float32(0)
                for q in range(2 * nchunks):
                    ch = q % nchunks
                    c0 = ch * kcs
                    nb = min(kcs, kc_total - c0)
                    s = pipe.consumer_wait()
                    p = s * stage_elems + grp * box_c + sub
                    left = n - c0 * box_c
                    if q < nchunks:
                        cm = row_max(dyn, p, sub, nb, left)
                        if cm > m:
                            total = total * math.exp(m - cm)
                            m = cm
                        if m > NEG_INF:  # an all -inf prefix contributes nothing (and exp(nan) must not)
                            total += row_expsum(dyn, p, sub, nb, left, m)
                        if q == nchunks - 1:
                            gm = group_max(m, scratch, warp, lane, grp)
                            if m > NEG_INF:
                                total = total * math.exp(m - gm)
                            m = gm
                            inv = float32(1) / group_sum(total, scratch, warp, lane, grp)
                    else:
                        row_normalise(dyn, p, sub, nb, left, m, inv)
                        fence_proxy_async_shared_cta()
                    done.producer_acquire()  # every consumer thread arrives (see the rows kernel)
                    done.producer_commit()

    return softmax_chunked_kernel


class Softmax(RowsPlan):
    """A planned ``out = softmax(x, axis=-1)`` (numerically stable: ``exp(x - max) / sum``), see the
    module docstring for the design and limits.

    ``x``, ``out``: CUDA arrays of one shape and dtype (float32/float16/bfloat16; 16-bit types computed in
    float32). Options: ``stages`` (4), ``warps`` (auto: 8 consumer warps), ``registers`` (True: rows mode keeps a thread's elements in registers
    when they fit), ``stage_bytes`` (32768; a stage
    grows to hold at least one row group in rows mode), ``threads_per_row`` (auto), ``rows_per_stage``
    (auto), ``chunk_boxes`` (auto, chunked mode), ``mode`` ("auto", "rows", "chunked"), ``store_lag``
    (0: a stage is released once its own store has read it; k: after the store k stages later),
    ``ctas_per_sm`` (1), ``l2_promotion`` (0), ``fastmath`` (False).
    """

    def __init__(self, x, out, *, stages=4, warps=None, stage_bytes=32768, threads_per_row=None,
                 rows_per_stage=None, chunk_boxes=None, mode="auto", store_lag=0, ctas_per_sm=1,
                 l2_promotion=0, fastmath=False, registers=True):
        op = "Softmax"
        auto_warps = warps is None
        if auto_warps:
            warps = 8
        check_common(op, stages, warps, stage_bytes, ctas_per_sm, threads_per_row, rows_per_stage, chunk_boxes, mode)
        bool_option(op, "fastmath", fastmath)
        bool_option(op, "registers", registers)
        int_option(op, "store_lag", store_lag, 0, 8)
        if not 0 <= store_lag <= 8 or store_lag >= stages:
            raise TensorMapError(f"{op}: store_lag must be in 0..min(8, stages - 1), got {store_lag}")
        xr = rows_view(op, x)
        lo = array_layout(out)
        if lo.shape != xr.layout.shape or lo.dtype != xr.dtype:
            raise TensorMapError(
                f"{op}: out is a {lo.name} but x is a {xr.layout.name}; they must have the same shape and dtype."
            )
        orr = rows_view(op, out, "out")
        self.x, self.out = x, out
        self.rows, self.n, self.dtype = xr.rows, xr.n, xr.dtype
        self._grid = None
        self.config = None
        self.kernel = None
        self.max_registers = None
        if xr.rows == 0 or xr.n == 0:
            self.nbytes = 0
            return
        item = xr.dtype.itemsize
        box_c, kc = box_cols(xr.n, item)
        wp = kc * box_c
        if auto_warps and wp >= LONG_ROW and mode != "chunked":
            warps = LONG_ROW_WARPS  # long rows: registers for a row share (falls back below if chunked)
        consumers = 32 * warps
        if threads_per_row is None:
            if kc == 1 and box_c <= 32:
                tpr = next_pow2(box_c)
            elif wp <= 1024:
                tpr = 32
            else:
                tpr = min(consumers, next_pow2(ceil_div(wp, 32)))
            tpr = min(tpr, consumers)
        else:
            tpr = threads_per_row
        check_tpr(op, tpr, consumers)
        budget = smem_budget(op, ctas_per_sm, 4 * stages * 8 + 8 * warps)
        rows_plan = plan_rows(xr.rows, xr.n, item, warps=warps, tpr=tpr, stage_bytes=stage_bytes,
                              rows_per_stage=rows_per_stage, budget=budget, stages=stages, op=op)
        if mode == "rows":
            if rows_plan.stages < 1:
                rf = consumers // tpr
                per16 = 16 // item
                longest = budget // rf // item // per16 * per16
                raise TensorMapError(
                    f"{op}: mode='rows' keeps whole rows in shared memory; a stage of {rows_plan.rows_per_stage} "
                    f"rows of n={xr.n} {xr.dtype.name} elements needs {rows_plan.stage_bytes} bytes, but at most "
                    f"{budget} bytes of shared memory are available per CTA (227 KiB shared by ctas_per_sm="
                    f"{ctas_per_sm} CTAs per SM, less barriers). Rows of up to about {longest} elements fit with "
                    f"{rf} rows per stage (threads_per_row={tpr}); use mode='chunked' or mode='auto' for longer rows."
                )
            use_rows = True
        elif mode == "chunked":
            use_rows = False
        else:
            use_rows = rows_plan.stages >= min(2, stages)
        if not use_rows and auto_warps and warps != 8:  # chunked mode keeps its 8 warps
            warps, consumers = 8, 256
            if threads_per_row is None:
                tpr = min(tpr, consumers)
        if use_rows:
            plan = rows_plan
            lag = min(store_lag, plan.stages - 1)
        else:
            if tpr <= 32 and kc > 32 and threads_per_row is None:
                tpr = consumers  # long rows: every consumer thread on one row, one row per block
            plan = plan_chunked(xr.n, item, warps=warps, tpr=tpr, stage_bytes=stage_bytes,
                                chunk_boxes=chunk_boxes, budget=budget, stages=stages, op=op)
            if plan.stages < 1:
                raise TensorMapError(
                    f"{op}: a chunk of {plan.rows_per_stage} rows x {plan.col_boxes} boxes of "
                    f"{plan.box_cols} elements needs {plan.stage_bytes} bytes of shared memory; at most "
                    f"{budget} are available per CTA. Use a smaller chunk_boxes, fewer ctas_per_sm or a larger "
                    f"threads_per_row."
                )
            lag = min(store_lag, plan.stages - 1)
        self.config = plan.config("rows" if use_rows else "chunked", warps, xr.rows, ctas_per_sm, lag)
        c = self.config
        box = (c.box_rows, c.box_cols)
        self.x_map = TensorMap(xr.view, box, l2_promotion=l2_promotion)
        self.out_store = ExactStore(orr.view, box)
        self.out_map = self.out_store.map
        exact = (self.out_store.tma, self.out_store.has_tail)
        nb_dtype = self.x_map.numba_type.dtype
        self.block = 32 * (warps + 2)
        self.fallback = None
        # registers per thread that let ctas_per_sm CTAs of self.block threads fit; rows mode only (chunked
        # mode: None, ptxas chooses)
        self.max_registers = register_cap(ctas_per_sm * self.block // 32) if use_rows else None
        if use_rows:
            self._rows_kernel_args = (
                xr.dtype.name, nb_dtype, warps, c.stages, c.threads_per_row, c.box_rows, c.box_cols,
                c.row_boxes, c.col_boxes, c.slot, lag, bool(fastmath), xr.n == c.col_boxes * c.box_cols, *exact,
            )
            self.kernel = _softmax_rows_kernel(*self._rows_kernel_args, bool(registers), self.max_registers)
            self.nbytes = 2 * xr.rows * xr.n * item
        else:
            self.kernel = _softmax_chunked_kernel(
                xr.dtype.name, nb_dtype, warps, c.stages, c.threads_per_row, c.box_cols, c.col_boxes, c.slot,
                lag, bool(fastmath), *exact,
            )
            self.nbytes = 3 * xr.rows * xr.n * item  # x read twice

    writes = ("out",)
    #: ``softmax(x, x)``: a row is handled by one CTA, which loads each part of it before storing the same part
    #: (chunked mode: both passes' loads of a chunk precede its store), so in place is allowed.
    may_alias = (("out", "x"),)

    @property
    def args(self):
        """The kernel's arguments: ``(x_map, out_map, out tail, aligned, rows, n, row_blocks)`` and, in chunked
        mode, the column boxes of a row."""
        c = self.config
        args = (self.x_map, self.out_map, self.out_store.tail, self.out_store.aligned, self.rows, self.n,
                c.row_blocks)
        return args + ((c.total_col_boxes,) if c.mode == "chunked" else ())

    @property
    def output(self):
        return self.out

    def argtypes(self):
        """Kernel argument types (for offline compilation with :func:`numbatma.compile.compile_ptx`)."""
        from numba.cuda import types

        extra = () if self.config.mode == "rows" else (types.int64,)
        return (self.x_map, self.out_map, self.out_store.tail, types.int64, types.int64, types.int64,
                types.int64) + extra

    def launch(self, stream=None):
        """Launch on ``stream`` (asynchronously) and return ``out``. Should the rows-mode register path need
        more registers than ``block`` threads can have, the plan switches to the shared-memory loops (once;
        ``plan.fallback`` says so)."""
        try:
            return super().launch(stream)
        except Exception as exc:  # noqa: BLE001 - only the register-budget failure is handled
            if "OUT_OF_RESOURCES" not in str(exc) or self.config.mode != "rows" or self.fallback is not None:
                raise
            # The build used more registers than self.block threads can have (the cap was not honoured):
            # use the shared-memory loops, which need far fewer, and say so in plan.fallback.
            regs = self.kernel.get_regs_per_thread() if len(self.kernel.overloads) == 1 else None
            self._update(fallback=f"register path needs {regs} registers/thread for {self.block} threads; loops used",
                         kernel=_softmax_rows_kernel(*self._rows_kernel_args, False, self.max_registers))
            return super().launch(stream)


def softmax(x, out, **options):
    """``out[...] = softmax(x, axis=-1)`` with :class:`Softmax` (options as there, plus ``stream``); returns ``out``."""
    return run(Softmax, x, out, **options)
