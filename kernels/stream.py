"""Streaming kernels: a pipelined, persistent TMA copy and a warp-specialized ``out = a*x + y``.

Both view their arrays as 2-D ``(rows, cols)`` (leading dimensions of a C-contiguous array folded into
rows; 1-D arrays folded into rows of up to 4096 elements when the length allows) and walk tiles of
``(tile_rows, tile_cols)`` with a persistent grid. Tiles live in a ring of ``stages`` shared-memory stages
managed by :class:`numbatma.intrinsics.Pipeline`.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from numbatma import TensorMap, TensorMapError, array_layout
from numbatma.intrinsics import (
    Pipeline,
    bulk_wait_group,
    elect_one_sync,
    fence_proxy_async_shared_cta,
    l2_policy_evict_first,
    named_barrier_sync,
    persistent_share,
    shared_view,
    store_release,
    tma_store,
    tma_store_hinted,
)

from ._compile_cache import kernel_factory
from ._device import grid_dependency_sync
from ._exact_store import ExactStore, tail_store_2d
from ._launch import MAX_BOX, SMEM_PER_BLOCK, ceil_div, persistent_grid, same_layout, slot_elems
from ._options import bool_option, int_option, scalar_option
from ._plan import Plan, run

__all__ = ["StreamCopy", "stream_copy", "Axpy", "axpy"]

SMEM_LIMIT = SMEM_PER_BLOCK - 1024  # less the pipeline's static barriers


# -- host side: 2-D views and tiles ---------------------------------------------------------------------
def _contiguous(layout):
    shape, item = layout.shape, layout.dtype.itemsize
    return all(layout.strides[i] == item * math.prod(shape[i + 1:]) for i in range(len(shape)) if shape[i] > 1)


def _views(op, *arrays):
    """2-D views ``(rows, cols)`` of same-shape arrays, and the layout of the first.

    2-D arrays are used as they are (any row stride TMA accepts). Other ranks must be C-contiguous: leading
    dimensions fold into rows; a 1-D array becomes rows of up to 4096 elements when its length allows.
    (Viewing contiguous 2-D data as 1 KiB rows, so that each tile is one contiguous block, measured ~3%
    slower on an H200 than tiles spanning 32 rows of a 64 KiB-row matrix; see benchmarks/RESULTS.md.)"""
    layouts = [array_layout(a) for a in arrays]
    shape = layouts[0].shape
    if len(shape) == 2:
        return list(arrays), layouts[0]
    bad = next((lay for lay in layouts if not _contiguous(lay)), None)
    if bad is not None:
        raise TensorMapError(
            f"{op}: the {bad.name} has strides {bad.strides} bytes; arrays of rank other than 2 must be "
            f"C-contiguous (a 2-D array may have any row stride that TMA accepts)."
        )
    n = math.prod(shape)
    if len(shape) == 1:
        cols = next((w for w in (4096, 2048, 1024, 512, 256) if n % w == 0), n)
    else:
        cols = shape[-1]
    views = [a.reshape((n // cols, cols)) for a in arrays]
    return views, array_layout(views[0])


def _stream_options(op, stages, tile_bytes, ctas_per_sm):
    """The common options of StreamCopy and Axpy, checked (:mod:`._options`)."""
    return (int_option(op, "stages", stages, 1, 32), int_option(op, "tile_bytes", tile_bytes, 16, SMEM_PER_BLOCK),
            int_option(op, "ctas_per_sm", ctas_per_sm, 1, 32))


def _tile(layout, tile_bytes, tiles_per_ring=1, max_cols=MAX_BOX):
    """(tile_rows, tile_cols): a row of at most 256 elements (a multiple of 16 bytes), rows to fill
    ``tile_bytes``, fewer when ``tiles_per_ring`` such tiles would not fit in shared memory."""
    rows, cols = layout.shape
    item = layout.dtype.itemsize
    per16 = max(1, 16 // item)
    tc = min(max_cols, ceil_div(cols, per16) * per16)
    tr = max(1, min(MAX_BOX, tile_bytes // (tc * item), rows))
    while tr > 1 and tiles_per_ring * slot_elems((tr, tc), item) * item > SMEM_LIMIT:
        tr //= 2
    return tr, tc


# -- the copy kernel ------------------------------------------------------------------------------------
@kernel_factory
def _copy_kernel(stages, tile, nb_dtype, evict_first=False, tma_part=True, has_tail=False):
    tr, tc = tile
    tile_elems = slot_elems(tile, nb_dtype.bitwidth // 8)
    lag = 1 if stages > 1 else 0  # a stage is refilled once the store issued *before* the current one read it
    store_tail = tail_store_2d(tile, nb_dtype.bitwidth // 8)
    release = store_release(lag)

    @cuda.jit(device=True, inline="always")
    def load(pipe, ring, src, t, tiles_c, policy):
        s = pipe.producer_acquire()
        tile = shared_view(ring, s * tile_elems, (tr, tc))
        coords = ((t // tiles_c) * tr, (t % tiles_c) * tc)
        if evict_first:
            pipe.load_hinted(tile, src, coords, policy)
        else:
            pipe.load(tile, src, coords)
        pipe.producer_commit()

    @cuda.jit
    def stream_copy_kernel(src, dst, tail, aligned, tiles_c, ntiles):
        ring = cuda.shared.array(0, nb_dtype, alignment=1024)
        pipe = Pipeline(stages, 1, 1)
        grid_dependency_sync()
        if cuda.threadIdx.x == 0:
            policy = l2_policy_evict_first()
            first, step, mine = persistent_share(ntiles)
            for i in range(min(stages, mine)):  # fill the ring
                load(pipe, ring, src, first + i * step, tiles_c, policy)
            for i in range(mine):
                t = first + i * step
                c = pipe.consumer_wait()
                tile = shared_view(ring, c * tile_elems, (tr, tc))
                coords = ((t // tiles_c) * tr, (t % tiles_c) * tc)
                if tma_part and coords[1] < aligned:  # dst describes columns [0, aligned): exact
                    if evict_first:
                        tma_store_hinted(dst, coords, tile, policy)
                    else:
                        tma_store(dst, coords, tile)
                if has_tail:  # the rows' last partial 16-byte unit: ordinary stores from the tile
                    store_tail(tile, tail, coords[0], coords[1], aligned, 0, 1)
                release(pipe, i)  # commit; once the store before this one read its stage, free it
                if i >= lag:  # and refill the freed stage
                    j = i - lag + stages
                    if j < mine:
                        load(pipe, ring, src, first + j * step, tiles_c, policy)
            bulk_wait_group(0)

    return stream_copy_kernel


@kernel_factory
def _copy_kernel_two_roles(stages, tile, nb_dtype, tma_part=True, has_tail=False):
    """The copy with a loading warp and a storing warp (one elected lane each): loads never wait behind the
    storer's ``wait_group.read``; the storer releases a stage once the store before the current one read
    it."""
    tr, tc = tile
    tile_elems = slot_elems(tile, nb_dtype.bitwidth // 8)
    lag = 1 if stages > 1 else 0
    store_tail = tail_store_2d(tile, nb_dtype.bitwidth // 8)
    release = store_release(lag)

    @cuda.jit
    def stream_copy_two_roles_kernel(src, dst, tail, aligned, tiles_c, ntiles):
        ring = cuda.shared.array(0, nb_dtype, alignment=1024)
        pipe = Pipeline(stages, 1, 1)
        grid_dependency_sync()
        first, step, mine = persistent_share(ntiles)
        if cuda.threadIdx.x // 32 == 0:
            if elect_one_sync():
                for i in range(mine):
                    t = first + i * step
                    s = pipe.producer_acquire()
                    pipe.load(shared_view(ring, s * tile_elems, (tr, tc)), src,
                              ((t // tiles_c) * tr, (t % tiles_c) * tc))
                    pipe.producer_commit()
        elif elect_one_sync():
            for i in range(mine):
                t = first + i * step
                c = pipe.consumer_wait()
                tile = shared_view(ring, c * tile_elems, (tr, tc))
                r0 = (t // tiles_c) * tr
                c0 = (t % tiles_c) * tc
                if tma_part and c0 < aligned:
                    tma_store(dst, (r0, c0), tile)
                if has_tail:
                    store_tail(tile, tail, r0, c0, aligned, 0, 1)
                release(pipe, i)
            bulk_wait_group(0)

    return stream_copy_two_roles_kernel


class StreamCopy(Plan):
    """A planned copy ``dst[...] = src`` through shared memory with TMA: persistent CTAs, one issuing
    thread each, a ring of ``stages`` tiles of about ``tile_bytes`` bytes.

    ``src`` and ``dst``: CUDA arrays (numba, CuPy, torch) of the same shape and dtype; 2-D arrays may be
    strided views, other ranks must be C-contiguous. Rows must start on 16-byte boundaries (TMA's rule).
    ``stages=1`` gives the unpipelined version (load, store, wait, repeat) for comparison.
    ``evict_first=True`` marks the loads and stores with an L2 evict-first policy (``.L2::cache_hint``).
    ``two_roles=True`` uses a loading warp and a storing warp instead of one thread doing both.
    Follows the plan contract of :class:`numbatma.kernels.Plan` (``launch(stream)`` returns ``dst``).
    """

    def __init__(self, src, dst, *, stages=4, tile_bytes=16384, ctas_per_sm=1, l2_promotion=0,
                 evict_first=False, two_roles=False):
        op = "StreamCopy"
        stages, tile_bytes, ctas_per_sm = _stream_options(op, stages, tile_bytes, ctas_per_sm)
        evict_first, two_roles = bool_option(op, "evict_first", evict_first), bool_option(op, "two_roles", two_roles)
        same_layout(op, src, dst)
        self.dst = dst
        self.ntiles = 0
        if math.prod(array_layout(src).shape) == 0:
            return
        (src2, dst2), ls = _views(op, src, dst)
        self.tile = _tile(ls, tile_bytes, stages)
        self.src_map = TensorMap(src2, self.tile, l2_promotion=l2_promotion)
        self.out = ExactStore(dst2, self.tile)
        self.dst_map = self.out.map
        rows, cols = ls.shape
        self.tiles_c = ceil_div(cols, self.tile[1])
        self.ntiles = ceil_div(rows, self.tile[0]) * self.tiles_c
        self.stages = stages
        self.shared_mem = stages * slot_elems(self.tile, ls.dtype.itemsize) * ls.dtype.itemsize
        self.grid = persistent_grid(self.ntiles, ctas_per_sm)
        nb_dtype = self.src_map.numba_type.dtype
        exact = (self.out.tma, self.out.has_tail)
        if two_roles:
            self.kernel, self.block = _copy_kernel_two_roles(stages, self.tile, nb_dtype, *exact), 64
        else:
            self.kernel, self.block = _copy_kernel(stages, self.tile, nb_dtype, bool(evict_first), *exact), 32
        self.nbytes = 2 * math.prod(ls.shape) * ls.dtype.itemsize  # read + written

    smem = property(lambda self: self.shared_mem, doc="``shared_mem`` (the earlier name).")
    threads = property(lambda self: self.block, doc="``block`` (the earlier name).")
    writes = ("dst",)
    #: ``stream_copy(x, x)``: each tile is loaded and stored back by the same CTA (a no-op copy; allowed).
    may_alias = (("dst", "src"),)

    @property
    def args(self):
        """The kernel's arguments (valid offline, e.g. for ``numbatma.compile.compile_ptx``)."""
        return (self.src_map, self.dst_map, self.out.tail, self.out.aligned, self.tiles_c, self.ntiles)

    @property
    def output(self):
        return self.dst


def stream_copy(src, dst, **options):
    """``dst[...] = src`` with :class:`StreamCopy` (options as there, plus ``stream``); returns ``dst``."""
    return run(StreamCopy, src, dst, **options)


# -- axpy: warp-specialized, TMA in and out -------------------------------------------------------------
CONSUMER_WARPS = 4
CONSUMERS = 32 * CONSUMER_WARPS


@kernel_factory
def _axpy_kernel(stages, tile, nb_dtype, tma_part=True, has_tail=False):
    tr, tc = tile
    tile_elems = slot_elems(tile, nb_dtype.bitwidth // 8)
    stage_elems = 2 * tile_elems  # x tile, then y tile
    n = tr * tc
    lag = 1 if stages > 1 else 0
    store_tail = tail_store_2d(tile, nb_dtype.bitwidth // 8)
    release = store_release(lag)

    @cuda.jit
    def axpy_kernel(a, x, y, out, tail, aligned, tiles_c, ntiles):
        ring = cuda.shared.array(0, nb_dtype, alignment=1024)
        # full: the producer's arrival + TMA bytes; empty: the storing consumer thread's arrival
        pipe = Pipeline(stages, 1, 1)
        grid_dependency_sync()
        warp = cuda.threadIdx.x // 32
        first, step, mine = persistent_share(ntiles)
        if warp == 0:
            # producer warp: one elected lane loads x and y tiles into each stage
            if elect_one_sync():
                for i in range(mine):
                    t = first + i * step
                    r0 = (t // tiles_c) * tr
                    c0 = (t % tiles_c) * tc
                    s = pipe.producer_acquire()
                    base = s * stage_elems
                    pipe.load(shared_view(ring, base, (tr, tc)), x, (r0, c0))
                    pipe.load(shared_view(ring, base + tile_elems, (tr, tc)), y, (r0, c0))
                    pipe.producer_commit()
        else:
            me = cuda.threadIdx.x - 32
            for i in range(mine):
                t = first + i * step
                c = pipe.consumer_wait()
                base = c * stage_elems
                xs = shared_view(ring, base, n)
                ys = shared_view(ring, base + tile_elems, n)
                for k in range(me, n, CONSUMERS):
                    xs[k] = a * xs[k] + ys[k]
                fence_proxy_async_shared_cta()
                named_barrier_sync(1, CONSUMERS)
                r0 = (t // tiles_c) * tr
                c0 = (t % tiles_c) * tc
                if has_tail and c0 + tc > aligned:  # the rows' last partial 16-byte unit: ordinary stores
                    store_tail(shared_view(ring, base, (tr, tc)), tail, r0, c0, aligned, me, CONSUMERS)
                    named_barrier_sync(1, CONSUMERS)  # every tail read of the stage is done before its release
                if me == 0:
                    if tma_part and c0 < aligned:  # out describes columns [0, aligned): exact
                        tma_store(out, (r0, c0), shared_view(ring, base, (tr, tc)))
                    release(pipe, i)
            if me == 0:
                bulk_wait_group(0)

    return axpy_kernel


class Axpy(Plan):
    """A planned ``out = a * x + y`` (float32 or float64 arrays of one shape; ``a`` a Python scalar given
    at construction, changeable with ``plan.a = ...``).

    One producer warp (an elected lane issues TMA loads of the x and y tiles of a stage) and four
    consumer warps (compute in shared memory, over the x tile, which one thread TMA-stores to ``out``; the
    stage is released once the store has read it). Persistent grid, ``stages`` stages. Follows the plan
    contract of :class:`numbatma.kernels.Plan` (``launch(stream)`` returns ``out``).
    """

    def __init__(self, a, x, y, out, *, stages=3, tile_bytes=32768, ctas_per_sm=1, l2_promotion=256):
        op = "Axpy"
        a = scalar_option(op, "a", a)
        stages, tile_bytes, ctas_per_sm = _stream_options(op, stages, tile_bytes, ctas_per_sm)
        layout = same_layout(op, x, y, out)
        if layout.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TensorMapError(f"{op}: x is a {layout.name}; Axpy supports float32 and float64.")
        self.dtype = layout.dtype
        self.a = layout.dtype.type(a)
        self.dst = out
        self.ntiles = 0
        if math.prod(layout.shape) == 0:
            return
        (x2, y2, o2), lx = _views(op, x, y, out)
        self.tile = _tile(lx, tile_bytes, 2 * stages)
        self.x_map = TensorMap(x2, self.tile, l2_promotion=l2_promotion)
        self.y_map = TensorMap(y2, self.tile, l2_promotion=l2_promotion)
        self.out = ExactStore(o2, self.tile)
        self.out_map = self.out.map
        rows, cols = lx.shape
        self.tiles_c = ceil_div(cols, self.tile[1])
        self.ntiles = ceil_div(rows, self.tile[0]) * self.tiles_c
        self.stages = stages
        self.shared_mem = stages * 2 * slot_elems(self.tile, lx.dtype.itemsize) * lx.dtype.itemsize
        self.grid = persistent_grid(self.ntiles, ctas_per_sm)
        self.kernel = _axpy_kernel(stages, self.tile, self.x_map.numba_type.dtype, self.out.tma, self.out.has_tail)
        self.nbytes = 3 * math.prod(lx.shape) * lx.dtype.itemsize  # two reads, one write

    block = 32 + CONSUMERS  # a producer warp and the consumer warps
    writes = ("out",)
    #: ``axpy(a, x, y, y)`` / ``axpy(a, x, y, x)``: element-wise; a CTA loads the x and y tiles of a stage and
    #: TMA-stores the out tile of the same coordinates after computing it (allowed).
    may_alias = (("out", "x"), ("out", "y"))
    #: ``plan.a = 2.5``: the kernel reads ``a`` at every launch (a real number: see ``_options.scalar_option``).
    settable = {"a": lambda plan, value: plan.dtype.type(scalar_option("Axpy", "a", value))}
    smem = property(lambda self: self.shared_mem, doc="``shared_mem`` (the earlier name).")

    @property
    def args(self):
        """The kernel's arguments (valid offline, e.g. for ``numbatma.compile.compile_ptx``)."""
        return (self.a, self.x_map, self.y_map, self.out_map, self.out.tail, self.out.aligned, self.tiles_c,
                self.ntiles)

    @property
    def output(self):
        return self.dst


def axpy(a, x, y, out, **options):
    """``out = a * x + y`` with :class:`Axpy` (options as there, plus ``stream``); returns ``out``."""
    return run(Axpy, a, x, y, out, **options)
