"""Out-of-place 2-D transpose ``dst = src.T`` through shared memory with TMA, 128-byte swizzle on both sides.

Design (one CTA per SM or more, persistent; ``consumer_warps + 1`` warps):

* The source is cut into tiles of ``(tile_m, tile_n)`` elements; tile ``t`` (looped with stride
  ``gridDim.x``) has its top-left element at ``(r0, c0)`` and lands in ``dst`` at ``(c0, r0)``.
* **Producer warp** (the last warp, one elected lane): for each tile, waits for a free stage of a
  ``stages``-deep :class:`numbatma.intrinsics.Pipeline` and TMA-loads the tile as ``tile_n / W`` boxes of
  ``(tile_m, W)`` elements, where ``W = 128 / itemsize`` (every box row is 128 bytes, loaded with
  ``SWIZZLE_128B``). Boxes lying wholly right of the array are skipped; partial ones are zero-filled.
* **Consumer warps**: wait for the stage, move the tile *transposed* into an output buffer (one of
  ``out_stages``), release the input stage, ``fence.proxy.async.shared::cta`` + a named barrier; then one
  thread TMA-stores the output buffer as ``tile_m / W`` boxes of ``(tile_n, W)`` elements of ``dst``
  (store descriptor also ``SWIZZLE_128B``; the hardware clips what lies outside ``dst``). Before an output
  buffer is rewritten, the storing thread has waited (``cp.async.bulk.wait_group.read``) for the store that
  last read it, ahead of the named barrier everyone passes.

Shared-memory indexing. With ``SWIZZLE_128B`` the byte at offset ``o`` of a 1024-byte aligned box lives at
``o ^ (((o >> 7) & 7) << 4)``: the 16-byte chunk index (bits 4-6) is XORed with the row index mod 8 (bits
7-9). Consumers move 32-bit words (2- and 4-byte dtypes; a 2-byte tile moves as 2x2 blocks packed in two
words) or 64-bit words (8-byte dtypes). A warp moves one *unit* (32x32 elements for 4 bytes, 64x64 for 2
bytes, 32x16 for 8 bytes) along diagonals: in step ``k`` lane ``l`` reads source row ``l`` (rows ``2l, 2l+1``
for 2 bytes) at word ``l ^ k`` and writes output row ``l ^ k`` at word ``l``. Both the swizzled read address
and the swizzled write address are then ``base + (H(l) ^ constant(k))`` with one per-lane ``H`` (see
``_unit4``/``_unit2``/``_unit8``), and in every step the 32 lanes hit 32 different banks on both sides
(for 8-byte words: each half-warp covers all 32 banks), i.e. no bank conflicts. ``tests/test_transpose_cpu.py``
checks this by running the unit functions in Python against a byte-level model of the TMA swizzle.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, uint32

from numbatma import OOBFill, Swizzle, TensorMap, TensorMapError, array_layout
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    elect_one_sync,
    fence_proxy_async_shared_cta,
    named_barrier_sync,
    persistent_share,
    shared_view,
    tma_store,
)

from ._compile_cache import kernel_factory
from ._device import grid_dependency_sync
from ._exact_store import ExactStore, tail_store_2d
from ._launch import MAX_BOX, SMEM_PER_BLOCK, SMEM_PER_SM, ceil_div, persistent_grid
from ._options import choice_option, int_option
from ._plan import Plan, run

__all__ = ["Transpose", "transpose", "default_tile", "UNIT_SHAPES"]

ITEMSIZES = (2, 4, 8)
# Elements (rows, cols) of the source one consumer warp transposes at a time.
UNIT_SHAPES = {4: (32, 32), 2: (64, 64), 8: (32, 16)}
DEFAULT_TILES = {4: (64, 64), 2: (128, 128), 8: (64, 32)}
SMEM_LIMIT = SMEM_PER_BLOCK
ORDERS = ("src", "dst")


def default_tile(itemsize):
    """The default ``(tile_m, tile_n)`` for an element size (16 KiB tiles, 32 KiB for 2-byte elements)."""
    return DEFAULT_TILES[itemsize]


# -- the consumer's unit moves (plain Python: run by the kernel and by the CPU tests) ----------------------
# ``w`` is the dynamic shared memory viewed as 32-bit (or 64-bit) words; ``src0``/``dst0`` are word offsets
# of the unit's first source row (in its load box) and first output row (in its store box). Both are
# multiples of the unit's word count, so XOR-ing constants below that size is the same as adding them.
def _unit4(w, src0, dst0, lane, half_stride):
    """4-byte elements, a 32x32 unit; rows of 32 words. Source word (r, c) of the unit sits at
    ``32 r + (c ^ 4 (r & 7))``; lane ``l`` reads row ``l`` word ``l ^ k`` = ``H ^ k`` and writes output row
    ``l ^ k`` word ``l`` = ``H ^ (32 k + 4 (k & 7))``, with ``H = 32 l + (l ^ 4 (l & 7))``."""
    h = lane * 32 + (lane ^ ((lane & 7) << 2))
    for k0 in range(0, 32, 8):
        r = src0 + (h ^ k0)
        o = dst0 + (h ^ (k0 << 5))
        v0 = w[uint32(r)]
        v1 = w[uint32(r ^ 1)]
        v2 = w[uint32(r ^ 2)]
        v3 = w[uint32(r ^ 3)]
        v4 = w[uint32(r ^ 4)]
        v5 = w[uint32(r ^ 5)]
        v6 = w[uint32(r ^ 6)]
        v7 = w[uint32(r ^ 7)]
        w[uint32(o)] = v0
        w[uint32(o ^ 36)] = v1
        w[uint32(o ^ 72)] = v2
        w[uint32(o ^ 108)] = v3
        w[uint32(o ^ 144)] = v4
        w[uint32(o ^ 180)] = v5
        w[uint32(o ^ 216)] = v6
        w[uint32(o ^ 252)] = v7


def _unit2(w, src0, dst0, lane, half_stride):
    """2-byte elements, a 64x64 unit as 32x32 blocks of 2x2 elements; rows of 32 words (64 elements).
    Lane ``l`` reads words ``l ^ k`` of rows ``2l`` and ``2l + 1`` (``G ^ k``, ``G ^ k ^ 36``), swaps the
    halves, and writes word ``l`` of output rows ``2(l ^ k)`` and ``2(l ^ k) + 1`` (``G ^ K``, ``G ^ K ^ 36``
    with ``K = 64 k + 8 (k & 3)``), ``G = 64 l + (l ^ 8 (l & 3))``."""
    g = lane * 64 + (lane ^ ((lane & 3) << 3))
    for k0 in range(0, 32, 4):
        r = src0 + (g ^ k0)
        o = dst0 + (g ^ (k0 << 6))
        a0 = w[uint32(r)]
        b0 = w[uint32(r ^ 36)]
        a1 = w[uint32(r ^ 1)]
        b1 = w[uint32(r ^ 37)]
        a2 = w[uint32(r ^ 2)]
        b2 = w[uint32(r ^ 38)]
        a3 = w[uint32(r ^ 3)]
        b3 = w[uint32(r ^ 39)]
        # element (2l, 2q) is the low half of a, (2l+1, 2q) the low half of b: output row 2q gets
        # (lo a, lo b), output row 2q+1 gets (hi a, hi b).
        w[uint32(o)] = (a0 & 0xFFFF) | ((b0 & 0xFFFF) << 16)
        w[uint32(o ^ 36)] = (a0 >> 16) | (b0 & 0xFFFF0000)
        w[uint32(o ^ 72)] = (a1 & 0xFFFF) | ((b1 & 0xFFFF) << 16)
        w[uint32(o ^ 108)] = (a1 >> 16) | (b1 & 0xFFFF0000)
        w[uint32(o ^ 144)] = (a2 & 0xFFFF) | ((b2 & 0xFFFF) << 16)
        w[uint32(o ^ 180)] = (a2 >> 16) | (b2 & 0xFFFF0000)
        w[uint32(o ^ 216)] = (a3 & 0xFFFF) | ((b3 & 0xFFFF) << 16)
        w[uint32(o ^ 252)] = (a3 >> 16) | (b3 & 0xFFFF0000)


def _unit8(w, src0, dst0, lane, half_stride):
    """8-byte elements, a 32x16 unit; rows of 16 words (64-bit). Half-warp ``h`` takes source rows
    ``16 h .. 16 h + 15`` (and output box ``h`` of the unit, ``half_stride`` words further); lane ``m`` of
    the half reads row ``m`` word ``m ^ k`` = ``G ^ k`` and writes output row ``m ^ k`` word ``m`` =
    ``G ^ (16 k + 2 (k & 7))``, ``G = 16 m + (m ^ 2 (m & 7))``."""
    m = lane & 15
    hh = lane >> 4
    g = m * 16 + (m ^ ((m & 7) << 1))
    for k0 in range(0, 16, 8):
        r = src0 + hh * 256 + (g ^ k0)
        o = dst0 + hh * half_stride + (g ^ (k0 << 4))
        v0 = w[uint32(r)]
        v1 = w[uint32(r ^ 1)]
        v2 = w[uint32(r ^ 2)]
        v3 = w[uint32(r ^ 3)]
        v4 = w[uint32(r ^ 4)]
        v5 = w[uint32(r ^ 5)]
        v6 = w[uint32(r ^ 6)]
        v7 = w[uint32(r ^ 7)]
        w[uint32(o)] = v0
        w[uint32(o ^ 18)] = v1
        w[uint32(o ^ 36)] = v2
        w[uint32(o ^ 54)] = v3
        w[uint32(o ^ 72)] = v4
        w[uint32(o ^ 90)] = v5
        w[uint32(o ^ 108)] = v6
        w[uint32(o ^ 126)] = v7


UNITS = {4: _unit4, 2: _unit2, 8: _unit8}


class Geometry:
    """Every size the kernel is built from, in elements and in words (the consumers' access width)."""

    def __init__(self, itemsize, tile, stages, consumer_warps, out_stages):
        self.itemsize = itemsize
        self.tm, self.tn = tile
        self.stages = stages
        self.consumer_warps = consumer_warps
        self.out_stages = out_stages
        self.W = 128 // itemsize  # elements in one 128-byte box row
        self.word = 8 if itemsize == 8 else 4
        self.row_words = 128 // self.word
        self.unit_m, self.unit_n = UNIT_SHAPES[itemsize]
        self.units_m = self.tm // self.unit_m
        self.units_n = self.tn // self.unit_n
        self.units = self.units_m * self.units_n
        self.tile_elems = self.tm * self.tn
        self.tile_words = self.tile_elems * itemsize // self.word
        self.load_boxes = self.tn // self.W  # boxes (tm, W) per tile
        self.store_boxes = self.tm // self.W  # boxes (tn, W) per tile
        self.tile_bytes = self.tile_elems * itemsize
        self.smem = (stages + out_stages) * self.tile_bytes
        # Input buffer: load box a (tm rows of W elements) at element a * tm * W. Output buffer: store box b
        # (tn rows of W elements) at element b * tn * W. Unit (ur, uc) covers source rows ur * unit_m.. and
        # columns uc * unit_n.. (unit_n == W: one load box); its output rows start in store box
        # ur * unit_m / W (two boxes per unit for 8-byte elements), at row uc * unit_n.
        self.src_step = (self.unit_m * self.row_words, self.tm * self.row_words)  # words per (ur, uc)
        self.dst_step = ((self.unit_m // self.W) * self.tn * self.row_words, self.unit_n * self.row_words)

    def unit_offsets(self, ur, uc):
        """Word offsets (in the tile's input / output buffer) of unit (ur, uc)'s first source row and
        first output row."""
        return (ur * self.src_step[0] + uc * self.src_step[1], ur * self.dst_step[0] + uc * self.dst_step[1])

    @property
    def half_stride(self):
        """Words between two consecutive store boxes (8-byte units span two)."""
        return self.tn * self.row_words


@kernel_factory
def _transpose_kernel(itemsize, nb_dtype, tile, stages, consumer_warps, out_stages, order, tma_part=True,
                      has_tail=False):
    geo = Geometry(itemsize, tile, stages, consumer_warps, out_stages)
    tm, tn, W = geo.tm, geo.tn, geo.W
    tile_elems, tile_words = geo.tile_elems, geo.tile_words
    load_boxes, store_boxes = geo.load_boxes, geo.store_boxes
    units, units_n = geo.units, geo.units_n
    ncw = consumer_warps
    consumers = 32 * ncw
    word_dtype = np.uint64 if itemsize == 8 else np.uint32
    u_src_r, u_src_c = geo.src_step
    u_dst_r, u_dst_c = geo.dst_step
    half_stride = geo.half_stride
    wait_read = out_stages - 2
    src_major = order == "src"
    move = cuda.jit(device=True, inline="always")(UNITS[itemsize])
    store_tail = tail_store_2d((tn, W), itemsize, swizzle=128)  # a store box: (tn, W), 128B-swizzled

    @cuda.jit
    def transpose_kernel(src, dst, tail, aligned, rows, cols, tiles_fast, ntiles):
        smem = cuda.shared.array(0, nb_dtype, alignment=1024)
        # full: the producer's arrival + the TMA bytes; empty: one arrival per consumer warp
        pipe = Pipeline(stages, 1, ncw)
        grid_dependency_sync()
        warp = cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        first, step, _ = persistent_share(ntiles)  # tiles first, first + step, ... < ntiles
        if warp == ncw:
            # producer warp: one elected lane streams the tiles into the stages
            if elect_one_sync():
                for t in range(first, ntiles, step):
                    if src_major:
                        r0 = (t // tiles_fast) * tm
                        c0 = (t % tiles_fast) * tn
                    else:
                        c0 = (t // tiles_fast) * tn
                        r0 = (t % tiles_fast) * tm
                    s = pipe.producer_acquire()
                    base = s * tile_elems
                    for a in range(load_boxes):
                        if c0 + a * W < cols:
                            pipe.load(shared_view(smem, base + a * tm * W, (tm, W)), src, (r0, c0 + a * W))
                    pipe.producer_commit()
        else:
            words = smem.view(word_dtype)
            storer = cuda.threadIdx.x == 0
            ob = 0
            for t in range(first, ntiles, step):
                if src_major:
                    r0 = (t // tiles_fast) * tm
                    c0 = (t % tiles_fast) * tn
                else:
                    c0 = (t // tiles_fast) * tn
                    r0 = (t % tiles_fast) * tm
                s = pipe.consumer_wait()
                in0 = s * tile_words
                out0 = (stages + ob) * tile_words
                for u in range(warp, units, ncw):
                    ur = u // units_n
                    uc = u % units_n
                    move(words, in0 + ur * u_src_r + uc * u_src_c, out0 + ur * u_dst_r + uc * u_dst_c, lane,
                         half_stride)
                # every lane of this warp has read (and re-stored) its share of the stage
                cuda.syncwarp()
                if lane == 0:
                    pipe.consumer_release()
                fence_proxy_async_shared_cta()
                if storer:
                    # the buffer the *next* tile writes was last read by the store out_stages - 1 tiles ago
                    bulk_wait_group_read(wait_read)
                named_barrier_sync(1, consumers)
                obase = (stages + ob) * tile_elems
                if storer:
                    for b in range(store_boxes):
                        if tma_part and r0 + b * W < aligned:  # dst describes columns [0, aligned): exact
                            tma_store(dst, (c0, r0 + b * W), shared_view(smem, obase + b * tn * W, (tn, W)))
                    bulk_commit_group()
                if has_tail and r0 + tm > aligned:
                    # dst's rows end mid 16-byte unit: its last columns (source rows >= aligned) get ordinary
                    # stores by all consumers; the buffer is rewritten only after a later named barrier.
                    for b in range(store_boxes):
                        store_tail(shared_view(smem, obase + b * tn * W, (tn, W)), tail, c0, r0 + b * W, aligned,
                                   cuda.threadIdx.x, consumers)
                ob += 1
                if ob == out_stages:
                    ob = 0
            if storer:
                bulk_wait_group(0)

    return transpose_kernel


def _check_tile(op, itemsize, dtype_name, tile):
    import numbers

    try:
        tm, tn = tile
        if not all(isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)) for x in (tm, tn)):
            raise TypeError
        tm, tn = int(tm), int(tn)
    except (TypeError, ValueError):
        raise TensorMapError(f"{op}: tile must be a pair (tile_m, tile_n) of integers, got {tile!r}.") from None
    um, un = UNIT_SHAPES[itemsize]
    if tm % um or tn % un or not 0 < tm <= MAX_BOX or not 0 < tn <= MAX_BOX:
        raise TensorMapError(
            f"{op}: tile {(tm, tn)} for {dtype_name} ({itemsize}-byte) elements: tile_m must be a multiple of "
            f"{um} and tile_n a multiple of {un}, both at most {MAX_BOX} (TMA's largest box dimension); "
            f"e.g. {DEFAULT_TILES[itemsize]}."
        )
    return tm, tn


class Transpose(Plan):
    """A planned out-of-place transpose ``dst[...] = src.T`` of a 2-D CUDA array with TMA.

    ``src``: a 2-D CUDA array (numba, CuPy, torch: anything with ``__cuda_array_interface__`` or
    ``__dlpack__``) of a 2-, 4- or 8-byte dtype; ``dst``: shape ``(src.shape[1], src.shape[0])``, same dtype,
    not overlapping ``src``. Rows may be strided (padded), but every row of both arrays must start on a
    16-byte boundary (TMA's rule): for C-contiguous arrays both dimensions must be multiples of
    ``16 / itemsize`` elements.

    Options (to tune): ``tile=(tile_m, tile_n)`` source elements per tile (multiples of
    :data:`UNIT_SHAPES`, default :func:`default_tile`), ``stages`` (input stages in flight),
    ``out_stages`` (output buffers, >= 2), ``consumer_warps``, ``ctas_per_sm`` (persistent CTAs per SM;
    default 2 when two fit in shared memory, else 1),
    ``order`` ("dst", the default: consecutive tiles run along a destination row band; "src": along a source
    row band),
    ``l2_promotion`` of the loads (0/64/128/256), ``grid`` (number of CTAs instead of the persistent
    ``ctas_per_sm * SMs``; each CTA loops over tiles ``blockIdx.x, blockIdx.x + gridDim.x, ...``).

    Shared memory per CTA: ``(stages + out_stages) * tile_m * tile_n * itemsize`` bytes (at most 226 KiB).
    TensorMaps and the kernel are built here; ``launch(stream)`` runs it and returns ``dst`` (the plan contract
    of :class:`numbatma.kernels.Plan`).
    """

    def __init__(self, src, dst, *, stages=4, ctas_per_sm=None, tile=None, consumer_warps=4, out_stages=2,
                 order="dst", l2_promotion=0, grid=None):
        op = "Transpose"
        ls, ld = array_layout(src), array_layout(dst)
        for what, lay in (("src", ls), ("dst", ld)):
            if len(lay.shape) != 2:
                raise TensorMapError(f"{op}: {what} is a {lay.name}; transpose takes 2-D arrays.")
        if ls.dtype != ld.dtype:
            raise TensorMapError(
                f"{op}: src is a {ls.name} but dst is a {ld.name}; both must have the same dtype "
                f"(transpose moves bits, it does not convert)."
            )
        m, n = ls.shape
        if ld.shape != (n, m):
            raise TensorMapError(
                f"{op}: dst is a {ld.name}, but the transpose of a {ls.name} has shape ({n}, {m})."
            )
        itemsize = ls.dtype.itemsize
        if itemsize not in ITEMSIZES:
            raise TensorMapError(
                f"{op}: src is a {ls.name}; this kernel transposes 2-, 4- and 8-byte elements, not "
                f"{itemsize}-byte ones."
            )
        empty = m * n == 0
        for what, lay in (("src", ls), ("dst", ld)):
            rs = lay.strides[0]
            if empty:
                break
            if rs <= 0 or rs % 16:
                per = 16 // itemsize
                raise TensorMapError(
                    f"{op}: the rows of {what} (a {lay.name}) are {rs} bytes apart; TMA needs every row to start "
                    f"on a 16-byte boundary. For contiguous arrays both dimensions of src must be multiples of "
                    f"{per} {lay.dtype.name} elements; otherwise pad the rows: allocate "
                    f"({lay.shape[0]}, {ceil_div(lay.shape[1], per) * per}) and pass the view [:, :{lay.shape[1]}]."
                )
        stages = int_option(op, "stages", stages, 1, 16)
        out_stages = int_option(op, "out_stages", out_stages, 2, 8)
        consumer_warps = int_option(op, "consumer_warps", consumer_warps, 1, 16)
        ctas_per_sm = int_option(op, "ctas_per_sm", ctas_per_sm, 1, 32, none_ok=True)
        grid = int_option(op, "grid (number of CTAs)", grid, 1, 2**31 - 1, none_ok=True)
        order = choice_option(op, "order", order, ORDERS)
        self.tile = _check_tile(op, itemsize, ls.dtype.name, default_tile(itemsize) if tile is None else tile)
        self.geometry = Geometry(itemsize, self.tile, stages, consumer_warps, out_stages)
        # + the pipeline's mbarriers, which ptxas pads to 1024 bytes so the dynamic buffer stays 1024-aligned
        if self.geometry.smem + 1024 > SMEM_LIMIT:
            raise TensorMapError(
                f"{op}: (stages + out_stages) * tile = ({stages} + {out_stages}) * {self.geometry.tile_bytes} "
                f"bytes = {self.geometry.smem} bytes of shared memory (+ 1024 for the barriers), more than the "
                f"{SMEM_LIMIT} a block may use; lower stages or the tile."
            )
        self.src, self.dst = src, dst
        self.shape = (m, n)
        self.dtype = ls.dtype
        self.stages = stages
        self.out_stages = out_stages
        self.consumer_warps = consumer_warps
        self.ctas_per_sm = ctas_per_sm
        self.order = order
        self.block = 32 * (consumer_warps + 1)
        self.shared_mem = self.geometry.smem
        if self.ctas_per_sm is None:  # two CTAs per SM when two fit (measured faster on an H200)
            self.ctas_per_sm = 2 if 2 * (self.shared_mem + 2048) <= SMEM_PER_SM else 1
        self.nbytes = 2 * m * n * itemsize  # read + written
        tm, tn = self.tile
        w = self.geometry.W
        self.tiles_m, self.tiles_n = ceil_div(m, tm), ceil_div(n, tn)
        self.ntiles = self.tiles_m * self.tiles_n
        self.tiles_fast = self.tiles_n if order == "src" else self.tiles_m
        self._grid = None if grid is None else min(grid, max(self.ntiles, 1))
        if self.ntiles == 0:  # an empty array: nothing to describe or launch
            self.src_map = self.dst_map = self.out = None
            self.kernel = None
            return
        self.src_map = TensorMap(src, (tm, w), swizzle=Swizzle.B128, oob_fill=OOBFill.ZERO,
                                 l2_promotion=l2_promotion)
        self.out = ExactStore(dst, (tn, w), swizzle=Swizzle.B128)
        self.dst_map = self.out.map
        self.kernel = _transpose_kernel(itemsize, self.src_map.numba_type.dtype, self.tile, stages,
                                        consumer_warps, out_stages, order, self.out.tma, self.out.has_tail)

    @property
    def args(self):
        """The kernel's arguments (descriptors first), e.g. for ``numbatma.compile.compile_ptx``."""
        m, n = self.shape
        return (self.src_map, self.dst_map, self.out.tail, self.out.aligned, m, n, self.tiles_fast, self.ntiles)

    @property
    def grid(self):
        """Persistent grid: ``ctas_per_sm`` CTAs per SM, never more than there are tiles (needs the GPU)."""
        if self._grid is None:
            self._grid = persistent_grid(self.ntiles, self.ctas_per_sm)
        return self._grid

    smem = property(lambda self: self.shared_mem, doc="``shared_mem`` (the earlier name).")
    threads = property(lambda self: self.block, doc="``block`` (the earlier name).")
    #: No in-place transpose: a CTA's stored tile lands where another CTA's tile is still to be loaded.
    writes = ("dst",)
    overlap_note = "a CTA stores its tile where another CTA's tile may still be unread, so it cannot run in place"

    @property
    def output(self):
        return self.dst

    def __repr__(self):
        m, n = self.shape
        return (f"Transpose({self.dtype.name}({m}, {n}) -> ({n}, {m}), tile={self.tile}, stages={self.stages}, "
                f"out_stages={self.out_stages}, consumer_warps={self.consumer_warps}, order={self.order!r})")


def transpose(src, dst, **options):
    """``dst[...] = src.T`` with :class:`Transpose` (options as there, plus ``stream``); returns ``dst``."""
    return run(Transpose, src, dst, **options)
