"""2-D 5-point Laplacian with a zero boundary, streamed through shared memory with TMA.

``dst[i, j] = src[i-1, j] + src[i+1, j] + src[i, j-1] + src[i, j+1] - 4 * src[i, j]``, where neighbours
outside the array count as 0.

Design (persistent, warp-specialized):

* The output is cut into tiles of ``BR x BC`` elements, numbered row-major; CTA ``b`` of a persistent grid
  handles tiles ``b, b + grid, b + 2*grid, ...`` (neighbouring tiles run at the same time on neighbouring
  CTAs, so the halo rows and columns a tile shares with its neighbours are mostly read from L2).
* One producer warp (one elected lane) TMA-loads the haloed box of each tile, ``(BR + 2) x (BC + 2*H)``
  elements at ``(r0 - 1, c0 - H)``, into a ring of ``stages`` shared buffers (a :class:`Pipeline`).
  ``H = 16 / itemsize`` (4 float32, 2 float64): the innermost TMA coordinate must be a multiple of 16 bytes,
  so the one-column halo travels as 16 bytes on each side. Out-of-bounds elements are filled with zero by
  TMA, which is exactly the zero boundary.
* ``consumer_warps`` warps compute from the stage into an output tile in shared memory (a ring of 2). Each
  consumer thread owns one column (or a few) of a band of rows and walks down it with a sliding window
  (the rows above and at the centre stay in registers): three shared loads and one shared store per output.
* After a fence and a named barrier among the consumers, one consumer thread TMA-stores the output tile
  (stores clip at the array's edge) and gives the stage back to the producer. Before the barrier it waits
  until the previous store has *read* its output buffer (``bulk_wait_group_read(0)``), so the buffer the
  consumers fill next is free.

Every buffer lives in dynamic shared memory (above 48 KiB is fine: numbatma raises the kernel's limit).
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from numbatma import L2Promotion, TensorMap, TensorMapError, array_layout
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    elect_one_sync,
    fence_proxy_async_shared_cta,
    named_barrier_sync,
    shared_view,
    tma_store,
)

from ._compile_cache import kernel_factory
from ._device import grid_dependency_sync
from ._exact_store import ExactStore, tail_store_2d
from ._launch import BOX_ALIGN, MAX_BOX, SMEM_PER_BLOCK, ceil_div, persistent_grid, round_up
from ._options import choice_option, int_option
from ._plan import Plan, run

__all__ = ["Laplacian5", "laplacian5"]

DTYPES = ("float32", "float64")
# Default tile per dtype: about 18 KiB per input stage and 16 KiB per output tile.
DEFAULT_TILE = {"float32": (16, 248), "float64": (16, 124)}  # (16, 248) fp32: best of the H200 sweep
DEFAULT_STAGES = 4
DEFAULT_CONSUMER_WARPS = 4
DEFAULT_CTAS_PER_SM = 2
MAX_SHARED_BYTES = SMEM_PER_BLOCK  # dynamic + static
_ALIGN = BOX_ALIGN  # every TMA buffer starts on a 128-byte boundary
_STATIC_SMEM = 2048  # static shared memory of the kernel as ptxas reports it (mbarriers + alignment)
_NAMED_BARRIER = 1  # id 0 is __syncthreads
_CHUNK = 8  # rows whose shared-memory loads a consumer thread issues together


def smem_layout(dtype, tile, stages):
    """Element offsets and sizes of the dynamic shared buffers: ``(in_stride, in_size, out_base, out_stride,
    out_size, nbytes)``; strides are rounded to 128 bytes."""
    itemsize = np.dtype(dtype).itemsize
    halo = 16 // itemsize
    br, bc = tile
    in_size = (br + 2) * (bc + 2 * halo)
    out_size = br * bc
    align = _ALIGN // itemsize
    in_stride = round_up(in_size, align)
    out_stride = round_up(out_size, align)
    out_base = stages * in_stride
    nbytes = (out_base + 2 * out_stride) * itemsize
    return in_stride, in_size, out_base, out_stride, out_size, nbytes


def consumer_layout(br, bc, consumer_warps):
    """How the consumer threads share an output tile: ``LANES`` threads side by side along the columns (each
    owning columns ``lane, lane + LANES, ...``), ``RG`` bands of ``ROWS`` rows stacked vertically; each thread
    walks its rows ``CHUNK`` at a time. Returns ``(LANES, RG, ROWS, CHUNK)``."""
    nt = consumer_warps * 32
    lanes = min(bc, nt)
    rg = min(nt // lanes, br)
    rows = ceil_div(br, rg)
    return lanes, rg, rows, min(rows, _CHUNK)


def _tile_compute(dtype_name, br, bc, consumer_warps):
    """The consumers' share of one tile as a plain Python function ``compute_tile(dyn, ibase, obase, tid)``:
    the kernel compiles it as a device function; the CPU tests run it on NumPy arrays.

    ``dyn`` is the flat shared buffer, ``ibase`` the element offset of the haloed input tile
    ``(br + 2, bc + 2*H)``, ``obase`` that of the output tile ``(br, bc)``, ``tid`` the consumer thread."""
    from numba.cuda import types as nbtypes

    nb_dtype = getattr(nbtypes, dtype_name)
    H = 16 // np.dtype(dtype_name).itemsize  # halo columns on each side (16 bytes)
    IW = bc + 2 * H  # input tile width
    BR = br
    BC = bc
    LANES, RG, ROWS, CHUNK = consumer_layout(br, bc, consumer_warps)
    U = np.uint64  # unsigned shared-memory indices: no negative-index wraparound code
    FOUR = nb_dtype(4)

    def compute_tile(dyn, ibase, obase, tid):
        band = tid // LANES
        lane = tid - band * LANES
        if band < RG:
            r_begin = band * ROWS
            r_end = min(r_begin + ROWS, BR)
            c = lane
            while c < BC:
                # input element (r + 1, c + H) is the centre of output (r, c)
                p = ibase + r_begin * IW + c + H
                up = dyn[U(p)]
                mid = dyn[U(p + IW)]
                q = obase + r_begin * BC + c
                r = r_begin
                # CHUNK rows at a time: all their loads first (independent, one shared-memory latency),
                # then the outputs (the compiler cannot move loads above stores into the same buffer).
                while r + CHUNK <= r_end:
                    dn = cuda.local.array(CHUNK, nb_dtype)
                    lf = cuda.local.array(CHUNK, nb_dtype)
                    rt = cuda.local.array(CHUNK, nb_dtype)
                    for k in range(CHUNK):
                        pk = p + (k + 1) * IW
                        dn[k] = dyn[U(pk + IW)]
                        lf[k] = dyn[U(pk - 1)]
                        rt[k] = dyn[U(pk + 1)]
                    for k in range(CHUNK):
                        dyn[U(q + k * BC)] = up + dn[k] + lf[k] + rt[k] - FOUR * mid
                        up = mid
                        mid = dn[k]
                    p += CHUNK * IW
                    q += CHUNK * BC
                    r += CHUNK
                while r < r_end:
                    p += IW
                    down = dyn[U(p + IW)]
                    left = dyn[U(p - 1)]
                    right = dyn[U(p + 1)]
                    dyn[U(q)] = up + down + left + right - FOUR * mid
                    up = mid
                    mid = down
                    q += BC
                    r += 1
                c += LANES

    return compute_tile


@kernel_factory
def _laplacian_kernel(dtype_name, br, bc, stages, consumer_warps, walk="rows", tma_part=True, has_tail=False):
    """The kernel for one (dtype, tile, stages, consumer warps); all of them compile-time constants."""
    from numba.cuda import types as nbtypes

    nb_dtype = getattr(nbtypes, dtype_name)
    H = 16 // np.dtype(dtype_name).itemsize  # halo columns on each side (16 bytes)
    IW = bc + 2 * H  # input tile width
    IH = br + 2  # input tile height
    IN_STRIDE, _, OUT_BASE, OUT_STRIDE, _, _ = smem_layout(dtype_name, (br, bc), stages)
    STAGES = stages
    NT = consumer_warps * 32  # consumer threads
    PRODUCER_WARP = consumer_warps  # the last warp
    BR = br
    BC = bc
    BAR = _NAMED_BARRIER
    compute_tile = cuda.jit(device=True, inline="always")(_tile_compute(dtype_name, br, bc, consumer_warps))

    strips = walk == "strips"
    store_tail = tail_store_2d((br, bc), np.dtype(dtype_name).itemsize)

    @cuda.jit(device=True, inline="always")
    def walk_range(ntiles):
        """This CTA's tiles: a contiguous run of the column-major order ("strips": walking down a column
        strip, a tile's top halo rows were loaded a moment ago as the previous tile's bottom rows, so they
        come from L2), or every gridDim-th tile of the row-major order ("rows")."""
        if strips:
            per = (ntiles + cuda.gridDim.x - 1) // cuda.gridDim.x
            first = cuda.blockIdx.x * per
            return first, min(first + per, ntiles), 1
        return cuda.blockIdx.x, ntiles, cuda.gridDim.x

    @cuda.jit(device=True, inline="always")
    def tile_origin(t, ntiles, tile_cols):
        if strips:
            tile_rows = ntiles // tile_cols
            tc = t // tile_rows
            return (t - tc * tile_rows) * BR, tc * BC
        tr = t // tile_cols
        return tr * BR, (t - tr * tile_cols) * BC

    @cuda.jit
    def laplacian5_kernel(src, dst, tail, aligned, ntiles, tile_cols):
        dyn = cuda.shared.array(0, nb_dtype, alignment=1024)
        pipe = Pipeline(STAGES, 1, 1)
        grid_dependency_sync()
        tid = cuda.threadIdx.x
        warp = tid // 32
        if warp == PRODUCER_WARP:
            if elect_one_sync():
                t, end, step = walk_range(ntiles)
                while t < end:
                    r0, c0 = tile_origin(t, ntiles, tile_cols)
                    s = pipe.producer_acquire()
                    pipe.load(shared_view(dyn, s * IN_STRIDE, (IH, IW)), src, (r0 - 1, c0 - H))
                    pipe.producer_commit()
                    t += step
        else:
            t, end, step = walk_range(ntiles)
            b = 0
            while t < end:
                r0, c0 = tile_origin(t, ntiles, tile_cols)
                s = pipe.consumer_wait()
                compute_tile(dyn, s * IN_STRIDE, OUT_BASE + b * OUT_STRIDE, tid)
                fence_proxy_async_shared_cta()
                if tid == 0:
                    # The store issued one tile ago read output buffer b ^ 1: wait for it, so that after the
                    # barrier everybody may fill that buffer for the next tile.
                    bulk_wait_group_read(0)
                named_barrier_sync(BAR, NT)
                if tid == 0:
                    if tma_part and c0 < aligned:  # dst describes columns [0, aligned): exact
                        tma_store(dst, (r0, c0), shared_view(dyn, OUT_BASE + b * OUT_STRIDE, (BR, BC)))
                    bulk_commit_group()
                    pipe.consumer_release()  # every consumer has finished reading stage s
                if has_tail and c0 + BC > aligned:
                    # the rows' last partial 16-byte unit: ordinary stores by the consumers (output buffer b is
                    # rewritten two tiles later, after the next named barrier)
                    store_tail(shared_view(dyn, OUT_BASE + b * OUT_STRIDE, (BR, BC)), tail, r0, c0, aligned, tid, NT)
                b ^= 1
                t += step
            if tid == 0:
                bulk_wait_group(0)

    return laplacian5_kernel


def _check_tile(tile, dtype):
    op = "Laplacian5"
    try:
        br, bc = (int(v) for v in tile)
        ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in tile) and len(tile) == 2
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise TensorMapError(f"{op}: tile must be a pair of integers (rows, columns), got {tile!r}.")
    itemsize = np.dtype(dtype).itemsize
    halo = 16 // itemsize
    if not 1 <= br <= MAX_BOX - 2:
        raise TensorMapError(
            f"{op}: tile={tile!r} has {br} rows; the haloed load box has rows + 2 <= {MAX_BOX}, so use "
            f"1..{MAX_BOX - 2} rows."
        )
    max_cols = MAX_BOX - 2 * halo
    if not (1 <= bc <= max_cols) or bc % halo:
        raise TensorMapError(
            f"{op}: tile={tile!r} has {bc} columns; for {np.dtype(dtype).name} the columns must be a multiple of "
            f"{halo} (16 bytes) in {halo}..{max_cols} (the haloed load box is columns + {2 * halo} <= {MAX_BOX} wide)."
        )
    return br, bc


class Laplacian5(Plan):
    """A planned 5-point Laplacian ``dst = laplace(src)`` with a zero boundary (see the module docstring).

    ``Laplacian5(src, dst, *, tile=None, stages=4, consumer_warps=4, ctas_per_sm=2, l2_promotion=256)``

    * ``src``, ``dst``: 2-D float32 or float64 CUDA arrays (numba, CuPy, PyTorch) of the same shape and
      dtype, not overlapping. The innermost axis must be contiguous and the row stride a multiple of 16 bytes
      (a column count that is a multiple of 4 for float32, 2 for float64; other widths work as a view of
      a padded array, e.g. ``padded[:, :67]``).
    * ``tile``: output tile ``(rows, columns)``; default ``(16, 248)`` for float32, ``(16, 124)`` for float64
      (wide, short tiles measured fastest on an H200: ``benchmarks/RESULTS.md``).
      Columns are a multiple of 16 bytes; the haloed load box ``(rows + 2, columns + 32 bytes)`` must fit
      TMA's 256-element limit.
    * ``stages``: input buffers in flight per CTA (TMA loads ahead of the compute).
    * ``consumer_warps``: warps that compute and store (plus one producer warp).
    * ``ctas_per_sm``: CTAs per SM in the persistent grid.
    * ``l2_promotion``: L2 promotion of the loads (:class:`numbatma.L2Promotion`).
    * ``walk``: ``"rows"`` (default: every ``gridDim``-th tile in row-major order, so the CTAs work on
      neighbouring tiles at once) or ``"strips"`` (each CTA walks down a column strip, so a tile's top halo
      rows were just loaded by the tile above). On an H200 "rows" reads ~12% more from DRAM (ncu: the halo
      rows) but is faster, 3.64 vs 3.15 TB/s: DRAM locality across CTAs matters more than halo reuse.

    Validation needs no GPU; the kernel compiles on the first :meth:`launch`. Follows the plan contract of
    :class:`numbatma.kernels.Plan` (``launch(stream)`` returns ``dst``).
    """

    def __init__(
        self,
        src,
        dst,
        *,
        tile=None,
        stages=DEFAULT_STAGES,
        consumer_warps=DEFAULT_CONSUMER_WARPS,
        ctas_per_sm=DEFAULT_CTAS_PER_SM,
        l2_promotion=L2Promotion.B256,
        walk="rows",
    ):
        op = "Laplacian5"
        walk = choice_option(op, "walk", walk, ("strips", "rows"))
        stages = int_option(op, "stages", stages, 1, 32)
        consumer_warps = int_option(op, "consumer_warps", consumer_warps, 1, 31)
        ctas_per_sm = int_option(op, "ctas_per_sm", ctas_per_sm, 1, 32)
        self.walk = walk
        ls, ld = array_layout(src), array_layout(dst)
        for what, lay in (("src", ls), ("dst", ld)):
            if len(lay.shape) != 2:
                raise TensorMapError(f"{op}: {what} is a {lay.name}; the 5-point Laplacian takes 2-D arrays.")
            if lay.dtype.name not in DTYPES:
                raise TensorMapError(f"{op}: {what} is a {lay.name}; supported dtypes: {', '.join(DTYPES)}.")
        if ls.shape != ld.shape or ls.dtype != ld.dtype:
            raise TensorMapError(
                f"{op}: src is a {ls.name} but dst is a {ld.name}; both must have the same shape and dtype."
            )
        dtype = ls.dtype
        itemsize = dtype.itemsize
        halo = 16 // itemsize
        self.empty = 0 in ls.shape
        for what, lay in (("src", ls), ("dst", ld)):
            if self.empty:  # (nothing is described or launched: any strides do)
                break
            if lay.strides[1] != itemsize:
                raise TensorMapError(
                    f"{op}: the columns of {what} (a {lay.name}) are {lay.strides[1]} bytes apart; they must be "
                    f"contiguous ({itemsize} bytes). Pass a contiguous array (e.g. a copy)."
                )
            if lay.strides[0] <= 0 or lay.strides[0] % 16:
                padded = round_up(lay.shape[1], halo)
                raise TensorMapError(
                    f"{op}: the rows of {what} (a {lay.name}) are {lay.strides[0]} bytes apart; TMA needs the row "
                    f"stride to be a positive multiple of 16 bytes, i.e. a column count that is a multiple of "
                    f"{halo} for {dtype.name}. Allocate rows of {padded} columns and pass a view of the first "
                    f"{lay.shape[1]} (e.g. padded[:, :{lay.shape[1]}])."
                )
            if lay.ptr % 16:
                raise TensorMapError(
                    f"{op}: {what} (a {lay.name}) starts at address 0x{lay.ptr:x}, not a multiple of 16 bytes; "
                    f"TMA needs 16-byte aligned arrays."
                )
        self.shape = ls.shape
        self.dtype = dtype
        if tile is None:
            tile = DEFAULT_TILE[dtype.name]
        self.tile = _check_tile(tile, dtype)
        self.stages = int(stages)
        self.consumer_warps = int(consumer_warps)
        self.ctas_per_sm = int(ctas_per_sm)
        self.shared_mem = smem_layout(dtype, self.tile, self.stages)[-1]
        static = _STATIC_SMEM  # the pipeline's mbarriers, placed before the 1024-aligned dynamic buffer
        if self.shared_mem + static > MAX_SHARED_BYTES:
            raise TensorMapError(
                f"{op}: tile={self.tile} with stages={self.stages} needs {self.shared_mem + static} bytes of "
                f"shared memory per CTA; the limit is {MAX_SHARED_BYTES}. Use fewer stages or a smaller tile."
            )
        br, bc = self.tile
        self.tile_rows = ceil_div(self.shape[0], br) if not self.empty else 0
        self.tile_cols = ceil_div(self.shape[1], bc) if not self.empty else 0
        self.ntiles = self.tile_rows * self.tile_cols
        self.block = 32 * (self.consumer_warps + 1)
        if self.empty:
            self.src_map = self.dst_map = self.out = None
        else:
            self.src_map = TensorMap(src, (br + 2, bc + 2 * halo), l2_promotion=l2_promotion)
            self.out = ExactStore(dst, (br, bc))
            self.dst_map = self.out.map
        self.src = src
        self.dst = dst

    smem_bytes = property(lambda self: self.shared_mem, doc="``shared_mem`` (the earlier name).")
    #: No in place: the stencil reads the neighbours of every element, which other CTAs write (the shared overlap
    #: rule of :class:`numbatma.kernels.Plan` refuses dst sharing memory with src).
    writes = ("dst",)
    overlap_note = "the stencil reads the neighbours of every element, so it cannot run in place"

    @property
    def kernel(self):
        """The ``@cuda.jit`` kernel (compiled for this plan's dtype, tile, stages and consumer warps); None for
        an empty array."""
        if self.empty:
            return None
        return _laplacian_kernel(self.dtype.name, *self.tile, self.stages, self.consumer_warps, self.walk,
                                 self.out.tma, self.out.has_tail)

    @property
    def args(self):
        """The kernel's arguments: ``(src_map, dst_map, dst_tail, aligned, ntiles, tile_cols)``."""
        return (self.src_map, self.dst_map, self.out.tail, self.out.aligned, self.ntiles, self.tile_cols)

    @property
    def grid(self):
        """Persistent grid size (needs the GPU to count SMs). An int; calling it (``plan.grid()``, the earlier
        method form) gives the same number."""
        return _CallableInt(persistent_grid(self.ntiles, self.ctas_per_sm))

    @property
    def output(self):
        return self.dst

    def __repr__(self):
        return (
            f"Laplacian5({self.dtype.name}{self.shape}, tile={self.tile}, stages={self.stages}, "
            f"consumer_warps={self.consumer_warps}, ctas_per_sm={self.ctas_per_sm}, smem={self.shared_mem} B)"
        )


def laplacian5(src, dst, *, stream=None, **options):
    """``dst[i, j] = src[i-1, j] + src[i+1, j] + src[i, j-1] + src[i, j+1] - 4 * src[i, j]`` with zeros outside
    the array; builds a :class:`Laplacian5` plan (``options`` as there) and launches it. Returns ``dst``."""
    return run(Laplacian5, src, dst, stream=stream, **options)


class _CallableInt(int):
    """An int that returns itself when called: ``Laplacian5.grid`` was a method before it became the int
    attribute of the plan contract."""

    def __call__(self):
        return int(self)
