"""TMA copy: every box of ``src`` goes global -> shared (TMA load on an mbarrier) -> global (TMA store).

One CTA per box, one issuing thread. Works for rank 1-5, every TMA dtype and swizzle, and shapes that are
not multiples of the box (the loads fill, the stores clip). Writes nothing outside ``dst``: the TMA stores
cover the 16-byte-aligned part of each row, ordinary stores the last elements (``_exact_store``). This is the reference TMA round trip; the
pipelined, persistent streaming copy is a separate kernel.
"""
from __future__ import annotations

import math

from numba import cuda

from numbatma import TensorMap, TensorMapError, array_layout
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    shared_view,
    tma_load,
    tma_store,
)

from ._compile_cache import kernel_factory
from ._device import grid_dependency_sync
from ._exact_store import ExactStore, tail_store_nd
from ._launch import MAX_BOX, ceil_div, round_up
from ._plan import Plan

__all__ = ["TmaCopy", "tma_copy", "default_box"]


def default_box(shape, itemsize, swizzle=0):
    """A box of at most 128 bytes per row (or the swizzle span) and at most 8 KiB in all."""
    rank = len(shape)
    row_bytes = int(swizzle) if swizzle else 128
    inner = max(16 // itemsize, min(row_bytes // itemsize, round_up(shape[-1], 16 // itemsize)))
    box = [inner]
    budget = max(1, 8192 // (inner * itemsize))
    for d in reversed(shape[:-1]):
        b = min(d, budget, MAX_BOX)
        box.append(b)
        budget = max(1, budget // b)
    return tuple(reversed(box))[:rank]


# -- the kernels: one per rank, because a coordinate tuple has a fixed length -----------------------------
def _coords(rank):
    """Device function: coordinates of box number ``b`` in a grid of ``tiles`` boxes of shape ``box``."""
    if rank == 1:
        return cuda.jit(device=True, inline="always")(lambda b, tiles, box: (b * box[0],))
    if rank == 2:

        def c2(b, tiles, box):
            return ((b // tiles[1]) * box[0], (b % tiles[1]) * box[1])

        return cuda.jit(device=True, inline="always")(c2)
    if rank == 3:

        def c3(b, tiles, box):
            i2 = b % tiles[2]
            b //= tiles[2]
            return ((b // tiles[1]) * box[0], (b % tiles[1]) * box[1], i2 * box[2])

        return cuda.jit(device=True, inline="always")(c3)
    if rank == 4:

        def c4(b, tiles, box):
            i3 = b % tiles[3]
            b //= tiles[3]
            i2 = b % tiles[2]
            b //= tiles[2]
            return ((b // tiles[1]) * box[0], (b % tiles[1]) * box[1], i2 * box[2], i3 * box[3])

        return cuda.jit(device=True, inline="always")(c4)

    def c5(b, tiles, box):
        i4 = b % tiles[4]
        b //= tiles[4]
        i3 = b % tiles[3]
        b //= tiles[3]
        i2 = b % tiles[2]
        b //= tiles[2]
        return ((b // tiles[1]) * box[0], (b % tiles[1]) * box[1], i2 * box[2], i3 * box[3], i4 * box[4])

    return cuda.jit(device=True, inline="always")(c5)


@kernel_factory
def _copy_kernel(rank, box, shared_shape, nb_dtype, alignment, swizzle, tma_part, has_tail):
    coords_of = _coords(rank)
    itemsize = nb_dtype.bitwidth // 8
    rows2d = (math.prod(shared_shape[:-1]), shared_shape[-1])  # the tile with its leading axes folded
    store_tail = tail_store_nd(rank, box, itemsize, swizzle)

    @cuda.jit
    def tma_copy_kernel(src, dst, tail, aligned, tiles):
        tile = cuda.shared.array(shared_shape, nb_dtype, alignment=alignment)
        bar = cuda.shared.array(1, "uint64")
        grid_dependency_sync()
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            coords = coords_of(cuda.blockIdx.x, tiles, src.box)
            mbarrier_arrive_expect_tx(bar, src.box_bytes)
            tma_load(tile, src, coords, bar)
            mbarrier_wait_parity(bar, 0)
            # The tile was written by the async proxy and is read by the async proxy: no proxy fence needed.
            if tma_part and coords[rank - 1] < aligned:
                tma_store(dst, coords, tile)  # dst describes columns [0, aligned) only: exact
                bulk_commit_group()
            if has_tail:  # the last partial 16-byte unit of each row: ordinary stores
                store_tail(shared_view(tile, 0, rows2d), tail, coords, aligned)
            bulk_wait_group(0)

    return tma_copy_kernel


class TmaCopy(Plan):
    """A planned box-by-box copy ``dst[...] = src`` (same shape and dtype, any CUDA arrays, rank 1-5): one CTA
    per box of ``box`` (default :func:`default_box`), optional ``swizzle`` of the shared tile. Follows the plan
    contract of :class:`numbatma.kernels.Plan` (``launch(stream)`` returns ``dst``)."""

    block = 32  # one issuing thread (a whole warp launched)

    def __init__(self, src, dst, box=None, *, swizzle=0):
        ls, ld = array_layout(src), array_layout(dst)
        if ls.shape != ld.shape or ls.dtype != ld.dtype:
            raise TensorMapError(
                f"tma_copy: src is {ls.name} but dst is {ld.name}; both must have the same shape and dtype."
            )
        if box is None:
            box = default_box(ls.shape, ls.dtype.itemsize, swizzle)
        self.src_map = s = TensorMap(src, box, swizzle=swizzle)
        self.out = ExactStore(dst, box, swizzle=swizzle)
        self.dst_map = self.out.map
        self.dst = dst
        self.tiles = tuple(ceil_div(n, b) for n, b in zip(ls.shape, s.box))
        self.grid = math.prod(self.tiles)
        self.kernel = None if self.grid == 0 else _copy_kernel(  # (no blocks for an empty array: no launch)
            s.rank, s.box, s.shared_shape, s.numba_type.dtype, s.shared_alignment, int(s.swizzle), self.out.tma,
            self.out.has_tail)

    @property
    def args(self):
        """The kernel's arguments (valid offline, e.g. for ``numbatma.compile.compile_ptx``)."""
        return (self.src_map, self.dst_map, self.out.tail, self.out.aligned, self.tiles)

    @property
    def output(self):
        return self.dst


def tma_copy(src, dst, box=None, *, swizzle=0, stream=None):
    """Copy ``src`` into ``dst`` (same shape and dtype, any CUDA arrays) box by box through shared memory
    with TMA (:class:`TmaCopy`). Returns the pair of :class:`TensorMap` used (the store descriptor covers the
    16-byte-aligned part of ``dst``'s rows), so a caller can reuse or inspect them."""
    plan = TmaCopy(src, dst, box, swizzle=swizzle)
    plan.launch(stream)
    return plan.src_map, plan.dst_map
