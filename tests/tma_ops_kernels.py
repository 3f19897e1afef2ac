"""Kernels and NumPy references shared by the reduce-store / tensor-prefetch tests (CPU compile checks,
simulator tests and GPU tests): tests/test_tma_ops_cpu.py, tests/sim/test_sim_tma_ops.py,
tests/test_gpu_tma_ops.py.

Every block loads its own box of ``src`` (block ``b`` holds rows ``b*box[0] ...`` of the first dimension),
then reduces that tile into the box of ``dst`` at ``dst_coords[b]`` - so the contributions are known
exactly, and several blocks may reduce into overlapping boxes.
"""
import functools

import numpy as np
from numba import cuda

from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    fence_mbarrier_init,
    l2_policy_evict_first,
    l2_policy_evict_last,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    tma_load,
    tma_store,
)
from numbatma.intrinsics.tma import tma_prefetch, tma_prefetch_hinted, tma_reduce, tma_reduce_hinted

# (array shape, box) per rank: inner extents are whole 16-byte units for every dtype (no store overhang).
SHAPES = {1: (200,), 2: (20, 40), 3: (5, 9, 40), 4: (3, 4, 5, 24), 5: (2, 3, 4, 5, 24)}
BOXES = {1: (64,), 2: (8, 16), 3: (2, 4, 16), 4: (2, 2, 3, 16), 5: (1, 2, 2, 3, 16)}

# The (reduction, dtype) pairs PTX defines (cp.reduce.async.bulk.tensor), written out independently of
# numbatma's own table.
LEGAL = {
    "add": ["uint32", "int32", "uint64", "float32", "float16", "bfloat16"],
    "min": ["uint32", "int32", "uint64", "int64", "float16", "bfloat16"],
    "max": ["uint32", "int32", "uint64", "int64", "float16", "bfloat16"],
    "inc": ["uint32"],
    "dec": ["uint32"],
    # (PTX allows b64 - int64 too - but an INT64 descriptor faults on an H200: scripts/probe_reduce_ops.py)
    "and": ["uint32", "int32", "uint64"],
    "or": ["uint32", "int32", "uint64"],
    "xor": ["uint32", "int32", "uint64"],
}
ALL_DTYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "bfloat16",
              "float32", "float64"]


def np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def tile_dtype(name):
    """The dtype of a shared tile for ``name`` data (bfloat16 tiles are declared as uint16)."""
    return np.uint16 if name == "bfloat16" else np.dtype(name).type


@cuda.jit(device=True)
def _c1(c, b):
    return c[b, 0]


@cuda.jit(device=True)
def _c2(c, b):
    return (c[b, 0], c[b, 1])


@cuda.jit(device=True)
def _c3(c, b):
    return (c[b, 0], c[b, 1], c[b, 2])


@cuda.jit(device=True)
def _c4(c, b):
    return (c[b, 0], c[b, 1], c[b, 2], c[b, 3])


@cuda.jit(device=True)
def _c5(c, b):
    return (c[b, 0], c[b, 1], c[b, 2], c[b, 3], c[b, 4])


COORDS = {1: _c1, 2: _c2, 3: _c3, 4: _c4, 5: _c5}


def reduce_kernel_source(kind, shared_shape, dtype, rank, hinted=False):
    """The Python function (not yet jitted) of a load-then-reduce kernel for reduction ``kind``."""
    coords = COORDS[rank]
    shape = tuple(shared_shape)
    tdtype = tile_dtype(dtype)

    if hinted:
        def reduce_hinted_kernel(src, dst, src_coords, dst_coords):
            tile = cuda.shared.array(shape, tdtype, alignment=1024)
            bar = cuda.shared.array(1, np.uint64)
            b = cuda.blockIdx.x
            if cuda.threadIdx.x == 0:
                mbarrier_init(bar, 1)
                fence_mbarrier_init()
                mbarrier_arrive_expect_tx(bar, src.box_bytes)
                tma_load(tile, src, coords(src_coords, b), bar)
                mbarrier_wait_parity(bar, 0)
                tma_reduce_hinted(kind, dst, coords(dst_coords, b), tile, l2_policy_evict_first())
                bulk_commit_group()
                bulk_wait_group(0)

        return reduce_hinted_kernel

    def reduce_kernel(src, dst, src_coords, dst_coords):
        tile = cuda.shared.array(shape, tdtype, alignment=1024)
        bar = cuda.shared.array(1, np.uint64)
        b = cuda.blockIdx.x
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, src.box_bytes)
            tma_load(tile, src, coords(src_coords, b), bar)
            mbarrier_wait_parity(bar, 0)
            tma_reduce(kind, dst, coords(dst_coords, b), tile)
            bulk_commit_group()
            bulk_wait_group(0)

    return reduce_kernel


def prefetch_kernel_source(shared_shape, dtype, rank, hinted=False):
    """Prefetch the box at ``coords[b]`` of ``src`` into L2, then load it and store it as block ``b``'s box of
    ``out`` (at ``out_coords[b]``)."""
    coords = COORDS[rank]
    shape = tuple(shared_shape)
    tdtype = tile_dtype(dtype)

    def prefetch_kernel(src, out, src_coords, out_coords):
        tile = cuda.shared.array(shape, tdtype, alignment=1024)
        bar = cuda.shared.array(1, np.uint64)
        b = cuda.blockIdx.x
        if cuda.threadIdx.x == 0:
            if hinted:
                tma_prefetch_hinted(src, coords(src_coords, b), l2_policy_evict_last())
            else:
                tma_prefetch(src, coords(src_coords, b))
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, src.box_bytes)
            tma_load(tile, src, coords(src_coords, b), bar)
            mbarrier_wait_parity(bar, 0)
            tma_store(out, coords(out_coords, b), tile)
            bulk_commit_group()
            bulk_wait_group(0)

    return prefetch_kernel


@functools.lru_cache(maxsize=None)
def reduce_kernel(kind, shared_shape, dtype, rank, hinted=False):
    return cuda.jit(reduce_kernel_source(kind, shared_shape, dtype, rank, hinted))


@functools.lru_cache(maxsize=None)
def prefetch_kernel(shared_shape, dtype, rank, hinted=False):
    return cuda.jit(prefetch_kernel_source(shared_shape, dtype, rank, hinted))


# -- data and references ---------------------------------------------------------------------------------
def random_data(rng, kind, dtype, shape):
    """Random values for ``kind`` that make every result exact and independent of the order in which
    overlapping boxes are reduced (float sums of small halves; integers over their whole range)."""
    dt = np_dtype(dtype)
    if dtype in ("float16", "float32", "bfloat16"):
        if kind == "add":
            return (rng.integers(-16, 17, size=shape) / 2).astype(dt)
        return rng.standard_normal(shape).astype(np.float32).astype(dt)
    if kind in ("inc", "dec"):  # small values, so both branches of inc/dec occur, plus 0 and the maximum
        v = rng.integers(0, 12, size=shape).astype(dt)
        flat = v.reshape(-1)
        flat[rng.integers(0, flat.size, size=max(1, flat.size // 16))] = np.iinfo(dt).max
        return v
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


def combine(kind, old, val):
    """``old <kind> val`` as PTX defines the reductions (no NaNs in the test data)."""
    if kind == "add":
        with np.errstate(over="ignore"):
            return (old + val).astype(old.dtype)
    if kind == "min":
        return np.minimum(old, val)
    if kind == "max":
        return np.maximum(old, val)
    if kind == "inc":
        return np.where(old >= val, np.zeros_like(old), old + np.ones_like(old)).astype(old.dtype)
    if kind == "dec":
        return np.where((old == 0) | (old > val), val, old - np.ones_like(old)).astype(old.dtype)
    if kind == "and":
        return old & val
    if kind == "or":
        return old | val
    if kind == "xor":
        return old ^ val
    raise ValueError(kind)


def reference(kind, dst, tiles, coords):
    """``dst`` after reducing each tile (a whole box) into the box at its coordinates, clipped to bounds."""
    out = dst.copy()
    for tile, c in zip(tiles, coords):
        dsl, tsl = [], []
        for ci, b, n in zip(c, tile.shape, out.shape):
            lo, hi = max(int(ci), 0), min(int(ci) + b, n)
            if lo >= hi:
                break
            dsl.append(slice(lo, hi))
            tsl.append(slice(lo - int(ci), hi - int(ci)))
        else:
            out[tuple(dsl)] = combine(kind, out[tuple(dsl)], tile[tuple(tsl)])
    return out


def box_coords(rng, shape, box, n_random, itemsize):
    """Coordinates of boxes: two at the origin (exact overlap), one shifted along every axis (partial
    overlap), one hanging over the end of every axis, then random ones (partly out of bounds too; never
    negative: scripts/probe_reduce.py). Innermost coordinates are multiples of 16 bytes (``16 // itemsize`` elements), as the
    hardware requires (docs/guide.md: "Innermost coordinate")."""
    rank = len(shape)
    q = max(1, 16 // itemsize)

    def inner(c):  # round the innermost coordinate down to a multiple of q
        return c[:-1] + ((c[-1] // q) * q,)

    coords = [(0,) * rank, (0,) * rank, (1,) * (rank - 1) + (q,),
              inner(tuple(n - b // 2 for n, b in zip(shape, box)))]
    for _ in range(n_random):  # (never negative: a reduce box starting before the tensor faults on an H200)
        coords.append(inner(tuple(int(rng.integers(0, n)) for n, b in zip(shape, box))))
    return np.array(coords, dtype=np.int32)


def source_tiles(rng, kind, dtype, box, nblocks, same=False):
    """``nblocks`` boxes of data stacked along the first axis (the source array), and the boxes themselves.
    ``same``: every block reduces the same tile (so inc/dec into overlapping boxes are order-independent)."""
    if same:  # one value everywhere: partly overlapping boxes then apply identical updates (inc/dec do not
        # commute for different operands, and the order of CTAs is not defined)
        one = np.full(box, random_data(rng, kind, dtype, (1,))[0], np_dtype(dtype))
        tiles = np.stack([one] * nblocks)
    else:
        tiles = random_data(rng, kind, dtype, (nblocks,) + tuple(box))
    src = tiles.reshape((nblocks * box[0],) + tuple(box[1:]))
    src_coords = np.zeros((nblocks, len(box)), np.int32)
    src_coords[:, 0] = np.arange(nblocks) * box[0]
    return np.ascontiguousarray(src), src_coords, list(tiles)
