"""Row reductions over the last axis with TMA: :class:`RowSum` (``out[i] = sum(x[i, :])``) and
:class:`Softmax` (``out[i, :] = softmax(x[i, :])``, numerically stable).

Arrays: any CUDA arrays (numba, CuPy, PyTorch) of float32, float16 or bfloat16 (16-bit types are read,
accumulated and exponentiated in float32). ``x`` has shape ``(..., n)``: leading dimensions are folded
into rows when their strides allow it (C-contiguous over the leading dimensions; the row pitch may be
padded). Rows must start on 16-byte boundaries (TMA's rule): for a contiguous array, ``n`` a multiple of
4 (float32) or 8 (16-bit types).

Design (both kernels): a persistent grid (CTA ``b`` takes row blocks ``b, b + grid, ...``), one producer
warp whose lane 0 TMA-loads stages into a ring of ``stages`` dynamic shared-memory buffers
(:class:`numbatma.intrinsics.Pipeline`), and ``warps`` consumer warps. A row is read by a group of
``threads_per_row`` consumer threads (a power of two; <= 32: shuffles only; more: shuffles, then a
shared-memory exchange behind a named barrier per group). A stage holds ``(box_rows, box_cols)`` TMA boxes:
``box_cols <= 256`` elements cover a row with ``ceil(n / 256)`` boxes of equal width (rounded up to 16
bytes); each box slot is padded to 128 bytes in shared memory.

RowSum
  *rows* mode (a stage holds whole rows, ``rows_per_stage`` of them): each group sums its rows from
  shared memory and writes them; *chunked* mode (long rows): one warp per row, a stage holds ``warps``
  rows x ``chunk_boxes`` column boxes, each lane accumulates in a register across the chunks, one
  shuffle reduction per row at the end. Reads every element once; zero-filled out-of-bounds elements add
  nothing. Results are written with ordinary stores.

Softmax
  *rows* mode (default whenever at least two stages of whole rows fit in shared memory): the stage holds
  whole rows. Register path (default when a thread owns at most 64 elements of a row under the register
  cap; ``registers=False`` turns it off): each thread loads its elements once into registers (generated,
  unrolled code, constant shared-memory offsets), then max, group max, ``exp(x - max)`` and its sum, group
  sum, and writes ``e * (1 / sum)`` back: one load, one exp, one store per element. Otherwise loops over
  shared memory: max (one pass), ``exp(x - max)`` and its sum (second pass; for float32 the exponentials
  are written back), normalisation written back into the same buffer (third pass). Consumers then ``fence.proxy.async`` and hand the stage (an mbarrier per stage) to a *storer*
  warp whose lane 0 TMA-stores it and releases the stage to the producer once the store has read it
  (``bulk_wait_group_read(store_lag)``). HBM traffic: one read and one write per element.
  *chunked* mode (rows too long for shared memory; or ``mode="chunked"``): two passes over each row block
  through the same ring: pass 1 keeps an online (max, sum) per lane, reduced per row at the end; pass 2
  re-loads the chunks, writes ``exp(x - max) / sum`` in place and TMA-stores them. HBM traffic: two
  reads and one write per element (the second read may hit L2: a row block is re-read soon after the first pass).

Limits: ``n`` is unbounded in chunked mode. Rows mode needs ``rows_per_stage * padded_row_bytes *
stages`` to fit in shared memory (227 KiB per CTA on H100/H200, shared by ``ctas_per_sm`` CTAs): about
28K float32 / 56K 16-bit elements per row with two stages; ``mode="rows"`` with longer rows raises
:class:`numbatma.TensorMapError` naming the limit. Few rows with very long rows use few CTAs (one row
block per CTA; no split of a row across CTAs).

Tuning (constructor options): ``stages``, ``warps`` (consumer warps, 1..16), ``stage_bytes`` (target
bytes per stage), ``threads_per_row``, ``rows_per_stage``, ``chunk_boxes``, ``ctas_per_sm``,
``l2_promotion``, ``fastmath``; Softmax also ``mode``, ``store_lag`` and ``registers``. ``plan.config`` shows
the chosen values. Softmax's default ``warps`` is 16 for rows mode with rows of at least 2048 elements
(box-rounded), else 8; ``threads_per_row`` then aims at 32 elements per thread. Softmax rows-mode kernels
are compiled with ``max_registers`` (``plan.max_registers``) so that ``ctas_per_sm`` CTAs fit.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, int32, int64, uint16, uint32, uint64

from numbatma import SIMULATING, TensorMap, TensorMapError, array_layout
from numbatma.tensormap import _simulator_memory
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    fence_proxy_async_shared_cta,
    named_barrier_sync,
    shared_view,
    tma_store,
)

from ._exact_store import ExactStore, tail_store_2d
from ._launch import SMEM_PER_BLOCK, SMEM_PER_SM, ceil_div, persistent_grid

__all__ = ["RowSum", "Softmax", "row_sum", "softmax"]

DTYPES = ("float32", "float16", "bfloat16")
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)
MAX_BOX = 256
LONG_ROW = 2048  # Softmax rows mode: rows of at least this many elements (box-rounded) use LONG_ROW_WARPS
LONG_ROW_WARPS = 8  # 8 consumer warps + producer + storer = 10 warps: up to 168 registers per thread


def _register_cap(warps_per_sm):
    """The most registers per thread with which ``warps_per_sm`` warps are resident on one SM. The 64K
    registers of an SM sit in 4 quadrants of 16K and warps are spread over the quadrants, so the busiest
    quadrant holds ceil(warps / 4) warps (seen on an H200: 18 warps x 112 registers did not launch,
    18 x 104 neither, 18 x 83 did). Allocation is in units of 8 registers per thread."""
    per_quadrant = -(-warps_per_sm // 4)
    return min(255, 16384 // (32 * per_quadrant) // 8 * 8)


SMEM_RESERVED_PER_CTA = 1024
BOX_ALIGN = 128  # a TMA tile in shared memory starts on a 128-byte boundary


def _round_up(a, b):
    return ceil_div(a, b) * b


def _next_pow2(v):
    return 1 << max(0, int(v) - 1).bit_length()


# -- host: views of the arrays ------------------------------------------------------------------------
class _View:
    """A strided view of device memory exposing the CUDA Array Interface (keeps ``base`` alive). bfloat16
    travels as uint16 (TMA moves bits; the kernels convert). Under the CUDA simulator it is a NumPy view
    (``_ary``) of the base array's memory."""

    def __init__(self, base, ptr, shape, strides, dtype):
        self.base = base
        if SIMULATING:
            host = _simulator_memory(base)
            item_dtype = np.dtype("<u2") if dtype.name == "bfloat16" else dtype
            self._ary = np.ndarray(shape, item_dtype, buffer=host, strides=strides,
                                   offset=ptr - int(host.__array_interface__["data"][0]))
        typestr = "<u2" if dtype.name == "bfloat16" else dtype.str
        self.__cuda_array_interface__ = {
            "data": (int(ptr), False),
            "shape": tuple(int(s) for s in shape),
            "strides": tuple(int(s) for s in strides),
            "typestr": typestr,
            "version": 3,
        }


def _fold(op, what, layout, keep_last):
    """(count, stride) of the dimensions of ``layout`` folded into one (the last one kept apart when
    ``keep_last``); raises when their strides do not allow a single stride."""
    shape, strides = layout.shape, layout.strides
    dims = list(zip(shape[:-1], strides[:-1])) if keep_last else list(zip(shape, strides))
    count = math.prod(d for d, _ in dims) if dims else 1
    big = [(d, s) for d, s in dims if d != 1]
    for (d0, s0), (d1, s1) in zip(big, big[1:]):
        if s0 != s1 * d1:
            raise TensorMapError(
                f"{op}: the {what} is a {layout.name} with byte strides {layout.strides}; its leading "
                f"dimensions cannot be folded into one row index. Make it C-contiguous (e.g. .copy())."
            )
    stride = big[-1][1] if big else None
    return count, stride


@dataclass(frozen=True)
class _Rows:
    """A (rows, n) view of an array: the TMA-describable 2-D view (the array itself or a :class:`_View`)
    and its facts."""

    view: object
    rows: int
    n: int
    dtype: np.dtype
    layout: object


def _rows_view(op, array, what="x"):
    layout = array_layout(array)
    if len(layout.shape) < 1:
        raise TensorMapError(f"{op}: the {what} is a 0-dimensional array; rows are taken along the last axis.")
    dtype = layout.dtype
    if dtype.name not in DTYPES:
        raise TensorMapError(f"{op}: the {what} is a {layout.name}; supported dtypes: {', '.join(DTYPES)}.")
    item = dtype.itemsize
    n = layout.shape[-1]
    rows, row_stride = _fold(op, what, layout, keep_last=True)
    if n > 1 and layout.strides[-1] != item:
        raise TensorMapError(
            f"{op}: the last axis of the {what} ({layout.name}) has a stride of {layout.strides[-1]} bytes; "
            f"it must be contiguous ({item} bytes)."
        )
    if row_stride is None:  # a single row
        row_stride = _round_up(max(n, 1) * item, 16)
    if rows > 1 and (row_stride % 16 or row_stride < n * item):
        per16 = 16 // item
        raise TensorMapError(
            f"{op}: rows of the {what} ({layout.name}) are {row_stride} bytes apart; TMA needs rows to start "
            f"on 16-byte boundaries, i.e. the row length n={n} a multiple of {per16} for a contiguous "
            f"{dtype.name} array. Pad the rows to {_round_up(n, per16)} elements (and slice the padding off)."
        )
    if len(layout.shape) == 2 and dtype.name != "bfloat16" and rows > 1:
        view = array  # already (rows, n): describe it directly
    else:
        view = _View(array, layout.ptr, (rows, n), (row_stride, item), dtype)
    return _Rows(view, rows, n, dtype, layout)


def _box_cols(n, item):
    """Column boxes covering a row: (box_cols, count) with box_cols <= 256 a multiple of 16 bytes."""
    per16 = 16 // item
    count = ceil_div(n, MAX_BOX)
    return min(MAX_BOX, _round_up(ceil_div(n, count), per16)), count


def _slot(box_r, box_c, item):
    """Elements between consecutive box slots in shared memory (a box padded to 128 bytes)."""
    return _round_up(box_r * box_c * item, BOX_ALIGN) // item


def _smem_budget(op, ctas_per_sm, static_bytes):
    """Dynamic shared memory bytes a CTA may ask for. The dynamic buffer is 1024-byte aligned and follows
    the static variables (barriers, scratch) and a reserved 1 KiB: ptxas reports 2048 bytes of static
    shared memory for 192 bytes of static variables, so the static part is rounded up accordingly."""
    if not 1 <= ctas_per_sm <= 32:
        raise TensorMapError(f"{op}: ctas_per_sm must be in 1..32, got {ctas_per_sm}")
    per_cta = min(SMEM_PER_BLOCK, SMEM_PER_SM // ctas_per_sm - SMEM_RESERVED_PER_CTA)
    return per_cta - _round_up(static_bytes + 1024, 1024)


def _check_common(op, stages, warps, stage_bytes):
    if not 1 <= stages <= 32:
        raise TensorMapError(f"{op}: stages must be in 1..32, got {stages}")
    if not 1 <= warps <= 16:
        raise TensorMapError(f"{op}: warps (consumer warps) must be in 1..16, got {warps}")
    if stage_bytes < 1024:
        raise TensorMapError(f"{op}: stage_bytes must be at least 1024, got {stage_bytes}")


def _check_tpr(op, tpr, consumers):
    if tpr < 1 or tpr & (tpr - 1) or tpr > consumers or (tpr > 32 and tpr % 32):
        raise TensorMapError(
            f"{op}: threads_per_row must be a power of two in 1..{consumers} (the consumer threads), got {tpr}"
        )


@dataclass(frozen=True)
class RowsConfig:
    """What a plan chose. ``rows_per_stage`` = ``box_rows * row_boxes``; a stage holds
    ``row_boxes x col_boxes`` TMA boxes of ``(box_rows, box_cols)``."""

    mode: str  # "rows" or "chunked"
    warps: int
    stages: int
    threads_per_row: int
    rows_per_stage: int
    box_rows: int
    box_cols: int
    row_boxes: int
    col_boxes: int  # boxes per stage along a row (all of them in rows mode)
    total_col_boxes: int  # boxes covering a row
    slot: int  # elements between box slots
    smem_bytes: int  # dynamic shared memory per CTA
    row_blocks: int
    ctas_per_sm: int
    store_lag: int | None = None  # Softmax only

    @property
    def stage_elems(self):
        return self.row_boxes * self.col_boxes * self.slot


def _plan_rows(rows, n, item, *, warps, tpr, stage_bytes, rows_per_stage, budget, stages, op):
    """Rows mode: whole rows per stage, at least one row per thread group (``consumers / tpr`` rows) and
    about ``stage_bytes`` in all. ``stages`` in the result is how many such stages fit (0: none)."""
    consumers = 32 * warps
    box_c, kc = _box_cols(n, item)
    rf = consumers // tpr  # rows handled at once (one per group)
    slot_row_bytes = lambda br: kc * _slot(br, box_c, item) * item  # noqa: E731 - bytes of br rows
    if rows_per_stage is None:
        per_row = kc * box_c * item
        want = max(rf, stage_bytes // per_row)
        want = min(want, _round_up(rows, rf))  # no point loading many out-of-range rows
        br = max(rf, want // rf * rf)
    else:
        br = rows_per_stage
        if br % rf:
            raise TensorMapError(
                f"{op}: rows_per_stage={br} must be a multiple of {rf} (consumer threads / threads_per_row)"
            )
    if br > MAX_BOX:
        br = br // MAX_BOX * MAX_BOX
        box_r, kr = MAX_BOX, br // MAX_BOX
    else:
        box_r, kr = br, 1
    stage = kr * slot_row_bytes(box_r)
    fit = budget // stage
    return dict(threads_per_row=tpr, rows_per_stage=br, box_rows=box_r, row_boxes=kr, box_cols=box_c,
                col_boxes=kc, total_col_boxes=kc, slot=_slot(box_r, box_c, item),
                stages=min(stages, fit), stage_bytes=stage)


def _plan_chunked(n, item, *, warps, tpr, stage_bytes, chunk_boxes, budget, stages, op):
    consumers = 32 * warps
    box_c, kc = _box_cols(n, item)
    br = consumers // tpr  # one row per group
    slot = _slot(br, box_c, item)
    if chunk_boxes is None:
        kcs = max(1, min(kc, stage_bytes // (slot * item)))
        while kcs > 1 and kcs * slot * item * min(stages, 2) > budget:  # keep two stages when possible
            kcs //= 2
    else:
        kcs = chunk_boxes
        if kcs < 1:
            raise TensorMapError(f"{op}: chunk_boxes must be positive, got {kcs}")
    kcs = min(kcs, kc)
    stage = kcs * slot * item
    return dict(threads_per_row=tpr, rows_per_stage=br, box_rows=br, row_boxes=1, box_cols=box_c,
                col_boxes=kcs, total_col_boxes=kc, slot=slot, stages=min(stages, budget // stage),
                stage_bytes=stage)


# -- device: conversions and reductions ---------------------------------------------------------------
def _dev(fn):
    return cuda.jit(device=True, inline="always")(fn)


# Shared-memory element access with a non-negative index: an unsigned index spares Numba's wraparound
# code for negative indices (a compare, a select and 64-bit adds per access).
_ld = _dev(lambda buf, i: buf[uint64(i)])


@_dev
def _st(buf, i, v):
    buf[uint64(i)] = v


@functools.lru_cache(maxsize=None)
def _converters(dtype_name):
    """(to_f32, from_f32) for the element type as seen in shared memory."""
    if dtype_name == "float32":
        return _dev(lambda v: v), _dev(lambda v: v)
    if dtype_name == "float16":
        from numba.cuda.types import float16

        return _dev(lambda v: float32(v)), _dev(lambda v: float16(v))
    from numba.cuda import libdevice

    def bf16_to_f32(b):
        return libdevice.int_as_float(int32(int64(b) << 16))

    def f32_to_bf16(f):
        u = int64(libdevice.float_as_int(f)) & 0xFFFFFFFF
        if (u & 0x7FFFFFFF) > 0x7F800000:  # NaN: keep it a (quiet) NaN
            return uint16((u >> 16) | 0x40)
        return uint16(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)  # round to nearest even

    return _dev(bf16_to_f32), _dev(f32_to_bf16)


def _xor_level(inner, off, is_max):
    """``inner`` followed by one butterfly level: combine with the lane ``off`` away (xor)."""
    if is_max:

        def level(v):
            v = inner(v)
            return max(v, cuda.shfl_xor_sync(FULL_MASK, v, off))

    else:

        def level(v):
            v = inner(v)
            return v + cuda.shfl_xor_sync(FULL_MASK, v, off)

    return _dev(level)


@functools.lru_cache(maxsize=None)
def _shuffle_reducers(width):
    """(sum, max) over aligned groups of ``width`` lanes (a power of two <= 32), one shuffle per level,
    unrolled at definition time. Every lane of the warp must call them (full mask)."""
    red_sum = red_max = _dev(lambda v: v)
    off = 1
    while off < width:
        red_sum = _xor_level(red_sum, off, False)
        red_max = _xor_level(red_max, off, True)
        off *= 2
    return red_sum, red_max


@functools.lru_cache(maxsize=None)
def _group_reducers(tpr, warps):
    """(group_sum, group_max)(v, scratch, warp, lane, grp) over the ``tpr`` threads of a row group.
    Groups wider than a warp exchange warp results through ``scratch`` (2 * warps float32: max slots
    first, then sum slots) behind named barrier ``1 + grp``; alternating max/sum (softmax) keeps the
    slots from being overwritten before they are read."""
    warp_sum, warp_max = _shuffle_reducers(min(tpr, 32))
    if tpr <= 32:

        def group_sum(v, scratch, warp, lane, grp):
            return warp_sum(v)

        def group_max(v, scratch, warp, lane, grp):
            return warp_max(v)

        return _dev(group_sum), _dev(group_max)
    wpg = tpr // 32

    def group_sum(v, scratch, warp, lane, grp):
        v = warp_sum(v)
        if lane == 0:
            scratch[warps + warp] = v
        named_barrier_sync(1 + grp, tpr)
        first = warps + grp * wpg
        v = scratch[first]
        for k in range(1, wpg):
            v += scratch[first + k]
        return v

    def group_max(v, scratch, warp, lane, grp):
        v = warp_max(v)
        if lane == 0:
            scratch[warp] = v
        named_barrier_sync(1 + grp, tpr)
        first = grp * wpg
        v = scratch[first]
        for k in range(1, wpg):
            v = max(v, scratch[first + k])
        return v

    return _dev(group_sum), _dev(group_max)


# -- RowSum kernel --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _row_sum_kernel(dtype_name, nb_dtype, warps, stages, tpr, box_r, box_c, kr, kcs, slot, chunked, fastmath):
    to_f32, from_f32 = _converters(dtype_name)
    warp_sum, _ = _shuffle_reducers(tpr)
    rf = 32 * warps // tpr
    br = kr * box_r
    stage_elems = kr * kcs * slot
    full = box_c // tpr
    rem = box_c - full * tpr

    @cuda.jit(fastmath=fastmath)
    def row_sum_kernel(x, out, rows, nblocks, kc_total):
        dyn = cuda.shared.array(0, nb_dtype, alignment=1024)
        pipe = Pipeline(stages, 1, warps)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        first = cuda.blockIdx.x
        step = cuda.gridDim.x
        mine = (nblocks - first + step - 1) // step
        nchunks = (kc_total + kcs - 1) // kcs
        if warp == warps:
            # producer: lane 0 loads the boxes of every (row block, chunk) into the ring
            if lane == 0:
                for i in range(mine):
                    r0 = (first + i * step) * br
                    nbr = min(kr, (rows - r0 + box_r - 1) // box_r)
                    for ch in range(nchunks):
                        c0 = ch * kcs
                        nb = min(kcs, kc_total - c0)
                        s = pipe.producer_acquire()
                        base = s * stage_elems
                        for a in range(nbr):
                            for b in range(nb):
                                pipe.load(shared_view(dyn, base + (a * kcs + b) * slot, (box_r, box_c)), x,
                                          (r0 + a * box_r, (c0 + b) * box_c))
                        pipe.producer_commit()
        else:
            grp = tid // tpr
            sub = tid % tpr
            for i in range(mine):
                r0 = (first + i * step) * br
                acc = float32(0)
                for ch in range(nchunks):
                    nb = min(kcs, kc_total - ch * kcs)
                    s = pipe.consumer_wait()
                    base = s * stage_elems
                    for r in range(grp, br, rf):
                        rb = r // box_r
                        p0 = base + rb * kcs * slot + (r - rb * box_r) * box_c + sub
                        v = float32(0)
                        for b in range(nb):
                            p = p0 + b * slot
                            for t in range(full):
                                v += to_f32(_ld(dyn, p + t * tpr))
                            if rem:
                                if sub < rem:
                                    v += to_f32(_ld(dyn, p + full * tpr))
                        if chunked:
                            acc += v
                        else:
                            v = warp_sum(v)
                            if sub == 0 and r0 + r < rows:
                                out[r0 + r] = from_f32(v)
                    cuda.syncwarp()
                    if lane == 0:
                        pipe.consumer_release()
                if chunked:
                    acc = warp_sum(acc)
                    if lane == 0 and r0 + warp < rows:
                        out[r0 + warp] = from_f32(acc)

    return row_sum_kernel


@functools.lru_cache(maxsize=None)
def _fill_zero_kernel():
    @cuda.jit
    def fill_zero(out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = 0

    return fill_zero


class RowSum:
    """A planned ``out[i] = x[i, :].sum()`` over the last axis (see the module docstring for the design).

    ``x``: CUDA array ``(..., n)`` of float32/float16/bfloat16; ``out``: same dtype, shape
    ``x.shape[:-1]`` (or ``(rows,)``). Options: ``stages`` (4), ``warps`` (8 consumer warps),
    ``stage_bytes`` (32768), ``threads_per_row`` (auto), ``rows_per_stage`` (auto, rows mode),
    ``chunk_boxes`` (auto, chunked mode), ``mode`` ("auto", "rows", "chunked"), ``ctas_per_sm`` (1),
    ``l2_promotion`` (0), ``fastmath`` (False). Accumulation is in float32.
    """

    def __init__(self, x, out, *, stages=4, warps=8, stage_bytes=32768, threads_per_row=None,
                 rows_per_stage=None, chunk_boxes=None, mode="auto", ctas_per_sm=1, l2_promotion=0,
                 fastmath=False):
        op = "RowSum"
        _check_common(op, stages, warps, stage_bytes)
        xr = _rows_view(op, x)
        lo = array_layout(out)
        if lo.dtype != xr.dtype:
            raise TensorMapError(f"{op}: out is a {lo.name} but x is a {xr.layout.name}; out must be {xr.dtype.name}.")
        lead = xr.layout.shape[:-1]
        if lo.shape != lead and lo.shape != (xr.rows,):
            raise TensorMapError(
                f"{op}: out is a {lo.name}; for x of shape {xr.layout.shape} it must have shape {lead} "
                f"(or ({xr.rows},))."
            )
        _, ostride = _fold(op, "out", lo, keep_last=False)
        ostride = ostride or xr.dtype.itemsize
        if len(lo.shape) == 1 and xr.dtype.name != "bfloat16":
            self.out_view = out
        else:
            self.out_view = _View(out, lo.ptr, (xr.rows,), (ostride,), xr.dtype)
        self._out_stride = ostride
        self.x, self.out = x, out
        self.rows, self.n, self.dtype = xr.rows, xr.n, xr.dtype
        self.nbytes = xr.rows * xr.n * xr.dtype.itemsize
        self._grid = None
        self._out_dev = None
        self.config = None
        if xr.rows == 0 or xr.n == 0:
            self.kernel = None
            return
        item = xr.dtype.itemsize
        consumers = 32 * warps
        box_c, kc = _box_cols(xr.n, item)
        budget = _smem_budget(op, ctas_per_sm, 2 * stages * 8)
        if mode not in ("auto", "rows", "chunked"):
            raise TensorMapError(f"{op}: mode must be 'auto', 'rows' or 'chunked', got {mode!r}")
        if threads_per_row is None:
            tpr = min(32, _next_pow2(box_c)) if kc == 1 else 32
        else:
            tpr = threads_per_row
        _check_tpr(op, tpr, consumers)
        if tpr > 32:
            raise TensorMapError(f"{op}: threads_per_row must be at most 32 for RowSum, got {tpr}")
        rows_plan = _plan_rows(xr.rows, xr.n, item, warps=warps, tpr=tpr, stage_bytes=stage_bytes,
                               rows_per_stage=rows_per_stage, budget=budget, stages=stages, op=op)
        use_rows = mode == "rows" or (
            mode == "auto" and rows_plan["stages"] >= min(2, stages)
            and rows_plan["rows_per_stage"] * kc * box_c * item <= 2 * stage_bytes
        )
        if use_rows:
            plan = rows_plan
            if plan["stages"] < 1:
                raise TensorMapError(
                    f"{op}: a stage of {plan['rows_per_stage']} rows of {xr.n} elements needs "
                    f"{plan['stage_bytes']} bytes of shared memory; at most {budget} are available per CTA. "
                    f"Use mode='chunked' or fewer rows_per_stage."
                )
        else:  # one warp per row
            plan = _plan_chunked(xr.n, item, warps=warps, tpr=32, stage_bytes=stage_bytes,
                                 chunk_boxes=chunk_boxes, budget=budget, stages=stages, op=op)
            if plan["stages"] < 1:
                raise TensorMapError(
                    f"{op}: a chunk of {plan['rows_per_stage']} rows x {plan['col_boxes']} boxes of "
                    f"{plan['box_cols']} elements needs {plan['stage_bytes']} bytes of shared memory; at most "
                    f"{budget} are available per CTA. Use a smaller chunk_boxes or fewer ctas_per_sm."
                )
        chunked = not use_rows
        self.config = RowsConfig(
            mode="chunked" if chunked else "rows", warps=warps, stages=plan["stages"],
            threads_per_row=plan["threads_per_row"], rows_per_stage=plan["rows_per_stage"],
            box_rows=plan["box_rows"], box_cols=plan["box_cols"], row_boxes=plan["row_boxes"],
            col_boxes=plan["col_boxes"], total_col_boxes=plan["total_col_boxes"], slot=plan["slot"],
            smem_bytes=plan["stages"] * plan["stage_bytes"], row_blocks=ceil_div(xr.rows, plan["rows_per_stage"]),
            ctas_per_sm=ctas_per_sm,
        )
        c = self.config
        self.x_map = TensorMap(xr.view, (c.box_rows, c.box_cols), l2_promotion=l2_promotion)
        self.kernel = _row_sum_kernel(
            xr.dtype.name, self.x_map.numba_type.dtype, warps, c.stages, c.threads_per_row, c.box_rows,
            c.box_cols, c.row_boxes, c.col_boxes, c.slot, chunked, bool(fastmath),
        )
        self.threads = 32 * (warps + 1)

    def argtypes(self):
        """Kernel argument types (for offline compilation with :func:`numbatma.compile.compile_ptx`)."""
        from numba.cuda import types

        layout = "C" if self._out_stride == self.dtype.itemsize else "A"
        out_t = types.Array(self.x_map.numba_type.dtype, 1, layout)
        return (self.x_map, out_t, types.int64, types.int64, types.int64)

    def _out_arg(self):
        """``out`` as a 1-D numba device array (converted once)."""
        if self._out_dev is None:
            self._out_dev = _simulator_memory(self.out_view) if SIMULATING else cuda.as_cuda_array(self.out_view)
        return self._out_dev

    def launch(self, stream=0):
        if self.rows == 0:
            return
        out = self._out_arg()
        if self.kernel is None:  # n == 0: every sum is 0
            _fill_zero_kernel()[ceil_div(self.rows, 256), 256, stream](out)
            return
        c = self.config
        if self._grid is None:
            self._grid = persistent_grid(c.row_blocks, c.ctas_per_sm)
        self.kernel[self._grid, self.threads, stream, c.smem_bytes](
            self.x_map, out, self.rows, c.row_blocks, c.total_col_boxes
        )


def row_sum(x, out, **options):
    """``out[...] = x.sum(axis=-1)`` with :class:`RowSum`; returns ``out``."""
    stream = options.pop("stream", 0)
    RowSum(x, out, **options).launch(stream)
    return out


# -- Softmax kernels ------------------------------------------------------------------------------------
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
                    m = max(m, to_f32(_ld(buf, q + t * tpr)))
        return m

    def row_expsum(buf, p, sub, nb, left, m):
        total = float32(0)
        for b in range(nb):
            lim = min(box_c, left - b * box_c) - sub
            q = p + b * slot
            for t in range(per_box):
                if t * tpr < lim:
                    e = math.exp(to_f32(_ld(buf, q + t * tpr)) - m)
                    total += e
                    if cache_exp:
                        _st(buf, q + t * tpr, e)
        return total

    def row_normalise(buf, p, sub, nb, left, m, inv):
        for b in range(nb):
            lim = min(box_c, left - b * box_c) - sub
            q = p + b * slot
            for t in range(per_box):
                if t * tpr < lim:
                    if cache_exp:
                        _st(buf, q + t * tpr, _ld(buf, q + t * tpr) * inv)
                    else:
                        _st(buf, q + t * tpr, from_f32(math.exp(to_f32(_ld(buf, q + t * tpr)) - m) * inv))

    return _dev(row_max), _dev(row_expsum), _dev(row_normalise)


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
        load = f"to_f32(_ld(buf, p + {off}))"
        lines.append(f"    v{k} = {load} if {' and '.join(conds)} else NEG_INF" if conds else f"    v{k} = {load}")
        names.append(f"v{k}")
    lines.append(f"    m = group_max({_tree('max({}, {})', names)}, scratch, warp, lane, grp)")
    for k in range(len(elems)):
        lines.append(f"    v{k} = math.exp(v{k} - m)")
    lines.append(f"    inv = float32(1) / group_sum({_tree('({} + {})', names)}, scratch, warp, lane, grp)")
    for k, (off, col, inbox) in enumerate(elems):
        st = f"_st(buf, p + {off}, from_f32(v{k} * inv))"
        if inbox is not None:
            lines.append(f"    if {inbox} < lbox:")
            lines.append(f"        {st}")
        else:
            lines.append(f"    {st}")
    scope = dict(to_f32=to_f32, from_f32=from_f32, group_sum=group_sum, group_max=group_max, _ld=_ld, _st=_st,
                 NEG_INF=NEG_INF, math=math, float32=float32)
    exec("\n".join(lines), scope)  # noqa: S102 - source generated above from integers only
    return _dev(scope["row_softmax"])


@functools.lru_cache(maxsize=None)
def _softmax_rows_kernel(dtype_name, nb_dtype, warps, stages, tpr, box_r, box_c, kr, kc, slot, lag, fastmath,
                         exact=False, tma_part=True, has_tail=False, registers=True, max_registers=None):
    to_f32, from_f32 = _converters(dtype_name)
    group_sum, group_max = _group_reducers(tpr, warps)
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

    @cuda.jit(fastmath=fastmath, **({} if SIMULATING else {"max_registers": max_registers}))
    def softmax_rows_kernel(x, y, tail, aligned, rows, n, nblocks):
        dyn = cuda.shared.array(0, nb_dtype, alignment=1024)
        scratch = cuda.shared.array(nscratch, np.float32)
        pipe = Pipeline(stages, 1, 1)  # full: producer + TMA bytes; empty: the storer (after the store read it)
        done = Pipeline(stages, warps, 1)  # full: one arrival per consumer warp; empty: the storer
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        first = cuda.blockIdx.x
        step = cuda.gridDim.x
        mine = (nblocks - first + step - 1) // step
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
                    bulk_commit_group()
                    done.consumer_release()
                    bulk_wait_group_read(lag)
                    if i >= lag:
                        pipe.consumer_release()
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
                cuda.syncwarp()
                if lane == 0:
                    done.producer_acquire()
                    done.producer_commit()

    return softmax_rows_kernel


@functools.lru_cache(maxsize=None)
def _softmax_chunked_kernel(dtype_name, nb_dtype, warps, stages, tpr, box_c, kcs, slot, lag, fastmath,
                            tma_part=True, has_tail=False):
    to_f32, from_f32 = _converters(dtype_name)
    group_sum, group_max = _group_reducers(tpr, warps)
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
        done = Pipeline(stages, warps, 1)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        first = cuda.blockIdx.x
        step = cuda.gridDim.x
        mine = (nblocks - first + step - 1) // step
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
                    cuda.syncwarp()
                    if lane == 0:
                        done.producer_acquire()
                        done.producer_commit()

    return softmax_chunked_kernel


class Softmax:
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
        _check_common(op, stages, warps, stage_bytes)
        if mode not in ("auto", "rows", "chunked"):
            raise TensorMapError(f"{op}: mode must be 'auto', 'rows' or 'chunked', got {mode!r}")
        if not 0 <= store_lag <= 8 or store_lag >= stages:
            raise TensorMapError(f"{op}: store_lag must be in 0..min(8, stages - 1), got {store_lag}")
        xr = _rows_view(op, x)
        lo = array_layout(out)
        if lo.shape != xr.layout.shape or lo.dtype != xr.dtype:
            raise TensorMapError(
                f"{op}: out is a {lo.name} but x is a {xr.layout.name}; they must have the same shape and dtype."
            )
        orr = _rows_view(op, out, "out")
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
        box_c, kc = _box_cols(xr.n, item)
        wp = kc * box_c
        if auto_warps and wp >= LONG_ROW and mode != "chunked":
            warps = LONG_ROW_WARPS  # long rows: registers for a row share (falls back below if chunked)
        consumers = 32 * warps
        if threads_per_row is None:
            if kc == 1 and box_c <= 32:
                tpr = _next_pow2(box_c)
            elif wp <= 1024:
                tpr = 32
            else:
                tpr = min(consumers, _next_pow2(ceil_div(wp, 32)))
            tpr = min(tpr, consumers)
        else:
            tpr = threads_per_row
        _check_tpr(op, tpr, consumers)
        budget = _smem_budget(op, ctas_per_sm, 4 * stages * 8 + 8 * warps)
        rows_plan = _plan_rows(xr.rows, xr.n, item, warps=warps, tpr=tpr, stage_bytes=stage_bytes,
                               rows_per_stage=rows_per_stage, budget=budget, stages=stages, op=op)
        if mode == "rows":
            if rows_plan["stages"] < 1:
                rf = consumers // tpr
                per16 = 16 // item
                longest = budget // rf // item // per16 * per16
                raise TensorMapError(
                    f"{op}: mode='rows' keeps whole rows in shared memory; a stage of {rows_plan['rows_per_stage']} "
                    f"rows of n={xr.n} {xr.dtype.name} elements needs {rows_plan['stage_bytes']} bytes, but at most "
                    f"{budget} bytes of shared memory are available per CTA (227 KiB shared by ctas_per_sm="
                    f"{ctas_per_sm} CTAs per SM, less barriers). Rows of up to about {longest} elements fit with "
                    f"{rf} rows per stage (threads_per_row={tpr}); use mode='chunked' or mode='auto' for longer rows."
                )
            use_rows = True
        elif mode == "chunked":
            use_rows = False
        else:
            use_rows = rows_plan["stages"] >= min(2, stages)
        if not use_rows and auto_warps and warps != 8:  # chunked mode keeps its 8 warps
            warps, consumers = 8, 256
            if threads_per_row is None:
                tpr = min(tpr, consumers)
        if use_rows:
            plan = rows_plan
            lag = min(store_lag, plan["stages"] - 1)
        else:
            if tpr <= 32 and kc > 32 and threads_per_row is None:
                tpr = consumers  # long rows: every consumer thread on one row, one row per block
            plan = _plan_chunked(xr.n, item, warps=warps, tpr=tpr, stage_bytes=stage_bytes,
                                 chunk_boxes=chunk_boxes, budget=budget, stages=stages, op=op)
            if plan["stages"] < 1:
                raise TensorMapError(
                    f"{op}: a chunk of {plan['rows_per_stage']} rows x {plan['col_boxes']} boxes of "
                    f"{plan['box_cols']} elements needs {plan['stage_bytes']} bytes of shared memory; at most "
                    f"{budget} are available per CTA. Use a smaller chunk_boxes, fewer ctas_per_sm or a larger "
                    f"threads_per_row."
                )
            lag = min(store_lag, plan["stages"] - 1)
        self.config = RowsConfig(
            mode="rows" if use_rows else "chunked", warps=warps, stages=plan["stages"],
            threads_per_row=plan["threads_per_row"], rows_per_stage=plan["rows_per_stage"],
            box_rows=plan["box_rows"], box_cols=plan["box_cols"], row_boxes=plan["row_boxes"],
            col_boxes=plan["col_boxes"], total_col_boxes=plan["total_col_boxes"], slot=plan["slot"],
            smem_bytes=plan["stages"] * plan["stage_bytes"], row_blocks=ceil_div(xr.rows, plan["rows_per_stage"]),
            ctas_per_sm=ctas_per_sm, store_lag=lag,
        )
        c = self.config
        box = (c.box_rows, c.box_cols)
        self.x_map = TensorMap(xr.view, box, l2_promotion=l2_promotion)
        self.out_store = ExactStore(orr.view, box)
        self.out_map = self.out_store.map
        exact = (self.out_store.tma, self.out_store.has_tail)
        nb_dtype = self.x_map.numba_type.dtype
        self.threads = 32 * (warps + 2)
        self.fallback = None
        # registers per thread that let ctas_per_sm CTAs of self.threads threads fit; rows mode only (chunked
        # mode: None, ptxas chooses)
        self.max_registers = _register_cap(ctas_per_sm * self.threads // 32) if use_rows else None
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

    def argtypes(self):
        """Kernel argument types (for offline compilation with :func:`numbatma.compile.compile_ptx`)."""
        from numba.cuda import types

        extra = () if self.config.mode == "rows" else (types.int64,)
        return (self.x_map, self.out_map, self.out_store.tail, types.int64, types.int64, types.int64,
                types.int64) + extra

    def launch(self, stream=0):
        if self.kernel is None:
            return
        c = self.config
        if self._grid is None:
            self._grid = persistent_grid(c.row_blocks, c.ctas_per_sm)
        args = (self.x_map, self.out_map, self.out_store.launch_tail, self.out_store.aligned, self.rows, self.n,
                c.row_blocks)
        if c.mode == "chunked":
            args += (c.total_col_boxes,)
        try:
            self.kernel[self._grid, self.threads, stream, c.smem_bytes](*args)
        except Exception as exc:  # noqa: BLE001 - only the register-budget failure is handled
            if "OUT_OF_RESOURCES" not in str(exc) or c.mode != "rows" or self.fallback is not None:
                raise
            # The build used more registers than self.threads threads can have (the cap was not honoured):
            # use the shared-memory loops, which need far fewer, and say so in plan.fallback.
            regs = self.kernel.get_regs_per_thread() if len(self.kernel.overloads) == 1 else None
            self.fallback = f"register path needs {regs} registers/thread for {self.threads} threads; loops used"
            self.kernel = _softmax_rows_kernel(*self._rows_kernel_args, False, self.max_registers)
            self.kernel[self._grid, self.threads, stream, c.smem_bytes](*args)


def softmax(x, out, **options):
    """``out[...] = softmax(x, axis=-1)`` with :class:`Softmax`; returns ``out``."""
    stream = options.pop("stream", 0)
    Softmax(x, out, **options).launch(stream)
    return out
